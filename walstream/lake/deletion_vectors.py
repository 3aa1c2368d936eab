"""Delta deletion vectors: rows of a data file marked deleted without rewriting the file
(Delta's PROTOCOL.md, "Deletion Vectors" and "Deletion Vector Format").

A deletion vector is a set of row positions, a 64-bit Roaring bitmap in the portable
format behind a magic number; a DV file holds one or more of them, each with its size and
CRC-32. An `add` action names its data file's vector by a `Descriptor`. delta-rs reads
tables with vectors but writes none, so walstream writes them here, on the published
format; the tests read the result with DuckDB's delta extension and delta-rs.
"""

from __future__ import annotations

import struct
import uuid
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

#: Little-endian, before the bitmap: the portable 64-bit Roaring format.
MAGIC = 1681511377
#: The first byte of a DV file: its format version.
FILE_VERSION = 1
_Z85 = "0123456789abcdefghijklmnopqrstuvwxyzABCDEFGHIJKLMNOPQRSTUVWXYZ.-:+=^!/*?&<>()[]{}@%$#"
_Z85_INDEX = {c: i for i, c in enumerate(_Z85)}


def z85(data: bytes) -> str:
    """Z85 (ZeroMQ's Base85, JSON-safe) of `data`, whose length is a multiple of 4."""
    if len(data) % 4:
        raise ValueError(f"Z85 encodes 4-byte groups; got {len(data)} bytes")
    out = []
    for (word,) in struct.iter_unpack(">I", data):
        chars = []
        for _ in range(5):
            word, digit = divmod(word, 85)
            chars.append(_Z85[digit])
        out.append("".join(reversed(chars)))
    return "".join(out)


def unz85(text: str) -> bytes:
    if len(text) % 5:
        raise ValueError(f"Z85 text comes in 5-character groups; got {len(text)} characters")
    out = bytearray()
    for i in range(0, len(text), 5):
        word = 0
        for c in text[i : i + 5]:
            word = word * 85 + _Z85_INDEX[c]
        out += struct.pack(">I", word)
    return bytes(out)


def _roaring() -> Any:
    from walstream.errors import optional_import

    return optional_import("pyroaring", "pyroaring (Delta deletion vectors)", "delta")


def positions(rows: Iterable[int] = ()) -> Any:
    """A set of row positions (a pyroaring BitMap64), as `decode` gives them."""
    return _roaring().BitMap64(rows)


def encode(rows: Iterable[int]) -> bytes:
    """A deletion vector's bytes: the magic number, then the positions as a portable
    64-bit Roaring bitmap."""
    return struct.pack("<I", MAGIC) + positions(rows).serialize()


def decode(data: bytes) -> Any:
    """The positions (a pyroaring BitMap64) of a deletion vector's bytes."""
    (magic,) = struct.unpack_from("<I", data)
    if magic != MAGIC:
        raise ValueError(f"not a portable deletion vector (magic {magic}, expected {MAGIC})")
    return _roaring().BitMap64.deserialize(data[4:])


@dataclass(frozen=True)
class Descriptor:
    """Where a data file's deletion vector is and how many rows it deletes: the
    `deletionVector` of an `add` or `remove` action (storage type `u`: a file beside the
    data, named by a UUID)."""

    file_id: uuid.UUID
    offset: int
    size: int
    cardinality: int

    def action(self) -> dict[str, Any]:
        return {
            "storageType": "u",
            "pathOrInlineDv": z85(self.file_id.bytes),
            "offset": self.offset,
            "sizeInBytes": self.size,
            "cardinality": self.cardinality,
        }

    @property
    def file_name(self) -> str:
        return f"deletion_vector_{self.file_id}.bin"

    @classmethod
    def of_action(cls, action: dict[str, Any]) -> Descriptor:
        """The descriptor of a `deletionVector` walstream wrote (relative, no prefix)."""
        if action.get("storageType") != "u" or len(action["pathOrInlineDv"]) != 20:
            raise ValueError(f"a deletion vector walstream did not write: {action}")
        return cls(
            uuid.UUID(bytes=unz85(action["pathOrInlineDv"])),
            int(action.get("offset") or 0),
            int(action["sizeInBytes"]),
            int(action["cardinality"]),
        )


def file_bytes(vectors: Sequence[bytes]) -> tuple[bytes, list[tuple[int, int]]]:
    """A DV file holding `vectors` (each `encode`d), and each one's (offset, size)."""
    out = bytearray([FILE_VERSION])
    places = []
    for data in vectors:
        places.append((len(out), len(data)))  # the offset is where the vector's size is
        out += struct.pack(">I", len(data))
        out += data
        out += struct.pack(">I", zlib.crc32(data))
    return bytes(out), places


def write(filesystem: Any, root: str, positions: Sequence[Iterable[int]]) -> list[Descriptor]:
    """One DV file in the table directory `root` (a path of the pyarrow `filesystem`) with a
    vector for each set of positions; their descriptors, in order."""
    vectors = [encode(p) for p in positions]
    data, places = file_bytes(vectors)
    file_id = uuid.uuid4()
    with filesystem.open_output_stream(f"{root.rstrip('/')}/deletion_vector_{file_id}.bin") as f:
        f.write(data)
    cardinalities = [len(decode(v)) for v in vectors]
    return [
        Descriptor(file_id, offset, size, n)
        for (offset, size), n in zip(places, cardinalities, strict=True)
    ]


def read(filesystem: Any, root: str, descriptor: Descriptor) -> Any:
    """The positions a descriptor names, checked against the vector's CRC-32."""
    with filesystem.open_input_file(f"{root.rstrip('/')}/{descriptor.file_name}") as f:
        f.seek(descriptor.offset)
        head = f.read(4)
        (size,) = struct.unpack(">I", head)
        data = f.read(size)
        (crc,) = struct.unpack(">I", f.read(4))
    if size != descriptor.size or zlib.crc32(data) != crc:
        raise ValueError(f"deletion vector {descriptor.file_name}@{descriptor.offset} is damaged")
    return decode(data)
