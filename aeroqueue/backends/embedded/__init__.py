"""The embedded Aerospike stand-in: records in SQLite, UDFs through lupa."""

from .client import Clock, EmbeddedClient, ManualClock, partition_id
from .faults import Fault, Faults

__all__ = ["Clock", "EmbeddedClient", "Fault", "Faults", "ManualClock", "partition_id"]
