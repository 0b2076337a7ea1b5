"""The armed async hit path: what it serves, on which loop, and when not."""

from __future__ import annotations

import asyncio
import gc
import inspect
import os
import threading
import weakref

import pytest
from helpers import WAIT, FakeClient, LoopThread, fork_and_check

from poolkeeper import aclose_all, close_all, keys, process_singleton

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")

NAME = "PK_TEST_ASYNC_HIT"


def is_armed(single) -> bool:
    """Whether *single*'s class has an armed ``__call__``."""
    return "__call__" in type(single).__dict__


def armed_loop(single) -> object:
    """The loop *single*'s hit path is armed for, or None."""
    return type(single).__dict__.get("_poolkeeper_loop")


async def armed(single) -> object:
    """Await *single* until its hit path is armed; return its client."""
    client = await single()
    assert client is await single()
    assert is_armed(single)
    return client


def stop(*threads: LoopThread) -> None:
    """Shut each loop down the way asyncio.run() does, then stop it."""
    for thread in threads:
        thread.run(thread.loop.shutdown_asyncgens())
        thread.stop()


@pytest.fixture(name="env")
def _env(monkeypatch):
    """One watched variable, set."""
    monkeypatch.setenv(NAME, "a")
    return NAME


@pytest.fixture(name="single", params=["no key", "env"])
def _single(request, env):
    """An async singleton with no key, or a keys.env key."""
    key = None if request.param == "no key" else keys.env(env)

    @process_singleton(key=key)
    async def single():
        return FakeClient(asyncio.get_running_loop())

    yield single
    close_all()


class TestPerLoop:
    def test_two_running_loops_each_get_their_own_client(self, single):
        """Loops on two threads, awaited in turns: each gets its own client."""
        one, two = LoopThread(), LoopThread()
        try:
            a = one.run(single())
            b = two.run(single())
            holder = armed_loop(single)
            seen = [(one.run(single()), two.run(single())) for _ in range(50)]
            # The loop armed last keeps the arming while it runs: the
            # other's calls do not take it back and forth.
            assert holder is armed_loop(single)
            assert holder in (one.loop, two.loop)
        finally:
            stop(one, two)
        assert a is not b
        assert a.label is one.loop
        assert b.label is two.loop
        assert all(x is a and y is b for x, y in seen)

    def test_loops_racing_on_two_threads_never_share(self, single):
        """Both loops await at once, many times: never the other's client."""
        one, two = LoopThread(), LoopThread()
        barrier = threading.Barrier(2)

        async def many():
            loop = asyncio.get_running_loop()
            await asyncio.to_thread(barrier.wait, WAIT)
            return [(await single()).label is loop for _ in range(2000)]

        try:
            futures = [
                asyncio.run_coroutine_threadsafe(many(), t.loop)
                for t in (one, two)
            ]
            results = [f.result(WAIT) for f in futures]
        finally:
            stop(one, two)
        assert [True] * 4000 == results[0] + results[1]

    def test_coroutine_made_on_one_loop_awaited_on_another(self, single):
        """The check runs at the await: the awaiting loop's client."""
        other = LoopThread()
        try:
            theirs = other.run(single())

            async def main():
                mine = await single()
                await single()
                assert is_armed(single)
                coro = single()  # Made here, armed for this loop...
                future = asyncio.run_coroutine_threadsafe(coro, other.loop)
                got = await asyncio.wrap_future(future)  # ...run there.
                return mine, got

            mine, got = asyncio.run(main())
        finally:
            stop(other)
        assert got is theirs
        assert mine is not theirs

    def test_loops_taking_turns_on_one_thread(self, single):
        """A stopped loop's arming does not serve the next loop run there."""
        first, second = asyncio.new_event_loop(), asyncio.new_event_loop()
        try:
            a = first.run_until_complete(single())
            assert a is first.run_until_complete(single())
            assert first is armed_loop(single)
            b = second.run_until_complete(single())
            assert b is second.run_until_complete(single())
            # A stopped loop does not keep the arming.
            assert second is armed_loop(single)
            assert a is first.run_until_complete(single())
        finally:
            for loop in (first, second):
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.close()
        assert a.label is first
        assert b.label is second


