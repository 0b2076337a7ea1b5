"""Healing (issue 21) with real SDK clients against real servers.

docs/healing.md's recipes, as written there: redis-py with
``check=lambda r: r.ping()`` against a redis-server of the test's own,
killed, paused and started again on the same port; an aiohttp
``ClientSession`` with ``check=lambda s: not s.closed`` against the
suite's gunicorn server. Every wait is bounded; timing bounds leave room
for a busy machine but fail a missing timer.
"""

from __future__ import annotations

import asyncio
import gc
import time

import aiohttp
import pytest
import redis
from redis.backoff import NoBackoff
from redis.retry import Retry
from sdk_net import wait_until

from poolkeeper import _lifecycle, process_singleton

#: Slack for a busy machine (2 cores shared with other agents).
SLACK = 1.0
#: check_every in these tests, seconds.
EVERY = 0.3
#: The redis clients' socket timeouts, seconds.
TIMEOUT = 0.5


class Closes:
    """A close hook that records each client it closes (and its loop)."""

    def __init__(self) -> None:
        self.closed: list[object] = []
        self.loops: list[object] = []

    def __call__(self, client) -> None:
        self.closed.append(client)
        client.close()

    async def aclose(self, client) -> None:
        self.closed.append(client)
        self.loops.append(asyncio.get_running_loop())
        await client.close()


def healing_builds_bound(seconds: float) -> int:
    """The most healing builds in *seconds* (see test_healing_servers)."""
    first, cap = _lifecycle.BACKOFF_FIRST, _lifecycle.BACKOFF_CAP
    builds, at, spacing = 1, 0.0, first
    while at + spacing <= seconds:
        at += spacing
        builds += 1
        spacing = min(2 * spacing, cap)
    return builds


def _cache(port: int, closes: Closes):
    @process_singleton(
        retire_on=redis.ConnectionError,
        check=lambda r: r.ping(),
        check_every=EVERY,
        close=closes,
    )
    def cache() -> redis.Redis:
        return redis.Redis(
            host="127.0.0.1",
            port=port,
            socket_timeout=TIMEOUT,
            socket_connect_timeout=TIMEOUT,
            retry=Retry(NoBackoff(), 1),
        )

    return cache


def _works(client) -> bool:
    try:
        client.set("healing", "yes")
        return b"yes" == client.get("healing")
    except redis.RedisError:
        return False


class TestRedis:
    """check=lambda r: r.ping() on redis-py."""

    def test_a_killed_server_retires_and_a_new_client_works(self, own_redis):
        """Ping fails: retired, rebuilt (damped); works once it is back."""
        closes = Closes()
        cache = _cache(own_redis.port, closes)
        first = cache()
        assert _works(first)

        own_redis.kill()
        killed = time.monotonic()
        # The first call that finds the probe due pings, fails, retires.
        assert wait_until(lambda: cache() is not first, EVERY + SLACK)
        replaced = time.monotonic() - killed
        assert wait_until(lambda: first in closes.closed, SLACK)
        # The outage goes on: calls keep coming, rebuilds are damped.
        while time.monotonic() - killed < 2.0:
            cache()
            time.sleep(0.02)
        window = time.monotonic() - killed
        builds_in_outage = cache.statistics().builds - 1

        own_redis.start()
        back = time.monotonic()
        assert wait_until(lambda: _works(cache()), 2 * EVERY + SLACK)
        recovered = time.monotonic() - back

        stats = cache.statistics()
        print(
            f"\nreplaced {replaced:.2f}s after the kill; {builds_in_outage}"
            f" builds in {window:.2f}s (bound"
            f" {healing_builds_bound(window)}); works {recovered:.2f}s"
            f" after the server returned; probes {stats.probes},"
            f" failed {stats.probe_failures}"
        )
        assert replaced <= EVERY + 2 * TIMEOUT + SLACK
        assert 1 <= builds_in_outage <= healing_builds_bound(window)
        assert stats.retirements["check"] >= 1
        assert stats.probe_failures >= 1
        assert cache() is not first
        assert 1 == closes.closed.count(first)

    def test_a_hung_server_times_the_probe_out(self, own_redis):
        """SIGSTOP: ping times out, retired; SIGCONT: the new one works."""
        closes = Closes()
        cache = _cache(own_redis.port, closes)
        first = cache()
        assert _works(first)

        own_redis.pause()
        try:
            paused = time.monotonic()
            assert wait_until(
                lambda: cache() is not first, EVERY + 4 * TIMEOUT + SLACK
            )
            replaced = time.monotonic() - paused
        finally:
            own_redis.resume()
        assert wait_until(lambda: _works(cache()), 2 * EVERY + SLACK)
        print(f"\nreplaced {replaced:.2f}s after the pause")
        assert 1 <= cache.statistics().retirements["check"]
        assert 1 == closes.closed.count(first)

    def test_a_dropped_connection_is_no_failure(self, own_redis):
        """redis-py reconnects by itself: the probes pass, nothing retired."""
        closes = Closes()
        cache = _cache(own_redis.port, closes)
        first = cache()
        assert _works(first)
        first.connection_pool.disconnect()
        probes = cache.statistics().probes
        assert wait_until(
            lambda: cache() and cache.statistics().probes >= probes + 2,
            3 * EVERY + SLACK,
        )
        assert cache() is first
        assert _works(first)
        stats = cache.statistics()
        assert 0 == stats.probe_failures
        assert 1 == stats.builds
        assert [] == closes.closed


class TestAiohttp:
    """check=lambda s: not s.closed on an async aiohttp singleton."""

    @pytest.mark.parametrize("how", ["close", "async-with"])
    def test_a_closed_session_is_replaced_on_its_loop(self, http_server, how):
        """Replaced within one check_every; closed on its loop; no leak."""
        closes = Closes()

        @process_singleton(
            check=lambda s: not s.closed,
            check_every=EVERY,
            close=closes.aclose,
        )
        async def web() -> aiohttp.ClientSession:
            return aiohttp.ClientSession(http_server.url)

        async def status(session) -> int:
            async with session.get("/ready") as reply:
                await reply.read()
                return reply.status

        async def main():
            first = await web()
            assert 200 == await status(first)
            if how == "close":
                await first.close()
            else:
                async with first:  # The idiom: closes it on the way out.
                    pass
            closed_at = time.monotonic()
            while await web() is first:
                assert time.monotonic() - closed_at <= EVERY + SLACK
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - closed_at
            async with web.lease() as second:
                assert 200 == await status(second)
            for _ in range(200):  # Its close is a task of this loop.
                if first in closes.closed:
                    break
                await asyncio.sleep(0.01)
            assert [first] == closes.closed
            assert [asyncio.get_running_loop()] == closes.loops
            return first, second, elapsed

        first, second, elapsed = asyncio.run(main())
        gc.collect()  # An unclosed session would warn (an error here).

        print(f"\nreplaced {elapsed:.3f}s after the close")
        assert first is not second
        assert elapsed <= EVERY + SLACK
        assert second.closed  # At the loop's end.
        assert [first, second] == closes.closed
        stats = web.statistics()
        assert 1 == stats.retirements["check"]
        assert 1 == stats.probe_failures
