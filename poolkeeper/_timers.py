"""Healing's timers, all on one thread for the whole process.

A deferred retirement, a client's *max_age* and its next probe each wait
for a deadline. They are entries of one heap, served by one daemon thread,
``poolkeeper-timers``, started by the first timer (never by an import) and
ended when the heap is empty; so 200 idle healing singletons cost one
thread, not two each. The thread sleeps until the earliest deadline (or a
new, earlier one) and then runs what is due: a quick callback (a probe
made due) on itself, one that may close a client (a retirement's, which
can do I/O for seconds) on a short-lived thread of its own,
``poolkeeper-retire``, so that no close delays another timer.

A forked child has none of its parent's threads, and may hold none of its
parent's locks: the fork hook makes the lock anew and forgets the thread.
The parent's entries wait for :func:`resume`, which the runtime's fork
hook calls once every singleton has abandoned or kept its clients: the
timers of a ``fork="keep"`` singleton's kept clients (their age, their
next probe, a deferred retirement) stay due at their deadlines, on a thread
of the child's own; the others are dropped.
"""

from __future__ import annotations

import contextlib
import heapq
import itertools
import threading
import time
from typing import TYPE_CHECKING, Final, final

from poolkeeper._records import is_owned

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = [
    "THREAD_NAME",
    "WORKER_NAME",
    "Timer",
    "after_fork_in_child",
    "alive",
    "resume",
]

#: The timer thread's name, and a retirement's worker threads' names.
THREAD_NAME: Final = "poolkeeper-timers"
WORKER_NAME: Final = "poolkeeper-retire"

_PENDING, _RUNNING, _DONE = 0, 1, 2


@final
class Timer:
    """A callback due at a deadline: ``Timer(delay, function, *args)``.

    Started when made. The part of ``threading.Timer``'s interface that
    poolkeeper uses: ``cancel()``, ``is_alive()`` (due or running),
    ``join()`` (wait until it ran or was cancelled), ``function`` and
    ``args``. *inline*: run on the timer thread itself (it must be quick
    and must not block). *owner*: what the timer is for (a singleton's
    slot), for :func:`resume` to decide in a forked child.
    """

    __slots__ = (
        "_ended",
        "_state",
        "args",
        "deadline",
        "function",
        "inline",
        "owner",
    )

    def __init__(
        self,
        delay: float,
        function: Callable[..., object],
        *args: object,
        inline: bool = False,
        owner: object = None,
    ) -> None:
        self.function = function
        self.args = args
        self.inline = inline
        self.owner = owner
        self.deadline = time.monotonic() + max(delay, 0.0)
        self._state = _PENDING
        self._ended = threading.Event()
        _schedule(self)

    def cancel(self) -> None:
        """Stop it from running, if it has not started; idempotent.

        Its callback and arguments are let go at once (they hold a
        singleton's lifecycle): a cancelled entry waits in the heap only
        until the heap is compacted.
        """
        global _dead  # noqa: PLW0603 -- under _lock.
        outer = is_owned(_mutex)
        try:
            with _lock:
                if self._state != _PENDING:
                    return
                self._state = _DONE
                self.function, self.args, self.owner = _nothing, (), None
                _dead += 1
                if _dead > _COMPACT_AT and 2 * _dead > len(_heap):
                    _compact()
                # The thread may sleep until this one's deadline: it wakes to
                # sleep until the next one, or to end if none is left.
                _lock.notify()
        finally:
            _leaked(outer)
        self._ended.set()

    def is_alive(self) -> bool:
        """Whether it is still due, or running."""
        return self._state != _DONE

    def join(self, timeout: float | None = None) -> None:
        """Wait until it has run, or was cancelled, or *timeout* passed."""
        self._ended.wait(timeout)

    def _run(self) -> None:
        try:
            self.function(*self.args)
        finally:
            outer = is_owned(_mutex)
            try:
                with _lock:
                    self._state = _DONE
                    _running.discard(self)
            finally:
                _leaked(outer)
            self._ended.set()


# Reentrant, so that a block cut by an injected exception can tell that it
# still holds it (see _leaked).
_mutex = threading.RLock()
_lock = threading.Condition(_mutex)
_heap: list[tuple[float, int, Timer]] = []
_order = itertools.count()
_thread: threading.Thread | None = None
# The timers taken from the heap whose callback has not returned yet.
_running: set[Timer] = set()
# Cancelled entries still in the heap; past _COMPACT_AT and half of it,
# the heap is rebuilt without them (a churn cancels two timers a build).
_dead = 0
_COMPACT_AT: Final = 64


def _nothing() -> None:
    """A cancelled timer's callback."""


def _leaked(outer: bool) -> None:  # noqa: FBT001 -- held before the block.
    """After a ``with _lock`` block, release what it may have left held.

    An exception injected at the line event of the block's exit (a tracer,
    a signal handler's) skips ``__exit__``: the lock stays held, and every
    timer of the process would wait for it (see ``_records.under``).
    """
    if not outer and is_owned(_mutex):
        _mutex.release()


def _compact() -> None:
    """Drop the cancelled entries (under _lock)."""
    global _heap, _dead  # noqa: PLW0603 -- under _lock.
    _heap = [e for e in _heap if e[2]._state == _PENDING]
    heapq.heapify(_heap)
    _dead = 0


