"""Builds cut short at every line, and builders interrupted mid-factory.

The invariants checked after each cut: every caller ends (bounded waits),
the next call works, no build is left recorded, and every client built is
the live one or was closed exactly once.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading

import pytest
from attack import Inject, join, no_collector, run
from helpers import WAIT, Factory, FakeClient, blocked_in

from poolkeeper import close_all, process_singleton
from poolkeeper._close import Closer


class Custom(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


async def make_client() -> FakeClient:
    await asyncio.sleep(0)
    return FakeClient()


class Once:
    """Wraps a lifecycle transition so that its first call raises *exc*."""

    def __init__(self, method, exc: type[BaseException]) -> None:
        self.method = method
        self.exc = exc
        self.raised = False

    def __call__(self, *args, **kwargs):
        if not self.raised:
            self.raised = True
            raise self.exc
        return self.method(*args, **kwargs)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, Custom])
class TestBuilderInterrupted:
    def test_waiters_retry_instead_of_raising_it(self, exc):
        """The builder's KeyboardInterrupt is its own: waiters get a client."""
        gate = threading.Event()
        factory = Factory(gate=gate)
        calls: list[int] = []

        def build():
            calls.append(1)
            client = factory()
            if len(calls) == 1:
                raise exc
            return client

        single = process_singleton(build)
        builder, b_box = run(single)
        assert factory.entered.wait(WAIT)
        waiters = [run(single) for _ in range(3)]
        assert blocked_in("_acquire", 3)
        gate.set()
        join(builder, *(w for w, _ in waiters))
        assert isinstance(b_box[0], exc)
        live = single()
        assert [[live]] * 3 == [box for _, box in waiters]
        # The builder's factory call raised: counted (issue 25, point 7).
        assert 1 == single.statistics().build_failures


class TestAsyncBuilderInterrupted:
    def test_async_waiters_retry(self):
        """In a task too (asyncio lets KeyboardInterrupt out of the loop)."""
        exc = Custom
        calls: list[int] = []

        async def build():
            calls.append(1)
            await asyncio.sleep(0)
            if len(calls) == 1:
                raise exc
            return FakeClient()

        single = process_singleton(build)

        async def main():
            tasks = [asyncio.ensure_future(single()) for _ in range(4)]
            await asyncio.wait(tasks, timeout=WAIT)
            return [t.exception() or t.result() for t in tasks]

        results = asyncio.run(main())
        assert isinstance(results[0], exc)
        assert 2 == len(calls)
        assert 1 == len({id(r) for r in results[1:]})
        assert isinstance(results[1], FakeClient)


@pytest.mark.parametrize("exc", [KeyboardInterrupt, Custom, RuntimeError])
class TestSettle:
    def test_sync_cut_after_the_factory_makes_the_client_live(self, exc):
        """built() cut short: the build settles, the client made live."""
        factory = Factory()
        single = process_singleton(factory)
        life = single._self_life
        life.built = Once(life.built, exc)
        with pytest.raises(exc):
            single()
        assert [single()] == factory.built
        assert single._self_slot.build is None
        assert 1 == single.statistics().builds

    def test_sync_cut_while_recording_a_failure(self, exc):
        """failed() cut short: the build still ends; the next call builds."""
        factory = Factory(fail_with=OSError("down"))
        single = process_singleton(factory)
        life = single._self_life
        life.failed = Once(life.failed, exc)
        with pytest.raises(exc):
            single()
        assert single._self_slot.build is None
        factory.fail_with = None
        assert [single()] == factory.built


@pytest.mark.parametrize("exc", [asyncio.CancelledError, Custom, RuntimeError])
class TestSettleAsync:
    def test_cut_after_the_factory_makes_the_client_live(self, exc):
        """The async build settles too: its client is made live."""
        built: list[FakeClient] = []

        async def build():
            built.append(FakeClient())
            return built[-1]

        single = process_singleton(build)
        life = single._self_life
        life.built = Once(life.built, exc)

        async def main():
            with pytest.raises(exc):
                await single()
            return await single()

        assert built == [asyncio.run(main())]
        assert 1 == single.statistics().builds

    @pytest.mark.parametrize("cancel", [False, True])
    def test_cut_while_recording_a_failure(self, exc, cancel):
        """failed() cut short in a task; the next await builds."""
        calls: list[int] = []

        async def build():
            calls.append(1)
            if len(calls) == 1:
                if cancel:
                    raise asyncio.CancelledError
                raise OSError("down")
            return FakeClient()

        single = process_singleton(build)
        life = single._self_life
        life.failed = Once(life.failed, exc)

        async def main():
            with pytest.raises(exc):
                await single()
            slot = next(iter(life.slots.values()))
            assert slot.build is None
            return await single()

        assert isinstance(asyncio.run(main()), FakeClient)
        assert 2 == len(calls)


