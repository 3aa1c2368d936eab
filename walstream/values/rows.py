"""A tuple's values as the `record` JSON and the key, in one pass: a function generated
per relation, or the same encoder compiled (`_tuples.pyx`).

The decoder is the throughput bottleneck of the whole pipeline (docs/architecture.md
§3), so each relation gets straight-line code: no loop, no per-column
dispatch, the common types' encoders inlined. It handles text and NULL
columns; anything else (unchanged TOAST, binary, a column-count mismatch, a json/jsonb
value that is the JSON null, which `ChangeRow.json_nulls` lists) returns None and the
generic path takes over.

Where it was built (bin/setup installs a C compiler), the tuple encoder is the compiled
`_tuples.TupleEncoder`: the same output, ~10× faster. `WALSTREAM_PURE_PYTHON=1` keeps
the Python one, and a `_tuples.pyx` newer than its build is not used (rebuild with
`bin/setup`).
"""

from __future__ import annotations

import logging
import os
import struct
from collections.abc import Callable, Sequence
from json.encoder import encode_basestring
from typing import Any

from walstream.values import codecs as t

log = logging.getLogger(__name__)

FastEncoder = Callable[[bytes, int], "tuple[str, list[str | None]] | None"]

_INLINE: dict[int, str] = {
    id(t.INT): '{v}.decode("ascii")',
    id(t.TEXT): '_ebs({v}.decode("utf-8"))',
    id(t.BOOL): '("true" if {v} == b"t" else "false")',
    id(t.NUMERIC): '"\\"" + {v}.decode("ascii") + "\\""',
    id(t.JSON): '{v}.decode("utf-8")',
}


def _value_expr(i: int, codec: t.Codec, v: str, ns: dict[str, object]) -> str:
    """Code for the JSON text of value `v` of column i: inlined for common types."""
    template = _INLINE.get(id(codec))
    if template is None:
        ns[f"_enc{i}"] = codec.json
        return f"_enc{i}({v})"
    return template.format(v=v)


def _compile(
    lines: list[str],
    names: Sequence[str],
    key_idx: Sequence[int],
    ns: dict[str, object],
    label: str,
) -> Any:
    """Append the return of (record JSON, pk) from p<i>/v<i> to `lines`; compile `encode`."""
    n = len(names)
    for i, name in enumerate(names):
        ns[f"K{i}"] = ("{" if i == 0 else ",") + encode_basestring(name) + ":"
    parts = ", ".join(f"K{i}, p{i}" for i in range(n))
    record = f'"".join(({parts}, "}}"))' if n else '"{}"'
    pk = ", ".join(f'(None if v{i} is None else v{i}.decode("utf-8"))' for i in key_idx)
    lines.append(f"    return {record}, [{pk}]")
    exec(compile("\n".join(lines), f"<walstream {label} encoder {n} columns>", "exec"), ns)
    return ns["encode"]


#: The compiled encoder's column kinds (the enum in _tuples.pyx); other codecs are called.
_KINDS: dict[int, int] = {
    id(t.INT): 0,
    id(t.JSON): 1,
    id(t.TEXT): 2,
    id(t.BOOL): 3,
    id(t.NUMERIC): 4,
    id(t.FLOAT): 5,
    id(t.TIMESTAMPTZ): 6,
}
_CODEC = 7


def beside_the_zip() -> Any:
    """The compiled module on a cluster's executor: there walstream runs from the zip the
    driver ships (`addPyFile`), and Python loads no compiled module from a zip, so the
    driver ships it as a file of its own (`addFile`), which lands beside the zip."""
    import importlib.machinery
    import importlib.util
    import sys
    import zipfile

    archive = os.path.dirname(os.path.dirname(os.path.dirname(__file__)))
    if not zipfile.is_zipfile(archive):
        return None
    for suffix in importlib.machinery.EXTENSION_SUFFIXES:
        path = os.path.join(os.path.dirname(archive), "_tuples" + suffix)
        if os.path.exists(path):
            name = "walstream.values._tuples"
            spec = importlib.util.spec_from_file_location(name, path)
            assert spec is not None and spec.loader is not None
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            sys.modules[name] = module
            return module
    log.warning(
        "walstream runs from %s without its compiled decoder beside it: decoding in Python, "
        "several times slower",
        archive,
    )
    return None


