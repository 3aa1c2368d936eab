"""What a format module provides: its renderings of one change (see `__init__.py`)."""

from __future__ import annotations

from collections.abc import Callable

from walstream.change import ChangeRow

#: One change row as a message's text.
Formatter = Callable[[ChangeRow], str]
