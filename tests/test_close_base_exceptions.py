"""A BaseException from a close hook: one rule on every close path.

The rule: an ``Exception`` from a close hook is logged and counted, never
raised. Anything else (``KeyboardInterrupt``, ``SystemExit``, a custom
``BaseException``) is counted once and reaches the caller of the close,
after every other client that caller closes was closed, and the state
stays consistent: the next call serves or builds. A close that runs on
another thread (a helper thread, another thread's running loop) hands it
back to the caller rather than raising it there.
"""

from __future__ import annotations

import asyncio
import contextlib
import gc
import os
import sys
import threading

import pytest
from helpers import WAIT, FakeClient

from poolkeeper import (
    UnclosedClientWarning,
    _close,
    aclose_all,
    close_all,
    keys,
    process_singleton,
)


class Custom(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


EXCEPTIONS = [KeyboardInterrupt, SystemExit, Custom]
NAME = "PK_CBE_KEY"


class Raiser:
    """A close hook that closes its client, then raises while armed."""

    def __init__(self, exc: type[BaseException]) -> None:
        self.exc = exc
        self.armed = True
        self.closed: list[object] = []

    def __call__(self, client: object) -> None:
        self.closed.append(client)
        if self.armed:
            raise self.exc

    async def aclose(self, client: object) -> None:
        self(client)


class AClient:
    """An async client counting its aclose() calls."""

    def __init__(self) -> None:
        self.closes = 0

    async def aclose(self) -> None:
        self.closes += 1


async def make_aclient() -> AClient:
    return AClient()


@pytest.fixture(name="env")
def _env(monkeypatch):
    monkeypatch.setenv(NAME, "1")
    yield os.environ
    os.environ.pop(NAME, None)


def counts(single) -> tuple[int, int]:
    stats = single.statistics()
    return stats.closes, stats.close_failures


@pytest.mark.parametrize("exc", EXCEPTIONS)
class TestSyncPaths:
    def test_rotation(self, exc, env):
        """The rebuild that retires raises; the new client is live."""
        hook = Raiser(exc)
        single = process_singleton(key=keys.env(NAME), close=hook)(FakeClient)
        old = single()
        env[NAME] = "2"
        with pytest.raises(exc):
            single()
        hook.armed = False
        assert [old] == hook.closed
        new = single()
        assert new is not old
        assert new is single()
        assert (0, 1) == counts(single)

    def test_lease_end(self, exc):
        """The lease's exit raises, once its client is closed."""
        hook = Raiser(exc)
        single = process_singleton(close=hook)(FakeClient)
        lease = single.lease()
        leased = lease.__enter__()
        assert single.reset()
        assert [] == hook.closed
        with pytest.raises(exc):
            lease.__exit__(None, None, None)
        hook.armed = False
        assert [leased] == hook.closed
        assert single() is not leased
        assert (0, 1) == counts(single)

    def test_reset(self, exc):
        """reset() raises; the client was retired all the same."""
        hook = Raiser(exc)
        single = process_singleton(close=hook)(FakeClient)
        old = single()
        with pytest.raises(exc):
            single.reset()
        hook.armed = False
        assert [old] == hook.closed
        assert single() is not old
        assert (0, 1) == counts(single)

    def test_close_all_skips_no_client(self, exc):
        """close_all() raises after closing every other client."""
        hook = Raiser(exc)
        before = process_singleton(FakeClient)
        bad = process_singleton(close=hook)(FakeClient)
        after = process_singleton(FakeClient)
        clients = [before(), bad(), after()]
        with pytest.raises(exc):
            close_all()
        hook.armed = False
        assert [clients[1]] == hook.closed
        assert clients[0].closed
        assert clients[2].closed
        assert (0, 1) == counts(bad)
        assert bad() is not clients[1]


def run_loop_in_thread(main):
    """Run asyncio.run(main(ready, stop)) in a thread; return its parts."""
    ready = threading.Event()
    box: list[object] = []
    holder: list[object] = []

    async def body():
        stop = asyncio.Event()
        holder.append((asyncio.get_running_loop(), stop))
        await main(ready)
        ready.set()
        await stop.wait()
        return "finished"

    def target():
        try:
            box.append(asyncio.run(body()))
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=target)
    thread.start()
    assert ready.wait(WAIT)
    loop, stop = holder[0]

    def finish():
        loop.call_soon_threadsafe(stop.set)
        thread.join(WAIT)
        assert not thread.is_alive()
        return box[0]

    return finish


