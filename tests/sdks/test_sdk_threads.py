"""128 threads share each recipe's client: no error, no churn.

Each thread makes CALLS requests through the recipe's singleton. The
server names the connection that carried each request (its client port),
so the distinct ports are the connections the client opened. A pool sized
for the threads opens at most one per thread and keeps them: never more
than its size, whatever the number of requests. A pool too small for the
threads shows up as errors (redis-py's MaxConnectionsError), as urllib3's
"Connection pool is full, discarding connection" warnings (requests,
urllib3, boto3), or as connections opened beyond the pool's size (httpx
closing what it may not keep alive).
"""

from __future__ import annotations

import logging
import uuid

import pytest
import sdk_net
from sdk_drivers import Requests
from sdk_outcomes import record

from poolkeeper import keys, process_singleton

#: The issue's job: 128 threads on one client.
THREADS = 128
#: Requests per thread: 1,024 in all, eight times the pool's size, so a
#: pool that churns opens many more connections than it holds.
CALLS = 8
JOIN = 120.0
#: requests' default pool: connections kept per host.
POOL = 10


class _PoolWarnings(logging.Handler):
    """What urllib3's connection pools log at WARNING (a full pool)."""

    def __init__(self):
        super().__init__(logging.WARNING)
        self.messages = []

    def emit(self, record):
        self.messages.append(record.getMessage())


@pytest.fixture(name="pool_warnings")
def _pool_warnings():
    handler = _PoolWarnings()
    logger = logging.getLogger("urllib3.connectionpool")
    logger.addHandler(handler)
    try:
        yield handler.messages
    finally:
        logger.removeHandler(handler)


def _share(sdk, single, use=None):
    """THREADS threads make CALLS requests each; return (ports, errors)."""
    ports = []
    use = sdk.use if use is None else use

    def calls():
        ports.extend(use(single()) for _ in range(CALLS))

    return ports, sdk_net.together(THREADS, calls, JOIN)


def _record(name, sdk, ports, errors, **row):
    """Record a shared client's row of the threads page's table."""
    record(
        name,
        object=sdk.shared,
        scope="process",
        threads=THREADS,
        errors=len(errors),
        connections=len(set(ports)),
        requests=len(ports),
        **row,
    )


class TestSharedByThreads:
    def test_one_client_serves_128_threads_within_its_pool(
        self, sdk, pool_warnings
    ):
        """128 threads: no error or warning, connections within the pool."""
        assert THREADS <= sdk.pool_size or 1 == sdk.pool_size
        ports, errors = _share(sdk, sdk.singleton)
        builds = sdk.singleton.statistics().builds
        _record(
            f"{sdk!r}",
            sdk,
            ports,
            errors,
            pool=sdk.pool_size,
            warnings=len(pool_warnings),
            setting=sdk.setting,
            builds=builds,
        )
        assert [] == errors
        assert [] == pool_warnings
        assert 1 == builds
        assert THREADS * CALLS == len(ports)
        assert len(set(ports)) <= sdk.pool_size

    def test_a_pool_too_small_churns_and_warns(
        self, recipe, http_server, monkeypatch, pool_warnings
    ):
        """requests' default pool (10): warnings, connections beyond it.

        The harness sees what the recipes avoid.
        """
        sdk = Requests(recipe("sdk_requests"), http_server, monkeypatch)
        plain = process_singleton(key=keys.env(*sdk.key_names))(
            lambda: __import__("requests").Session()
        )
        # The first POOL + 1 requests are held at the server until all of
        # them arrived: that many connections are open at once, one more
        # than the pool keeps, however the threads are scheduled.
        gate = f"{http_server.url}/gather?n={POOL + 1}&id={uuid.uuid4().hex}"

        def use(client):
            response = client.get(gate, timeout=30)
            response.raise_for_status()
            return int(response.headers["x-conn-id"])

        try:
            ports, errors = _share(sdk, plain, use)
            builds = plain.statistics().builds
        finally:
            plain.reset()
        _record(
            "Requests default pool",
            sdk,
            ports,
            errors,
            pool=POOL,
            warnings=len(pool_warnings),
            setting="none: `Session()`'s default (10 per host)",
            builds=builds,
        )
        assert [] == errors
        assert pool_warnings
        assert all("Connection pool is full" in m for m in pool_warnings)
        assert len(set(ports)) > POOL
