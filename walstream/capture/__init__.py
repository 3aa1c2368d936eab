"""Capture: read a slot's pgoutput messages into a buffer, in WAL order, confirming only what
Spark committed (docs/architecture.md §1, §4)."""
