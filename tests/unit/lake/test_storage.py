"""Where walstream writes a lake table's files itself (`lake/storage.py`): delta-rs' storage
option spellings, the directories it takes and refuses, and create-if-absent on local disk
with writers racing. On S3: tests/integration/test_lake_storage.py."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.lake import race_to_create
from walstream.errors import SinkError
from walstream.lake.delta import DeltaDestination
from walstream.lake.storage import open_store, s3_filesystem, s3_settings


def test_s3_settings_take_every_spelling_delta_rs_takes(monkeypatch) -> None:
    monkeypatch.delenv("AWS_REGION", raising=False)
    monkeypatch.delenv("AWS_DEFAULT_REGION", raising=False)
    monkeypatch.delenv("AWS_ACCESS_KEY_ID", raising=False)
    upper = s3_settings({"AWS_ACCESS_KEY_ID": "k", "AWS_SECRET_ACCESS_KEY": "s",
                         "AWS_ENDPOINT_URL": "http://h:9000", "AWS_ALLOW_HTTP": "true"})  # fmt: skip
    lower = s3_settings({"access_key_id": "k", "secret_access_key": "s", "endpoint": "http://h:9000",
                         "aws_allow_http": "true"})  # fmt: skip
    want = {"access_key": "k", "secret_key": "s", "endpoint": "http://h:9000", "allow_http": "true"}
    assert upper == lower == want
    monkeypatch.setenv("AWS_REGION", "eu-west-3")  # absent from the options: from the env
    assert s3_settings({"aws_access_key_id": "k"}) == {"access_key": "k", "region": "eu-west-3"}
    assert s3_settings({"region": "us-east-2"})["region"] == "us-east-2"  # the options first


def test_an_endpoint_url_sets_pyarrows_host_and_scheme() -> None:
    fs = s3_filesystem({"endpoint": "http://127.0.0.1:9000", "region": "us-east-1",
                        "access_key": "k", "secret_key": "s"})  # fmt: skip
    (settings,) = fs.__reduce__()[1]  # what pyarrow was given
    assert (settings["endpoint_override"], settings["scheme"]) == ("127.0.0.1:9000", "http")
    assert (settings["region"], settings["access_key"]) == ("us-east-1", "k")


def test_local_and_s3_directories_are_taken_and_others_refused(tmp_path: Path) -> None:
    local = open_store(str(tmp_path / "t"))
    assert (local.filesystem.type_name, local.root) == ("local", str(tmp_path / "t"))
    assert open_store(f"file://{tmp_path}/t/").root == str(tmp_path / "t")
    s3 = open_store("s3://bucket/lake/t", {"AWS_REGION": "us-east-1"})
    assert (s3.filesystem.type_name, s3.root, s3.path("x")) == ("s3", "bucket/lake/t",
                                                                "bucket/lake/t/x")  # fmt: skip
    with pytest.raises(SinkError) as caught:
        open_store("gs://bucket/t")
    assert "local disk and S3, not gs://bucket/t" in caught.value.problem
    assert "copy_on_write" in caught.value.fix


def test_merge_on_read_is_refused_at_load_where_walstream_cannot_write_it() -> None:
    DeltaDestination(type="delta", path="s3://b/{table}", updates="merge_on_read")  # accepted
    with pytest.raises(ValueError, match="local disk and S3"):
        DeltaDestination(type="delta", path="gs://b/{table}", updates="merge_on_read")
    DeltaDestination(type="delta", path="gs://b/{table}")  # copy-on-write: delta-rs alone


def test_of_writers_racing_to_create_one_file_exactly_one_wins(tmp_path: Path) -> None:
    store = open_store(str(tmp_path))
    race_to_create(store, "00000000000000000001.json", 8)
    assert [n for n, _ in store.names()] == ["00000000000000000001.json"]  # no temp left
