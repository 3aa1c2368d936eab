"""What executors run on a cluster: the zip `ship_package` sends, in a Python that has
walstream's dependencies but not walstream. The compiled decoder, which Python cannot load
from a zip, is loaded from the file shipped beside it; without that file, decoding falls
back to Python with a warning."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

from tests.integration.test_cluster import python_without_walstream
from walstream.engine.session import package_zip
from walstream.values import rows

PROBE = """
import sys
sys.path.insert(0, sys.argv[1])
import walstream
from walstream.values.rows import compiled_module
m = compiled_module()
print(walstream.__file__)
print(m.__file__ if m is not None else None)
"""


def test_executors_load_the_compiled_decoder_shipped_beside_the_zip(tmp_path: Path) -> None:
    python = python_without_walstream(tmp_path)
    ship = tmp_path / "userFiles"  # an executor's SparkFiles directory
    ship.mkdir()
    zipped = package_zip(ship)
    compiled = rows.compiled_module()
    assert compiled is not None, "bin/setup builds the compiled decoder"

    def probe() -> tuple[list[str], str]:
        done = subprocess.run([python, "-c", PROBE, str(zipped)], capture_output=True, text=True,
                              cwd=tmp_path, check=True)  # fmt: skip
        return done.stdout.split(), done.stderr

    (package, module), err = probe()  # no compiled file beside the zip: Python, said so
    assert package == f"{zipped}/walstream/__init__.py" and module == "None"
    assert "without its compiled decoder beside it: decoding in Python" in err
    beside = ship / Path(compiled.__file__).name
    shutil.copy(compiled.__file__, beside)  # what addFile puts there
    (package, module), err = probe()
    assert package == f"{zipped}/walstream/__init__.py" and module == str(beside)
    assert "decoding in Python" not in err
