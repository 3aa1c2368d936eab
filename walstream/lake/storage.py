"""A lake table's directory as walstream reads and writes it itself (the Delta log, the data
and deletion-vector files of merge-on-read, staged files adopted into a table): a local
directory or an S3 bucket, opened with the destination's `storage_options` in delta-rs' own
keys, so one setting serves delta-rs and walstream alike.

The Delta log takes one write no plain filesystem API offers: create a version's file only
if absent. On local disk that is a hard link (it fails when the name exists); on S3 it is a
PUT with `If-None-Match: *` (AWS S3 and most S3-compatible stores support it; obstore sends
it, as delta-rs' own object store does).
"""

from __future__ import annotations

import importlib
import os
import uuid
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import urlsplit

from walstream.errors import SinkError, optional_import

#: delta-rs (object_store) spellings of each S3 setting, lower-cased.
S3_KEYS = {
    "access_key": ("aws_access_key_id", "access_key_id"),
    "secret_key": ("aws_secret_access_key", "secret_access_key"),
    "session_token": ("aws_session_token", "aws_token", "session_token", "token"),
    "region": ("aws_region", "aws_default_region", "region"),
    "endpoint": ("aws_endpoint_url", "aws_endpoint", "endpoint_url", "endpoint"),
    "allow_http": ("aws_allow_http", "allow_http"),
    "virtual_hosted": ("aws_virtual_hosted_style_request", "virtual_hosted_style_request"),
}


#: (endpoint, bucket) of the S3 stores seen to refuse a second create of one name.
_CONDITIONAL: set[tuple[str, str]] = set()


def s3_settings(options: Mapping[str, str]) -> dict[str, str]:
    """The S3 settings among delta-rs storage options (any spelling delta-rs takes), by
    their names in `S3_KEYS`; the absent ones come from the environment, as in delta-rs."""
    lowered = {k.lower(): v for k, v in options.items()}
    env = {k.lower(): v for k, v in os.environ.items() if k.startswith("AWS_")}
    out: dict[str, str] = {}
    for name, spellings in S3_KEYS.items():
        for source in (lowered, env):
            value = next((source[s] for s in spellings if s in source), None)
            if value is not None:
                out[name] = value
                break
    return out


def _true(value: str | None) -> bool:
    return (value or "").strip().lower() in ("1", "true", "yes", "on")


@dataclass
class Store:
    """A table's directory: `filesystem` (pyarrow) and `root` (the directory as it names
    it), and how to create a file only if absent there."""

    location: str
    filesystem: Any
    root: str
    s3: dict[str, str] | None = None
    _objects: Any = field(default=None, repr=False)

    def path(self, name: str) -> str:
        """A file of the table, `name` relative to its directory, as `filesystem` opens it."""
        return f"{self.root}/{name}"

    def read(self, name: str) -> bytes:
        with self.filesystem.open_input_stream(self.path(name)) as f:
            return bytes(f.read())

    def write(self, name: str, data: bytes) -> None:
        with self.filesystem.open_output_stream(self.path(name)) as f:
            f.write(data)

    def names(self, folder: str = "") -> list[tuple[str, float]]:
        """The files right inside a folder of the table: (name, modified as a Unix time;
        infinity when the store does not say, so nothing takes such a file for old)."""
        from pyarrow import fs as pafs

        where = self.path(folder) if folder else self.root
        found = self.filesystem.get_file_info(pafs.FileSelector(where, allow_not_found=True))
        return [
            (f.base_name, f.mtime.timestamp() if f.mtime is not None else float("inf"))
            for f in found
            if f.type == pafs.FileType.File
        ]

    def exists(self, name: str) -> bool:
        from pyarrow import fs as pafs

        return bool(self.filesystem.get_file_info(self.path(name)).type != pafs.FileType.NotFound)

    def size(self, name: str) -> int:
        return int(self.filesystem.get_file_info(self.path(name)).size)

    def delete(self, name: str) -> None:
        self.filesystem.delete_file(self.path(name))

    def create(self, name: str, data: bytes) -> bool:
        """Write `name` whole only if no file has the name: False when one has."""
        if self.s3 is None:
            return _link_new(self.path(name), data)
        obstore = _obstore()
        self._check_conditional(obstore)
        try:
            obstore.put(self._bucket(), self._key(name), data, mode="create")
        except obstore.exceptions.AlreadyExistsError:
            return False
        return True

    def _key(self, name: str) -> str:
        return self.path(name).split("/", 1)[1]

    def _check_conditional(self, obstore: Any) -> None:
        """Once per store: a probe created twice must fail the second time. A store that
        ignores `If-None-Match` would let two writers take one version, each deleting rows
        the other's version no longer names: walstream refuses to commit there."""
        s3 = self.s3 or {}
        where = (s3.get("endpoint") or "aws", self.root.split("/", 1)[0])
        if where in _CONDITIONAL:
            return
        probe = self._key(f".walstream-probe-{uuid.uuid4().hex}")
        obstore.put(self._bucket(), probe, b"", mode="create")
        try:
            obstore.put(self._bucket(), probe, b"", mode="create")
        except obstore.exceptions.AlreadyExistsError:
            _CONDITIONAL.add(where)
            return
        finally:
            obstore.delete(self._bucket(), probe)
        raise SinkError(
            f"Delta: the S3 store {where[0]} (bucket {where[1]}) wrote over an existing file "
            "despite `If-None-Match: *`: merge-on-read commits there could overwrite each "
            "other",
            "use a store with conditional writes (AWS S3, MinIO, Cloudflare R2, ...), or "
            "`updates: copy_on_write`, which delta-rs commits (with a DynamoDB lock: "
            "AWS_S3_LOCKING_PROVIDER in storage_options)",
            retryable=False,
        )

    def _bucket(self) -> Any:
        if self._objects is None:
            S3Store = _obstore().store.S3Store
            s3 = self.s3 or {}
            endpoint = s3.get("endpoint")
            kwargs: dict[str, Any] = {
                "access_key_id": s3.get("access_key"),
                "secret_access_key": s3.get("secret_key"),
                "session_token": s3.get("session_token"),
                "region": s3.get("region"),
                "endpoint": endpoint,
                "virtual_hosted_style_request": _true(s3.get("virtual_hosted")) or None,
            }
            http = _true(s3.get("allow_http")) or (endpoint or "").startswith("http://")
            self._objects = S3Store(
                self.root.split("/", 1)[0],
                **{k: v for k, v in kwargs.items() if v is not None},
                client_options={"allow_http": True} if http else None,
            )
        return self._objects