def compiled_module() -> Any:
    """The compiled `_tuples` module, or None: not built, out of date, or turned off."""
    if os.environ.get("WALSTREAM_PURE_PYTHON") == "1":
        return None
    try:
        from walstream.values import _tuples  # type: ignore[attr-defined]
    except ImportError:
        _tuples = beside_the_zip()
        if _tuples is None:
            return None
    source = os.path.join(os.path.dirname(__file__), "_tuples.pyx")
    try:
        stale = os.path.getmtime(source) > os.path.getmtime(_tuples.__file__)
    except OSError:  # an installed wheel ships no .pyx
        stale = False
    if stale:
        log.warning(
            "walstream's compiled decoder is older than its source (%s); using the slower "
            "Python one. Rebuild it with bin/setup (or pip install -e .)",
            source,
        )
        return None
    return _tuples


def compile_tuple_encoder(
    names: Sequence[str], codecs: Sequence[t.Codec], key_idx: Sequence[int]
) -> FastEncoder:
    """(record JSON, pk) from a TupleData at `pos`, or None for the generic path."""
    compiled = _COMPILED
    if compiled is not None:
        keys = [
            (("{" if i == 0 else ",") + encode_basestring(name) + ":").encode("utf-8")
            for i, name in enumerate(names)
        ]
        kinds = [_KINDS.get(id(c), _CODEC) for c in codecs]
        return compiled.TupleEncoder(keys, kinds, [c.json for c in codecs], list(key_idx))
    return python_tuple_encoder(names, codecs, key_idx)


def python_tuple_encoder(
    names: Sequence[str], codecs: Sequence[t.Codec], key_idx: Sequence[int]
) -> FastEncoder:
    """The tuple encoder in Python: straight-line code generated for the relation."""
    n = len(names)
    ns: dict[str, object] = {
        "_I16": struct.Struct("!h").unpack_from,
        "_I32": struct.Struct("!i").unpack_from,
        "_ebs": encode_basestring,
    }
    lines = [
        "def encode(buf, pos):",
        f"    if _I16(buf, pos)[0] != {n}:",
        "        return None",
        "    pos += 2",
    ]
    for i, codec in enumerate(codecs):
        v = f"v{i}"
        expr = _value_expr(i, codec, v, ns)
        lines += [
            "    k = buf[pos]",
            "    if k == 116:",
            "        e = pos + 5 + _I32(buf, pos + 1)[0]",
            f"        {v} = buf[pos + 5:e]",
            *(
                [
                    f'        if {v}.lstrip()[:1] == b"n":',
                    "            return None  # JSON null: listed",
                ]
                if codec is t.JSON
                else []
            ),
            "        pos = e",
            f"        p{i} = {expr}",
            "    elif k == 110:",
            "        pos += 1",
            f"        {v} = None",
            f'        p{i} = "null"',
            "    else:",
            "        return None",
        ]
    lines += ["    if pos > len(buf):", "        return None  # a value ran past the message's end"]
    return _compile(lines, names, key_idx, ns, "tuple")


FieldsEncoder = Callable[[Sequence["bytes | None"]], "tuple[str, list[str | None]]"]


def compile_fields_encoder(
    names: Sequence[str], codecs: Sequence[t.Codec], key_idx: Sequence[int]
) -> FieldsEncoder:
    """The same record JSON and pk as `compile_tuple_encoder`, from a row's text values
    (bytes, None for NULL) — a backfill's `COPY ... TO STDOUT` rows, so a read row is
    byte-for-byte what the stream would send for the same values."""
    n = len(names)
    ns: dict[str, object] = {"_ebs": encode_basestring}
    lines = [
        "def encode(f):",
        f"    {', '.join(f'v{i}' for i in range(n))}{',' if n == 1 else ''} = f",
    ]
    if n == 0:
        lines[1] = "    pass"
    for i, codec in enumerate(codecs):
        expr = _value_expr(i, codec, f"v{i}", ns)
        lines.append(f'    p{i} = "null" if v{i} is None else {expr}')
    return _compile(lines, names, key_idx, ns, "fields")


_COMPILED = compiled_module()
