"""The lifecycle rules of every singleton, sync and async, in one place.

Everything that decides what happens to a client lives in this package:
when to build, who waits, what is served, what is retired, what must be
closed, what a forked child abandons. It does no I/O. It never calls the
factory, a key, a close hook or ``after_fork``; it never waits and never
logs. Each transition takes the lifecycle's lock, decides, records, and
tells the driver (``_singleton`` for threads, ``_async`` for event loops)
what to do next: serve this record, wait for this ticket, build now, or
close these records.

Each transition computes in locals and commits its stores in one C call
(``commit`` in :mod:`poolkeeper._records`), so an exception injected at
any line (a signal handler's ``KeyboardInterrupt``, a tracer) leaves the
state as it was before the transition or as it is after it, never
half-way, however the code is laid out; its lock is released on every way
out (``locked``). Transitions that may be
cut short by such an exception in the driver are idempotent, so the
driver's ``finally`` can run them again.

:class:`Lifecycle` is one class; its transitions are grouped by job, one
module each: ``_state`` (the state, arming, the retirement decision),
``_builds`` (calls and builds), ``_leases``, ``_ends`` (retirements,
owed closes, a loop's end, fork) and ``_changes`` (subscribed variables,
overrides). The data they keep is in :mod:`poolkeeper._records`.
"""

from __future__ import annotations

from typing import TypeVar

from poolkeeper._lifecycle._builds import Builds
from poolkeeper._lifecycle._changes import Changes
from poolkeeper._lifecycle._ends import Ends
from poolkeeper._lifecycle._leases import Leases
from poolkeeper._lifecycle._state import MAX_ROUNDS, constant, gil
from poolkeeper._records import (
    DONE,
    Build,
    ClientState,
    Ended,
    Holder,
    Record,
    Serve,
    Slot,
    Ticket,
    Wait,
)

__all__ = [
    "DONE",
    "MAX_ROUNDS",
    "Build",
    "ClientState",
    "Ended",
    "Holder",
    "Lifecycle",
    "Record",
    "Serve",
    "Slot",
    "Ticket",
    "Wait",
    "constant",
    "gil",
]

T = TypeVar("T")


class Lifecycle(Builds[T], Leases[T], Ends[T], Changes[T]):
    """The state of one singleton, and every rule that changes it."""