@pytest.mark.parametrize("exc", EXCEPTIONS)
class TestAsyncPaths:
    """The same on the running loop: raised in the awaiting code.

    asyncio lets a ``KeyboardInterrupt`` or ``SystemExit`` out of a task
    and stops the loop with it; the close runs in a task of its own (so a
    cancelled caller does not leak the client), so it is carried back.
    """

    @staticmethod
    def _caught(exc, step, hook):
        async def main():
            try:
                await step()
            except exc:
                await asyncio.sleep(0)  # The loop still runs.
                return "caught"
            finally:
                hook.armed = False  # The loop's end closes the rest.
            return "not raised"

        return asyncio.run(main())

    def test_reset(self, exc):
        """``await reset()`` raises; the client was retired all the same."""
        hook = Raiser(exc)
        single = process_singleton(close=hook.aclose)(make_aclient)
        box = []

        async def step():
            box.append(await single())
            await single.reset()

        assert "caught" == self._caught(exc, step, hook)
        assert box == hook.closed
        assert (0, 1) == counts(single)

    def test_rotation(self, exc, env):
        """The await that rebuilds raises; the new client went live."""
        hook = Raiser(exc)
        single = process_singleton(key=keys.env(NAME), close=hook.aclose)(
            make_aclient
        )
        box = []

        async def step():
            box.append(await single())
            env[NAME] = "2"
            await single()

        assert "caught" == self._caught(exc, step, hook)
        # The old client, then (at the loop's end) the new one.
        assert box == hook.closed[:1]
        assert 2 == len(hook.closed)
        assert 2 == single.statistics().builds

    def test_lease_end(self, exc):
        """The lease's exit raises, once its client is closed."""
        hook = Raiser(exc)
        single = process_singleton(close=hook.aclose)(make_aclient)
        box = []

        async def step():
            async with single.lease() as leased:
                box.append(leased)
                await single.reset()
                assert [] == hook.closed

        assert "caught" == self._caught(exc, step, hook)
        assert box == hook.closed
        assert (0, 1) == counts(single)


@pytest.mark.parametrize("exc", EXCEPTIONS)
class TestOtherThreads:
    def test_helper_thread_raises_once_in_the_caller(self, exc):
        """Closing on an idle loop from a running one: raised, counted once."""
        hook = Raiser(exc)
        bad = process_singleton(close=hook.aclose)(make_aclient)
        good = process_singleton(make_aclient)
        idle = asyncio.new_event_loop()
        try:
            bad_client = idle.run_until_complete(bad())
            good_client = idle.run_until_complete(good())

            async def main():
                with pytest.raises(exc):
                    close_all()  # A sync call inside a running loop.

            asyncio.run(main())
            hook.armed = False
            assert [bad_client] == hook.closed
            assert 1 == good_client.closes
            assert (0, 1) == counts(bad)
        finally:
            idle.close()

    def test_other_threads_running_loop_survives(self, exc):
        """close_all() raises here; the client's loop thread runs on."""
        hook = Raiser(exc)
        bad = process_singleton(close=hook.aclose)(make_aclient)
        good = process_singleton(make_aclient)
        clients: list[AClient] = []

        async def main(ready):
            clients.append(await good())
            clients.append(await bad())

        finish = run_loop_in_thread(main)
        try:
            with pytest.raises(exc):
                close_all()
        finally:
            outcome = finish()
        hook.armed = False
        assert "finished" == outcome
        assert [clients[1]] == hook.closed
        assert 1 == clients[0].closes
        assert (0, 1) == counts(bad)

    def test_aclose_all_idle_loop_raises_in_the_awaiter(self, exc):
        """aclose_all() closing on an idle loop: raised to its awaiter."""
        hook = Raiser(exc)
        good = process_singleton(make_aclient)
        bad = process_singleton(close=hook.aclose)(make_aclient)
        idle = asyncio.new_event_loop()
        try:
            good_client = idle.run_until_complete(good())
            bad_client = idle.run_until_complete(bad())
            seen: list[object] = []

            async def main():
                try:
                    await aclose_all()
                except exc:
                    seen.append(exc)

            asyncio.run(main())
            hook.armed = False
            assert [exc] == seen
            assert [bad_client] == hook.closed
            assert 1 == good_client.closes
            assert (0, 1) == counts(bad)
        finally:
            idle.close()

    def test_aclose_all_running_loop_raises_in_the_awaiter(self, exc):
        """aclose_all() closing on another thread's loop: raised here only."""
        hook = Raiser(exc)
        good = process_singleton(make_aclient)
        bad = process_singleton(close=hook.aclose)(make_aclient)
        clients: list[AClient] = []

        async def main(ready):
            clients.append(await good())
            clients.append(await bad())

        finish = run_loop_in_thread(main)
        seen: list[object] = []

        async def closer():
            try:
                await aclose_all()
            except exc:
                seen.append(exc)

        try:
            asyncio.run(closer())
        finally:
            outcome = finish()
        hook.armed = False
        assert "finished" == outcome
        assert [exc] == seen
        assert 1 == clients[0].closes
        assert (0, 1) == counts(bad)


