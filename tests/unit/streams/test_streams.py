"""Progress markers and catch-up coalescing of pull streams (pure functions)."""

from __future__ import annotations

import json
from dataclasses import dataclass

import pytest

from walstream.streams import markers
from walstream.streams.coalesce import Coalesced, coalesce, net, rewrite
from walstream.streams.markers import START, BadMarker


def test_a_marker_round_trips_and_is_url_safe():
    at = {"orders-db": (2**40 + 7, 3), "users": (12, 0)}
    m = markers.encode("all", at)
    assert set(m) <= set("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789-_")
    assert markers.decode("all", m) == at
    # A source at the start is left out: it reads from its first kept message.
    assert markers.decode("all", markers.encode("all", {"a": START, "b": (1, 1)})) == {"b": (1, 1)}


@pytest.mark.parametrize(
    ("marker", "problem"),
    [
        ("not a marker!", "not a progress marker"),
        ("eyJ2IjoyfQ", "unknown layout"),  # {"v":2}
        (markers.encode("other", {"a": (1, 1)}), "of stream 'other', not of 'all'"),
        ("eyJ2IjoxLCJzIjoiYWxsIiwicCI6eyJhIjpbMV19fQ", "malformed"),  # "a": [1]
        ("eyJ2IjoxLCJzIjoiYWxsIiwicCI6eyJhIjpbLTEsMF19fQ", "malformed"),  # "a": [-1, 0]
        ("eyJ2IjoxLCJzIjoiYWxsIiwicCI6eyJhIjpbdHJ1ZSwwXX19", "malformed"),  # "a": [true, 0]
    ],
)
def test_a_bad_marker_says_what_is_wrong(marker, problem):
    with pytest.raises(BadMarker, match=problem.replace("(", r"\(")):
        markers.decode("all", marker)


def test_furthest_takes_each_sources_later_position():
    assert markers.furthest({"a": (5, 1), "b": (2, 0)}, {"a": (5, 0), "c": (1, 1)}) == {
        "a": (5, 1), "b": (2, 0), "c": (1, 1),
    }  # fmt: skip


@dataclass(frozen=True)
class C:
    action: str
    key: str | None = "1"
    table: str = "public.t"
    source: str = "a"


@pytest.mark.parametrize(
    ("first", "last", "expected"),
    [
        ("insert", "update", "insert"),
        ("insert", "delete", None),
        ("read", "update", "read"),
        ("update", "delete", "delete"),
        ("update", "update", "update"),
        ("delete", "insert", "update"),
        ("delete", "delete", "delete"),
    ],
)
def test_net_actions(first, last, expected):
    assert net(first, last) == expected


def test_coalesce_collapses_per_row_in_order_of_each_rows_last_change():
    window = [
        C("insert", "1"),  # 0   1: insert, update, update -> insert at 3
        C("update", "1"),  # 1
        C("insert", "2"),  # 2   2: insert, delete -> nothing
        C("update", "1"),  # 3
        C("update", "3"),  # 4   3: update, delete -> delete at 6
        C("delete", "2"),  # 5
        C("delete", "3"),  # 6
        C("update", "1", source="b"),  # 7   another source's row 1: its own entry
        C("insert", None),  # 8   no key: as it is
    ]
    assert coalesce(window) == [
        Coalesced(3, "insert", 3),
        Coalesced(6, "delete", 2),
        Coalesced(7, "update", 1),
        Coalesced(8, "insert", 1),
    ]


def test_a_truncate_wipes_its_tables_earlier_entries_and_keeps_its_place():
    window = [
        C("insert", "1"),
        C("insert", "1", table="public.other"),
        C("update", "2"),
        C("truncate", None),  # 3: wipes public.t's 1 and 2 of source a
        C("insert", "1"),  # 4: after the truncate, a new entry
    ]
    assert coalesce(window) == [
        Coalesced(1, "insert", 1),
        Coalesced(3, "truncate", 3),
        Coalesced(4, "insert", 1),
    ]


def test_rewrite_puts_the_net_action_in_sequin_messages():
    sequin = json.dumps({"record": {"id": 1, "v": 2}, "changes": {"v": 1}, "action": "update"})
    out = json.loads(rewrite(sequin, "sequin", "insert", "update"))
    assert out == {"record": {"id": 1, "v": 2}, "changes": None, "action": "insert"}
    assert rewrite('{"id":1}', "record", "insert", "update") == '{"id":1}'
    assert rewrite(sequin, "sequin", "update", "update") == sequin
