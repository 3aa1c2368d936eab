"""`walstream run`: Plan -> SparkSession -> one supervised streaming query per source.

`supervisor.py` is the Runtime (start, supervise, stop, the status it publishes),
`query.py` one source's query, `retention.py` the retention tasks, `checks.py` the
destinations' connection checks.
"""

from walstream.runtime.checks import check_destinations
from walstream.runtime.query import SourceQuery, database_name
from walstream.runtime.supervisor import Runtime

__all__ = ["Runtime", "SourceQuery", "check_destinations", "database_name"]
