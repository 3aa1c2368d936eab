"""Postgres administration: connections, slots, publications, setup checks, standbys and the
embedded server."""
