"""Async SDK clients from docs/recipes: one per event loop, closed on it."""

from __future__ import annotations

import asyncio
import gc
import logging
import threading
import warnings

import pytest
import sdk_net
from sdk_drivers import ASYNC, Grpc
from sdk_fork import Forked

import poolkeeper

TASKS = 32
JOIN = 60.0


class LoopThread:
    """An event loop running in a thread of its own; records its errors."""

    def __init__(self):
        self.loop = asyncio.new_event_loop()
        self.errors = []
        self.loop.set_exception_handler(lambda _, ctx: self.errors.append(ctx))
        self.thread = threading.Thread(target=self.loop.run_forever)
        self.thread.start()

    def run(self, coro):
        """Run *coro* on the loop; return its result (bounded wait)."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(JOIN)

    def stop(self):
        """Stop and close the loop after its thread ends."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(JOIN)
        assert not self.thread.is_alive()
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()


@pytest.fixture(name="adriver", params=list(ASYNC), ids=lambda c: c.__name__)
def _adriver(request, recipe, monkeypatch):
    cls = request.param
    server = request.getfixturevalue(cls.server)
    driver = cls(recipe(cls.recipe), server, monkeypatch)
    driver.asingle = getattr(driver.module, ASYNC[cls])
    return driver


@pytest.fixture(name="clean")
def _clean(caplog):
    """Fail on any warning, unraisable error or asyncio error log."""
    caplog.set_level(logging.WARNING)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        yield
        gc.collect()
    assert [] == [str(w.message) for w in caught]
    assert [] == [r.getMessage() for r in caplog.records]


class TestOnePerLoop:
    def test_racing_tasks_build_one_client(self, adriver, clean):
        """32 tasks awaiting first on one loop build one client."""

        async def race():
            async def first():
                client = await adriver.asingle()
                return client, await adriver.ause(client)

            return await asyncio.gather(*(first() for _ in range(TASKS)))

        loop = LoopThread()
        try:
            pairs = loop.run(race())
            assert 1 == adriver.asingle.statistics().builds
            assert all(c is pairs[0][0] for c, _ in pairs)
            ports = {p for _, p in pairs}
            loop.run(adriver.asingle.reset())
            assert sdk_net.wait_until(
                lambda: not any(adriver.server_open(p) for p in ports)
            )
        finally:
            loop.stop()
        assert [] == loop.errors

    def test_each_loop_has_its_own_closed_on_its_own_loop(
        self, adriver, clean
    ):
        """Two loops, two clients, each closed on its own loop."""
        a, b = LoopThread(), LoopThread()
        try:
            ca, cb = a.run(adriver.asingle()), b.run(adriver.asingle())
            assert ca is not cb
            assert ca is a.run(adriver.asingle())
            pa, pb = a.run(adriver.ause(ca)), b.run(adriver.ause(cb))
            assert pa != pb
            adriver.rotate()
            ca2 = a.run(adriver.asingle())
            assert ca2 is not ca
            assert sdk_net.wait_until(lambda: not adriver.server_open(pa))
            assert adriver.server_open(pb)
            assert 1 == adriver.asingle.statistics().closes
            pa2 = a.run(adriver.ause(ca2))
            # cb's loop runs in another thread: closed there, awaited here.
            a.run(poolkeeper.aclose_all())
            assert 3 == adriver.asingle.statistics().closes
            assert 0 == adriver.asingle.statistics().close_failures
            assert sdk_net.wait_until(
                lambda: (
                    not adriver.server_open(pb)
                    and not adriver.server_open(pa2)
                )
            )
        finally:
            a.stop()
            b.stop()
        assert [] == a.errors + b.errors


# grpc.aio does not support fork at all (the recipe page says so).
FORKABLE = [cls for cls in ASYNC if cls is not Grpc]


class TestAsyncFork:
    @pytest.mark.parametrize(
        "adriver", FORKABLE, ids=lambda c: c.__name__, indirect=True
    )
    def test_child_builds_its_own_on_its_own_loop(self, adriver, clean):
        """A forked child's asyncio.run builds a client of its own."""
        loop = LoopThread()
        try:
            parent = loop.run(adriver.asingle())
            port = loop.run(adriver.ause(parent))

            def in_child():
                async def main():
                    client = await adriver.asingle()
                    reply = {
                        "fresh": client is not parent,
                        "port": await adriver.ause(client),
                    }
                    await poolkeeper.aclose_all()
                    return reply

                return asyncio.run(main())

            child = Forked(in_child)
            reply = child.result()
            assert 0 == child.finish()
            assert reply["fresh"]
            assert port != reply["port"]
            assert port == loop.run(adriver.ause(parent))
            assert adriver.server_open(port)
            loop.run(poolkeeper.aclose_all())
        finally:
            loop.stop()
        assert [] == loop.errors
