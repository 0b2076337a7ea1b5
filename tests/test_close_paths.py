"""Every way a retired client gets closed, and every way that can fail."""

from __future__ import annotations

import asyncio
import contextlib
import gc
import threading
import warnings
from typing import TYPE_CHECKING

import pytest
from helpers import WAIT, FakeClient, LoopThread

from poolkeeper import (
    UnclosedClientWarning,
    _close,
    aclose_all,
    close_all,
    process_singleton,
)

if TYPE_CHECKING:
    from collections.abc import Iterator


class Stop(BaseException):
    """A BaseException that is neither cancellation nor Ctrl-C."""


class Awaitable:
    """An awaitable that is not a coroutine (a future-like object)."""

    def __await__(self):
        return iter(())


class AsyncClient:
    """An async client that records the loop it was closed on."""

    def __init__(self) -> None:
        self.closed_on: list[asyncio.AbstractEventLoop] = []
        self.release: asyncio.Event | None = None

    async def aclose(self) -> None:
        if self.release is not None:
            await asyncio.wait_for(self.release.wait(), WAIT)
        self.closed_on.append(asyncio.get_running_loop())


def async_single(**options):
    """Return an async singleton of AsyncClient and the clients it built."""
    built: list[AsyncClient] = []

    async def build() -> AsyncClient:
        client = AsyncClient()
        built.append(client)
        return client

    return process_singleton(**options)(build), built


class RefusingLoop(asyncio.SelectorEventLoop):
    """A loop that refuses to run anything once *refuse* is set."""

    refuse = False

    def run_until_complete(self, future):
        if self.refuse:
            if asyncio.iscoroutine(future):
                future.close()
            raise RuntimeError("this loop refuses to run")
        return super().run_until_complete(future)


class TestSyncClose:
    def test_ctrl_c_from_a_close_hook_is_counted_and_propagates(self):
        """A KeyboardInterrupt from close= reaches reset()'s caller."""

        def interrupt(client):
            raise KeyboardInterrupt

        single = process_singleton(close=interrupt)(FakeClient)
        single()
        with pytest.raises(KeyboardInterrupt):
            single.reset()
        stats = single.statistics()
        assert (0, 1) == (stats.closes, stats.close_failures)
        assert None is single.current()

    def test_non_coroutine_awaitable_from_a_sync_close_is_reported(self):
        """A sync close returning a future-like object warns, never drops."""
        single = process_singleton(close=lambda client: Awaitable())(
            FakeClient
        )
        single()
        with pytest.warns(UnclosedClientWarning, match="cannot await"):
            single.reset()
        assert 1 == single.statistics().close_failures

    def test_ctrl_c_in_close_all_closes_the_others_first(self):
        """close_all() closes every client, then raises the interrupt."""
        calm = process_singleton(FakeClient)

        def interrupt(client):
            raise KeyboardInterrupt

        loud = process_singleton(close=interrupt)(FakeClient)
        first, _ = calm(), loud()
        with pytest.raises(KeyboardInterrupt):
            close_all()
        assert first.closed
        assert 1 == loud.statistics().close_failures


