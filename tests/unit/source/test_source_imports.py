"""Spark starts a fresh Python process for each planning step of a Python data source
(creating it at `load()`, planning the read): those get the source's classes without
what reading the slot needs, and the reading side still finds all of it."""

from __future__ import annotations

import json
import subprocess
import sys
import textwrap

SCRIPT = textwrap.dedent(
    """
    import json, sys
    from walstream.source.datasource import WalstreamDataSource

    source = WalstreamDataSource({"dsn": "postgresql://u@127.0.0.1:1/app", "slot": "s",
                                  "publication": "p"})
    source.schema()
    reader = source.streamReader(None)
    heavy = ("psycopg", "psycopg2", "pyarrow", "walstream.capture.reader",
             "walstream.decode.decoder")
    out = {"planning": sorted(m for m in heavy if m in sys.modules)}
    from walstream.source.partition import ChangePartition
    out["read"] = sum(b.num_rows for b in reader.read(ChangePartition("app", [], [], {})))
    print(json.dumps(out))
    """
)


def test_planning_a_read_imports_nothing_of_reading_it() -> None:
    done = subprocess.run(
        [sys.executable, "-c", SCRIPT], capture_output=True, text=True, timeout=120, check=True
    )
    out = json.loads(done.stdout.strip().splitlines()[-1])
    assert out == {"planning": [], "read": 0}
