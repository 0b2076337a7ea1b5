"""Issue 25's third round of attack findings (points 1, 2, 3, 5, 7, 8).

Each class is one promise the attacks broke; each test failed before its
fix.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import threading
import warnings
from typing import cast

import pytest
from attack import Pause, join, run
from helpers import WAIT, Factory, FakeClient, LoopThread, wait_until

from poolkeeper import (
    PoolkeeperWarning,
    UnclosedClientWarning,
    _environ,
    close_all,
    keys,
    process_singleton,
)
from poolkeeper._lease import PinRef


class Custom(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


BASE_EXCEPTIONS = [KeyboardInterrupt, SystemExit, GeneratorExit, Custom]


class TestEveryFactoryErrorIsCounted:
    """Point 7: build_failures counts factory calls that raised anything."""

    @pytest.mark.parametrize("exc", BASE_EXCEPTIONS)
    def test_sync_factory(self, exc):
        """A sync factory's BaseException is counted, and propagates."""
        factory = Factory(fail_with=exc())
        single = process_singleton(factory)

        with pytest.raises(exc):
            single()

        assert 1 == single.statistics().build_failures
        assert 0 == single.statistics().builds
        factory.fail_with = None
        assert single() is factory.built[0]
        assert (1, 1) == (
            single.statistics().builds,
            single.statistics().build_failures,
        )

    @pytest.mark.parametrize("exc", [SystemExit, GeneratorExit, Custom])
    def test_async_factory(self, exc):
        """An async factory's BaseException is counted too."""

        @process_singleton
        async def single() -> FakeClient:
            await asyncio.sleep(0)
            raise exc

        async def main():
            with pytest.raises(exc):
                await single()

        asyncio.run(main())
        assert 1 == single.statistics().build_failures

    def test_a_cancelled_async_build_is_no_failure(self):
        """Cancelling the builder is the caller's doing, not the factory's."""
        started: list[asyncio.Event] = []

        @process_singleton
        async def single() -> FakeClient:
            started[0].set()
            await asyncio.sleep(3600)
            raise AssertionError  # pragma: no cover -- cancelled first.

        async def main():
            started.append(asyncio.Event())
            task = asyncio.ensure_future(single())
            await asyncio.wait_for(started[0].wait(), WAIT)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert 0 == single.statistics().build_failures


class SlowKey:
    """A key value whose *n*-th comparison waits for the gate's release."""

    def __init__(self, value: str, gate: dict[str, object]) -> None:
        self.value = value
        self.gate = gate

    def __hash__(self) -> int:
        return 0  # One hash for every value: only __eq__ tells them apart.

    def __eq__(self, other: object) -> bool:
        gate = self.gate
        if "release" in gate:
            gate["n"] = n = cast("int", gate["n"]) - 1
            if n == 0:
                cast("threading.Event", gate["entered"]).set()
                release = cast("threading.Event", gate["release"])
                gate["released"] = release.wait(WAIT)
        return isinstance(other, SlowKey) and self.value == other.value

    def __repr__(self) -> str:
        return f"SlowKey({self.value!r})"


class TestKeysAreComparedWithNoLockHeld:
    """Point 5: a key's __eq__ never runs under the singleton's lock."""

    def test_statistics_do_not_wait_for_a_slow_comparison(self):
        """statistics() on another thread answers while __eq__ runs.

        The key changes: the polled hit path compares once (no lock) and
        misses; the slow path's comparison is the one that waits.
        """
        gate: dict[str, object] = {}
        value = ["a"]
        factory = Factory()
        single = process_singleton(key=lambda: SlowKey(value[0], gate))(
            factory
        )
        single()
        entered, release = threading.Event(), threading.Event()
        gate.update(n=2, entered=entered, release=release)
        value[0] = "b"
        caller, box = run(single)
        assert entered.wait(WAIT)
        stats = []

        def look() -> None:
            stats.append(single.statistics())
            release.set()

        looker, _ = run(look)
        join(looker, caller)
        assert gate["released"], "statistics() waited for the comparison"
        assert [factory.built[1]] == box
        assert 1 == stats[0].builds

    def test_a_record_made_live_after_the_comparison_is_compared_again(self):
        """The live record changed between the comparison and request()."""
        factory = Factory()
        single = process_singleton(factory)
        pause = Pause("ask", "step = life.request(")
        box: list[object] = []
        caller = threading.Thread(
            target=pause.run(lambda: box.append(single()))
        )
        caller.start()
        try:
            # The caller compared with no live record, then stops.
            assert pause.reached.wait(WAIT)
            client = single()
            pause.release.set()
            join(caller)
        finally:
            pause.release.set()
        assert [client] == box
        assert 1 == factory.calls