@pytest.mark.parametrize("exc", EXCEPTIONS)
class TestLoopEnd:
    def test_every_client_of_the_slot_is_closed(self, exc, env):
        """A raising close at loop end skips none of the slot's clients."""
        hook = Raiser(exc)
        single = process_singleton(key=keys.env(NAME), close=hook.aclose)(
            make_aclient
        )
        other = process_singleton(make_aclient)
        clients: list[object] = []
        leases: list[object] = []

        async def main():
            clients.append(await other())
            await single()  # Its slot, and the slot's loop-end hook.
            lease = single.lease()
            # Entered unknown to the loop (no firstiter hook), so the loop
            # does not end the lease: it is held when the loop ends.
            hooks = sys.get_asyncgen_hooks()
            sys.set_asyncgen_hooks(firstiter=None, finalizer=None)
            try:
                lease.__aenter__().send(None)
            except StopIteration as stop:
                clients.append(stop.value)
            else:
                pytest.fail("entering the lease suspended")
            finally:
                sys.set_asyncgen_hooks(*hooks)
            leases.append(lease)
            env[NAME] = "2"
            clients.append(await single())

        with contextlib.suppress(exc):
            asyncio.run(main())
        # asyncio left a task holding the exception; collect it now, not at
        # a random later point (CPython 3.11 can fail formatting it then).
        gc.collect()
        hook.armed = False
        retired, live = clients[1], clients[2]
        assert retired is not live
        assert sorted(map(id, [retired, live])) == sorted(map(id, hook.closed))
        assert 1 == clients[0].closes


class TestCancelledOnItsLoop:
    def test_close_all_does_not_raise_the_cancellation(self, monkeypatch):
        """A close that hangs when its loop ends: reported, never raised.

        ``asyncio.run()`` cancels it; it runs once more (a close cut short
        is finished), and hangs again until its bound: counted once, as a
        client left unclosed.
        """
        monkeypatch.setattr(_close, "CROSS_LOOP_CLOSE_SECONDS", 0.5)
        started = threading.Event()

        async def slow(client):
            started.set()
            await asyncio.sleep(WAIT * 10)

        single = process_singleton(close=slow)(make_aclient)
        # Expected from before the threads start: where warnings follow the
        # context (3.14t's default), a thread sees the one it started in.
        with pytest.warns(UnclosedClientWarning, match="not finish in time"):
            box = _close_all_as_the_loop_ends(single, started)
        assert ["returned"] == box
        assert (0, 1) == counts(single)

    @pytest.mark.parametrize("exc", EXCEPTIONS)
    def test_a_base_exception_from_the_rerun_reaches_the_caller(self, exc):
        """The close, cut short by its loop's end, raises when run again.

        Its second run is awaited in the close's own task (not in a task of
        its own, out of which asyncio would let a ``KeyboardInterrupt`` stop
        the loop): the exception reaches close_all()'s caller, counted once.
        """
        started = threading.Event()
        runs: list[int] = []

        async def cut_short_then_raises(client):
            runs.append(1)
            started.set()
            if len(runs) == 1:
                await asyncio.sleep(WAIT * 10)
            await asyncio.sleep(0.01)
            raise exc

        single = process_singleton(close=cut_short_then_raises)(make_aclient)
        box = _close_all_as_the_loop_ends(single, started)
        assert [exc] == [type(b) for b in box]
        assert 2 == len(runs)
        assert (0, 1) == counts(single)


def _close_all_as_the_loop_ends(single, started: threading.Event) -> list:
    """close_all() from a thread; end the client's loop once it closes.

    Returns what close_all() did: ``["returned"]`` or what it raised.
    """

    async def main(ready):
        await single()

    box: list[object] = []

    def close():
        try:
            close_all()
            box.append("returned")
        except BaseException as exc:
            box.append(exc)

    closer = threading.Thread(target=close)
    finish = run_loop_in_thread(main)
    closer.start()
    try:
        assert started.wait(WAIT)
    finally:
        # asyncio.run() cancels the close still running on its loop.
        assert "finished" == finish()
        closer.join(WAIT)
    assert not closer.is_alive()
    return box