class TestAsyncClose:
    def test_client_without_aclose_is_dropped(self):
        """reset() of an async client with no close method closes nothing."""

        async def build() -> object:
            return object()

        single = process_singleton(build)

        async def main():
            await single()
            return await single.reset()

        assert asyncio.run(main())
        stats = single.statistics()
        assert (0, 0) == (stats.closes, stats.close_failures)

    def test_base_exception_from_an_awaited_close_propagates(self):
        """A BaseException from an awaited aclose() is counted and raised."""

        async def stop(client):
            await asyncio.sleep(0)
            raise Stop

        single, _ = async_single(close=stop)

        async def main():
            await single()
            with pytest.raises(Stop):
                await single.reset()

        asyncio.run(main())
        assert 1 == single.statistics().close_failures

    def test_close_all_on_the_clients_own_loop_refuses(self):
        """close_all() inside the client's loop says to await aclose_all().

        It cannot await the close there, and a close it scheduled instead
        was cancelled by asyncio.run (issue 25, point 3): it closes nothing
        and raises; aclose_all() then closes the client on its loop.
        """
        single, _ = async_single()

        async def main():
            client = await single()
            with pytest.raises(
                RuntimeError, match=r"await poolkeeper\.aclose_all\(\)"
            ):
                close_all()
            assert [] == client.closed_on
            assert client is await single()  # Still live.
            await aclose_all()
            return client, asyncio.get_running_loop()

        client, loop = asyncio.run(main())
        assert [loop] == client.closed_on
        assert (1, 0) == (
            single.statistics().closes,
            single.statistics().close_failures,
        )

    def test_close_all_runs_an_idle_loop_to_close(self):
        """close_all() with no loop running closes on the idle client loop."""
        single, _ = async_single()
        loop = asyncio.new_event_loop()
        try:
            client = loop.run_until_complete(single())
            close_all()
            assert [loop] == client.closed_on
        finally:
            loop.close()

    def test_close_all_inside_a_loop_closes_an_idle_loop_on_a_thread(self):
        """From a running loop, an idle loop's client closes on that loop."""
        single, _ = async_single()
        idle = asyncio.new_event_loop()
        try:
            client = idle.run_until_complete(single())

            async def main():
                close_all()

            asyncio.run(main())
            assert [idle] == client.closed_on
        finally:
            idle.close()
        assert 1 == single.statistics().closes

    def test_close_all_inside_a_loop_reports_a_loop_that_refuses(self, caplog):
        """An idle loop that cannot run the close is logged and counted."""
        single, _ = async_single()
        idle = RefusingLoop()
        try:
            client = idle.run_until_complete(single())
            idle.refuse = True

            async def main():
                close_all()

            asyncio.run(main())
        finally:
            idle.close()
        assert [] == client.closed_on
        assert 1 == single.statistics().close_failures
        assert "RuntimeError raised at" in caplog.text
        assert "this loop refuses to run" not in caplog.text

    def test_aclose_all_reports_an_idle_loop_that_refuses(self, caplog):
        """aclose_all() logs and counts a close its loop would not run."""
        single, _ = async_single()
        idle = RefusingLoop()
        try:
            client = idle.run_until_complete(single())
            idle.refuse = True
            asyncio.run(aclose_all())
        finally:
            idle.close()
        assert [] == client.closed_on
        assert 1 == single.statistics().close_failures
        assert "RuntimeError raised at" in caplog.text
        assert "this loop refuses to run" not in caplog.text

    def test_aclose_all_raises_a_base_exception_after_the_others(self):
        """aclose_all() closes every client before raising a BaseException."""

        def stop(client):
            raise Stop

        calm = process_singleton(FakeClient)
        loud = process_singleton(close=stop)(FakeClient)
        first, _ = calm(), loud()
        with pytest.raises(Stop):
            asyncio.run(aclose_all())
        assert first.closed
        assert 1 == loud.statistics().close_failures


def _aclose_all_now() -> None:
    asyncio.run(aclose_all())


class TestCrossLoopTimeout:
    @pytest.mark.parametrize("shutdown", [close_all, _aclose_all_now])
    def test_gives_up_on_a_slow_close_elsewhere(self, monkeypatch, shutdown):
        """Shutdown waits a bounded time for another loop's close."""
        monkeypatch.setattr(_close, "CROSS_LOOP_CLOSE_SECONDS", 0.1)
        single, _ = async_single()
        other = LoopThread()
        try:
            client = other.run(single())
            client.release = other.run(_event())
            with pytest.warns(UnclosedClientWarning, match="not finish"):
                shutdown()
            other.loop.call_soon_threadsafe(client.release.set)
            other.run(_settle())
        finally:
            other.stop()
        assert [] == client.closed_on
        # Cancelled when given up on: one failure, counted once.
        stats = single.statistics()
        assert (0, 1) == (stats.closes, stats.close_failures)

    def test_close_all_gives_up_on_a_slow_close_on_a_helper_thread(
        self, monkeypatch
    ):
        """A close on a helper thread is waited for a bounded time."""
        monkeypatch.setattr(_close, "CROSS_LOOP_CLOSE_SECONDS", 0.1)
        gate = threading.Event()

        def slow(client):
            assert gate.wait(WAIT)

        async def build() -> object:
            return object()

        single = process_singleton(close=slow)(build)
        idle = asyncio.new_event_loop()
        try:
            idle.run_until_complete(single())

            async def main():
                close_all()

            with pytest.warns(UnclosedClientWarning, match="not finish"):
                asyncio.run(main())
            gate.set()
            helper = [
                t
                for t in threading.enumerate()
                if t.name == "poolkeeper-close"
            ]
            for thread in helper:
                thread.join(WAIT)
                assert not thread.is_alive()
        finally:
            gate.set()
            idle.close()
        # The close given up on finished later and counted itself, once.
        stats = single.statistics()
        assert (1, 0) == (stats.closes, stats.close_failures)