def alive() -> list[Timer]:
    """The timers not yet run nor cancelled, and those running now."""
    outer = is_owned(_mutex)
    try:
        with _lock:
            waiting = [t for _, _, t in _heap if t._state == _PENDING]
            return [*waiting, *_running]
    finally:
        _leaked(outer)


def _schedule(timer: Timer) -> None:
    global _thread  # noqa: PLW0603 -- started here, cleared by itself.
    outer = is_owned(_mutex)
    try:
        with _lock:
            # The thread first, the entry last: an exception between two
            # lines (a signal's, a tracer's) leaves either no entry, as if
            # the timer had never been made, or an entry that a running
            # thread will see; never one waiting behind a sleep that
            # nothing cuts short.
            if _thread is None or not _thread.is_alive():
                # Started, then recorded: an exception between the two
                # leaves a thread serving the heap unrecorded, and the next
                # timer starts another (each entry is taken once, under the
                # lock), never a recorded thread that never runs.
                thread = threading.Thread(
                    target=_serve, name=THREAD_NAME, daemon=True
                )
                thread.start()
                _thread = thread
            else:
                # It may sleep until a later deadline than this one's: it
                # wakes (once the lock is free) to sleep until the earliest.
                _lock.notify()
            heapq.heappush(_heap, (timer.deadline, next(_order), timer))
    finally:
        _leaked(outer)


def _next() -> Timer | None:
    """Wait for the next due timer; None once there is none (the end)."""
    global _thread, _dead  # noqa: PLW0603 -- the thread ends itself.
    outer = is_owned(_mutex)
    try:
        with _lock:
            while True:
                while _heap and _heap[0][2]._state != _PENDING:
                    heapq.heappop(_heap)  # Cancelled.
                    _dead = max(0, _dead - 1)
                if not _heap:
                    if _thread is threading.current_thread():
                        _thread = None
                    return None
                deadline, _, timer = _heap[0]
                now = time.monotonic()
                if deadline <= now:
                    # Running first, then off the heap: a fork between two
                    # lines (by another thread) finds it in one or both,
                    # and the child's timers keep it (after_fork_in_child).
                    _running.add(timer)
                    heapq.heappop(_heap)
                    timer._state = _RUNNING
                    return timer
                _lock.wait(deadline - now)
    finally:
        _leaked(outer)


def _serve() -> None:
    """The timer thread: run each timer as it comes due, until none is."""
    global _thread  # noqa: PLW0603 -- the thread ends itself.
    try:
        while (timer := _next()) is not None:
            if timer.inline:
                _run_quietly(timer)
            else:
                threading.Thread(
                    target=_run_quietly,
                    args=(timer,),
                    name=WORKER_NAME,
                    daemon=True,
                ).start()
    finally:
        # Ended otherwise than by an empty heap (interpreter exit): the
        # next timer starts another thread.
        outer = is_owned(_mutex)
        try:
            with _lock:
                if _thread is threading.current_thread():
                    _thread = None
        finally:
            _leaked(outer)


def _run_quietly(timer: Timer) -> None:
    # A callback's exception would end the timer thread, and every other
    # timer with it; poolkeeper's callbacks report their own failures. A
    # KeyboardInterrupt is the main thread's, never a timer's.
    with contextlib.suppress(BaseException):
        timer._run()


def after_fork_in_child() -> None:
    """A fresh lock, no thread; the parent's timers wait (the fork hook).

    Takes no lock. A timer that was running on a parent thread did not
    finish here: it is due again, for :func:`resume` to keep or drop (each
    callback does nothing once it no longer applies, so running one twice
    is safe). Each timer gets a fresh event: a parent thread may have held
    the old one's lock.
    """
    global _mutex, _lock, _thread, _heap, _dead, _running  # noqa: PLW0603
    _mutex = threading.RLock()
    _lock = threading.Condition(_mutex)
    _thread = None
    timers = [t for _, _, t in _heap if t._state == _PENDING]
    # Taken from the heap, or being taken (in both): once each.
    timers.extend(t for t in _running if all(t is not o for o in timers))
    for timer in timers:
        timer._state = _PENDING
        timer._ended = threading.Event()
    _heap = [(t.deadline, next(_order), t) for t in timers]
    heapq.heapify(_heap)
    _dead = 0
    _running = set[Timer]()


def resume(keep: Callable[[Timer], bool]) -> None:
    """In a forked child: keep the timers *keep* accepts, drop the others.

    Called by the runtime's fork hook after every singleton abandoned or
    kept its parent's clients; takes no lock (the child has one thread).
    Starts the child's timer thread if a timer is left. Never raises: a
    timer *keep* raises for is dropped, and a thread that cannot start is
    started by the child's next timer.
    """
    global _heap, _thread  # noqa: PLW0603 -- the child's one thread.
    kept: list[tuple[float, int, Timer]] = []
    for entry in _heap:
        timer = entry[2]
        try:
            keeping = keep(timer)
        except BaseException:  # noqa: BLE001 -- drop it, keep the others.
            keeping = False
        if keeping:
            kept.append(entry)
        else:
            timer._state = _DONE
            timer.function, timer.args, timer.owner = _nothing, (), None
            timer._ended.set()
    heapq.heapify(kept)
    _heap = kept
    if kept:
        thread = threading.Thread(target=_serve, name=THREAD_NAME, daemon=True)
        try:
            thread.start()
        except BaseException:  # noqa: BLE001, S110 -- the next timer's.
            pass
        else:
            _thread = thread