class TestNothingStale:
    def test_environment_write_outdates_armed_and_pending_calls(self, env):
        """After the write returns, no await gets the old value's client."""

        @process_singleton(key=keys.env(env))
        async def single():
            return FakeClient(os.environ[env])

        async def main():
            old = await single()
            await single()
            assert is_armed(single)
            pending = single()  # Made before the write, awaited after.
            os.environ[env] = "b"
            return old, await pending, await single()

        old, pending, new = asyncio.run(main())
        assert "a" == old.label
        assert "b" == pending.label
        assert pending is new
        assert 1 == len(old.closes)

    def test_reset_while_armed_serves_no_retired_client(self, single):
        """A coroutine made before reset() never returns the retired one."""

        async def main():
            old = await single()
            await single()
            pending = single()
            assert await single.reset()
            new = await pending
            return old, new, new.closed

        old, new, was_closed = asyncio.run(main())
        assert new is not old
        assert 1 == len(old.closes)
        assert not was_closed

    def test_close_all_from_another_thread_disarms(self, single):
        """close_all() on another thread: the next await builds afresh."""

        async def main():
            old = await single()
            await single()
            assert is_armed(single)
            closer = threading.Thread(target=close_all)
            closer.start()
            await asyncio.to_thread(closer.join, WAIT)
            assert not closer.is_alive()
            assert not is_armed(single)
            return old, await single()

        old, new = asyncio.run(main())
        assert new is not old
        assert 1 == len(old.closes)

    def test_aclose_all_disarms(self, single):
        """aclose_all(): the next await builds afresh."""

        async def main():
            old = await single()
            await single()
            await aclose_all()
            return old, await single()

        old, new = asyncio.run(main())
        assert new is not old
        assert old.closed

    def test_override_wins_over_an_armed_hit(self, single):
        """Inside override() every await gets the override; then the live."""

        async def main():
            live = await single()
            await single()
            with single.override("fake"):
                inside = await single()
            return live, inside, await single()

        live, inside, after = asyncio.run(main())
        assert "fake" == inside
        assert after is live

    def test_loop_end_disarms_and_keeps_no_loop(self, single):
        """asyncio.run() ends: disarmed; three hundred loops, none kept."""
        loops = []

        async def main():
            loops.append(weakref.ref(asyncio.get_running_loop()))
            client = await single()
            assert client is await single()
            assert is_armed(single)
            return client

        clients = [asyncio.run(main()) for _ in range(300)]
        assert not is_armed(single)
        assert 300 == len({id(c) for c in clients})
        assert all(c.closed for c in clients)
        del clients
        gc.collect()
        assert [] == [ref for ref in loops if ref() is not None]

    def test_loop_used_after_its_shutdown_builds_afresh(self, single):
        """After shutdown_asyncgens() closed its clients, no hit serves one."""
        loop = asyncio.new_event_loop()
        try:
            old = loop.run_until_complete(single())
            assert old is loop.run_until_complete(single())
            loop.run_until_complete(loop.shutdown_asyncgens())
            assert old.closed
            # asyncio warns of the new slot's loop-end generator.
            with pytest.warns(ResourceWarning, match="shutdown_asyncgens"):
                new = loop.run_until_complete(single())
        finally:
            loop.close()
        assert new is not old

    @needs_fork
    def test_fork_inside_a_running_loop_builds_in_the_child(self, single):
        """Forked while armed: the child's await builds its own client."""

        async def main():
            parent = await single()
            await single()
            assert is_armed(single)

            def child():
                # The same loop and thread, in the child: only the fork
                # hook's disarm keeps the parent's client from being served.
                if is_armed(single):
                    return False
                coro = single()
                try:
                    coro.send(None)
                except StopIteration as stop:
                    return stop.value is not parent
                except RuntimeError:  # No running loop here: the slow path.
                    return True
                finally:
                    coro.close()
                return False  # pragma: no cover -- the build suspended.

            return fork_and_check(child)

        assert 0 == asyncio.run(main())


