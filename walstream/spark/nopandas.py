"""Build Arrow arrays from Python objects in a Python worker without loading pandas.

pyarrow imports pandas the first time `pa.array` converts Python objects (its
pandas shim checks for Series, and its C++ converter looks up pandas' types), and
pandas then stays in that process: ~50 MB more in each of Spark's Python workers,
which walstream never uses. While `no_pandas()` is active an `import pandas` fails
as if pandas were not installed; pyarrow handles that (it converts plain lists
either way) and tries again when pandas is asked for by name: a user's transform
may still `import pandas` and call `to_pandas()` afterwards.

For the workers' own conversions only (single-threaded): the import system is
shared by the whole process, so a thread importing pandas at that moment would
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
