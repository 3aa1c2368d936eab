"""The guarantees, sink-agnostic: delivery ledger, retries (later: parking, dead letters)."""
