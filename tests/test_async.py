"""Async factories: one client per process and event loop."""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import warnings

import pytest
from helpers import WAIT, fork_and_check

import poolkeeper
from poolkeeper import (
    AsyncProcessSingleton,
    ReentrantBuildError,
    UnclosedClientWarning,
    aclose_all,
    close_all,
    process_singleton,
)


class AsyncClient:
    """An async client that records the loop it was built and closed on."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed_on: list[asyncio.AbstractEventLoop] = []

    async def aclose(self) -> None:
        await asyncio.sleep(0)
        self.closed_on.append(asyncio.get_running_loop())


class AsyncFactory:
    """An async factory that can block on an event or fail."""

    def __init__(self) -> None:
        self.calls = 0
        self.gate: asyncio.Event | None = None
        self.fail: BaseException | None = None
        self.built: list[AsyncClient] = []

    async def __call__(self) -> AsyncClient:
        self.calls += 1
        if self.gate is not None:
            await asyncio.wait_for(self.gate.wait(), WAIT)
        if self.fail is not None:
            raise self.fail
        client = AsyncClient()
        self.built.append(client)
        return client


def make(factory: AsyncFactory | None = None, **options):
    factory = factory or AsyncFactory()

    async def build() -> AsyncClient:
        return await factory()

    return process_singleton(**options)(build), factory


async def settle(rounds: int = 5) -> None:
    """Let every ready task run up to its next suspension point."""
    for _ in range(rounds):
        await asyncio.sleep(0)


class TestBuild:
    def test_decorating_async_def_gives_an_async_singleton(self):
        """An async def factory makes an AsyncProcessSingleton."""
        single, _ = make()
        assert isinstance(single, AsyncProcessSingleton)
        assert "build" == single.__name__

    def test_concurrent_awaits_build_once(self):
        """Tasks awaiting first while the build blocks share one client."""

        async def main():
            single, factory = make()
            factory.gate = asyncio.Event()
            tasks = [asyncio.ensure_future(single()) for _ in range(16)]
            await settle()
            assert 1 == factory.calls
            factory.gate.set()
            results = await asyncio.wait_for(asyncio.gather(*tasks), WAIT)
            assert all(r is results[0] for r in results)
            assert results[0] is await single()
            await aclose_all()
            return factory.calls

        assert 1 == asyncio.run(main())

    def test_failed_build_reaches_every_waiter_and_caches_nothing(self):
        """Every waiter gets the factory's error; the next await retries."""

        async def main():
            single, factory = make()
            factory.gate = asyncio.Event()
            error = ConnectionError("edge refused")
            factory.fail = error
            tasks = [asyncio.ensure_future(single()) for _ in range(4)]
            await settle()
            factory.gate.set()
            results = await asyncio.wait_for(
                asyncio.gather(*tasks, return_exceptions=True), WAIT
            )
            assert [error] * 4 == results
            assert single.current() is None
            factory.fail = None
            factory.gate = None
            client = await single()
            assert 2 == factory.calls
            assert 1 == single.statistics().build_failures
            await aclose_all()
            return client

        assert isinstance(asyncio.run(main()), AsyncClient)

    def test_cancelled_builder_lets_a_waiter_build(self):
        """Cancelling the building task does not fail or strand its waiters."""

        async def main():
            single, factory = make()
            factory.gate = asyncio.Event()
            builder = asyncio.ensure_future(single())
            await settle()
            waiter = asyncio.ensure_future(single())
            await settle()
            builder.cancel()
            await settle()
            factory.gate.set()
            client = await asyncio.wait_for(waiter, WAIT)
            with pytest.raises(asyncio.CancelledError):
                await builder
            await aclose_all()
            return client, factory.calls

        client, calls = asyncio.run(main())
        assert isinstance(client, AsyncClient)
        assert 2 == calls

    def test_reentrant_await_raises(self):
        """A factory awaiting its own singleton gets ReentrantBuildError."""

        @process_singleton
        async def make_client() -> AsyncClient:
            await make_client()
            return AsyncClient()  # pragma: no cover

        with pytest.raises(ReentrantBuildError, match="make_client"):
            asyncio.run(make_client())


