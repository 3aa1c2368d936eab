"""The Python that Spark starts for its workers on a local master: this one, minus pyspark.zip.

Spark puts `$SPARK_HOME/python/lib/pyspark.zip` first on every Python worker's
PYTHONPATH, so a worker imports PySpark from that zip. Python compiles a module
imported from a zip every time (it caches bytecode only beside files), and every fresh
process pays it: ~0.5-0.7 s on this machine for what a worker imports
(docs/performance-log.md, "Start"). A Python data source costs four fresh processes one
after another before its first batch, besides the daemon.

With pip's PySpark, the zip holds the very package installed beside it, already
compiled (and Py4J's zip the Py4J installed with it). So on a local master
`worker_python` gives Spark a small wrapper that takes those zips off PYTHONPATH and
runs this Python: the workers import the installed PySpark and Py4J. Anything else (a
SPARK_HOME of its own, a cluster, PYSPARK_PYTHON set by the user, no cache directory)
keeps Spark's own way.
"""

from __future__ import annotations

import hashlib
import logging
import os
import shlex
import sys
from pathlib import Path

from walstream.engine.classes import cache_dir

log = logging.getLogger(__name__)

_SCRIPT = """#!/bin/sh
# Made by walstream (walstream/engine/pyworker.py): Spark's Python workers import the
# installed PySpark (and Py4J), compiled once, instead of compiling these zips in every
# process: {zips}
set -f
kept=
IFS=:
for entry in $PYTHONPATH; do
  case $entry in
    {patterns}) ;;
    *) kept=${{kept:+$kept:}}$entry ;;
  esac
done
unset IFS
if [ -n "$kept" ]; then export PYTHONPATH="$kept"; else unset PYTHONPATH; fi
exec {python_q} "$@"
"""


def bundled_zips() -> list[Path]:
    """The zips of pip's PySpark that hold what is installed beside them, when that is the
    Spark this process starts: pyspark.zip, and Py4J's when the installed Py4J is its
    version."""
    from importlib.metadata import PackageNotFoundError, version

    import pyspark

    home = Path(pyspark.__file__).parent
    if os.environ.get("SPARK_HOME") not in (None, "", str(home)):
        return []  # a Spark installation of its own: its zips may differ from this PySpark
    lib = home / "python" / "lib"
    found = [lib / "pyspark.zip"] if (lib / "pyspark.zip").is_file() else []
    try:
        py4j = lib / f"py4j-{version('py4j')}-src.zip"
    except PackageNotFoundError:
        return found
    return [*found, py4j] if found and py4j.is_file() else found


def worker_python() -> str:
    """The executable for PYSPARK_PYTHON on a local master (see the module docstring)."""
    zips = bundled_zips()
    if not zips:
        return sys.executable
    text = _SCRIPT.format(
        zips=" ".join(str(z) for z in zips),
        patterns="|".join(shlex.quote(str(z)) for z in zips),
        python_q=shlex.quote(sys.executable),
    )
    digest = hashlib.sha256(text.encode()).hexdigest()[:12]
    target = cache_dir() / f"python-worker-{digest}.sh"
    try:
        if not target.is_file() or target.read_text() != text:
            target.parent.mkdir(parents=True, exist_ok=True)
            tmp = target.with_suffix(f".{os.getpid()}.tmp")
            tmp.write_text(text)
            tmp.chmod(0o755)
            tmp.replace(target)
    except OSError as exc:  # only the speed-up is lost
        log.debug("no worker wrapper (%s): workers import PySpark from its zip", exc)
        return sys.executable
    return str(target)
