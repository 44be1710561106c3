"""aeroqueue: a job queue on Aerospike.

O(1) reservation from job lists, heartbeat sessions that bring back the jobs
of workers that died, exactly-once acknowledgement, and a PySpark sync of
processed jobs to MySQL.
"""

from .backends import Backend, open_backend
from .config import StoreURL, parse_url, resolve_url
from .errors import AeroqueueError

__all__ = ["AeroqueueError", "Backend", "StoreURL", "open_backend", "parse_url", "resolve_url"]
__version__ = "0.1.0"