class TestBuildNeverBegun:
    """request() made the caller the builder; an exception came before."""

    @pytest.mark.parametrize("exc", [KeyboardInterrupt, Custom, OSError])
    def test_sync_waiters_retry(self, exc):
        """The unbegun build is settled: waiters build, none hangs."""
        gate = threading.Event()
        factory = Factory(gate=gate)
        single = process_singleton(factory)
        cls = type(single)
        begin = cls._build
        first = threading.Event()

        def cut(self, ticket):
            if not first.is_set():
                first.set()
                # Hold the ticket until the waiters wait for it.
                assert blocked_in("_acquire", 2)
                raise exc
            return begin(self, ticket)

        cls._build = cut
        builder, b_box = run(single)
        assert first.wait(WAIT)
        waiters = [run(single) for _ in range(2)]
        gate.set()
        join(builder, *(w for w, _ in waiters))
        assert isinstance(b_box[0], exc)
        live = single()
        assert [[live], [live]] == [box for _, box in waiters]
        assert [live] == factory.built

    @pytest.mark.parametrize("exc", [asyncio.CancelledError, Custom, OSError])
    def test_async_waiters_retry(self, exc):
        """The same for tasks: the waiting tasks build, none hangs."""
        single = process_singleton(make_client)
        cls = type(single)
        begin = cls._build
        cut_once: list[int] = []

        def cut(self, ticket, loop):
            if not cut_once:
                cut_once.append(1)
                raise exc
            return begin(self, ticket, loop)

        cls._build = cut

        async def main():
            tasks = [asyncio.ensure_future(single()) for _ in range(3)]
            _, pending = await asyncio.wait(tasks, timeout=WAIT)
            assert not pending, "a caller hung"
            return tasks

        tasks = asyncio.run(main())
        assert tasks[0].cancelled() or isinstance(tasks[0].exception(), exc)
        results = {id(t.result()) for t in tasks[1:]}
        assert 1 == len(results)


class TestOverrideCutShort:
    @pytest.mark.parametrize("exc", [KeyboardInterrupt, Custom])
    def test_push_cut_short_is_popped(self, exc):
        """An override whose push is cut short does not outlive its block."""
        single = process_singleton(FakeClient)
        live = single()
        life = single._self_life
        life._arm = Once(life._arm, exc)
        with pytest.raises(exc), single.override("stand-in"):
            pass  # Not reached: entering raised.
        assert live is single()
        assert not single.statistics().is_overridden

    @pytest.mark.parametrize("keyed", [False, True], ids=["no key", "polled"])
    def test_pop_cut_at_every_line_still_ends_the_override(self, keyed):
        """An exception at any line of the block's exit: the override ends.

        The first pop may be cut between its disarm and its commit; the
        exit's second layer pops again. Afterwards every call gets the live
        client, armed or not.
        """
        fired_any = False
        for n in range(1, 40):
            key = (lambda: "k") if keyed else None
            single = process_singleton(key=key)(FakeClient)
            live = single()
            single()
            inject = Inject(n, KeyboardInterrupt)
            block = single.override("stand-in")
            assert "stand-in" == block.__enter__()
            assert "stand-in" == single()
            # Coverage traces this thread too: put its tracer back after.
            previous = sys.gettrace()
            sys.settrace(inject.tracer)
            try:
                inject.armed = True
                block.__exit__(None, None, None)
            except KeyboardInterrupt:
                pass
            finally:
                sys.settrace(previous)
            if inject.fired is None:
                break  # Past the exit's last line: every line was cut.
            fired_any = True
            assert not single.statistics().is_overridden, inject.fired
            assert live is single(), inject.fired
            assert live is single(), inject.fired
        else:
            pytest.fail("the exit ran more lines than the sweep covers")
        assert fired_any


