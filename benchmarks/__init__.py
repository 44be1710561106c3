"""Benchmarks that compare aeroqueue with the job queues users would otherwise pick.

`python -m benchmarks.peers` runs one workload on aeroqueue and on every peer
available on the machine (beanstalkd, MariaDB/MySQL, PostgreSQL, Redis) and
prints one table. This package lives beside `aeroqueue`, not inside it: it
needs client libraries for the peers that aeroqueue itself never imports.
"""
