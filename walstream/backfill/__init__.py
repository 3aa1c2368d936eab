"""Backfills (docs/architecture.md §6): a table's existing rows, read in key-range chunks by
Spark tasks between watermarks, joined to the stream where it reaches each chunk's high
watermark.

- `store`: the state tables (backfills, chunks, watermarks seen).
- `read`: one chunk, on an executor: low watermark, COPY, staged Parquet, high watermark.
- `merge`: the pipeline's side, in foreachBatch: which rows of a chunk the stream
  superseded, the rest as action `read` at the high watermark's place.
- `coordinator`: the driver thread of `walstream run` that plans and reads chunks.
"""