class TestDecoratingUnderGarbageCollection:
    """Point 2: registering and forgetting survive callbacks anywhere."""

    @pytest.mark.parametrize(
        "threshold", [(700, 10, 10), (10, 2, 2), (50, 5, 5)]
    )
    def test_many_singletons_keyed_on_one_variable(
        self, threshold, monkeypatch
    ):
        """2,000 singletons on one variable, collected as they are made.

        Each dropped one's subscription is forgotten by a weakref callback
        that the collector runs at whatever allocation comes next, in the
        middle of the next registration (CPython 3.10 and 3.11 collect
        inside an allocation: there it raised "dictionary changed size
        during iteration").
        """
        monkeypatch.setenv("PK_ROUND3", "1")
        before = gc.get_threshold()
        gc.set_threshold(*threshold)
        try:
            for _ in range(2000):
                single = process_singleton(key=keys.env("PK_ROUND3"))(
                    FakeClient
                )
        finally:
            gc.set_threshold(*before)
        client = single()
        assert client is single()
        monkeypatch.setenv("PK_ROUND3", "2")  # Still subscribed: rebuilt.
        assert client is not single()
        gc.collect()
        # The dropped are forgotten: what is left is alive, the same in the
        # tuple that writes read, and at most the last singleton and the
        # lifecycle the registry lets go of at the next registration.
        refs = _environ._refs["PK_ROUND3"]
        assert list(refs.values()) == list(_environ._subscribers["PK_ROUND3"])
        assert all(ref() is not None for ref in refs.values())
        assert 2 >= len(refs)


class AClient:
    """An async client whose close is seen from any thread."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    async def aclose(self) -> None:
        await asyncio.sleep(0)
        self.closed.set()


class TestCollectionNeverBlocks:
    """Point 1: dropping a singleton closes its client without blocking."""

    def test_an_async_client_on_another_threads_loop(self):
        """Collected on one thread, closed on the loop's, neither waits.

        The clean-up used to hold the singleton's lock while it waited for
        the close on the other loop, which needed that lock: both threads
        froze for CROSS_LOOP_CLOSE_SECONDS, then the client was reported
        unclosed.
        """

        async def make() -> AClient:
            return AClient()

        loop = LoopThread()
        try:
            single = process_singleton(make)
            client = loop.run(single())
            with warnings.catch_warnings():
                warnings.simplefilter("error", UnclosedClientWarning)
                del single
                collector, box = run(gc.collect)
                # The close runs on the loop, with no lock held by the
                # collector, and the collection ends without waiting.
                assert client.closed.wait(WAIT)
                join(collector)
            assert isinstance(box[0], int)
            assert "alive" == loop.run(asyncio.sleep(0, "alive"))
        finally:
            loop.stop()

    def test_an_async_client_of_an_idle_loop(self):
        """An idle loop's client closes when its own thread runs it next.

        Nothing waits for it, and no other thread runs the loop (its own
        thread could start it at the same moment).
        """

        async def make() -> AClient:
            return AClient()

        async def until_closed(client: AClient) -> bool:
            for _ in range(int(WAIT * 100)):
                if client.closed.is_set():
                    return True
                await asyncio.sleep(0.01)
            return False

        loop = asyncio.new_event_loop()
        try:
            single = process_singleton(make)
            client = loop.run_until_complete(single())
            del single
            gc.collect()
            assert not client.closed.is_set()  # No thread ran the loop.
            assert loop.run_until_complete(until_closed(client))
        finally:
            loop.close()

    def test_an_async_client_of_the_collecting_loop(self):
        """Collected on its own loop: its close is a task of that loop."""

        async def make() -> AClient:
            return AClient()

        async def main() -> AClient:
            single = process_singleton(make)
            client = await single()
            del single
            gc.collect()
            await asyncio.wait_for(
                asyncio.get_running_loop().run_in_executor(
                    None, client.closed.wait, WAIT
                ),
                WAIT,
            )
            return client

        assert asyncio.run(main()).closed.is_set()

    def test_what_a_close_on_another_loop_raised_is_logged(self, caplog):
        """No caller awaits it: a close hook's BaseException is logged."""

        async def make() -> AClient:
            return AClient()

        async def close(client: AClient) -> None:
            await asyncio.sleep(0)
            raise Custom

        loop = LoopThread()
        try:
            single = process_singleton(close=close)(make)
            loop.run(single())
            life = single._self_life
            del single
            with caplog.at_level("WARNING", logger="poolkeeper"):
                gc.collect()
                assert wait_until(lambda: "Closing a collected" in caplog.text)
            assert 1 == life.close_failures
        finally:
            loop.stop()


class TestCloseAllInsideARunningLoop:
    """Point 3: close_all() in a running loop fails loudly, closing nothing."""

    def test_async_clients_of_the_running_loop(self):
        """asyncio.run used to cancel the close it scheduled, silently."""

        async def make() -> AClient:
            return AClient()

        single = process_singleton(make)

        async def main() -> AClient:
            client = await single()
            with pytest.raises(RuntimeError) as info:
                close_all()
            assert "await poolkeeper.aclose_all()" in str(info.value)
            assert "make" in str(info.value)
            return client

        client = asyncio.run(main())
        # Nothing was closed by close_all(); the loop's end closed it.
        assert client.closed.is_set()
        stats = single.statistics()
        assert (1, 0) == (stats.closes, stats.close_failures)

    def test_sync_clients_close_inside_a_running_loop(self):
        """With no async client on the loop, close_all() works there."""
        single = process_singleton(FakeClient)
        client = single()

        async def main() -> None:
            close_all()

        asyncio.run(main())
        assert client.closed