def _obstore() -> Any:
    obstore = optional_import("obstore", "obstore (Delta commits on S3)", "delta")
    importlib.import_module("obstore.store")
    importlib.import_module("obstore.exceptions")
    return obstore


def _link_new(target: str, data: bytes) -> bool:
    """Write a temporary file whole, then link it to `target`: a link fails when the name
    exists, so two writers never both create it."""
    temp = f"{os.path.dirname(target)}/.{os.path.basename(target)}.{uuid.uuid4().hex}.tmp"
    with open(temp, "wb") as f:
        f.write(data)
        f.flush()
        os.fsync(f.fileno())
    try:
        os.link(temp, target)
    except FileExistsError:
        return False
    finally:
        os.unlink(temp)
    return True


def s3_filesystem(s3: Mapping[str, str]) -> Any:
    """pyarrow's S3 filesystem with these settings (see `s3_settings`)."""
    from pyarrow import fs as pafs

    kwargs: dict[str, Any] = {
        "access_key": s3.get("access_key"),
        "secret_key": s3.get("secret_key"),
        "session_token": s3.get("session_token"),
        "region": s3.get("region"),
    }
    endpoint = s3.get("endpoint")
    if endpoint:
        parts = urlsplit(endpoint if "://" in endpoint else f"https://{endpoint}")
        kwargs["endpoint_override"] = parts.netloc
        kwargs["scheme"] = parts.scheme
    if _true(s3.get("virtual_hosted")):
        kwargs["force_virtual_addressing"] = True
    return pafs.S3FileSystem(**{k: v for k, v in kwargs.items() if v is not None})


def open_store(location: str, options: Mapping[str, str] | None = None) -> Store:
    """The directory at `location` (a local path, `file://`, `s3://` or `s3a://`), with
    delta-rs storage `options` (credentials, region, endpoint) for S3."""
    from pyarrow import fs as pafs

    location = location.rstrip("/")
    scheme = urlsplit(location).scheme if "://" in location else ""
    if scheme in ("", "file"):
        path = location.removeprefix("file://")
        return Store(location, pafs.LocalFileSystem(), os.path.abspath(path))
    if scheme in ("s3", "s3a"):
        s3 = s3_settings(options or {})
        parts = urlsplit(location)
        return Store(location, s3_filesystem(s3), f"{parts.netloc}{parts.path}", s3)
    raise SinkError(
        f"lake: walstream writes its own files to local disk and S3, not {location}",
        "use a local path or s3:// (S3-compatible stores included), or `updates: "
        "copy_on_write`, which delta-rs writes alone",
        retryable=False,
    )


def file_at(io: Any, uri: str) -> tuple[Any, str]:
    """An Iceberg table's file `uri` as (pyarrow filesystem, path), opened through the
    table's own FileIO (so with the catalog's `s3.*` properties)."""
    from pyarrow import fs as pafs
    from pyiceberg.io.pyarrow import PyArrowFileIO

    scheme, netloc, path = PyArrowFileIO.parse_location(uri)
    by_scheme = getattr(io, "fs_by_scheme", None)
    if by_scheme is None:  # not pyarrow's FileIO: the URI alone (credentials from the env)
        filesystem, path = pafs.FileSystem.from_uri(uri)
        return filesystem, path
    return by_scheme(scheme, netloc), path
