"""What the lifecycle knows: a client's state, its record, builds, slots.

Plain data: a :class:`Record` for each built client (its state, key,
generation and leases), a :class:`Ticket` for each build in progress, a
:class:`Slot` for each place a client lives (the process, or one event
loop) with its healing state (:class:`ProbeDue` or :class:`Probing`, a
:class:`Deferral`), the decisions a transition hands its driver
(:class:`Serve`, :class:`Probe`, :class:`Wait`, :class:`Build`, a
:class:`Verdict`), and the snapshots of its counters a user reads
(:class:`Statistics`) and its metrics observe (:class:`Census`).

Who writes it: :mod:`poolkeeper._lifecycle`, under its lock, writes every
field, except these, each written where it is named:

- ``Record.pins``: a sync lease adds and removes its own entry without
  the lock (``_lease``, I3), and ``_lease.loosen`` replaces a retired
  record's pins with a weak mapping;
- ``Record.timers``: ``_healing`` starts a client's timers after its
  build and keeps them there; its close cancels them (``_close``);
- ``Slot.hook``: ``_loops`` keeps an async slot's loop-end hook.
"""

from __future__ import annotations

import collections
import enum
import itertools
import threading
import time
from dataclasses import dataclass, field
from itertools import chain, starmap
from operator import setitem
from typing import (
    TYPE_CHECKING,
    Any,
    Final,
    Generic,
    ParamSpec,
    Protocol,
    TypeVar,
    final,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Mapping

    from poolkeeper._timers import Timer

T = TypeVar("T")
P = ParamSpec("P")
R = TypeVar("R")

# -- atomic by structure -----------------------------------------------------
# An exception can be injected at any line event (a tracer) and after any
# call returns (CPython runs signal handlers there). So a transition that
# must not be cut between two stores makes them in one C call (commit),
# and a lock is released on every way out of the call it guards (under).
# Neither adds a Python frame between the transition and its stores.

#: In a :func:`commit` store, replaces all of a list's items.
ALL: Final = slice(None)

#: Runs an iterator of stores to its end inside one C call, which runs no
#: bytecode: no line event, thread switch or signal handler falls between
#: two stores, however the call is laid out. The stores are themselves C:
#: ``commit(starmap(setattr, ((obj, "name", value), ...)))``, chained with
#: ``starmap(setitem, ((a_list, ALL, items), ...))`` for items.
commit: Final = collections.deque[object](maxlen=0).extend


def stores(
    *attributes: tuple[object, str, object],
    items: tuple[tuple[Any, object, object], ...] = (),
) -> None:
    """Make every store of a transition at once: ``(obj, "name", value)``.

    Each store is ``setattr(obj, "name", value)``; *items* are item stores,
    ``(container, index, value)``: ``(a_list, ALL, values)`` replaces a
    list's items. All run inside one C call (:data:`commit`):
    an exception injected in this function's frame lands before the first
    store or after the last one, never between two.
    """
    commit(chain(starmap(setattr, attributes), starmap(setitem, items)))


# The C method that says whether the calling thread holds an RLock.
is_owned: Callable[[object], bool] = vars(type(threading.RLock()))["_is_owned"]


def under(
    lock: threading.RLock,
    fn: Callable[P, R],
    /,
    *args: P.args,
    **kwargs: P.kwargs,
) -> R:
    """Call *fn* holding *lock*; release it on every way out.

    An exception injected at the line event of the ``with``'s exit (after
    the body, before ``__exit__`` runs) would leave the lock held: the
    ``finally`` releases it then, unless this thread held it before.
    """
    outer = is_owned(lock)
    try:
        with lock:
            return fn(*args, **kwargs)
    finally:
        if not outer and is_owned(lock):
            lock.release()


#: Orders builds across every singleton, so shutdown closes in reverse.
_sequence = itertools.count(1)


class ClientState(enum.Enum):
    """Where a built client is in its life; written only by this module."""

    LIVE = "live"  # Served to callers.
    RETIRED = "retired"  # Displaced; its close waits for its leases.
    CLOSED = "closed"  # Done with: closed once, or shared with a live one.
    ABANDONED = "abandoned"  # Inherited by a forked child; never closed.


@final
class Sealed:
    """Holds a key's raw value for comparison; never shows it."""

    __slots__ = ("value",)

    def __init__(self, value: object) -> None:
        self.value = value

    def __repr__(self) -> str:
        return "<sealed key>"


@final
class Record(Generic[T]):
    """A built client and what the lifecycle knows about it."""

    __slots__ = (
        "built_at",
        "client",
        "dependents",
        "fingerprint",
        "generation",
        "key",
        "key_hash",
        "leases",
        "open",
        "pins",
        "prober",
        "probes",
        "read_ended",
        "sequence",
        "slot",
        "state",
        "timers",
    )

    def __init__(self, client: T, ticket: Ticket, generation: int) -> None:
        self.client = client
        self.key_hash = ticket.key_hash
        self.key = ticket.key
        self.read_ended = ticket.read_ended
        self.slot = ticket.slot
        self.generation = generation
        self.sequence = next(_sequence)
        # When it was made, on the monotonic clock: its age when retired.
        self.built_at = time.monotonic()
        # Async leases count here, under the lifecycle's lock; sync leases
        # pin in pins, without it (see I3 in poolkeeper._lifecycle).
        self.leases = 0
        # Of those leases, the holds of objects made from the client (see
        # poolkeeper._dependents): counted apart for the statistics.
        self.dependents = 0
        self.pins: dict[object, None] = {}
        # Whether a sync lease may pin without the lock: a transition
        # that may retire the record clears it before it reads the pins.
        # Never set without the GIL (see Lifecycle.built).
        self.open = True
        self.state = ClientState.LIVE
        # Computed by the driver before the build (repr() of the key).
        self.fingerprint: str | None = None
        # Its health probes reported (cut short ones too): a probe timer
        # acts only at the count it was started for (see Lifecycle.due).
        self.probes = 0
        # The wake-up of the call probing it, while a probe holds it (a
        # lease's worth, in leases): released once, by its report, even
        # if the slot has moved on to another client meanwhile.
        self.prober: object = None
        # Its max_age and next probe's timers, by the driver: its close
        # cancels them.
        self.timers: dict[str, Timer] = {}

    def is_closed(self) -> bool:
        """Whether this client is closed (or closing): done with."""
        return self.state is ClientState.CLOSED

    def is_abandoned(self) -> bool:
        """Whether a forked child abandoned this client (never closed)."""
        return self.state is ClientState.ABANDONED

    def is_retired(self) -> bool:
        """Whether this client is retired and waits for its holders."""
        return self.state is ClientState.RETIRED

    def cancel_timers(self) -> None:
        """Cancel this client's timers: it is closed, nothing is due."""
        # A copy in one call: another thread may start the next probe's
        # timer meanwhile, and without the GIL iterating the dict itself
        # could then fail (which left a client unclosed). That timer sees
        # the record closed once it is in (see _healing._next_probe).
        for timer in self.timers.copy().values():
            timer.cancel()

    def matches(self, key_hash: int, key: object) -> bool:
        """Whether this record was built for *key* (by value, not hash)."""
        if self.key_hash != key_hash:
            return False
        mine = self.key.value
        return mine is key or bool(mine == key)


@final
class Ticket:
    """A build in progress, which other callers of its slot wait for."""

    __slots__ = (
        "done",
        "error",
        "finished",
        "key",
        "key_hash",
        "name",
        "owner",
        "read_ended",
        "record",
        "retired",
        "slot",
    )

    def __init__(  # noqa: PLR0913, PLR0917 -- one field each.
        self,
        slot: Slot,
        key_hash: int,
        key: object,
        owner: object,
        done: Any,  # noqa: ANN401 -- the driver's event or future.
        name: str,
        read_ended: int = 0,
    ) -> None:
        self.slot = slot
        self.key_hash = key_hash
        self.key = Sealed(key)
        # When the read of its key ended (a number of _builds.read_key's
        # count): a call whose read began later saw a value as new or newer.
        self.read_ended = read_ended
        self.owner = owner
        self.done = done
        self.name = name
        self.record: Record[Any] | None = None
        # The retirement of the client this build replaced (its key
        # changed), stored with the build's commit: the driver says it.
        self.retired: Verdict | None = None
        self.error: BaseException | None = None
        self.finished = False

    def matches(self, key_hash: int, key: object) -> bool:
        """Whether this build is for *key*."""
        mine = self.key.value
        return self.key_hash == key_hash and (mine is key or bool(mine == key))

    def error_for(self, key_hash: int, key: object) -> BaseException | None:
        """The error this build failed with, if it was a build for *key*.

        A waiter for *key* raises it; one that waited for a build of
        another key (the key changed meanwhile) asks again instead.
        """
        error = self.error
        return (
            error
            if error is not None and self.matches(key_hash, key)
            else None
        )


@final
class Slot:
    """One place a client lives: the process (sync) or one event loop."""

    __slots__ = (
        "build",
        "built_at",
        "cause",
        "deferred",
        "dropped",
        "hook",
        "key",
        "live",
        "loop",
        "probe",
        "retired",
        "spacing",
        "thread",
    )

    def __init__(self, key: object = None, loop: Any = None) -> None:  # noqa: ANN401
        # The key in Lifecycle.slots, and a weak reference to the event
        # loop for async slots (None for the process's slot).
        self.key = key
        self.loop = loop
        # An async slot's loop's thread: the one running it when the slot
        # opened (a slot opens on its loop). Another thread never runs that
        # loop while this one lives (see _close.foreign).
        self.thread: threading.Thread | None = (
            None if loop is None else threading.current_thread()
        )
        self.live: Record[Any] | None = None
        self.build: Ticket | None = None
        self.retired: tuple[Record[Any], ...] = ()
        self.built_at = float("-inf")
        # The async driver's loop-end hook, and whether it was let go.
        self.hook: object = None
        self.dropped = False
        # Healing's backoff: the spacing a healing retirement of the live
        # client must keep from its build (0: none, retire at once), and
        # the retirement deferred until then, if any.
        self.spacing = 0.0
        self.deferred: Deferral | None = None
        # Why the slot has no live client: the last retirement's reason
        # (None after a build), the reason its next build reports.
        self.cause: str | None = None
        # The probe (*check*) of the live client: due, or in flight;
        # None between probes.
        self.probe: ProbeDue | Probing | None = None

    def has_client(self) -> bool:
        """Whether a client is live in this slot.

        In a forked child: whether the slot kept its client (``fork="keep"``);
        an abandoned one is not live there.
        """
        return self.live is not None


# -- healing's state ---------------------------------------------------------
# A slot's probe and deferral are values, replaced whole in one store: a
# transition that changes them commits one new record, never a field.


@final
@dataclass(frozen=True, slots=True)
class Census:
    """A singleton's clients and holds, now: what the metrics observe.

    Clients *live* and *retired* (not yet closed), *leases* held (pins
    too), and retired clients *held* open by objects made from them
    (``made_from``). Singletons of one name add up (``+``).
    """

    live: int = 0
    retired: int = 0
    leases: int = 0
    held: int = 0

    def __add__(self, other: Census) -> Census:
        """The counts of both."""
        return Census(
            self.live + other.live,
            self.retired + other.retired,
            self.leases + other.leases,
            self.held + other.held,
        )


@final
@dataclass(frozen=True, slots=True)
class ProbeDue:
    """The live record *sequence*'s probe is due: the next call runs it."""

    sequence: int


@final
@dataclass(frozen=True, slots=True)
class Probing:
    """The live record *sequence*'s probe is in flight.

    *prober* is the wake-up of the call running it (what ``unprobe``
    finds it by), *record* the record it holds, and *again* says that the
    next probe's timer ended meanwhile: the probe is due again at its
    report (see ``Lifecycle.due``).
    """

    sequence: int
    prober: object
    record: Record[Any]
    again: bool = False


@final
@dataclass(frozen=True, slots=True)
class Deferral:
    """A retirement of the live record *sequence*, deferred until *due*.

    Deferred by healing's backoff or by *min_rebuild_interval*: its
    *reason*, the type name of the *error* that caused it (or None), and
    when it is due on the monotonic clock.
    """

    sequence: int
    reason: str
    error: str | None
    due: float


class Verdict:
    """A retirement's outcome, for the driver to log and carry out.

    *retired*: the client was retired now. *delay*: seconds after which
    a deferred retirement is due (the driver starts a timer), None when
    nothing new was deferred. *age*: the client's age in seconds. *key*:
    its key's fingerprint. *spacing_before*, *spacing_after*: for a
    healing retirement, the backoff before and after it, in seconds.
    """

    __slots__ = (
        "age",
        "delay",
        "error",
        "key",
        "reason",
        "retired",
        "sequence",
        "spacing_after",
        "spacing_before",
    )

    def __init__(  # noqa: PLR0913 -- one field each.
        self,
        *,
        retired: bool,
        delay: float | None,
        age: float,
        reason: str,
        error: str | None,
        sequence: int,
        key: str | None = None,
        spacing_before: float = 0.0,
        spacing_after: float = 0.0,
    ) -> None:
        self.key = key  # The retired client's key fingerprint.
        # A healing retirement's backoff, in seconds: the spacing the
        # retired client had, and the one its successor has (both 0 for
        # any other retirement).
        self.spacing_before = spacing_before
        self.spacing_after = spacing_after
        self.retired = retired
        self.delay = delay
        self.age = age
        self.reason = reason
        self.error = error
        self.sequence = sequence


class Serve:
    """Decision: return this record's client."""

    __slots__ = ("record",)

    def __init__(self, record: Record[Any]) -> None:
        self.record = record


class Probe:
    """Decision: probe this record's client (*check*), then report.

    The record is held for the probe as a lease holds it: not closed
    until ``Lifecycle.probed`` releases it.
    """

    __slots__ = ("record",)

    def __init__(self, record: Record[Any]) -> None:
        self.record = record


class Wait:
    """Decision: wait for this build, then ask again."""

    __slots__ = ("ticket",)

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket


class Build:
    """Decision: call the factory now, then report to ``built``/``failed``."""

    __slots__ = ("ticket",)

    def __init__(self, ticket: Ticket) -> None:
        self.ticket = ticket


@final
class Ended:
    """The pin of a lease that ended, or that never pinned (an override)."""

    __slots__ = ()

    def __repr__(self) -> str:
        return "<lease ended>"


DONE: Final = Ended()


class Holder(Protocol):
    """What the sync lease keeps: its pin, and the record it must close."""

    pin: Record[Any] | Ended | None
    doomed: Record[Any] | None


@final
@dataclass(frozen=True, slots=True)
class Statistics:
    """An immutable snapshot of one singleton in one process.

    Counters start at zero in every process: a forked child does not
    inherit its parent's.

    Attributes:
        builds: Successful factory calls.
        build_failures: Factory calls that raised (any exception,
            ``KeyboardInterrupt`` included; not a cancelled async build).
        closes: Retired clients whose close hook returned normally.
        close_failures: Retired clients whose close hook raised.
        generation: The build number of the live client, 0 when none is
            live.
        key_fingerprint: :func:`~poolkeeper.fingerprint` of the live
            client's key; ``None`` without a key or a live client.
        pid: The process these numbers describe.
        leases: Leases held right now, on live and retired clients.
        pending_close: Retired clients whose close waits for their leases.
        resets_refused: ``reset()`` calls refused by
            *min_rebuild_interval*.
        is_overridden: Whether an ``override()`` block is active.
        retirements: Clients retired in this process, by reason; every
            reason is a key, 0 until it happens: ``"key"`` (the key
            changed), ``"fork"`` (in a forked child: the parent's live
            clients it abandoned), ``"reset"``, ``"retire"``
            (``retire()``), ``"retire_on"``, ``"check"``, ``"max_age"``,
            ``"close_all"`` (``close_all()``, ``aclose_all()`` and a
            collected singleton), ``"loop_end"`` (an event loop's end).
        backoff: The healing backoff now in force, in seconds: a healing
            retirement of the live client (``retire()``, *retire_on*)
            within this long of its build is deferred until then. 0 when
            a healing retirement would be carried out at once.
        deferred: The reason of a retirement of the live client that
            waits for the backoff (or *min_rebuild_interval*, for
            ``reset()``) to end, ``None`` when none waits.
        probes: Health probes (*check*) run to an answer.
        probe_failures: Health probes that answered false or raised an
            ``Exception``.
        dependents: Objects made from a client (see
            :func:`~poolkeeper.made_from`) holding it open right now, on
            live and retired clients; not counted in *leases*.
        held_open: Retired clients kept open by such objects (counted in
            *pending_close* too).
        live: Live clients right now: 0 or 1 for a thread singleton, one
            per event loop for an async singleton, one per thread with
            ``scope="thread"``.

    .. versionadded:: 0.1
    """

    builds: int
    build_failures: int
    closes: int
    close_failures: int
    generation: int
    key_fingerprint: str | None
    pid: int
    leases: int
    pending_close: int
    resets_refused: int
    is_overridden: bool
    retirements: Mapping[str, int] = field(default_factory=dict[str, int])
    backoff: float = 0.0
    deferred: str | None = None
    probes: int = 0
    probe_failures: int = 0
    dependents: int = 0
    held_open: int = 0
    live: int = 0