class TestCallShape:
    def test_arguments_raise_at_the_call_armed_or_not(self, single):
        """The same TypeError, at the call, before and after arming."""

        def error():
            with pytest.raises(TypeError) as info:
                single(1, x=2)
            return str(info.value)

        async def main():
            before = error()
            await single()
            await single()
            assert is_armed(single)
            return before, error()

        before, armed = asyncio.run(main())
        assert before == armed
        assert "takes no arguments (2 given)" in armed

    def test_armed_call_returns_a_real_coroutine(self, single):
        """create_task() and asyncio.run() take what an armed call returns."""

        async def main():
            client = await single()
            await single()
            assert is_armed(single)
            coro = single()
            assert inspect.iscoroutine(coro)
            return client, await asyncio.create_task(coro)

        client, from_task = asyncio.run(main())
        assert client is from_task

    def test_dropped_singleton_is_collected_while_armed(self, env):
        """The armed class holds the singleton weakly: it can be collected."""

        async def armed_and_dropped():
            @process_singleton(key=keys.env(env))
            async def single():
                return object()

            await single()
            await single()
            assert is_armed(single)
            return weakref.ref(single)

        async def main():
            ref = await armed_and_dropped()
            gc.collect()
            return ref() is None

        assert asyncio.run(main())


class TestRunningLoopVariant:
    @pytest.fixture(autouse=True)
    def _ask_asyncio(self, monkeypatch):
        """Arm with the variant 3.12+ uses: asyncio names the running loop."""
        monkeypatch.setattr("poolkeeper._loops._BY_THREAD", False)

    def test_serves_only_its_own_loop(self, single):
        """Two running loops and a cross-loop await: each loop's own client."""
        other = LoopThread()
        try:
            theirs = other.run(single())
            assert theirs is other.run(single())

            async def main():
                mine = await single()
                assert mine is await single()
                assert is_armed(single)
                coro = single()
                future = asyncio.run_coroutine_threadsafe(coro, other.loop)
                return mine, await asyncio.wrap_future(future)

            mine, got = asyncio.run(main())
        finally:
            stop(other)
        assert got is theirs
        assert mine is not theirs

    def test_environment_write_outdates_a_pending_call(self, env):
        """A coroutine made before the write and awaited after misses."""

        @process_singleton(key=keys.env(env))
        async def single():
            return FakeClient(os.environ[env])

        async def main():
            await single()
            await single()
            assert is_armed(single)
            pending = single()
            os.environ[env] = "b"
            return await pending

        assert "b" == asyncio.run(main()).label


class TestDroppedBeforeTheAwait:
    def test_await_after_the_singleton_was_collected_raises(self, env):
        """Made while armed, awaited after collection: ReferenceError."""

        def armed_coroutine(loop):
            @process_singleton(key=keys.env(env))
            async def single():
                return object()

            loop.run_until_complete(single())
            loop.run_until_complete(single())
            assert is_armed(single)
            return single(), weakref.ref(single)

        loop = asyncio.new_event_loop()
        try:
            coro, ref = armed_coroutine(loop)
            gc.collect()
            assert ref() is None
            with pytest.raises(ReferenceError, match="garbage collected"):
                loop.run_until_complete(coro)
        finally:
            loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    def test_the_error_names_the_factory_and_what_to_do(self, env):
        """The ReferenceError says which singleton, and to keep it alive."""

        async def main():
            @process_singleton(key=keys.env(env))
            async def make_client():
                return FakeClient()

            await armed(make_client)
            coro = make_client()
            del make_client
            gc.collect()
            with pytest.raises(ReferenceError) as caught:
                await coro
            return str(caught.value)

        message = asyncio.run(main())
        assert "main.<locals>.make_client" in message
        assert "keep a reference to the singleton" in message

    def test_collected_with_its_class_in_a_cycle_serves_no_closed_client(
        self, env
    ):
        """Collected by the cycle collector: the pending call does not hit.

        The collector clears the weak reference to the singleton's class
        before the orphan close disarms it; the call made while armed must
        still miss (and raise), not return the client that close closed.
        """

        async def main():
            @process_singleton(key=keys.env(env))
            async def single():
                return FakeClient()

            client = await armed(single)
            coro = single()
            cycle: list[object] = [single]
            cycle.append(cycle)
            del single, cycle
            gc.collect()
            await asyncio.sleep(0)  # Room for a close put on the loop.
            try:
                served = await coro
            except ReferenceError:
                served = None
            return client, served

        client, served = asyncio.run(main())
        assert served is None
        assert [os.getpid()] == client.closes