class TestBuildLog:
    def test_a_build_is_logged_as_a_sync_one_is(self, caplog, monkeypatch):
        """DEBUG "Built ..." with generation and fingerprint, no secret."""
        secret = "sk-async-log-secret"
        monkeypatch.setenv("PK_ASYNC_LOG_KEY", secret)
        caplog.set_level(logging.DEBUG, logger="poolkeeper")
        single, _ = make(key=poolkeeper.keys.env("PK_ASYNC_LOG_KEY"))

        async def main():
            await single()
            await single()  # A hit: not logged again.
            return single.statistics()

        stats = asyncio.run(main())
        built = [r for r in caplog.records if "Built" in r.getMessage()]
        assert 1 == len(built)
        record = built[0]
        assert "make.<locals>.build" == record.poolkeeper_factory
        assert 1 == record.poolkeeper_generation
        assert stats.key_fingerprint == record.poolkeeper_key
        assert secret not in caplog.text


class TestLoops:
    def test_each_loop_gets_its_own_client(self):
        """Two event loops in two threads build two clients."""
        single, factory = make()
        results: list[AsyncClient] = []

        def run():
            async def twice():
                a = await single()
                assert a is await single()
                await single.reset()
                return a

            results.append(asyncio.run(twice()))

        threads = [threading.Thread(target=run) for _ in range(2)]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
            assert not t.is_alive()
        assert 2 == factory.calls
        assert results[0] is not results[1]
        assert results[0].loop is not results[1].loop

    def test_retired_client_closes_on_its_own_loop(self):
        """A key rotation awaits the old client's aclose() on its loop."""
        value = ["a"]

        async def main():
            single, _ = make(key=lambda: value[0])
            old = await single()
            value[0] = "b"
            new = await single()
            new_was_open = [] == new.closed_on
            await aclose_all()
            return old, new, new_was_open, asyncio.get_running_loop()

        old, new, new_was_open, loop = asyncio.run(main())
        assert old is not new
        assert [loop] == old.closed_on
        assert new_was_open
        assert [loop] == new.closed_on

    def test_close_all_warns_about_a_closed_loop(self):
        """close_all() says which client it could not close, not silently."""
        single, _ = make()
        loop = asyncio.new_event_loop()
        client = loop.run_until_complete(single())
        loop.close()  # Without shutdown_asyncgens(): nothing closed it.

        with pytest.warns(UnclosedClientWarning, match="loop is closed"):
            close_all()
        assert [] == client.closed_on
        assert 1 == single.statistics().close_failures

    def test_an_error_filter_still_counts_the_unclosed_client_once(
        self, caplog
    ):
        """With the warning made an error, close_all() still never raises.

        The client is counted once and logged once: the warning's error
        is not taken for a close that failed as well.
        """
        single, _ = make()
        loop = asyncio.new_event_loop()
        client = loop.run_until_complete(single())
        loop.close()

        with (
            warnings.catch_warnings(),
            caplog.at_level(logging.DEBUG, logger="poolkeeper"),
        ):
            warnings.simplefilter("error", UnclosedClientWarning)
            close_all()
        assert [] == client.closed_on
        stats = single.statistics()
        assert (0, 1) == (stats.closes, stats.close_failures)
        failed = [
            r.getMessage()
            for r in caplog.records
            if getattr(r, "poolkeeper_event", None) == "close_failed"
        ]
        assert len(failed) == 1, failed
        assert "loop is closed" in failed[0]

    def test_close_all_closes_on_a_loop_running_elsewhere(self):
        """close_all() from another thread closes on the client's loop."""
        single, _ = make()
        ready, stop = threading.Event(), None
        box: dict[str, object] = {}

        def serve():
            async def main():
                nonlocal stop
                stop = asyncio.Event()
                box["client"] = await single()
                box["loop"] = asyncio.get_running_loop()
                ready.set()
                await asyncio.wait_for(stop.wait(), WAIT)

            asyncio.run(main())

        thread = threading.Thread(target=serve)
        thread.start()
        assert ready.wait(WAIT)
        close_all()
        loop = box["loop"]
        loop.call_soon_threadsafe(stop.set)
        thread.join(WAIT)
        assert not thread.is_alive()
        assert [loop] == box["client"].closed_on

    def test_aclose_all_closes_async_and_sync_clients(self):
        """aclose_all() awaits async closes and runs sync ones."""
        closed: list[str] = []
        sync_single = process_singleton(close=lambda c: closed.append("sync"))(
            object
        )

        async def main():
            single, _ = make()
            client = await single()
            sync_single()
            await aclose_all()
            return client, asyncio.get_running_loop()

        client, loop = asyncio.run(main())
        assert [loop] == client.closed_on
        assert ["sync"] == closed


