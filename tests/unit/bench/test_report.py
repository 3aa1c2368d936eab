"""bench.report says whether each figure meets its target."""

from __future__ import annotations

from typing import Any

from bench.report import met, table


def fig(
    value: float | None, unit: str, target: str | None, ref: float | None = None
) -> dict[str, Any]:
    return {"bench": "b", "name": "n", "value": value, "unit": unit, "reference": "r" if ref else None,
            "reference_value": ref, "target": target}  # fmt: skip


def test_ratio_targets_compare_against_the_reference() -> None:
    assert met(fig(70, "/s", ">= 0.35x", ref=200)) is True
    assert met(fig(69, "/s", ">= 0.35x", ref=200)) is False
    assert met(fig(300, "ms", "<= 1.5x", ref=200)) is True
    assert met(fig(301, "ms", "<= 1.5x", ref=200)) is False
    assert met(fig(70, "/s", ">= 0.35x")) is None  # no reference measured: nothing to say


def test_absolute_targets_compare_the_value_in_its_unit() -> None:
    assert met(fig(499, "ms", "<= 500 ms")) is True
    assert met(fig(501, "ms", "<= 500 ms")) is False
    assert met(fig(501, "MB", "<= 500 ms")) is None  # another unit: not comparable
    assert met(fig(5, "MB", "flat")) is None
    assert met(fig(None, "ms", "<= 500 ms")) is None


def test_the_table_has_a_met_column() -> None:
    out = table([fig(301, "ms", "<= 1.5x", ref=200), fig(499, "ms", "<= 500 ms")], {})
    lines = out.splitlines()
    assert lines[0].split()[-1] == "met"
    assert lines[2].rstrip().endswith("NO") and lines[3].rstrip().endswith("yes")
