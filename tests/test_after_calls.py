"""A ``KeyboardInterrupt`` right after each call a path makes.

CPython runs a signal handler when a call returns (and on backward jumps):
a Ctrl-C lands between a call and the instruction that uses its result.
Each test here cuts one path (sync or async: builds, leases, resets,
closes, watched writes) after its first call, its second, and so on until
the path makes no more calls, and checks what the path promises whatever
is raised where: a call gets an open client, built for the value the
environment holds; every client the factory built is live, owed or
closed, and closed exactly once in the end; no lease stays counted and no
lock is left held.
"""

from __future__ import annotations

import gc
import sys

import pytest
from attack import AfterCall, no_collector
from helpers import GIL_PARAMS, Factory, made_as_free_threaded

from poolkeeper import close_all, process_singleton
from poolkeeper._sync import ProcessSingleton

#: More calls than any path swept here makes.
MOST = 60


def _cut(code, n: int, step) -> AfterCall:
    """Run *step* with a KeyboardInterrupt after *code*'s *n*-th call."""
    inject = AfterCall(code, n, KeyboardInterrupt)
    with no_collector():
        # Coverage traces this thread too: put its tracer back after.
        previous = sys.gettrace()
        sys.settrace(inject.tracer)
        try:
            step()
        except KeyboardInterrupt:
            if inject.fired is None:
                raise
        finally:
            sys.settrace(previous)
    return inject


def _free(lock) -> bool:
    # An RLock held by another thread (or left held) cannot be taken.
    if not lock.acquire(blocking=False):
        return False
    lock.release()
    return True


def _every_client_closed_once(factory: Factory, where: str | None) -> None:
    close_all()
    for client in factory.built:
        assert 1 == len(client.closes), where


class TestBuildCutAfterACall:
    @pytest.mark.parametrize("rotate", [False, True], ids=["first", "rotate"])
    def test_a_built_client_is_made_live_or_closed(self, rotate):
        """A Ctrl-C after any call of a build: its client is never lost.

        A client the factory returned must end up live or closed (the
        build's own promise, see ``_builds``); cut right after the factory
        returned, before the driver stored it, it was neither.
        """
        code = ProcessSingleton._build.__code__
        fired: list[str] = []
        for n in range(1, MOST):
            factory = Factory()
            single = process_singleton(factory)
            if rotate:
                single()
                assert single.reset()
            inject = _cut(code, n, single)
            life = single._self_life
            assert _free(life.lock), inject.fired
            assert single._self_slot.build is None, inject.fired
            live = single.current()
            for client in factory.built:
                assert client is live or client.closed, inject.fired
            assert single() is factory.built[-1], inject.fired
            _every_client_closed_once(factory, inject.fired)
            if inject.fired is None:
                break  # Past the last call: a cut after each was tried.
            if len(factory.built) > rotate:
                fired.append(inject.fired)  # Cut once the factory returned.
        else:
            pytest.fail("the build made more calls than swept")
        assert fired


def _sweep(code, attempt) -> list[str]:
    """Call *attempt(n)* for n = 1, 2, ... until no cut fires; say where."""
    fired: list[str] = []
    for n in range(1, MOST):
        where = attempt(code, n)
        if where is None:
            return fired  # Past the last call: a cut after each was tried.
        fired.append(where)
    pytest.fail(f"{code.co_name} made more calls than swept")


@pytest.fixture(name="gil", params=GIL_PARAMS)
def _gil(request, monkeypatch):
    """Make singletons as with the GIL on, and as on a free-threaded build."""
    if not request.param:
        made_as_free_threaded(monkeypatch)
    return request.param


