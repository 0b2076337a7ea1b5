"""redis-py: one ``Redis`` per process, one ``redis.asyncio`` per loop."""

from __future__ import annotations

import os

import redis
import redis.asyncio

from poolkeeper import keys, process_singleton, release_sockets


# redis-py reads no environment variable; REDIS_URL is the application's.
# from_url() gives the client its own pool, which close() disconnects.
# redis-py's close() shuts its sockets down, so the server sees the close
# even while a forked child holds copies; release_sockets also frees the
# child's descriptors (redis-py drops them only if the child uses the pool).
@process_singleton(key=keys.env("REDIS_URL"), after_fork=release_sockets)
def cache() -> redis.Redis:
    """Connect to REDIS_URL, with a connection pool of its own."""
    return redis.Redis.from_url(os.environ["REDIS_URL"])


# Closed with aclose() on its own event loop.
@process_singleton(key=keys.env("REDIS_URL"), after_fork=release_sockets)
async def async_cache() -> redis.asyncio.Redis:
    """Connect to REDIS_URL from the running event loop."""
    return redis.asyncio.Redis.from_url(os.environ["REDIS_URL"])
