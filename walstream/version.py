"""walstream's version (one place: the package, the API and the console show it)."""

__version__ = "0.1.0"