class TestLeaseCutAfterACall:
    @pytest.mark.parametrize("where", ["__enter__", "_enter", "_finish"])
    @pytest.mark.parametrize("retired", [False, True], ids=["live", "retired"])
    def test_enter(self, where, retired, gil):
        """Cut in enter: a client returned is open and pinned, or none is.

        retired: the live record is closed to lock-free pins (a retirement
        cut short), so the entry takes its slow path too.
        """

        def attempt(code, n):
            factory = Factory()
            single = process_singleton(factory)
            assert gil is single._self_life.lock_free
            first = single()
            if retired:
                single._self_slot.live.open = False
            lease = single.lease()
            got: list[object] = []
            inject = _cut(code, n, lambda: got.append(lease.__enter__()))
            life = single._self_life
            assert _free(life.lock), inject.fired
            if got:
                assert got == [first], inject.fired
                assert 1 == single.statistics().leases, inject.fired
                assert single.reset()
                assert not first.closed, inject.fired
                lease.__exit__(None, None, None)
            assert 0 == single.statistics().leases, inject.fired
            _every_client_closed_once(factory, inject.fired)
            return inject.fired

        code = getattr(_lease_class(), where).__code__
        fired = _sweep(code, attempt)
        # Slow paths: all of them without the GIL, and a closed record's.
        slow = {"__enter__": True, "_enter": retired or not gil}
        assert bool(fired) is slow.get(where, retired and gil)

    @pytest.mark.parametrize("where", ["__exit__", "_finish"])
    @pytest.mark.parametrize("retired", [False, True], ids=["live", "retired"])
    def test_exit(self, where, retired, gil):
        """Cut in exit: the pin ends, and a retired client closes, once."""

        def attempt(code, n):
            factory = Factory()
            single = process_singleton(factory)
            lease = single.lease()
            client = lease.__enter__()
            if retired:
                assert single.reset()
                assert not client.closed
            inject = _cut(code, n, lambda: lease.__exit__(None, None, None))
            assert _free(single._self_life.lock), inject.fired
            assert 0 == single.statistics().leases, inject.fired
            assert len(client.closes) == retired, inject.fired
            _every_client_closed_once(factory, inject.fired)
            return inject.fired

        code = getattr(_lease_class(), where).__code__
        assert _sweep(code, attempt) or (where, retired) == ("_finish", False)


def _lease_class():
    from poolkeeper._lease import Lease

    return Lease


def _codes():
    from poolkeeper._builds import BuildRun, Rounds
    from poolkeeper._close import Closer
    from poolkeeper._lifecycle import Lifecycle

    return {
        "_acquire": ProcessSingleton._acquire.__code__,
        "_close": ProcessSingleton._close.__code__,
        "reset": ProcessSingleton.reset.__code__,
        "ProcessSingleton._retire": ProcessSingleton._retire.__code__,
        "Lifecycle.reset": Lifecycle.reset.__wrapped__.__code__,
        "locked": Lifecycle.reset.__code__,
        "Closer._start": Closer._start.__code__,
        "Closer.close": Closer.close.__code__,
        "request": Lifecycle.request.__wrapped__.__code__,
        "built": Lifecycle.built.__wrapped__.__code__,
        "_arm": Lifecycle._arm.__code__,
        "_retire": Lifecycle._retire.__code__,
        "BuildRun.end": BuildRun.end.__code__,
        "BuildRun.__exit__": BuildRun.__exit__.__code__,
        "Rounds.ask": Rounds.ask.__code__,
        "Rounds.__exit__": Rounds.__exit__.__code__,
        "Rounds.built": Rounds.built.__code__,
        "Rounds.waited": Rounds.waited.__code__,
        "Rounds.read": Rounds.read.__code__,
    }


class TestCallsCutAfterACall:
    @pytest.mark.parametrize("where", sorted(_codes()))
    @pytest.mark.parametrize("step", ["call", "rotate", "reset"])
    def test_no_closed_client_no_stuck_build(self, where, step):
        """Cut a call, a rotation or a reset after any call it makes.

        Afterwards the lock is free, no build is left in progress, a call
        gets the newest client, open, and every client closes once.
        """

        def attempt(code, n):
            factory = Factory()
            single = process_singleton(factory)
            if step != "call":
                single()
            if step == "rotate":
                assert single.reset()
            act = single.reset if step == "reset" else single
            inject = _cut(code, n, act)
            assert _free(single._self_life.lock), inject.fired
            assert single._self_slot.build is None, inject.fired
            client = single()
            assert client is factory.built[-1], inject.fired
            assert not client.closed, inject.fired
            assert single() is client, inject.fired
            # Each is live, closed, or owed: close_all() closes it.
            owed = [r.client for r in single._self_life.owed]
            for built in factory.built:
                assert (
                    any(built is c for c in (client, *owed)) or built.closed
                ), inject.fired
            _every_client_closed_once(factory, inject.fired)
            return inject.fired

        _sweep(_codes()[where], attempt)


