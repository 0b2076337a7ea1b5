"""Closing retired clients: one path for sync and async closes.

A close runs with no lock held, exactly once per doomed record (the
lifecycle hands each record out once). It uses ``close=`` when given, else
the close an adapter gives for the client's type (``_adapters``), else the
client's ``aclose()`` (async singletons) or ``close()``, else nothing
(said once per type). An ``Exception`` from any of that (even from looking
``close`` up) is logged at WARNING with its traceback and counted, never
raised; anything else (``KeyboardInterrupt``, ``SystemExit``,
cancellation) is counted once and propagates to the caller, after every
other client the caller closes was closed: a close run on another thread's
loop or on a helper thread hands it back to the caller instead of raising
it there. A client that cannot be closed is reported where a user sees it:
a WARNING log record and an :class:`UnclosedClientWarning` pointing at the
user's code.

Closing a client from wherever the caller runs is ``close_all()``'s path
(:func:`close_anywhere`, :func:`aclose_here`): a sync client is closed
where the caller is; an async client on its own loop, awaited there if the
caller runs on it, handed to it if it runs on another thread or belongs to
one still running (see ``foreign``), run to completion on it if it is idle
and its thread is the caller's or ended (on a helper thread when the caller
is inside another running loop); one whose loop ends, or is closed, before
it could run there is reported unclosed. A close that does not finish within
``CROSS_LOOP_CLOSE_SECONDS`` is given up and reported; a ``BaseException``
the close raised on another thread is brought back and raised in the
caller (see ``_carry``).

A close running in a task of its own (handed to its loop, scheduled on it,
or shielded from its caller) is tracked (``track``). ``asyncio.run()``
cancels every task before the loop's shutdown: such a close cut short is
run once more, to its end, and the loop's end waits for those started
after that cancellation, which the loop would otherwise close unfinished.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import operator
import sys
import threading
import time
import warnings
from typing import TYPE_CHECKING, Any, cast

from poolkeeper import _adapters
from poolkeeper import _events as events
from poolkeeper.exceptions import UnclosedClientWarning

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable, Sequence

    from poolkeeper._lifecycle import Lifecycle, Record

log = logging.getLogger("poolkeeper")

# Frames of these modules are skipped when a warning names the user's code.
_SKIPPED = ("poolkeeper", "contextlib", "asyncio", "threading", "concurrent")


class Closer:
    """Closes the retired clients of one singleton and counts the outcome."""

    __slots__ = ("hook", "is_async", "life")

    def __init__(
        self,
        life: Lifecycle[Any],
        hook: Callable[[Any], object] | None,
        *,
        is_async: bool,
    ) -> None:
        self.life = life
        self.hook = hook
        self.is_async = is_async

    def keeps_across_fork(self) -> bool:
        """Whether a ``fork="keep"`` child keeps these clients (if forked now).

        A process singleton's clients are every thread's, so yes; a thread
        singleton's are its thread's only (see ``_threads.ThreadCloser``).
        """
        return True

    def left_here(self) -> Sequence[Record[Any]]:
        """The closes left to the next call on this closer's thread.

        None for a process singleton, whose closes run where they are
        decided; a thread singleton's timers leave theirs to the client's
        thread (``_threads.ThreadCloser``).
        """
        return ()

    def take_over(self, owed: Sequence[Record[Any]]) -> Sequence[Record[Any]]:
        """In a ``fork="keep"`` child: which of *owed* the child still runs.

        *owed*: the closes decided and not yet begun at the fork. None for
        a process singleton: they were its parent's threads' to run (a
        lease's exit, a timer, ``close_all()``), and no such thread runs in
        the child. A thread singleton's are all the forking thread's (see
        ``_threads.ThreadCloser``).
        """
        del owed
        return ()

    # -- the hook -----------------------------------------------------------

    def _start(self, record: Record[Any]) -> tuple[bool, object]:
        """Call the close hook; return (whether it ran, what it returned)."""
        name = self.life.name
        # The record while this close holds its claim and has not begun.
        taken: list[Record[Any]] = []
        try:
            record.cancel_timers()  # Its deadline and probes are moot now.
            run = self._resolve(record.client)
            if run is not None:
                # Claimed from the lifecycle's owed closes, noted in *taken*
                # in the same step: a close cut short before it began is
                # owed again (below; close_all() does it), and one another
                # close took is not run twice.
                if not self.life.claim(record, taken):
                    return False, None
                return True, _begin(taken, run)
            claimed = self.life.claim(record)
        except Exception as exc:  # noqa: BLE001 -- logged, counted, not raised.
            self.life.claim(record)  # Failed: no longer owed.
            self.failed(record, exc)
            return False, None
        except BaseException:
            if taken:
                # Claimed, but cut short before the hook began (a signal
                # after the claim returned): owed again.
                self.life.owe(record)
            # Counted if it was this close's to run: one cut short before
            # it began is still owed, and counted when it runs.
            if not self.life.owes(record):
                self.life.closed(ok=False)
            raise
        if claimed:
            _adapters.say_unclosed(name, record.client)
            log.debug(
                "The retired %s client (generation %d) has no close(); "
                "dropping it.",
                name,
                record.generation,
                extra=_extra(name, record),
            )
        return False, None

    def _resolve(self, client: object) -> Callable[[], object] | None:
        if self.hook is not None:
            return functools.partial(self.hook, client)
        close = _adapters.learn(client).close
        if close is not None:
            return functools.partial(close, client)
        for name in ("aclose", "close") if self.is_async else ("close",):
            method = getattr(client, name, None)
            if callable(method):
                return cast("Callable[[], object]", method)
        return None

    def failed(self, record: Record[Any], exc: BaseException) -> None:
        """Count and log a close that raised *exc*."""
        self.life.closed(ok=False)
        self._failure(
            record,
            f"Closing the retired {self.life.name} client (generation "
            f"{record.generation}) failed; it was dropped.",
            exc,
            counted=True,
        )

    def _failure(
        self,
        record: Record[Any],
        message: str,
        exc: BaseException | None,
        *,
        counted: bool,
    ) -> None:
        # The one place a failed close's event is sent.
        events.close_failed(
            self.life.name,
            record.fingerprint,
            record.generation,
            message,
            exc,
            counted=counted,
        )

    def _done(self, record: Record[Any], started: float) -> None:
        self.life.closed(ok=True)
        events.closed(
            self.life.name,
            record.fingerprint,
            record.generation,
            time.monotonic() - started,
        )

    # -- where it runs ------------------------------------------------------

    def close(self, record: Record[Any]) -> None:
        """Close *record* here and now, synchronously."""
        started = time.monotonic()
        ran, result = self._start(record)
        if not ran:
            return
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # Silences "never awaited": we say it here.
            self.unclosed(
                record,
                "its close returned an awaitable that a synchronous close "
                "cannot await",
                "pass close= a function that closes it synchronously",
            )
            return
        self._done(record, started)

    async def aclose(self, record: Record[Any], *, own: bool = False) -> None:
        """Close *record* on the running loop, awaiting its close.

        *own*: the close runs in a task of its own (see ``track``), which no
        caller's cancellation reaches. A cancellation that cuts it short,
        unless it was given up on, came from the loop's end
        (``asyncio.run()`` cancels every task of a loop before it ends it),
        and the close is run once more, to its end (see ``_once_more``).
        """
        started = time.monotonic()
        ran, result = self._start(record)
        if not ran:
            return
        if inspect.isawaitable(result):
            try:
                await result
            except Exception as exc:  # noqa: BLE001 -- logged, counted.
                self.failed(record, exc)
                return
            except asyncio.CancelledError:
                if not own or asyncio.current_task() in _given_up:
                    self.life.closed(ok=False)
                    raise
                await self._once_more(record, started)
                return
            except BaseException:
                self.life.closed(ok=False)
                raise
        self._done(record, started)

    async def _once_more(self, record: Record[Any], started: float) -> None:
        """Run *record*'s close again, after a cancellation cut it short.

        Not its caller's (see :meth:`aclose`): the loop's end, which
        cancels every task once and then waits for them. Close hooks are
        idempotent (an SDK's ``close()`` is): what the first run closed
        stays closed, and what it did not reach is closed now. Counted
        once, for both runs. Bounded by ``CROSS_LOOP_CLOSE_SECONDS`` (then
        reported unclosed); a second cancellation ends it.
        """
        try:
            _uncancel()
            run = self._resolve(record.client)
            result = None if run is None else run()
            if inspect.isawaitable(result):
                await _within(result, CROSS_LOOP_CLOSE_SECONDS)
        except _TIMEOUTS:
            self.unclosed(record, "its close did not finish in time", "")
            return
        except Exception as exc:  # noqa: BLE001 -- logged, counted.
            self.failed(record, exc)
            return
        except BaseException:
            self.life.closed(ok=False)
            raise
        self._done(record, started)

    def unclosed(
        self,
        record: Record[Any],
        reason: str,
        hint: str,
        *,
        count: bool = True,
    ) -> None:
        """Count (unless told not to) and report a client left unclosed."""
        self.life.claim(record)  # No longer owed: it cannot be closed.
        if count:
            self.life.closed(ok=False)
        message = (
            f"Could not close a retired {self.life.name} client (generation "
            f"{record.generation}): {reason}" + (f"; {hint}." if hint else ".")
        )
        self._failure(record, message, None, counted=count)
        # The user's filters may make it an error: a close never raises,
        # and this one is counted and logged already.
        with contextlib.suppress(UnclosedClientWarning):
            warnings.warn(
                message, UnclosedClientWarning, stacklevel=_user_level()
            )


def _uncancel() -> None:
    """Withdraw the running task's cancellation requests (Python 3.11+).

    The task went on after its cancellation, so none is pending: the
    count ``Task.cancelling()`` keeps must not say otherwise to what runs
    next in it (a timeout's exit, an adapter's close).
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    uncancel = getattr(task, "uncancel", None)
    if cancelling is None or uncancel is None:
        return
    for _ in range(cancelling()):
        uncancel()


async def _within(awaitable: Awaitable[object], seconds: float) -> None:
    """Await *awaitable* in this task, cancelled after *seconds*.

    Then ``TimeoutError`` is raised. Not ``asyncio.wait_for()``: before
    Python 3.12 it awaits in a task of its own, out of which asyncio lets
    a ``KeyboardInterrupt`` stop the loop instead of reaching this task.
    """
    task = asyncio.current_task()
    expired: list[bool] = []

    def expire() -> None:
        expired.append(True)
        if task is not None:
            task.cancel()

    timer = asyncio.get_running_loop().call_later(seconds, expire)
    try:
        await awaitable
    except asyncio.CancelledError:
        if not expired:
            raise
        _uncancel()
        raise TimeoutError from None
    finally:
        timer.cancel()


def _begin(taken: list[Record[Any]], run: Callable[[], object]) -> object:
    """Run a claimed close, emptying *taken* in the same C call (see _start).

    No line event and no signal falls between saying it began and its
    start: the two calls are made by ``map``, in C.
    """
    return list(map(_call, (taken.clear, run)))[1]


_call = operator.methodcaller("__call__")


_LOOP_HINT = (
    "run the loop with asyncio.run() or asyncio.Runner, which let "
    "poolkeeper close it, or await poolkeeper.aclose_all() before the loop "
    "ends"
)


def _extra(name: str, record: Record[Any]) -> dict[str, object]:
    return {
        "poolkeeper_factory": name,
        "poolkeeper_generation": record.generation,
    }


def _user_level() -> int:
    """Return the stacklevel of the nearest frame outside poolkeeper."""
    frame = sys._getframe(1)  # The caller of warn().
    level = 1
    while frame.f_back is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".", 1)[0] not in _SKIPPED:
            break
        frame = frame.f_back
        level += 1
    return level


def run_each(calls: Iterable[Callable[[], object]]) -> None:
    """Run every call; never skip one.

    A ``BaseException`` from one call (Ctrl-C) stops none of the others;
    the first one is raised once they all ran.
    """
    first: BaseException | None = None
    for call in calls:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001, PERF203 -- raised below.
            first = first or exc
    if first is not None:
        raise first


async def arun_each(
    calls: Iterable[Callable[[], Awaitable[object]]],
) -> None:
    """Await every call in turn, like :func:`run_each`."""
    first: BaseException | None = None
    for call in calls:
        try:
            await call()
        except BaseException as exc:  # noqa: BLE001, PERF203 -- raised below.
            first = first or exc
    if first is not None:
        raise first


# -- closing from anywhere ------------------------------------------------

#: How long a close may take on another thread's loop before it is given up.
CROSS_LOOP_CLOSE_SECONDS = 30.0

# Distinct classes before Python 3.11, aliases of TimeoutError since.
_TIMEOUTS = (
    TimeoutError,
    asyncio.TimeoutError,
    concurrent.futures.TimeoutError,
)

# The closes running in tasks of their own, on every loop (see track).
_own: set[asyncio.Task[Any]] = set()
# Those given up on: their caller stopped waiting, or their loop's end did.
# A cancellation of theirs ends the close (see Closer.aclose).
_given_up: set[asyncio.Task[Any]] = set()


def track(task: asyncio.Task[Any]) -> None:
    """Keep *task*, a close in a task of its own, until it is done.

    Held strongly (the loop holds its tasks weakly), and found by its
    loop's end (:func:`await_own`): ``asyncio.run()`` cancels and waits
    for the tasks that existed when its main coroutine returned, not for
    one made after that (a close handed over meanwhile), and it closes the
    loop with such a task still pending.
    """
    _own.add(task)
    task.add_done_callback(_untrack)


def _untrack(task: asyncio.Task[Any]) -> None:
    _own.discard(task)
    _given_up.discard(task)


def _give_up(task: asyncio.Task[Any]) -> None:
    """Cancel *task*, a close in a task of its own, for good (no rerun)."""
    if not task.done():
        _given_up.add(task)
        task.cancel()


async def await_own(loop: asyncio.AbstractEventLoop) -> None:
    """At *loop*'s end: wait for the closes in tasks of their own on it.

    Each is waited for until ``CROSS_LOOP_CLOSE_SECONDS`` after this
    began; those still running then are given up on (cancelled, for good:
    each counts and reports itself) and waited for as long again. A close
    started meanwhile (a hand-over's) is waited for too.
    """
    running = await _await_own(loop)
    for task in running:
        _give_up(task)
    if running:
        await _await_own(loop)


async def _await_own(
    loop: asyncio.AbstractEventLoop,
) -> list[asyncio.Task[Any]]:
    """Wait a bounded time for *loop*'s own closes; return those running."""
    this = asyncio.current_task()
    deadline = loop.time() + CROSS_LOOP_CLOSE_SECONDS
    running: list[asyncio.Task[Any]] = []
    # Each round ends with all of them done or the time up; a round's
    # closes may have started others (a hand-over queued meanwhile).
    for _ in range(_MAX_ROUNDS):
        running = [
            t
            for t in tuple(_own)
            if t.get_loop() is loop and t is not this and not t.done()
        ]
        left = deadline - loop.time()
        if not running or left <= 0:
            break
        await asyncio.wait(running, timeout=left)
    return running


_MAX_ROUNDS = 100


def close_anywhere(closer: Closer, record: Record[Any]) -> None:
    """Close *record* from synchronous code, on its own loop if async.

    Never raises an ``Exception``: what goes wrong is logged, counted.
    """
    try:
        _close_anywhere(closer, record)
    except Exception as exc:  # noqa: BLE001 -- logged and counted.
        closer.failed(record, exc)


def _owner(
    closer: Closer, record: Record[Any]
) -> asyncio.AbstractEventLoop | None:
    """Return the open loop *record* closes on; else close or report it.

    A sync client is closed here and now; a client whose loop is gone
    is reported. Either way None is returned: nothing is left to do.
    """
    ref = record.slot.loop
    if ref is None:
        closer.close(record)
        return None
    loop: asyncio.AbstractEventLoop | None = ref()
    if loop is None or loop.is_closed():
        closer.unclosed(record, "its event loop is closed", _LOOP_HINT)
        return None
    return loop


def foreign(record: Record[Any]) -> bool:
    """Whether *record*'s loop belongs to another thread, still running.

    Such a loop, even idle, is never run from here: its thread may run it
    again at any moment (``asyncio.run()`` runs its loop in steps, idle
    between them), and two threads running one loop break both (the
    owner's end cancels the close's task, and cannot close its loop).
    Its close is handed to it, and runs at its next step. A loop is run
    from here only by its own thread, or once that thread ended.
    """
    thread = record.slot.thread
    return (
        thread is not None
        and thread is not threading.current_thread()
        and thread.is_alive()
    )


def _close_anywhere(closer: Closer, record: Record[Any]) -> None:
    loop = _owner(closer, record)
    if loop is None:
        return
    running = _running_loop()
    if loop is running:
        # Called synchronously from the client's own loop: it cannot be
        # awaited here, so it runs as soon as control returns to it.
        track(loop.create_task(closer.aclose(record, own=True)))
        return
    if loop.is_running() or foreign(record):
        handed = hand_over(closer, record, loop)
        try:
            error = _result(handed, loop)
        except _TIMEOUTS:
            handed.future.cancel()
            _late(closer, record)
            return
    elif running is None:
        error = _run_idle(closer, record, loop)
    else:
        # An idle loop cannot run inside this thread's running loop.
        error = _on_helper_thread(closer, record, loop)
    _raise(closer, record, error)


def close_soon(closer: Closer, record: Record[Any]) -> None:
    """Close *record* without waiting for another thread or loop.

    For the garbage collector's clean-up, which runs on whatever thread
    allocated and must never block there: a sync client is closed here, an
    async one is handed to its loop, which closes it when its own thread
    runs it (an idle loop is never run from another thread: its own may
    start it at any moment), and nothing waits for them. An ``Exception``
    is logged and counted; what a close on another thread raised otherwise
    is logged there (it has no caller to reach).
    """
    try:
        loop = _owner(closer, record)
        if loop is None:
            return
        if loop is _running_loop():
            _close_anywhere(closer, record)  # A task of this loop's.
        else:
            # Running on another thread, or idle: the close runs on the
            # loop, when its own thread runs it next (an idle loop is never
            # run from here: its thread may be about to run it too); a loop
            # closed first reports it (see _HandOver).
            future = hand_over(closer, record, loop).future
            future.add_done_callback(
                functools.partial(_report, closer, record)
            )
    except Exception as exc:  # noqa: BLE001 -- logged and counted.
        closer.failed(record, exc)


def _report(
    closer: Closer,
    record: Record[Any],
    future: concurrent.futures.Future[BaseException | None],
) -> None:
    # A close close_soon() handed to another loop ended: what it brought
    # back was counted there; it is logged, as no caller awaits it.
    try:
        error = (
            asyncio.CancelledError() if future.cancelled() else future.result()
        )
    except BaseException as exc:  # noqa: BLE001 -- logged below.
        error = exc
    if isinstance(error, asyncio.CancelledError):
        error = None
        closer.unclosed(
            record,
            "its close was cancelled on its event loop",
            "",
            count=False,
        )
    if error is not None:
        events.failure(
            log,
            f"Closing a collected {closer.life.name} singleton's client "
            "failed; it was dropped.",
            error,
        )


async def aclose_anywhere(closer: Closer, record: Record[Any]) -> None:
    """Close *record* from a coroutine, on its own loop if async.

    Never raises an ``Exception``: what goes wrong is logged, counted.
    """
    try:
        await _aclose_anywhere(closer, record)
    except Exception as exc:  # noqa: BLE001 -- logged and counted.
        closer.failed(record, exc)


async def _aclose_anywhere(closer: Closer, record: Record[Any]) -> None:
    loop = _owner(closer, record)
    if loop is None:
        return
    if loop is asyncio.get_running_loop():
        await closer.aclose(record)
        return
    try:
        if loop.is_running() or foreign(record):
            error = await _aresult(hand_over(closer, record, loop), loop)
        else:
            error = await asyncio.wait_for(
                asyncio.to_thread(_run_idle, closer, record, loop),
                CROSS_LOOP_CLOSE_SECONDS,
            )
    except _TIMEOUTS:
        _late(closer, record)
        return
    _raise(closer, record, error)


#: How often a caller waiting for a hand-over looks whether its loop closed.
_POLL_SECONDS = 0.05


def _result(
    handed: _HandOver, loop: asyncio.AbstractEventLoop
) -> BaseException | None:
    """Wait for *handed*'s close, up to ``CROSS_LOOP_CLOSE_SECONDS``.

    A loop closed with the hand-over still queued never runs it: the
    caller then reports it at once (``dropped``) rather than wait for the
    hand-over's collection, which a free-threaded build may defer to this
    very thread. Raises ``TimeoutError`` when given up.
    """
    future = handed.future
    deadline = time.monotonic() + CROSS_LOOP_CLOSE_SECONDS
    while True:
        left = deadline - time.monotonic()
        try:
            return future.result(max(0.0, min(left, _POLL_SECONDS)))
        except _TIMEOUTS:
            if left <= _POLL_SECONDS:
                raise
            _closed_unrun(handed, loop)


async def _aresult(
    handed: _HandOver, loop: asyncio.AbstractEventLoop
) -> BaseException | None:
    """:func:`_result` for a coroutine; cancelling it gives the close up."""
    waited = asyncio.wrap_future(handed.future)
    deadline = time.monotonic() + CROSS_LOOP_CLOSE_SECONDS
    try:
        while not waited.done():
            left = deadline - time.monotonic()
            if left <= 0:
                break
            await asyncio.wait({waited}, timeout=min(left, _POLL_SECONDS))
            if not waited.done():
                _closed_unrun(handed, loop)
    except BaseException:
        waited.cancel()
        raise
    if not waited.done():
        waited.cancel()
        raise TimeoutError
    return waited.result()


def _closed_unrun(handed: _HandOver, loop: asyncio.AbstractEventLoop) -> None:
    """Report *handed* if *loop* closed before running it."""
    if loop.is_closed():
        # A closed loop runs nothing more: its start never comes.
        handed.dropped()


def _raise(
    closer: Closer, record: Record[Any], error: BaseException | None
) -> None:
    """Raise what :meth:`_carry` brought back, in the caller."""
    if isinstance(error, asyncio.CancelledError):
        # Cancelled on its own loop (which is ending): counted there,
        # and no cancellation of the caller's.
        closer.unclosed(
            record,
            "its close was cancelled on its event loop",
            "",
            count=False,
        )
    elif error is not None:
        raise error


async def aclose_here(closer: Closer, record: Record[Any]) -> None:
    """Close *record* on the running loop, whatever happens to the caller.

    Shielded (in a task of its own), so a caller cancelled mid-close does
    not leak the client; carried (see ``_carry``), so a ``KeyboardInterrupt``
    or ``SystemExit`` from the close hook is raised here, in the awaiting
    code, instead of stopping the loop as asyncio does with a task's.
    """
    task = asyncio.get_running_loop().create_task(
        _carry(closer, record, own=True)
    )
    track(task)
    error = await asyncio.shield(task)
    if error is not None:
        raise error


async def _carry(
    closer: Closer, record: Record[Any], *, own: bool = False
) -> BaseException | None:
    """Close *record* on its loop; return, not raise, what escapes.

    Run for a caller on another thread: raised there, a
    ``KeyboardInterrupt`` or ``SystemExit`` from the close hook would
    stop that loop (asyncio lets them out of a task) and never reach
    the caller. The caller raises it instead; it was counted already.
    *own* as in :meth:`Closer.aclose`.
    """
    try:
        await closer.aclose(record, own=own)
    except BaseException as exc:  # noqa: BLE001 -- the caller raises it.
        return exc
    return None


def _run_idle(
    closer: Closer, record: Record[Any], loop: asyncio.AbstractEventLoop
) -> BaseException | None:
    carried = _carry(closer, record)
    try:
        return loop.run_until_complete(carried)
    except BaseException:
        if inspect.getcoroutinestate(carried) != inspect.CORO_CREATED:
            raise
        # The loop could not run it: closed, or started by its own thread,
        # since it was seen idle. Nothing ran, and nothing will.
        carried.close()
        if not loop.is_closed():
            raise
    closer.unclosed(record, "its event loop is closed", _LOOP_HINT)
    return None


class _HandOver:
    """A close handed to the loop of another thread (running, or idle).

    The close's coroutine is made on that loop, when it runs the hand-over
    (``start``): a loop that ends before that never had one, so no
    coroutine is left un-awaited, and the client is reported unclosed
    (``dropped``, also when the hand-over is collected unrun). What the
    close brings back (see ``_carry``) is the future's result; cancelling
    the future cancels the close, as ``asyncio.run_coroutine_threadsafe``
    does, and a cancellation from elsewhere (the loop's end) runs it once
    more (see :meth:`Closer.aclose`). Only the loop's queue and a caller
    waiting for it (see ``_result``) hold the hand-over.
    """

    __slots__ = ("closer", "future", "record", "task")

    def __init__(
        self,
        closer: Closer,
        record: Record[Any],
        future: concurrent.futures.Future[BaseException | None],
        task: list[asyncio.Task[BaseException | None]],
    ) -> None:
        self.closer = closer
        # Taken (popped, in one step) by whichever of start and dropped
        # comes first, on whatever thread.
        self.record = [record]
        self.future = future
        self.task = task  # Shared with the future's cancel callback.

    def start(self) -> None:
        """On the loop: make the close's task (unless the caller gave up)."""
        record = self._take()
        if record is None or self.future.cancelled():
            return
        if not self.closer.life.owes(record):
            # Another close took it (the loop's end's, say): nothing is
            # left to do, and no task is made that the loop, perhaps in
            # its last run, might close unfinished.
            if self.future.set_running_or_notify_cancel():
                self.future.set_result(None)
            return
        task = asyncio.get_running_loop().create_task(
            _carry(self.closer, record, own=True)
        )
        track(task)
        self.task.append(task)
        task.add_done_callback(functools.partial(_settle, self.future))

    def dropped(self) -> None:
        """The loop ended, or refused the hand-over: the close never ran."""
        record = self._take()
        if record is None:
            return  # Started: its task settles the future.
        try:
            # Unless another close (close_all()) claimed it meanwhile.
            if self.closer.life.owes(record):
                self.closer.unclosed(
                    record,
                    "its event loop ended before the close ran",
                    _LOOP_HINT,
                )
        finally:
            if self.future.set_running_or_notify_cancel():
                self.future.set_result(None)

    def _take(self) -> Record[Any] | None:
        try:
            return self.record.pop()
        except IndexError:
            return None

    def __del__(self) -> None:
        # Collected unrun: its loop was closed with the hand-over queued.
        with contextlib.suppress(BaseException):
            self.dropped()


def _settle(
    future: concurrent.futures.Future[BaseException | None],
    task: asyncio.Task[BaseException | None],
) -> None:
    if task.cancelled():  # Before its first step: nothing ran.
        future.cancel()
    elif future.set_running_or_notify_cancel():
        future.set_result(task.result())


def _cancel_task(
    loop: asyncio.AbstractEventLoop,
    task: list[asyncio.Task[BaseException | None]],
    future: concurrent.futures.Future[BaseException | None],
) -> None:
    if future.cancelled() and task:
        with contextlib.suppress(RuntimeError):  # The loop is closed.
            loop.call_soon_threadsafe(_give_up, task[0])


def hand_over(
    closer: Closer, record: Record[Any], loop: asyncio.AbstractEventLoop
) -> _HandOver:
    """Close *record* on *loop*, of another thread; see _HandOver."""
    future: concurrent.futures.Future[BaseException | None] = (
        concurrent.futures.Future()
    )
    task: list[asyncio.Task[BaseException | None]] = []
    future.add_done_callback(functools.partial(_cancel_task, loop, task))
    handed = _HandOver(closer, record, future, task)
    try:
        loop.call_soon_threadsafe(handed.start)
    except RuntimeError:  # Closed since it was seen running.
        handed.dropped()
    return handed


def _on_helper_thread(
    closer: Closer, record: Record[Any], loop: asyncio.AbstractEventLoop
) -> BaseException | None:
    # What the close raised, or what running the loop raised: either
    # way the caller raises it, once (see close_anywhere).
    box: list[BaseException | None] = [None]

    def run() -> None:
        try:
            box[0] = _run_idle(closer, record, loop)
        except BaseException as exc:  # noqa: BLE001 -- raised by caller.
            box[0] = exc

    thread = threading.Thread(target=run, name="poolkeeper-close")
    thread.start()
    thread.join(CROSS_LOOP_CLOSE_SECONDS)
    if thread.is_alive():
        _late(closer, record)
        return None
    return box[0]


def _late(closer: Closer, record: Record[Any]) -> None:
    # Not counted here: the close given up on still counts its own
    # outcome, when it ends or is cancelled, so counting it here too
    # would count one client twice.
    closer.unclosed(
        record, "its close did not finish in time", "", count=False
    )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
