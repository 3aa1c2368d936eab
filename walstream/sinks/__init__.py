"""Destinations: one module per sink behind the contract in base.py."""