class TestDroppedLeases:
    """Point 8: a lease dropped without exiting does not pin for ever."""

    @pytest.mark.parametrize("retire", ["reset", "close_all", "rebuild"])
    def test_a_collected_lease_releases_its_pin(self, retire, monkeypatch):
        """Entered, dropped, collected: the retired client closes."""
        monkeypatch.setenv("PK_ROUND3_LEASE", "1")
        single = process_singleton(key=keys.env("PK_ROUND3_LEASE"))(FakeClient)
        client = single()
        lease = single.lease()
        assert client is lease.__enter__()
        del lease
        gc.collect()
        assert not client.closed  # Live: a pin on a live client is moot.
        if retire == "reset":
            retired = single.reset
        elif retire == "close_all":
            retired = close_all
        else:

            def retired() -> None:
                monkeypatch.setenv("PK_ROUND3_LEASE", "2")
                assert client is not single()

        with pytest.warns(PoolkeeperWarning, match="FakeClient"):
            retired()
        gc.collect()
        assert [os.getpid()] == client.closes
        assert 0 == single.statistics().leases
        assert 0 == single.statistics().pending_close

    def test_dropped_after_the_retirement(self):
        """Dropped while its client is retired: released when collected."""
        single = process_singleton(FakeClient)
        client = single()
        stack = contextlib.ExitStack()
        assert client is stack.enter_context(single.lease())
        assert single.reset()
        gc.collect()
        assert not client.closed  # Still referenced: respected.
        assert 1 == single.statistics().pending_close
        with pytest.warns(PoolkeeperWarning, match="FakeClient"):
            del stack  # Freed here: no cycle holds it.
        gc.collect()
        assert 1 == len(client.closes)
        assert 0 == single.statistics().pending_close

    def test_an_exited_lease_whose_entry_outlives_it_says_nothing(self):
        """The weak entry of an exited lease is freed after the lease.

        As on a free-threaded build, where an object another thread let go
        may be freed late: the entry's callback then finds nothing to end.
        It used to warn that the lease was never exited (4,631 times in a
        minute of the healing churn on 3.14t).
        """
        single = process_singleton(FakeClient)
        client = single()
        lease = single.lease()
        assert client is lease.__enter__()
        assert single.reset()
        record = single._self_slot.retired[0]
        entries = list(record.pins)  # The weak entries, kept alive here.
        assert [PinRef] == [type(e) for e in entries]
        lease.__exit__(None, None, None)
        assert [os.getpid()] == client.closes
        with warnings.catch_warnings(record=True) as said:
            warnings.simplefilter("always")
            del lease
            gc.collect()
        assert [] == [str(w.message) for w in said]
        assert [os.getpid()] == client.closes
        assert 0 == single.statistics().pending_close
        del entries

    def test_a_referenced_lease_keeps_its_pin_and_exits(self):
        """A lease still held is respected, and its exit closes the client."""
        single = process_singleton(FakeClient)
        client = single()
        lease = single.lease()
        lease.__enter__()
        close_all()
        gc.collect()
        assert not client.closed
        assert 1 == single.statistics().leases
        lease.__exit__(None, None, None)
        assert 1 == len(client.closes)
        assert 0 == single.statistics().leases

    def test_an_async_lease_collected_on_its_loop(self):
        """Async: entered, dropped after the retirement, collected."""

        async def make() -> AClient:
            return AClient()

        single = process_singleton(make)

        async def settle(client: AClient) -> None:
            for _ in range(1000):
                if client.closed.is_set():
                    return
                await asyncio.sleep(0)

        async def main() -> AClient:
            client = await single()
            lease = single.lease()
            assert client is await lease.__aenter__()
            assert await single.reset()
            gc.collect()
            await settle(client)
            assert not client.closed.is_set()  # Still referenced.
            # Entered before the collection: the loop runs the release in
            # a context copied when it is scheduled, and on a free-threaded
            # 3.14 warnings filters live in the context.
            with pytest.warns(PoolkeeperWarning, match="make"):  # noqa: PT031
                del lease
                gc.collect()
                await settle(client)
            assert client.closed.is_set()
            assert 0 == single.statistics().leases
            return client

        asyncio.run(main())


class TestCollectionInsideATransition:
    """Point 1: the clean-up never enters a transition of its own thread."""

    def test_put_off_while_this_thread_holds_the_lock(self):
        """The lock is reentrant: the clean-up must not take it mid-change."""
        single = process_singleton(FakeClient)
        client = single()
        lock = single._self_life.lock
        with lock:  # Stands for a transition this thread is in.
            del single
            gc.collect()
            assert not client.closed
        process_singleton(FakeClient)  # The next registration drains it.
        assert 1 == len(client.closes)