async def _async_cut_at(n: int, exc: type[BaseException]) -> str | None:
    built: list[FakeClient] = []
    gate = asyncio.Event()
    inject = Inject(n, exc)

    async def factory():
        await gate.wait()
        built.append(FakeClient())
        inject.armed = True
        return built[-1]

    single = process_singleton(key=lambda: "k")(factory)
    tasks = [asyncio.ensure_future(single()) for _ in range(3)]
    await asyncio.sleep(0)
    with no_collector():
        # Coverage traces this thread too: put its tracer back after.
        previous = sys.gettrace()
        sys.settrace(inject.tracer)
        try:
            gate.set()
            _, pending = await asyncio.wait(tasks, timeout=WAIT)
        finally:
            sys.settrace(previous)
    assert not pending, "a caller hung"
    live = await asyncio.wait_for(single(), WAIT)
    assert all(s.build is None for s in single._self_life.slots.values())
    for client in built:
        assert (0 if client is live else 1) == len(client.closes)
    for task in tasks:
        if not task.cancelled() and task.exception() is None:
            assert task.result() is live
    return inject.fired


def sweep(cut, exc) -> int:
    """Cut at line 1, 2, ... until the build runs out of lines."""
    for n in range(1, 1000):
        if cut(n, exc) is None:
            return n
    pytest.fail("the sweep never ended")


class TestEveryLine:
    # The sync driver's sweep is test_guarantees.py's TestBuildAlwaysEnds.

    @pytest.mark.parametrize("exc", [asyncio.CancelledError, Custom, OSError])
    def test_async(self, exc):
        """A task's build cut at each line after its factory returned."""
        assert sweep(lambda n, e: asyncio.run(_async_cut_at(n, e)), exc) > 10


def _close_once_raises(monkeypatch, exc: type[BaseException]) -> None:
    """The next close raises *exc* before it begins (as a signal could)."""
    original = Closer.close
    raised: list[bool] = []

    def close(self, record):
        if not raised:
            raised.append(True)
            raise exc
        return original(self, record)

    monkeypatch.setattr(Closer, "close", close)


def _interrupted_reset(monkeypatch, exc: type[BaseException]):
    """A built singleton whose reset() raised *exc* before its close began."""
    single = process_singleton(FakeClient)
    client = single()
    _close_once_raises(monkeypatch, exc)
    with pytest.raises(exc):
        single.reset()
    assert not client.closed
    return single, client


class TestCloseCutShortBeforeItBegan:
    """A close decided, then cut short before its hook ran, is still owed."""

    @pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, Custom])
    def test_close_all_does_it_once(self, exc, monkeypatch):
        """reset() interrupted before its close: close_all() closes it."""
        single, client = _interrupted_reset(monkeypatch, exc)
        assert single._self_life.owes(single._self_life.owed[0])
        close_all()
        close_all()
        assert client.closed
        stats = single.statistics()
        assert (1, 0) == (stats.closes, stats.close_failures)

    def test_the_next_close_of_the_singleton_does_it(self, monkeypatch):
        """A sync singleton's next close finishes what was owed first."""
        single, first = _interrupted_reset(monkeypatch, KeyboardInterrupt)
        second = single()  # Its build's close step does the owed one.
        assert first.closed
        single.reset()
        assert second.closed
        assert [os.getpid()] == first.closes
        assert 2 == single.statistics().closes

    def test_a_forked_child_never_does_the_parents(self, monkeypatch):
        """What the parent owed is the parent's: the child closes none."""
        if not hasattr(os, "fork"):
            pytest.skip("needs os.fork")
        single, client = _interrupted_reset(monkeypatch, KeyboardInterrupt)
        pid = os.fork()
        if pid == 0:  # pragma: no cover -- the child reports by exit code.
            code = 1
            try:
                close_all()
                code = (
                    0
                    if not client.closed and not single._self_life.owed
                    else 2
                )
            finally:
                os._exit(code)
        _, status = os.waitpid(pid, 0)
        assert 0 == os.waitstatus_to_exitcode(status)
        close_all()
        assert client.closed