async def _event() -> asyncio.Event:
    return asyncio.Event()


async def _settle() -> None:
    """Let the loop finish what a cancelled close left to do."""
    for _ in range(10):
        await asyncio.sleep(0)


class TestLoopEndsWithTheCloseQueued:
    """The client's loop ends after a close was handed to it, before it ran.

    The close never runs: the client is reported unclosed and counted once,
    shutdown does not wait for it, and no coroutine is left un-awaited (the
    close's coroutine is made on the loop, when it takes the hand-over).
    """

    @pytest.mark.parametrize("shutdown", [close_all, _aclose_all_now])
    def test_reported_and_nothing_left_unawaited(self, shutdown):
        single, _ = async_single()
        other = LoopThread()
        client = other.run(single())
        blocked, go, queued = (threading.Event() for _ in range(3))
        hand = other.loop.call_soon_threadsafe

        def block():
            # Holds the loop until the close is queued, then stops it: the
            # close, queued during this turn, is never run.
            blocked.set()
            assert go.wait(WAIT)
            other.loop.stop()

        def spy(callback, *args, **kwargs):
            handle = hand(callback, *args, **kwargs)
            queued.set()
            return handle

        hand(block)
        assert blocked.wait(WAIT)
        other.loop.call_soon_threadsafe = spy
        # Reported by the waiting caller, or at the hand-over's collection,
        # whichever comes first (a thread started here records here too).
        with _recorded() as seen:
            shutter = threading.Thread(target=shutdown)
            shutter.start()
            try:
                assert queued.wait(WAIT)
            finally:
                go.set()
                other.thread.join(WAIT)
            assert not other.thread.is_alive()
            # The queued hand-over is dropped with the loop's queue.
            other.loop.close()
            gc.collect()
            shutter.join(WAIT)
        assert not shutter.is_alive()
        _reported_once(single, client, seen, "ended before the close ran")


class ClosingLoop(asyncio.SelectorEventLoop):
    """A loop closed by another thread just as a close is about to run it."""

    closing = False

    def run_until_complete(self, future):
        if self.closing:
            self.close()
        return super().run_until_complete(future)


class TestIdleLoopClosedMeanwhile:
    def test_reported_and_nothing_left_unawaited(self):
        """Seen idle, closed before it could run the close: reported."""
        single, client, seen = _close_all_on(ClosingLoop(), "closing")
        _reported_once(single, client, seen, "its event loop is closed")


def _reported_once(single, client, seen, why: str) -> None:
    """*client* was not closed, counted once, and reported saying *why*.

    And no coroutine was left un-awaited (its warning would be in *seen*).
    """
    assert [] == client.closed_on
    stats = single.statistics()
    assert (0, 1) == (stats.closes, stats.close_failures)
    messages = [str(w.message) for w in seen]
    assert any(why in m for m in messages), messages
    assert not any("never awaited" in m for m in messages), messages


class BusyLoop(asyncio.SelectorEventLoop):
    """A loop that another thread starts running just as a close runs it."""

    busy = False

    def run_until_complete(self, future):
        if self.busy:
            raise RuntimeError("This event loop is already running")
        return super().run_until_complete(future)


class ClosedAtHandOver(asyncio.SelectorEventLoop):
    """A loop seen running on another thread, closed as a close is handed."""

    pretend = False

    def is_running(self) -> bool:
        return self.pretend or super().is_running()

    def call_soon_threadsafe(self, *args, **kwargs):
        if self.pretend:
            self.pretend = False
            self.close()
        return super().call_soon_threadsafe(*args, **kwargs)