class TestCrossLoopShutdown:
    def test_aclose_all_closes_on_a_loop_running_elsewhere(self):
        """aclose_all() on one loop closes another thread's client there."""
        single, _ = make()
        ready = threading.Event()
        box: dict[str, object] = {}

        def serve():
            async def main():
                stop = asyncio.Event()
                box["stop"] = stop
                box["client"] = await single()
                box["loop"] = asyncio.get_running_loop()
                ready.set()
                await asyncio.wait_for(stop.wait(), WAIT)

            asyncio.run(main())

        thread = threading.Thread(target=serve)
        thread.start()
        assert ready.wait(WAIT)
        try:
            asyncio.run(aclose_all())
        finally:
            box["loop"].call_soon_threadsafe(box["stop"].set)
            thread.join(WAIT)
        assert not thread.is_alive()
        assert [box["loop"]] == box["client"].closed_on

    def test_aclose_all_closes_on_an_idle_loop(self):
        """A client whose loop is idle is closed on that loop, elsewhere."""
        single, _ = make()
        loop = asyncio.new_event_loop()
        try:
            client = loop.run_until_complete(single())
            asyncio.run(aclose_all())
            assert [loop] == client.closed_on
        finally:
            loop.close()


class TestLeaseOverrideReset:
    def test_lease_defers_close(self):
        """A client leased across a reset closes when the lease exits."""

        async def main():
            single, _ = make()
            async with single.lease() as client:
                assert await single.reset()
                assert [] == client.closed_on
                assert 1 == single.statistics().pending_close
            assert 1 == len(client.closed_on)
            await aclose_all()
            return single.statistics()

        stats = asyncio.run(main())
        assert (0, 1) == (stats.pending_close, stats.closes)

    def test_override(self):
        """override() makes awaits return the object on any loop."""
        single, factory = make()
        fake = object()

        async def main():
            with single.override(fake):
                assert fake is await single()
                assert fake is single.current()
            return single.current()

        assert asyncio.run(main()) is None
        assert 0 == factory.calls

    def test_min_rebuild_interval(self):
        """Resets right after a build are refused and counted."""

        async def main():
            single, _ = make(min_rebuild_interval=3600)
            client = await single()
            assert not await single.reset()
            assert client is await single()
            await aclose_all()
            return single.statistics().resets_refused

        assert 1 == asyncio.run(main())