ENV = "PK_AFTER_CALLS"


def _env_codes():
    import os

    from poolkeeper import keys
    from poolkeeper._lifecycle import Lifecycle

    # A watched name swaps os.environ's write hook in.
    process_singleton(key=keys.env(ENV))(object)
    return {
        "invalidate": Lifecycle.invalidate.__code__,
        "__setitem__": type(os.environ).__setitem__.__code__,
        "_disarm": Lifecycle._disarm.__code__,
    }


class TestWatchedWriteCutAfterACall:
    @pytest.mark.parametrize("where", ["invalidate", "__setitem__", "_disarm"])
    def test_a_call_after_the_write_gets_the_value_stored(
        self, where, gil, monkeypatch
    ):
        """A write cut after any call: calls then get the value it left."""
        import os

        from poolkeeper import keys

        monkeypatch.setenv(ENV, "a")
        codes = _env_codes()
        gc.collect()  # No other watcher of ENV: one invalidate per write.
        single = process_singleton(key=keys.env(ENV))(
            lambda: [os.environ.get(ENV)]
        )

        def attempt(code, n):
            os.environ[ENV] = "a"
            assert ["a"] == single()
            assert ["a"] == single()  # Armed.
            inject = _cut(code, n, lambda: os.environ.__setitem__(ENV, "b"))
            now = os.environ.get(ENV)
            assert [now] == single(), inject.fired
            assert [now] == single(), inject.fired
            assert _free(single._self_life.lock), inject.fired
            return inject.fired

        assert _sweep(codes[where], attempt)


def _async_codes():
    from poolkeeper._async import AsyncProcessSingleton
    from poolkeeper._builds import Rounds
    from poolkeeper._close import aclose_here
    from poolkeeper._lifecycle import Lifecycle

    return {
        "_build": AsyncProcessSingleton._build.__code__,
        "_acquire": AsyncProcessSingleton._acquire.__code__,
        "Rounds.ask": Rounds.ask.__code__,
        "Rounds.__exit__": Rounds.__exit__.__code__,
        "_close": AsyncProcessSingleton._close.__code__,
        "aclose_here": aclose_here.__code__,
        "reset": AsyncProcessSingleton.reset.__code__,
        "AsyncProcessSingleton._retire": (
            AsyncProcessSingleton._retire.__code__
        ),
        "lease": AsyncProcessSingleton.lease.__wrapped__.__code__,
        "locked": Lifecycle.lease.__code__,
    }


class TestAsyncCutAfterACall:
    # Cut between making a close's coroutine and awaiting it, the close is
    # still owed (the loop's end closes it); the coroutine object is not.
    @pytest.mark.filterwarnings(
        "ignore:coroutine .* was never awaited:RuntimeWarning"
    )
    @pytest.mark.parametrize("where", sorted(_async_codes()))
    @pytest.mark.parametrize("step", ["call", "rotate", "reset", "lease"])
    def test_no_closed_client_every_client_closed_once(self, where, step):
        """The async driver cut after any call: the same promises."""
        import asyncio

        def attempt(code, n):
            factory = Factory()

            @process_singleton
            async def single():
                return factory()

            inject = AfterCall(code, n, KeyboardInterrupt)

            async def lease():
                async with single.lease() as leased:
                    assert not leased.closed
                    assert await single.reset()
                    assert not leased.closed

            async def main():
                if step != "call":
                    await single()
                if step == "rotate":
                    assert await single.reset()
                act = {"reset": single.reset, "lease": lease}.get(step, single)
                previous = sys.gettrace()
                sys.settrace(inject.tracer)
                try:
                    await act()
                except KeyboardInterrupt:
                    if inject.fired is None:
                        raise
                finally:
                    sys.settrace(previous)
                assert 0 == single.statistics().leases, inject.fired
                client = await single()
                assert client is factory.built[-1], inject.fired
                assert not client.closed, inject.fired
                assert client is await single(), inject.fired

            with no_collector():
                asyncio.run(main())
            close_all()
            for client in factory.built:
                assert 1 == len(client.closes), inject.fired
            return inject.fired

        _sweep(_async_codes()[where], attempt)