class TestLoopStateChangedMeanwhile:
    def test_an_idle_loop_started_elsewhere_fails_the_close(self, caplog):
        """Seen idle, then running: the close fails, logged and counted."""
        single, client, seen = _close_all_on(BusyLoop(), "busy")
        assert [] == client.closed_on
        stats = single.statistics()
        assert (0, 1) == (stats.closes, stats.close_failures)
        assert "RuntimeError raised at" in caplog.text
        messages = [str(w.message) for w in seen]
        assert not any("never awaited" in m for m in messages), messages

    def test_a_running_loop_closed_at_the_hand_over(self):
        """Seen running, closed before it took the close: reported."""
        single, client, seen = _close_all_on(ClosedAtHandOver(), "pretend")
        _reported_once(single, client, seen, "ended before the close ran")


@contextlib.contextmanager
def _recorded() -> Iterator[list[warnings.WarningMessage]]:
    """Record every warning given here, or in a thread started here."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        yield seen


def _close_all_seen() -> list[warnings.WarningMessage]:
    """close_all(), then a collection; return every warning they gave."""
    with _recorded() as seen:
        close_all()
        gc.collect()
    return seen


def _close_all_on(loop: asyncio.AbstractEventLoop, flag: str):
    """Build a client on *loop*, set its *flag*, close_all(): what it gave.

    Returns the singleton, the client and the warnings; *loop* is closed.
    """
    single, _ = async_single()
    try:
        client = loop.run_until_complete(single())
        setattr(loop, flag, True)
        seen = _close_all_seen()
    finally:
        setattr(loop, flag, False)
        loop.close()
    return single, client, seen


class PartedClient:
    """An async client whose close shuts its parts one await at a time.

    Idempotent, as an SDK's close is: a part shut stays shut, and a second
    close shuts what the first did not reach. The first close hangs after
    its first part (with *hang*), as on a server that does not answer,
    until it is cancelled; each part takes a few milliseconds.
    """

    PARTS = 4

    def __init__(self, *, hang: bool) -> None:
        self.open = set(range(self.PARTS))
        self.runs = 0
        self.hang = hang

    async def aclose(self) -> None:
        self.runs += 1
        hang = self.hang and self.runs == 1
        for part in sorted(self.open):
            await asyncio.sleep(0.005)
            self.open.discard(part)
            if hang:
                await asyncio.sleep(WAIT)

    @property
    def hanging(self) -> bool:
        """Whether the first close shut one part and now hangs."""
        return self.runs == 1 and len(self.open) == self.PARTS - 1


def parted_single(*, hang: bool = True):
    """Return an async singleton of PartedClient and the clients it built."""
    built: list[PartedClient] = []

    async def build() -> PartedClient:
        client = PartedClient(hang=hang)
        built.append(client)
        return client

    return process_singleton(build), built


async def _until(predicate) -> None:
    """Let the loop run until *predicate()* holds (bounded)."""
    for _ in range(int(WAIT / 0.001)):
        if predicate():
            return
        await asyncio.sleep(0.001)
    raise AssertionError("never held")


class TestLoopEndsWithTheCloseRunning:
    """``asyncio.run()`` ends while a close runs in a task of its own.

    It cancels every task before the loop's shutdown, the close's task too.
    A close no caller cancelled is run once more, to its end: every part
    of the client is shut, the close is counted once and as a success, and
    nothing is reported unclosed.
    """

    def test_a_close_shielded_from_its_caller(self):
        single, built = parted_single()

        async def main():
            await single()
            # The reset awaits the close in a task of its own (shielded).
            asyncio.get_running_loop().create_task(single.reset())
            await _until(lambda: built[0].hanging)

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            asyncio.run(main())
        _closed_whole(single, built[0], seen)

    def test_a_close_handed_over_by_another_thread(self):
        single, built = parted_single()
        shutter, raised = _shutter()

        async def main():
            await single()
            shutter.start()
            await _until(lambda: built[0].hanging)

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            asyncio.run(main())
            shutter.join(WAIT)
        assert not shutter.is_alive()
        assert [] == raised
        _closed_whole(single, built[0], seen)

    def test_a_close_scheduled_by_the_collector_on_its_loop(self, caplog):
        built: list[PartedClient] = []

        async def main():
            async def build() -> PartedClient:
                client = PartedClient(hang=True)
                built.append(client)
                return client

            single = process_singleton(build)
            await single()
            # Collected on the loop's thread: its client's close is
            # scheduled on the loop, and nothing awaits it.
            del single
            gc.collect()
            await _until(lambda: built[0].hanging)

        with warnings.catch_warnings(record=True) as seen:
            warnings.simplefilter("always")
            asyncio.run(main())
        assert set() == built[0].open
        assert 2 == built[0].runs
        assert [] == [w for w in seen if w.category is UnclosedClientWarning]
        assert [] == [r for r in caplog.records if r.name == "poolkeeper"]

    def test_a_close_given_up_on_is_not_run_again(self, monkeypatch):
        """The caller's cancellation ends the close: it is not rerun."""
        monkeypatch.setattr(_close, "CROSS_LOOP_CLOSE_SECONDS", 0.2)
        single, built = parted_single()
        other = LoopThread()
        try:
            other.run(single())
            with pytest.warns(UnclosedClientWarning, match="not finish"):
                close_all()
            other.run(_settle())
        finally:
            other.stop()
        assert 1 == built[0].runs
        assert PartedClient.PARTS - 1 == len(built[0].open)
        stats = single.statistics()
        assert (0, 1) == (stats.closes, stats.close_failures)


