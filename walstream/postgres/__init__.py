"""Everything that speaks to Postgres: replication, pgoutput decoding, types, setup checks."""
