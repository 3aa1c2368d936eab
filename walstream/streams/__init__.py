"""Pull subscriptions: `type: stream` sinks keep messages in the state database, and
consumers read one merged stream over HTTP with opaque progress markers (see store.py)."""
