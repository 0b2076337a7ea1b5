"""urllib3: one ``PoolManager`` per process; it has no ``close()``."""

from __future__ import annotations

import functools
import os

import urllib3

from poolkeeper import keys, process_singleton, release_sockets

# How many threads of this process use the client at once; the pool is
# sized for them (docs/sdk-recipes.md, "Sizing the pool for the threads").
THREADS = int(os.environ.get("APP_THREADS", "128"))


@process_singleton(
    key=keys.env("UPSTREAM_CA_BUNDLE"),
    close=urllib3.PoolManager.clear,  # closes every pooled connection
    after_fork=release_sockets,
)
def http() -> urllib3.PoolManager:
    """Build the pool manager."""
    # maxsize is per host (the default keeps 1 connection): one for each
    # thread. block=False, the default: a thread beyond THREADS still gets
    # a connection, thrown away after its request with a "pool is full"
    # warning, the sign that THREADS is too small.
    return urllib3.PoolManager(
        maxsize=THREADS, ca_certs=os.environ.get("UPSTREAM_CA_BUNDLE")
    )


# With functools.partial, say how to close it just the same: without
# close=, poolkeeper finds no close() and a retired pool stays connected.
pooled = process_singleton(
    close=urllib3.PoolManager.clear, after_fork=release_sockets
)(functools.partial(urllib3.PoolManager, maxsize=THREADS))
