"""redis-py: one ``Redis`` per process, one ``redis.asyncio`` per loop."""

from __future__ import annotations

import os

import redis
import redis.asyncio

from poolkeeper import keys, process_singleton, release_sockets

# How many threads of this process use the client at once; the pool is
# sized for them (docs/sdk-recipes.md, "Sizing the pool for the threads").
THREADS = int(os.environ.get("APP_THREADS", "128"))


# redis-py reads no environment variable; REDIS_URL is the application's.
# from_pool() gives the client the pool to own: close() disconnects it.
# redis-py's close() shuts its sockets down, so the server sees the close
# even while a forked child holds copies; release_sockets also frees the
# child's descriptors (redis-py drops them only if the child uses the pool).
@process_singleton(key=keys.env("REDIS_URL"), after_fork=release_sockets)
def cache() -> redis.Redis:
    """Connect to REDIS_URL, with a connection pool of its own."""
    # A ConnectionPool at its max_connections (100 by default in redis-py
    # 8) raises MaxConnectionsError. A blocking pool of one connection per
    # thread never does: a thread beyond THREADS waits (up to 10 s) for a
    # free connection.
    pool = redis.BlockingConnectionPool.from_url(
        os.environ["REDIS_URL"], max_connections=THREADS, timeout=10
    )
    return redis.Redis.from_pool(pool)


# Closed with aclose() on its own event loop.
@process_singleton(key=keys.env("REDIS_URL"), after_fork=release_sockets)
async def async_cache() -> redis.asyncio.Redis:
    """Connect to REDIS_URL from the running event loop."""
    return redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
