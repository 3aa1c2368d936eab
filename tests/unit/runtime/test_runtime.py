"""Small pure parts of the runtime."""

from __future__ import annotations

from walstream.runtime import database_name


def test_database_name() -> None:
    assert database_name("postgresql://u@h:5432/app") == "app"
    assert database_name("host=h dbname=shop") == "shop"
