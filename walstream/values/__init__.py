"""A Postgres value as the change row's JSON: one mapping, three executors side by side.

The mapping (docs/architecture.md §2) is `codecs.py`: each type's `Codec` turns the
type's output text into the JSON value (`value`) or straight into its JSON text
(`json`); arrays, nested and with NULL elements, are `array_codec` of their element.
It is the reference; the other executors make byte for byte what it makes, faster:

- `rows.py`: a whole TupleData (pgoutput) as the `record` JSON and the key, in one
  pass: straight-line Python generated per relation, or `_tuples.pyx` compiled
  (`tests/unit/values/test_tuples.py` compares the two).
- `columns.py`: a column of a backfill chunk at a time, as Arrow kernels
  (`tests/unit/values/test_columns.py` compares them with the codecs).

Any value an executor has no fast path for goes through its codec, that value only, so
a change to the mapping is a change to `codecs.py` and to the fast path that covers
the type (the tests above fail until both agree).
"""