class TestFork:
    @pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
    def test_child_builds_its_own_async_client(self):
        """A forked child builds on its own loop; the parent's stays open."""
        single, _ = make()
        loop = asyncio.new_event_loop()
        try:
            parent = loop.run_until_complete(single())

            def child():
                mine = asyncio.run(single())
                return mine is not parent and [] == parent.closed_on

            assert 0 == fork_and_check(child)
            assert [] == parent.closed_on
            loop.run_until_complete(aclose_all())
            assert [loop] == parent.closed_on
        finally:
            loop.close()

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
    def test_keep_child_abandons_clients_of_loops_on_other_threads(self):
        """fork="keep", a client on a loop another thread runs.

        No thread of the child runs that loop: the child abandons the
        client (never uses or closes it) instead of keeping it, and its
        close_all() does not wait for the loop (it used to give up after
        30 s a client, saying the close did not finish in time). The
        parent's client is untouched.
        """
        single, _ = make(fork="keep")
        loop = asyncio.new_event_loop()
        runner = threading.Thread(target=loop.run_forever, daemon=True)
        runner.start()
        try:
            parent = asyncio.run_coroutine_threadsafe(single(), loop).result(
                WAIT
            )

            def child() -> bool:
                stats = single.statistics()
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    poolkeeper.close_all()
                mine = asyncio.run(single())
                return (
                    stats.retirements["fork"] == 1
                    and stats.pending_close == 0
                    and mine is not parent
                    and [] == parent.closed_on
                )

            assert 0 == fork_and_check(child)
            assert [] == parent.closed_on
            again = asyncio.run_coroutine_threadsafe(single(), loop)
            assert again.result(WAIT) is parent
            done = asyncio.run_coroutine_threadsafe(aclose_all(), loop)
            done.result(WAIT)
            assert [loop] == parent.closed_on
        finally:
            loop.call_soon_threadsafe(loop.stop)
            runner.join(WAIT)
            loop.close()

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
    def test_keep_child_forked_inside_a_coroutine_abandons_too(self):
        """fork="keep", forked inside a coroutine of the client's loop.

        asyncio reports no running loop in a forked child, even on the
        thread that forked: the child abandons that client as well, and
        its close_all() does not wait for the loop.
        """
        single, _ = make(fork="keep")

        async def main() -> None:
            parent = await single()

            def child() -> bool:
                stats = single.statistics()
                with warnings.catch_warnings():
                    warnings.simplefilter("error")
                    poolkeeper.close_all()
                return (stats.retirements["fork"], parent.closed_on) == (
                    1,
                    [],
                )

            assert 0 == fork_and_check(child)
            assert await single() is parent
            await aclose_all()
            assert [asyncio.get_running_loop()] == parent.closed_on

        asyncio.run(main())

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
    def test_after_fork_failure_is_logged_on_first_use(self, caplog):
        """A failing after_fork is reported in the child, never raised."""

        def broken(client):
            raise RuntimeError("cannot release")

        single, _ = make(after_fork=broken)

        async def main():
            await single()
            code = fork_and_check(child)
            await aclose_all()
            return code

        def child():
            with caplog.at_level("WARNING", logger="poolkeeper"):
                asyncio.run(single())
            # Its type and where it was raised, never its message.
            return (
                "RuntimeError raised at test_async.py" in caplog.text
                and "cannot release" not in caplog.text
            )

        assert 0 == asyncio.run(main())


class TestProxy:
    def test_proxy_follows_rotation(self):
        """A stored proxy reaches the new client after a key change."""
        value = ["a"]

        class Client:
            def __init__(self):
                self.key = value[0]
                self.closed = False

            def close(self):
                self.closed = True

        single = process_singleton(key=lambda: value[0])(Client)
        handle = single.proxy()
        assert single.current() is None

        assert "a" == handle.key
        first = single.current()
        value[0] = "b"

        assert "b" == handle.key
        assert first.closed
        assert isinstance(handle, Client)
        assert not handle.closed

    def test_proxy_pickles_by_reference(self):
        """A proxy unpickles to a proxy of the same singleton."""
        import pickle

        import forkhelpers

        handle = forkhelpers.SINGLE.proxy()
        again = pickle.loads(pickle.dumps(handle))
        assert again.pid == os.getpid()
        assert forkhelpers.SINGLE() is again.__wrapped__


def test_exports():
    """The async API is exported."""
    assert poolkeeper.aclose_all is aclose_all
