"""Objects made from a client hold it open: :func:`poolkeeper.made_from`.

Some objects an SDK client makes keep using that client's connections
after they are returned: a Daytona ``Sandbox`` (its API objects are the
client's), a boto3 resource, a redis ``PubSub``, an httpx streaming
response. When the singleton retires the client (healing, a key rotation,
``reset()``), such an object would run on a closed client. ``made_from``
says "this object was made from that client": the client, once retired,
stays open until its last lease has ended *and* its last such object is
gone (collected), or until ``close_all()`` or the process's exit.

Each object holds its client the way an async lease does (one count in
the record's ``leases``, told apart in its ``dependents``), released when
the object is collected. The object's weak reference's callback only
appends to a queue (it may run inside a collection, on any thread, in the
middle of anything: it takes no lock and calls into nothing), and a sweep
on the timer thread (``_timers``) releases the holds queued, every
:data:`SWEEP_EVERY` seconds while any object is held (every
:data:`SWEEP_SOON` while a retired client is held: its close waits for
the sweep), and hands a close a release dooms to a worker thread.

A forked child keeps the holds: those of abandoned clients release
nothing (an abandoned record is never closed), those of ``fork="keep"``
clients go on holding them; the sweep's timer is resumed in the child.
"""

from __future__ import annotations

import collections
import gc
import threading
import weakref
from typing import TYPE_CHECKING, Any, Final, final

from poolkeeper._timers import Timer

if TYPE_CHECKING:
    from poolkeeper._close import Closer
    from poolkeeper._lifecycle import Lifecycle
    from poolkeeper._records import Record

__all__ = [
    "SWEEP",
    "SWEEP_EVERY",
    "SWEEP_SOON",
    "Hold",
    "after_fork_in_child",
    "hold",
]

#: How often, in seconds, the holds of collected objects are released.
SWEEP_EVERY: Final = 0.5
#: How often while a retired client is held: its close should not wait.
SWEEP_SOON: Final = 0.05
#: The sweep's timer's owner (see _registry's fork hook).
SWEEP: Final = object()


@final
class Hold:
    """One object's hold on one client's record."""

    __slots__ = ("closer", "held", "life", "ref")

    def __init__(
        self, life: Lifecycle[Any], closer: Closer, held: list[Any]
    ) -> None:
        self.life = life
        self.closer = closer
        self.held = held  # The record, while held (see Lifecycle.depend).
        self.ref: weakref.ref[Any] | None = None

    def gone(self, ref: object) -> None:
        """The object was collected: queue the release. No lock, no call."""
        del ref
        _gone.append(self)


# Every hold whose object lives (keeps each hold and its weak reference).
_holds: set[Hold] = set()
# Holds whose object was collected, for the sweep (appended lock-free).
_gone: collections.deque[Hold] = collections.deque()
# Starts the sweep: never taken by a weak reference's callback.
_lock = threading.Lock()
_sweeper: Timer | None = None
# Whether the next sweep is for a retired client (see _interval).
_hurried = False


def hold(
    life: Lifecycle[Any], closer: Closer, obj: object, client: object
) -> bool:
    """Hold *client*'s record open while *obj* lives; say if it was held.

    False when *life* holds no open record of *client* (closed already).
    Raises TypeError, holding nothing, when *obj* takes no weak reference.
    """
    # Registered (and the sweep started) before it holds anything: an
    # exception landing anywhere in here (a signal's) leaves either no
    # hold, or one that the object's collection releases.
    entry = Hold(life, closer, [])
    entry.ref = weakref.ref(obj, entry.gone)
    _holds.add(entry)
    _start_sweep()
    if life.depend(client, entry.held):
        return True
    _holds.discard(entry)
    return False


def _start_sweep() -> None:
    global _sweeper  # noqa: PLW0603 -- the one sweep of the process.
    with _lock:
        if _sweeper is None or not _sweeper.is_alive():
            _sweeper = Timer(SWEEP_EVERY, _sweep, inline=True, owner=SWEEP)


def _sweep() -> None:
    """Release the holds of collected objects; again later if any is left.

    On the timer thread (inline): each release takes a lifecycle's lock
    for a moment; a close it dooms runs on a worker thread.
    """
    global _sweeper  # noqa: PLW0603 -- the one sweep of the process.
    try:
        if _hurried:
            # A retired client waits: objects made from it are often in
            # reference cycles (an SDK object and its parts), which only
            # the collector frees. The young generations, where they are.
            gc.collect(1)
        while True:
            try:
                entry = _gone.popleft()
            except IndexError:
                break
            _holds.discard(entry)
            _release(entry)
    finally:
        with _lock:
            _sweeper = None
            if _holds or _gone:
                _sweeper = Timer(_interval(), _sweep, inline=True, owner=SWEEP)


def _interval() -> float:
    """SWEEP_SOON while a hold is on a retired client, else SWEEP_EVERY."""
    global _hurried  # noqa: PLW0603 -- the sweep's own.
    _hurried = any(
        entry.held and entry.held[0].is_retired() for entry in list(_holds)
    )
    return SWEEP_SOON if _hurried else SWEEP_EVERY


def _release(entry: Hold) -> None:
    from poolkeeper._healing import closing  # noqa: PLC0415 -- import cycle.

    doomed: list[Record[Any]] = []
    try:
        entry.life.undepend(entry.held, doomed)
    finally:
        if doomed:
            Timer(0.0, closing, entry.life, entry.closer, None, doomed)


def after_fork_in_child() -> None:
    """A fresh lock (the fork hook; takes none). The holds stay."""
    global _lock  # noqa: PLW0603 -- a parent thread may have held it.
    _lock = threading.Lock()
