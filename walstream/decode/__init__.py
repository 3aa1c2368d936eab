"""Decode: pgoutput messages and Postgres values into change rows and typed columns
(docs/architecture.md §2, §3)."""