def _shutter() -> tuple[threading.Thread, list[BaseException]]:
    """A thread (not started) to run close_all(), and what it raised."""
    raised: list[BaseException] = []

    def shut():
        try:
            close_all()
        except BaseException as exc:
            raised.append(exc)

    return threading.Thread(target=shut), raised


def _closed_whole(single, client: PartedClient, seen) -> None:
    assert set() == client.open
    assert 2 == client.runs
    stats = single.statistics()
    assert (1, 0) == (stats.closes, stats.close_failures)
    assert [] == [w for w in seen if w.category is UnclosedClientWarning]


class TestHandOverTakenAfterTheLoopCancelledItsTasks:
    """A close handed over starts after ``asyncio.run()`` cancelled all tasks.

    Its task is not among those ``asyncio.run()`` waits for, and the loop
    would be closed with it unfinished (the close never counted, the task
    "destroyed but pending"): the loop's end waits for it.
    """

    def test_the_loops_end_waits_for_it(self, caplog):
        single, built = parted_single(hang=False)
        held: list[object] = []
        caught = threading.Event()
        shutter, raised = _shutter()

        async def main():
            await single()
            loop = asyncio.get_running_loop()
            queue = loop.call_soon_threadsafe

            def spy(callback, *args, **kwargs):
                # Held back: the hand-over's start, run below.
                if getattr(callback, "__name__", "") == "start":
                    held.append(callback)
                    caught.set()
                    return None
                return queue(callback, *args, **kwargs)

            loop.call_soon_threadsafe = spy
            shutter.start()
            await _until(caught.is_set)

            async def cancelled_at_the_end():
                try:
                    await asyncio.sleep(WAIT)
                except asyncio.CancelledError:
                    # asyncio.run() cancels this task, with the others it
                    # then waits for: the close's task starts after that.
                    held[0]()
                    raise

            waiting = loop.create_task(cancelled_at_the_end())
            await asyncio.sleep(0)
            assert not waiting.done()

        asyncio.run(main())
        shutter.join(WAIT)
        assert not shutter.is_alive()
        assert [] == raised
        assert set() == built[0].open
        assert 1 == built[0].runs
        stats = single.statistics()
        assert (1, 0) == (stats.closes, stats.close_failures)
        assert [] == [r for r in caplog.records if r.levelname == "ERROR"]


class SlowClient:
    """An async client whose close takes a while, and says when it began."""

    def __init__(self, began: threading.Event) -> None:
        self.began = began
        self.closed_on: list[asyncio.AbstractEventLoop] = []

    async def aclose(self) -> None:
        self.began.set()
        await asyncio.sleep(0.05)
        self.closed_on.append(asyncio.get_running_loop())


