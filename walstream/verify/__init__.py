"""`walstream verify`: proof that a sink holds what its source holds (docs/verify.md).

`hashing.py` hashes rows the same way on both sides, `sides.py` reads a source table and a
sink's copy of it, `run.py` compares them while the stream flows, `sinks.py` says which sinks
can be verified and builds their sides from the config, and repairs through backfills.
"""
