"""A lake sink without its library installed says which extra to install."""

from __future__ import annotations

import sys

import pytest

from walstream.errors import MissingDependency
from walstream.lake import deletion_vectors
from walstream.lake.delta import DeltaDestination, DeltaSink


def test_delta_without_deltalake_names_the_delta_extra(monkeypatch, tmp_path) -> None:
    monkeypatch.setitem(sys.modules, "deltalake", None)  # `import deltalake` fails
    sink = DeltaSink(DeltaDestination(type="delta", path=str(tmp_path / "{table}")))
    with pytest.raises(MissingDependency) as caught:
        sink.test_connection()
    assert caught.value.problem == "deltalake (the Delta Lake sink) is not installed"
    assert caught.value.fix == "pip install 'walstream[delta]'"


def test_deletion_vectors_without_pyroaring_name_the_delta_extra(monkeypatch) -> None:
    monkeypatch.setitem(sys.modules, "pyroaring", None)
    with pytest.raises(MissingDependency) as caught:
        deletion_vectors.encode([1])
    assert caught.value.fix == "pip install 'walstream[delta]'"
