"""Keep pandas out of the Python workers: pyarrow loads it to build any array.

`pa.array` (and `RecordBatch.from_pylist`) asks pyarrow's pandas shim whether its input
is a pandas object, and the shim imports pandas to find out: ~56 MB more in each Python
worker, for arrays that are never pandas. The shim tries that import once and
remembers a failure, so `skip_pandas` makes that one try fail (an import hook refuses
pandas for the moment of one tiny `pa.array`). Nothing is lost: pyarrow imports
pandas for real when something needs it (`to_pandas`, a pandas UDF), and pandas objects
are still recognised from then on.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

_done = False
_lock = threading.Lock()


def skip_pandas() -> None:
    """Make pyarrow's one try at importing pandas fail, unless pandas is loaded already."""
    global _done
    if _done:
        return
    with _lock:
        if _done:
            return
        _done = True
        if "pandas" in sys.modules:  # loaded already: nothing to save
            return
        import pyarrow as pa

        sys.meta_path.insert(0, _NoPandas)
        try:
            pa.array([0], pa.int8())  # the shim's one try, answered "no pandas"
        finally:
            sys.meta_path.remove(_NoPandas)


class _NoPandas:
    """An import hook that refuses pandas (and only pandas)."""

    @staticmethod
    def find_spec(name: str, *_: Any) -> None:
        if name == "pandas":
            raise ImportError("pandas is not needed here (walstream.spark.lean)")
