"""Build Arrow arrays from Python objects without loading pandas.

pyarrow imports pandas the first time it converts Python objects (`pa.array`,
`pa.scalar`, a compute function given a Python value: its pandas shim checks for
Series, and its C++ converter looks up pandas' types), and PySpark's driver imports
it while the SparkContext starts (py4j's converters import `pyspark.testing`). pandas
then stays in that process: ~45-50 MB in the CLI and in each of Spark's Python
workers, and walstream never uses it. While `no_pandas()` is active an `import
pandas` fails as if pandas were not installed; pyarrow and PySpark handle that, and
pyarrow tries again when pandas is asked for by name: a user's transform may still
`import pandas` and call `to_pandas()` afterwards.

Only around walstream's own steps, never around a user's code: the import system is
shared by the whole process, so another thread importing pandas at that moment would
fail too. Once pandas is loaded, this does nothing.
"""

from __future__ import annotations

import contextlib
import sys
from collections.abc import Iterator
from importlib.machinery import ModuleSpec
from typing import Any


class _HidePandas:
    """A meta path finder that answers 'not installed' for pandas and its modules."""

    def find_spec(self, name: str, path: Any = None, target: Any = None) -> ModuleSpec | None:
        if name == "pandas" or name.startswith("pandas."):
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)
        return None


_HIDE = _HidePandas()


@contextlib.contextmanager
def no_pandas() -> Iterator[None]:
    """Within the block, `import pandas` fails (unless pandas is already loaded)."""
    if "pandas" in sys.modules or _HIDE in sys.meta_path:
        yield
        return
    sys.meta_path.insert(0, _HIDE)
    try:
        yield
    finally:
        sys.meta_path.remove(_HIDE)