class TestIdleLoopOfALiveThread:
    """An idle loop whose thread lives is never run from another thread.

    ``asyncio.run()`` runs its loop in steps, idle between them: a close
    that ran the loop from another thread in such a gap raced the owner's
    end (which cancelled the close's task, then could not close a loop
    another thread was running).
    """

    @pytest.mark.parametrize("closing", ["close_all", "aclose_all"])
    def test_a_close_in_asyncio_runs_gap_runs_on_its_thread(
        self, monkeypatch, closing
    ):
        """Held between main's end and its task cancellation: no race.

        The owner is let go as soon as the close is handed to it, or
        (were the loop run from here) as soon as the close begins.
        """
        go = threading.Event()
        at_gap = threading.Event()
        cancel_all = asyncio.runners._cancel_all_tasks

        def held(loop):
            at_gap.set()
            go.wait(WAIT)
            cancel_all(loop)

        monkeypatch.setattr(asyncio.runners, "_cancel_all_tasks", held)
        _signal_hand_over(monkeypatch, go)

        @process_singleton
        async def single() -> SlowClient:
            return SlowClient(go)

        box: dict[str, object] = {}

        def owner() -> None:
            async def main():
                box["loop"] = asyncio.get_running_loop()
                box["client"] = await single()

            try:
                asyncio.run(main())
            except BaseException as exc:  # Asserted below.
                box["error"] = exc

        thread = threading.Thread(target=owner)
        thread.start()
        try:
            assert at_gap.wait(WAIT)
            if closing == "close_all":
                close_all()
            else:
                asyncio.run(aclose_all())
        finally:
            go.set()
            thread.join(WAIT)
        assert not thread.is_alive()
        assert "error" not in box, box
        assert box["loop"].is_closed()
        _closed_once_on(single, box["client"], box["loop"])

    def test_a_close_handed_over_runs_when_its_thread_runs_the_loop(
        self, monkeypatch
    ):
        """A manual loop, idle on a live thread: closed at its next run."""
        single, client, loop, _ = _close_all_on_a_live_thread(
            monkeypatch, lambda loop: loop.run_until_complete(asyncio.sleep(0))
        )
        _closed_once_on(single, client, loop)

    def test_a_loop_closed_by_its_thread_unrun_reports_the_client(
        self, monkeypatch
    ):
        """Handed to an idle loop its thread then closes: reported, once."""
        single, client, _, seen = _close_all_on_a_live_thread(
            monkeypatch, lambda loop: loop.close()
        )
        _reported_once(single, client, seen, "ended before the close ran")

    def test_an_idle_loop_whose_thread_ended_is_run_here(self):
        """Its thread is gone: nothing else can run it, so this does."""
        single, _ = async_single()
        loop = asyncio.new_event_loop()
        box: dict[str, object] = {}

        def owner() -> None:
            box["client"] = loop.run_until_complete(single())

        thread = threading.Thread(target=owner)
        thread.start()
        thread.join(WAIT)
        assert not thread.is_alive()
        try:
            close_all()
        finally:
            loop.close()
        _closed_once_on(single, box["client"], loop)


def _closed_once_on(single, client, loop) -> None:
    """*client* was closed once, on *loop*, and counted so."""
    assert [loop] == client.closed_on
    stats = single.statistics()
    assert (1, 0) == (stats.closes, stats.close_failures)


def _signal_hand_over(monkeypatch, handed: threading.Event) -> None:
    """Set *handed* each time a close is handed to a loop."""
    hand_over = _close.hand_over

    def handing(*args):
        try:
            return hand_over(*args)
        finally:
            handed.set()

    monkeypatch.setattr(_close, "hand_over", handing)


def _close_all_on_a_live_thread(monkeypatch, then):
    """close_all() with a client on an idle loop of a live thread.

    That thread built the client on its own loop and waits until the close
    is handed to it, then calls *then* with its loop. Returns the
    singleton, the client, the loop (closed) and close_all()'s warnings.
    """
    handed = threading.Event()
    _signal_hand_over(monkeypatch, handed)
    single, _ = async_single()
    loop = asyncio.new_event_loop()
    built = threading.Event()
    box: dict[str, object] = {}

    def owner() -> None:
        box["client"] = loop.run_until_complete(single())
        built.set()
        if handed.wait(WAIT):
            then(loop)

    # The owner thread may be the one to report (a thread started here
    # records here too, on a build whose warning filters are per thread).
    with _recorded() as seen:
        thread = threading.Thread(target=owner)
        thread.start()
        try:
            assert built.wait(WAIT)
            close_all()
        finally:
            handed.set()
            thread.join(WAIT)
            loop.close()
        gc.collect()
    assert not thread.is_alive()
    return single, box["client"], loop, seen
