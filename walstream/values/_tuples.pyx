# cython: language_level=3, boundscheck=False, wraparound=False, initializedcheck=False
"""The tuple encoder of `rows.compile_tuple_encoder`, compiled.

The stream's common message is an Insert (or an Update without an old tuple) whose
columns are all text or NULL. Turning its TupleData into the record's JSON and the key
values is the decoder's work per change; in Python it costs ~6 µs for an 8-column row,
here well under 1 µs. The output is byte-for-byte the Python encoder's:
`tests/unit/values/test_tuples.py` compares the two on every codec and on edge values.

Anything unusual returns None and the Python path takes over (which also reports
malformed input): a column-count mismatch, an unchanged TOAST or binary column, a
truncated message, invalid UTF-8, a non-ASCII number.
"""

from cpython.bytes cimport PyBytes_AS_STRING, PyBytes_GET_SIZE
from cpython.mem cimport PyMem_Free, PyMem_Malloc, PyMem_Realloc
from cpython.unicode cimport PyUnicode_AsUTF8AndSize, PyUnicode_DecodeUTF8
from libc.string cimport memcpy

# How each column's text becomes JSON (`_KINDS` maps the codecs in rows.py).
cdef enum:
    ASCII = 0        # the text itself, ASCII only (integers)
    UTF8 = 1         # the text itself (json, jsonb)
    STRING = 2       # a JSON string: quoted and escaped (text and the types shown as text)
    BOOL = 3         # 't' → true, anything else → false
    QUOTED = 4       # "text", ASCII only (numeric)
    FLOAT = 5        # NaN / Infinity / -Infinity quoted, other values as they are
    TIMESTAMPTZ = 6  # 'YYYY-MM-DD HH:MM:SS[.f]+00' → "YYYY-MM-DDTHH:MM:SS[.f]Z", else the codec
    CODEC = 7        # the codec's Python `json` function

cdef const char *HEX = b"0123456789abcdef"
#: The letter of a control character's short JSON escape (\b \t \n \f \r), 0 for \u00XX.
cdef const char *SHORT_ESCAPE = b"\0\0\0\0\0\0\0\0btn\0fr\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0\0"


cdef struct Out:
    char *buf
    Py_ssize_t len
    Py_ssize_t cap
    bint heap  # buf was allocated here (it starts on the caller's stack)


cdef int grow(Out *o, Py_ssize_t extra) except -1:
    cdef Py_ssize_t cap = o.cap
    cdef char *nbuf
    if o.len + extra <= cap:
        return 0
    while cap < o.len + extra:
        cap *= 2
    if o.heap:
        nbuf = <char *>PyMem_Realloc(o.buf, cap)
    else:
        nbuf = <char *>PyMem_Malloc(cap)
        if nbuf != NULL:
            memcpy(nbuf, o.buf, o.len)
    if nbuf == NULL:
        raise MemoryError()
    o.heap = True
    o.buf = nbuf
    o.cap = cap
    return 0


cdef inline int put(Out *o, const char *s, Py_ssize_t n) except -1:
    if o.len + n > o.cap:
        grow(o, n)
    memcpy(o.buf + o.len, s, n)
    o.len += n
    return 0


cdef int put_string(Out *o, const unsigned char *s, Py_ssize_t n) except -1:
    """A JSON string as json.encoder.encode_basestring writes it: `"` and `\\` and the
    control characters escaped, everything else (UTF-8 included) as it is."""
    cdef Py_ssize_t i
    cdef unsigned char c
    cdef char short
    grow(o, n + 2)
    o.buf[o.len] = 34
    o.len += 1
    for i in range(n):
        c = s[i]
        if c >= 32 and c != 34 and c != 92:
            if o.len + 2 > o.cap:
                grow(o, 2)
            o.buf[o.len] = <char>c
            o.len += 1
            continue
        grow(o, 6)
        o.buf[o.len] = 92
        short = c if c == 34 or c == 92 else SHORT_ESCAPE[c]
        if short:
            o.buf[o.len + 1] = short
            o.len += 2
        else:
            o.buf[o.len + 1] = 117  # u
            o.buf[o.len + 2] = 48
            o.buf[o.len + 3] = 48
            o.buf[o.len + 4] = HEX[c >> 4]
            o.buf[o.len + 5] = HEX[c & 15]
            o.len += 6
    put(o, b'"', 1)
    return 0


