"""Building: lazily, exactly once, and never caching a failure."""

from __future__ import annotations

import threading

import pytest
from helpers import WAIT, Factory, FakeClient, blocked_in, run_threads

from poolkeeper import PoolkeeperError, ReentrantBuildError, process_singleton


class TestLazyBuild:
    def test_nothing_is_built_at_decoration(self):
        """Decorating builds nothing; the first call does."""
        factory = Factory()
        single = process_singleton(factory)

        assert 0 == factory.calls
        assert single.current() is None
        client = single()
        assert 1 == factory.calls
        assert client is single.current()

    def test_calls_return_the_same_client(self):
        """Every call after the first returns the first client."""
        factory = Factory()
        single = process_singleton(factory)

        clients = {id(single()) for _ in range(100)}

        assert 1 == len(clients)
        assert 1 == factory.calls
        assert 1 == single.statistics().builds
        assert 1 == single.statistics().generation


class TestExactlyOnce:
    @pytest.mark.parametrize("n", [2, 8, 32])
    def test_concurrent_first_calls_build_once(self, n):
        """Callers released together while the build blocks share one build."""
        gate = threading.Event()
        factory = Factory(gate=gate)
        single = process_singleton(factory)
        waiting = threading.Barrier(n + 1)

        def call():
            waiting.wait(WAIT)
            return single()

        threads_done: list[object] = []
        runner = threading.Thread(
            target=lambda: threads_done.extend(run_threads(call, n))
        )
        runner.start()
        # The builder is inside the factory and every other caller waits
        # on its build before the gate opens.
        waiting.wait(WAIT)
        assert factory.entered.wait(WAIT)
        assert blocked_in("_acquire", n - 1)
        gate.set()
        runner.join(WAIT)

        assert not runner.is_alive()
        assert 1 == factory.calls
        assert n == len(threads_done)
        assert all(r is factory.built[0] for r in threads_done)

    def test_waiters_block_until_the_build_ends(self):
        """A caller arriving mid-build waits for it instead of building."""
        gate = threading.Event()
        factory = Factory(gate=gate)
        single = process_singleton(factory)
        first = threading.Thread(target=single)
        first.start()
        assert factory.entered.wait(WAIT)
        second_result: list[FakeClient] = []
        second = threading.Thread(
            target=lambda: second_result.append(single())
        )
        second.start()

        assert blocked_in("_acquire", 1)
        assert second.is_alive()
        gate.set()
        first.join(WAIT)
        second.join(WAIT)
        assert not first.is_alive()
        assert not second.is_alive()
        assert 1 == factory.calls
        assert second_result[0] is factory.built[0]


class TestFailedBuild:
    def test_error_propagates_unchanged(self):
        """The factory's own exception reaches the caller, not a wrapper."""
        error = ConnectionError("edge refused")
        single = process_singleton(Factory(fail_with=error))

        with pytest.raises(ConnectionError) as info:
            single()

        assert error is info.value
        assert single.current() is None
        assert 1 == single.statistics().build_failures

    def test_nothing_is_cached_and_the_next_call_retries(self):
        """After a failure the next call calls the factory again."""
        factory = Factory(fail_with=ValueError("bad"))
        single = process_singleton(factory)
        with pytest.raises(ValueError, match="bad"):
            single()

        factory.fail_with = None
        client = single()

        assert 2 == factory.calls
        assert client is single()
        assert 1 == single.statistics().builds

    @pytest.mark.parametrize(
        "error",
        [TimeoutError("api jitter"), StopIteration("no config")],
        ids=["TimeoutError", "StopIteration"],
    )
    def test_every_waiter_of_a_failed_build_gets_its_error(self, error):
        """Callers waiting on a build that fails all receive that error.

        Unchanged, a StopIteration too (no generator turns it into a
        RuntimeError on its way).
        """
        gate = threading.Event()
        factory = Factory(gate=gate, fail_with=error)
        single = process_singleton(factory)
        n = 8
        results: list[object] = []
        runner = threading.Thread(
            target=lambda: results.extend(run_threads(single, n))
        )
        runner.start()
        assert factory.entered.wait(WAIT)
        assert blocked_in("_acquire", n - 1)
        gate.set()
        runner.join(WAIT)

        assert not runner.is_alive()
        assert 1 == factory.calls
        assert [error] * n == results

    def test_a_failed_rebuild_keeps_the_previous_client(self):
        """A reset followed by a failing build leaves no live client cached."""
        keyval = ["a"]
        factory = Factory()
        single = process_singleton(key=lambda: keyval[0])(factory)
        old = single()
        keyval[0] = "b"
        factory.fail_with = OSError("down")

        with pytest.raises(OSError, match="down"):
            single()

        assert old is single.current()
        assert not old.closed
        factory.fail_with = None
        new = single()
        assert new is not old
        assert old.closed


class TestBuildsForDifferentKeys:
    def test_caller_with_a_new_key_waits_then_builds_its_own(self):
        """A caller whose key changed mid-build waits, then builds once."""
        gate = threading.Event()
        factory = Factory(gate=gate)
        key = ["k1"]
        single = process_singleton(key=lambda: key[0])(factory)
        first: list[FakeClient] = []
        builder = threading.Thread(target=lambda: first.append(single()))
        builder.start()
        assert factory.entered.wait(WAIT)
        key[0] = "k2"
        second: list[FakeClient] = []
        waiter = threading.Thread(target=lambda: second.append(single()))
        waiter.start()
        assert blocked_in("_acquire", 1)
        assert 1 == factory.calls
        factory.gate = None
        gate.set()
        for thread in (builder, waiter):
            thread.join(WAIT)
            assert not thread.is_alive()

        # The builder's own call may return either client: the k1 client
        # it built, or, if the waiter's k2 build replaced that before the
        # builder was served, the live k2 client (a call returns only a
        # client that was live when it returned).
        assert 2 == factory.calls
        old, new = factory.built
        assert first[0] in (old, new)
        assert second[0] is new
        assert old.closed
        assert not new.closed
        assert new is single()


class TestReentrancy:
    def test_factory_calling_its_own_singleton_raises(self):
        """A factory that calls its own singleton gets a clear error."""

        @process_singleton
        def make_client() -> FakeClient:
            make_client()
            return FakeClient()  # pragma: no cover

        with pytest.raises(ReentrantBuildError) as info:
            make_client()

        assert isinstance(info.value, PoolkeeperError)
        assert isinstance(info.value, RuntimeError)
        assert "make_client" in str(info.value)
        assert make_client.current() is None
        assert 1 == make_client.statistics().build_failures

    def test_factory_may_use_another_singleton(self):
        """Singletons can be built from other singletons."""
        inner = process_singleton(Factory())

        @process_singleton
        def outer() -> tuple[object, FakeClient]:
            return (inner(), FakeClient())

        assert outer()[0] is inner()