cdef inline bint json_null(const unsigned char *v, Py_ssize_t n):
    """Whether a json/jsonb text is the JSON null (the only JSON value starting with 'n')."""
    cdef Py_ssize_t i = 0
    while i < n and (v[i] == 32 or v[i] == 9 or v[i] == 10 or v[i] == 13):
        i += 1
    return i < n and v[i] == 110


cdef inline bint is_ascii(const unsigned char *s, Py_ssize_t n):
    cdef Py_ssize_t i
    for i in range(n):
        if s[i] >= 128:
            return False
    return True


cdef inline bint equals(const unsigned char *s, Py_ssize_t n, const char *lit, Py_ssize_t m):
    cdef Py_ssize_t i
    if n != m:
        return False
    for i in range(n):
        if s[i] != <unsigned char>lit[i]:
            return False
    return True


cdef inline bint utc_timestamp(const unsigned char *s, Py_ssize_t n):
    """The codec's common case: '2024-01-02 03:04:05.678+00', ASCII."""
    return (n > 19 and s[n - 3] == 43 and s[n - 2] == 48 and s[n - 1] == 48
            and s[10] == 32 and s[4] == 45 and is_ascii(s, n))


cdef class TupleEncoder:
    """`encoder(buf, pos)` → (record JSON, [key values]) or None; see the module doc."""

    cdef Py_ssize_t ncols
    cdef bytes keys          # the column keys' JSON ('{"id":', ',"name":', ...) back to back
    cdef Py_ssize_t *key_end  # where each column's key ends in `keys`
    cdef int *kinds
    cdef list codecs         # each column's `json` function, for CODEC and TIMESTAMPTZ
    cdef Py_ssize_t *key_idx
    cdef Py_ssize_t nkeys

    def __cinit__(self, keys, kinds, codecs, key_idx):
        cdef Py_ssize_t i, pos = 0
        self.ncols = len(kinds)
        if len(keys) != self.ncols or len(codecs) != self.ncols:
            raise ValueError("keys, kinds and codecs must have one entry per column")
        self.keys = b"".join(keys)
        self.codecs = list(codecs)
        self.nkeys = len(key_idx)
        self.key_end = <Py_ssize_t *>PyMem_Malloc((self.ncols + 1) * sizeof(Py_ssize_t))
        self.kinds = <int *>PyMem_Malloc((self.ncols + 1) * sizeof(int))
        self.key_idx = <Py_ssize_t *>PyMem_Malloc((self.nkeys + 1) * sizeof(Py_ssize_t))
        if self.key_end == NULL or self.kinds == NULL or self.key_idx == NULL:
            raise MemoryError()
        for i in range(self.ncols):
            pos += len(keys[i])
            self.key_end[i] = pos
            self.kinds[i] = kinds[i]
            if not ASCII <= kinds[i] <= CODEC:
                raise ValueError(f"unknown column kind {kinds[i]}")
        for i in range(self.nkeys):
            if not 0 <= key_idx[i] < self.ncols:
                raise ValueError(f"key column {key_idx[i]} out of range")
            self.key_idx[i] = key_idx[i]

    def __dealloc__(self):
        PyMem_Free(self.key_end)
        PyMem_Free(self.kinds)
        PyMem_Free(self.key_idx)

    def __call__(self, bytes buf not None, Py_ssize_t pos):
        cdef const unsigned char *b = <const unsigned char *>PyBytes_AS_STRING(buf)
        cdef Py_ssize_t size = PyBytes_GET_SIZE(buf)
        cdef Py_ssize_t i, n, k, start, key_start
        cdef Py_ssize_t vstart[64]
        cdef Py_ssize_t vlen[64]
        cdef Py_ssize_t *starts = vstart
        cdef Py_ssize_t *lens = vlen
        cdef char first[1024]
        cdef Out o
        cdef const unsigned char *v
        cdef const char *text
        cdef Py_ssize_t tlen
        cdef int kind
        cdef object record, pk, s
        if pos < 0 or pos + 2 > size or ((b[pos] << 8) | b[pos + 1]) != self.ncols:
            return None
        pos += 2
        o.buf = first
        o.len = 0
        o.cap = 1024
        o.heap = False
        if self.ncols > 64:
            starts = <Py_ssize_t *>PyMem_Malloc(self.ncols * sizeof(Py_ssize_t))
            lens = <Py_ssize_t *>PyMem_Malloc(self.ncols * sizeof(Py_ssize_t))
            if starts == NULL or lens == NULL:
                PyMem_Free(starts)
                PyMem_Free(lens)
                raise MemoryError()
        try:
            key_start = 0
            for i in range(self.ncols):
                if pos >= size:
                    return None
                k = b[pos]
                put(&o, PyBytes_AS_STRING(self.keys) + key_start, self.key_end[i] - key_start)
                key_start = self.key_end[i]
                if k == 110:  # 'n'
                    pos += 1
                    lens[i] = -1
                    put(&o, b"null", 4)
                    continue
                if k != 116 or pos + 5 > size:  # not 't': unchanged TOAST, binary, truncated
                    return None
                n = (<Py_ssize_t>b[pos + 1] << 24) | (b[pos + 2] << 16) | (b[pos + 3] << 8) | b[pos + 4]
                start = pos + 5
                if n < 0 or n > size - start:
                    return None
                pos = start + n
                starts[i] = start
                lens[i] = n
                v = b + start
                kind = self.kinds[i]
                if kind == STRING:
                    put_string(&o, v, n)
                elif kind == ASCII:
                    if not is_ascii(v, n):
                        return None
                    put(&o, <const char *>v, n)
                elif kind == UTF8:
                    if json_null(v, n):  # the Python path lists it (`json_nulls`)
                        return None
                    put(&o, <const char *>v, n)
                elif kind == BOOL:
                    if n == 1 and v[0] == 116:
                        put(&o, b"true", 4)
                    else:
                        put(&o, b"false", 5)
                elif kind == QUOTED:
                    if not is_ascii(v, n):
                        return None
                    put(&o, b'"', 1)
                    put(&o, <const char *>v, n)
                    put(&o, b'"', 1)
                elif kind == FLOAT:
                    if not is_ascii(v, n):
                        return None
                    if equals(v, n, b"NaN", 3) or equals(v, n, b"Infinity", 8) or equals(v, n, b"-Infinity", 9):
                        put(&o, b'"', 1)
                        put(&o, <const char *>v, n)
                        put(&o, b'"', 1)
                    else:
                        put(&o, <const char *>v, n)
                elif kind == TIMESTAMPTZ and utc_timestamp(v, n):
                    put(&o, b'"', 1)
                    put(&o, <const char *>v, 10)
                    put(&o, b"T", 1)
                    put(&o, <const char *>v + 11, n - 14)
                    put(&o, b'Z"', 2)
                else:  # CODEC, or a timestamptz the codec itself handles
                    s = self.codecs[i](buf[start:pos])
                    text = PyUnicode_AsUTF8AndSize(s, &tlen)
                    put(&o, text, tlen)
            if self.ncols:
                put(&o, b"}", 1)
            else:
                put(&o, b"{}", 2)
            try:
                record = PyUnicode_DecodeUTF8(o.buf, o.len, NULL)
                pk = []
                for i in range(self.nkeys):
                    k = self.key_idx[i]
                    if lens[k] < 0:
                        pk.append(None)
                    else:
                        pk.append(PyUnicode_DecodeUTF8(<const char *>b + starts[k], lens[k], NULL))
            except UnicodeDecodeError:
                return None
            return record, pk
        finally:
            if o.heap:
                PyMem_Free(o.buf)
            if starts != vstart:
                PyMem_Free(starts)
                PyMem_Free(lens)
