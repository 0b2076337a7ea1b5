"""The lifecycle rules of every singleton, sync and async, in one place.

Everything that decides what happens to a client lives in this module:
when to build, who waits, what is served, what is retired, what must be
closed, what a forked child abandons. It does no I/O. It never calls the
factory, a key, a close hook or ``after_fork``; it never waits and never
logs. Each transition takes the lifecycle's lock, decides, records, and
tells the driver (``_sync`` for threads, ``_async`` for event loops)
what to do next: serve this record, wait for this ticket, build now, or
close these records. The data it keeps is in :mod:`poolkeeper._records`.

:class:`Lifecycle` is one class, in sections: state and counters,
requests and builds, leases, ends, healing, changes and overrides, fork.

Invariants (other modules refer to them as I1 ... I6):

I1. Atomic by structure. A transition computes in locals and makes its
    stores with one ``stores(...)``, which runs them in one C call, so an
    exception injected at any line (a tracer) or after any call (a signal
    handler's ``KeyboardInterrupt``) leaves the state as it was before the
    transition or as it is after it, never half-way, however the code is
    laid out. The lock is released on every way out (``locked``,
    ``under``), even when the exception lands at the line event of a
    ``with`` block's exit. Transitions that a driver may have to run again
    after such an exception are idempotent.
I2. Epochs. ``invalidate`` stores a new epoch, then reads ``armed``; an
    arming call stores ``armed``, then reads the epoch. Under the GIL each
    sees the other's store, so a change is never lost between a key's read
    and the arming. Without the GIL the epoch moves under the lock.
I3. Pins. A sync lease pins without the lock: it adds itself to the
    record's ``pins``, then reads the record's ``open`` flag; a transition
    that may retire the record clears ``open``, then reads the pins
    (``_retire``). Under the GIL each sees the other's store. Without the
    GIL ``open`` is never set, so every pin and unpin takes the lock.
I4. One switch. The hit path is armed and disarmed only here, under the
    lock: ``armed`` is set before arming and cleared after disarming, so
    a cut between the two can only cost a redundant switch later.
I5. Owed closes. A close decided here is in ``owed`` until a close claims
    it (``claim``), which is the only way out of ``owed``: a close cut
    short before it began is done later (``close_all()``) and none twice.
I6. Fork. ``forget_parent`` takes no lock (another thread may have held
    it at the fork), logs nothing and never raises. In the child, a close
    owed at the fork is a parent thread's to run: it leaves ``owed`` and
    its client is abandoned, but for a thread singleton's closes owed by
    the forking thread, with ``fork="keep"`` (I5 holds for those).

Lock-free decisions are this module's, as named queries (``override``,
``owed_besides``, ``holds_on``, ``holders``, ``ended_slots``,
``loop_slot``, ``census``, ``build_cause``, ``has_timers``;
``Record.matches``, ``is_closed``, ``is_retired``, ``is_abandoned``;
``Slot.has_client``), except
those on hot paths, which read the records inline because a call there
would add a Python frame to every call:

- ``_sync``'s polled hit path: the armed record is still live (one frame
  for a polled key; a later retirement is one after the return, I3).
- ``_lease``'s pin and unpin: ``pins`` then ``open`` (I3).
- ``_async``'s ``_get``: the record a pushed key matched is still live on
  this loop, its probe not due, its epoch unmoved (I2); and ``_slot``:
  the running loop's slot, hooked. Each await of an async singleton.
- ``_async``'s ``_acquire``: a polled key's value matches the loop's live
  record, with no probe due; this slot's clients close only on this loop.
- ``_healing``'s ``give_back``: whether the slot can hold a probe at all,
  on every call's way out by an exception.
- ``life.overrides and``, before ``override()`` on every call's path.

The healing section (``reset``, ``heal``, ``carry_out``, ``expire``,
``due``, ``probed``, ``unprobe``; its driver half is
:mod:`poolkeeper._healing`):

- **Heal.** A healing retirement (``retire()``, *retire_on*, a failed
  probe, *max_age*) compares and retires: it retires the client only while
  it is its slot's live one, so any number of callers retiring the same
  client cause one retirement.
- **Backoff.** Rebuilds caused by healing back off: the first is
  immediate, and the next client's spacing is :data:`BACKOFF_FIRST`
  seconds. A client that lives a full spacing resets it: its healing
  retirement is immediate again, and the next spacing is
  :data:`BACKOFF_FIRST`.
- **Deferral.** A healing retirement of a client younger than its spacing
  is deferred until the client is that old (a
  :class:`~poolkeeper._records.Deferral` in the slot; the driver starts a
  timer, which calls ``carry_out``), and the client after it gets twice
  the spacing, up to :data:`BACKOFF_CAP`. A ``reset()`` inside
  *min_rebuild_interval* is deferred the same way, until the interval
  ends. Retirements are counted by reason (:data:`REASONS`).
- **Ageing.** With *max_age*, the driver starts a timer at each build; at
  its end ``expire`` retires that client if it is still live, for reason
  "max_age", as a healing retirement (the backoff applies).
- **Probe.** With *check*, a timer makes the live client's probe due
  (``due``: a :class:`~poolkeeper._records.ProbeDue` in the slot), which
  disarms the hit path; the first ``request`` that finds it due answers
  :class:`Probe` (one prober: the slot's probe is then a
  :class:`~poolkeeper._records.Probing`, and other calls are served),
  holding the record as a lease does, so that it is not closed under the
  probe. ``probed`` takes the probe's verdict: it releases the record,
  counts the probe and retires a client that failed it, for reason
  "check"; a probe cut short by a ``BaseException``, or failed and not yet
  retired (cut between its two commits), is due again.
"""

from __future__ import annotations

import asyncio
import functools
import itertools
import os
import sys
import threading
import time
from itertools import chain, starmap
from operator import setitem
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Final,
    Generic,
    ParamSpec,
    TypeAlias,
    TypeVar,
    cast,
)

from poolkeeper._records import (
    ALL,
    DONE,
    Build,
    Census,
    ClientState,
    Deferral,
    Ended,
    Holder,
    Probe,
    ProbeDue,
    Probing,
    Record,
    Serve,
    Slot,
    Statistics,
    Ticket,
    Verdict,
    Wait,
    commit,
    is_owned,
    stores,
    under,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator, Sequence

    #: The change hook, ``arm(client, record, pushed) -> bool`` (see
    #: ``Lifecycle.arm``).
    Arm: TypeAlias = Callable[[object, Record[Any] | None, bool], bool]

__all__ = [
    "DONE",
    "MAX_ROUNDS",
    "Build",
    "ClientState",
    "Ended",
    "Holder",
    "Lifecycle",
    "Probe",
    "Record",
    "Serve",
    "Slot",
    "Ticket",
    "Wait",
    "constant",
    "gil",
]

T = TypeVar("T")
L = TypeVar("L", bound="Lifecycle[Any]")
P = ParamSpec("P")
R = TypeVar("R")

#: How many builds for other keys a call waits out before giving up.
MAX_ROUNDS: Final = 100

#: Healing's backoff, in seconds: the spacing after a first healing
#: retirement, doubled after each retirement that falls inside it, up to
#: BACKOFF_CAP. Read at each decision (tests patch them).
BACKOFF_FIRST = 1.0
BACKOFF_CAP = 60.0

#: Why a client was retired: the keys of ``Statistics.retirements``.
REASONS: Final[tuple[str, ...]] = (
    "key",
    "fork",
    "reset",
    "retire",
    "retire_on",
    "check",
    "max_age",
    "close_all",
    "loop_end",
)
#: The reasons that heal: their rebuilds back off.
HEALING: Final = frozenset(("retire", "retire_on", "check", "max_age"))

# Epochs: each change of a subscribed variable stores a number never stored
# before (next() on it is atomic), so an epoch that still equals the one a
# call read means no change has been stored since. Not 0, the first epoch.
epochs = itertools.count(1)


class _Sink:
    """Absorbs a state store aimed at no record (see ``_retire``)."""

    __slots__ = ("leases", "open", "state")


def locked(
    method: Callable[Concatenate[L, P], R],
) -> Callable[Concatenate[L, P], R]:
    """Run a transition under its lifecycle's lock, as :func:`under` does.

    Inlined here, one frame instead of two: an exception injected at the
    line event of the ``with``'s exit (after the body, before ``__exit__``
    runs) would leave the lock held, so the ``finally`` releases it then,
    unless this thread held it before the call.
    """

    @functools.wraps(method)
    def run(self: L, /, *args: P.args, **kwargs: P.kwargs) -> R:
        lock = self.lock
        outer = is_owned(lock)
        try:
            with lock:
                return method(self, *args, **kwargs)
        finally:
            if not outer and is_owned(lock):
                lock.release()

    return run


def constant(obj: R) -> Callable[[], R]:
    """Return a callable returning *obj*: a wake-up made ahead of request()."""
    return lambda: obj


def _free_threaded() -> bool:
    """Whether this is a free-threaded build (configured --disable-gil).

    Its ABI flags say so ("t"), where it has them (POSIX; Windows from
    3.14); elsewhere sysconfig does (Py_GIL_DISABLED), at an import's cost.
    """
    abiflags = getattr(sys, "abiflags", None)
    if abiflags is not None:
        return "t" in abiflags
    import sysconfig  # noqa: PLC0415 -- Windows before 3.14 only.

    return bool(sysconfig.get_config_var("Py_GIL_DISABLED"))


# A free-threaded build runs without the GIL, and sys._is_gil_enabled()
# cannot tell: every extension module's import turns the GIL on, on every
# thread, while its init runs, and off again after (and one not made for
# such a build turns it on for good). What a singleton may rely on is
# decided from the build instead.
FREE_THREADED: Final = _free_threaded()


def gil() -> bool:
    """Whether this build always runs Python code under the GIL.

    True on a default build. False on a free-threaded build: its GIL is
    off, and whatever turns it on may turn it off again.
    """
    return not FREE_THREADED


def _no_hit_path(_client: object, _record: object, _pushed: object) -> bool:
    """The change hook of a lifecycle that has no hit path."""
    return True


#: What a pin's entry is not: an exit may have taken it out already.
_ABSENT: Final = object()
# The states of a record an object made from its client can hold open.
_HOLDABLE: Final = (ClientState.LIVE, ClientState.RETIRED)


def _stranded(slot: Slot) -> bool:
    """In a forked child: whether *slot*'s loop was running at the fork.

    It still says it is running, but no thread runs it here, and asyncio
    itself reports no running loop in a forked child (the thread that
    forked inside a coroutine included): nothing can use or close a client
    on it.
    """
    loop = None if slot.loop is None else slot.loop()
    running = getattr(loop, "is_running", None)
    return running is not None and bool(running())


class Lifecycle(Generic[T]):
    """The state of one singleton, and every rule that changes it."""

    # -- state and counters --------------------------------------------------

    def __init__(
        self,
        name: str,
        *,
        pushed: bool,
        min_interval: float,
        arm: Arm | None = None,
    ) -> None:
        self.name = name
        self.lock = threading.RLock()
        # Lock-free steps rely on the GIL ordering every store and load
        # (see I2, I3); without it they take the lock.
        self.lock_free = gil()
        # The key is pushed (no key, or keys.env): the hit path may be armed.
        self.pushed = pushed
        self.min_interval = min_interval
        # The change hook, the one way the lifecycle reaches the driver's hit
        # path; each driver decides how to arm. Called under the lock as
        # arm(client, record, pushed): with None, None to disarm (the live
        # client is about to change, or may have); with an override's
        # stand-in and None, when every call gets the stand-in; with the
        # live record a call was served and its client, when the key that
        # call read still stands. It says whether the hit path now serves
        # *client*; armed is what it was last armed with (see _arm, I4).
        self.arm = arm or _no_hit_path
        self.armed: object = None
        self.slots: dict[object, Slot] = {}
        self.overrides: tuple[tuple[object, object], ...] = ()
        # Bumped by every change of a subscribed environment variable.
        self.epoch = 0
        self.fork_errors: list[BaseException] = []
        # A forked child's retirements (reason "fork") not yet said: the
        # child's first use says them (see take_forked).
        self.forked: tuple[Verdict, ...] = ()
        # Closes decided but not started (see I5).
        self.owed: tuple[Record[Any], ...] = ()
        # Ageing and probing (set by the decorator): seconds, or None; and
        # the probe function (check=), which only _healing calls (without
        # check=, no probe is ever due and bool is never called).
        self.max_age: float | None = None
        self.check_every: float | None = None
        self.check: Callable[[Any], object] = bool
        self._zero()

    # The switch is a class attribute store (a stop-the-world update on
    # free-threaded builds): skip it when it would change nothing. armed is
    # set before arming and cleared after disarming, so an exception
    # between the two steps can only cost a redundant switch later, never
    # leave the hit path armed with armed saying otherwise.
    # *record* is the live record a call is served, None for an override;
    # *epoch*, the epoch at which that call read its key. A change that
    # invalidate() stores meanwhile either sees armed set (and disarms
    # under the lock) or is seen here before the switch (see invalidate).
    def _arm(
        self,
        client: object,
        record: Record[T] | None = None,
        epoch: int | None = None,
    ) -> None:
        if self.armed is client:
            return
        before, self.armed = self.armed, client
        if epoch is not None and self.epoch != epoch:
            self._disarm()
            return
        # Not armed (another loop keeps the arming, say): as it was.
        if not self.arm(client, record, self.pushed):
            self.armed = before

    def _disarm(self) -> None:
        if self.armed is not None:
            self.arm(None, None, self.pushed)
            self.armed = None

    def _zero(self) -> None:
        # Counters are per process: a forked child starts from zero. The
        # generation only grows, under the lock, within a process.
        self.generation = 0
        self.pid = os.getpid()
        self.builds = 0
        self.build_failures = 0
        self.closes = 0
        self.close_failures = 0
        self.resets_refused = 0
        self.probes = 0
        self.probe_failures = 0
        self.retirements: dict[str, int] = dict.fromkeys(REASONS, 0)

    def _counted(self, reason: str, n: int = 1) -> dict[str, int]:
        """The retirement counters with *n* more for *reason*; a copy."""
        counts = dict(self.retirements)
        counts[reason] += n
        return counts

    def _retire(
        self, slot: Slot, old: Record[Any] | None, keep: Record[Any] | None
    ) -> tuple[tuple[Record[Any], ...], list[Record[Any]], ClientState, Any]:
        """Decide *old*'s retirement; one store (below), nothing else.

        Returns the slot's new retired tuple, what to close now, the state
        to give *old* and the object to store it on (a sink when there is
        no *old*), so the caller commits all of it in one ``stores``.

        Its one store comes first: *old* is closed to lock-free pins before
        its pins are read (see ``pin``). Cut short after it, *old* stays
        live and its leases pin under the lock until ``pin`` opens it.
        """
        if old is None:
            return slot.retired, [], ClientState.CLOSED, _Sink()
        old.open = False
        if old.leases or old.pins:
            return (*slot.retired, old), [], ClientState.RETIRED, old
        # A client still live elsewhere (the factory returned the same
        # object again, or another loop shares it) is not closed now.
        others = [r for r in self._holders() if r is not old]
        if keep is not None:
            others.append(keep)
        out = [] if self._shared(old, others) else [old]
        return slot.retired, out, ClientState.CLOSED, old

    def _holders(self) -> Iterator[Record[Any]]:
        for slot in self.slots.values():
            if slot.live is not None:
                yield slot.live
            yield from slot.retired

    @staticmethod
    def _shared(record: Record[Any], others: Iterable[Record[Any]]) -> bool:
        client = record.client
        return any(r.client is client for r in others if r is not record)

    @locked
    def statistics(
        self, slot: Slot | None, now: float | None = None
    ) -> Statistics:
        """Return a snapshot; live fields describe *slot*.

        *now* (monotonic) tells whether the live client has outlived its
        backoff; without it the backoff is the slot's spacing.
        """
        live = None if slot is None else slot.live
        records = list(self._holders())
        backoff, deferred = 0.0, None
        if slot is not None:
            backoff = slot.spacing
            if (
                live is not None
                and now is not None
                and now - live.built_at >= backoff
            ):
                backoff = 0.0
            pending = slot.deferred
            if (
                pending is not None
                and live is not None
                and pending.sequence == live.sequence
            ):
                deferred = pending.reason
        return Statistics(
            builds=self.builds,
            build_failures=self.build_failures,
            closes=self.closes,
            close_failures=self.close_failures,
            generation=0 if live is None else live.generation,
            key_fingerprint=None if live is None else live.fingerprint,
            pid=self.pid,
            leases=sum(r.leases - r.dependents + len(r.pins) for r in records),
            dependents=sum(r.dependents for r in records),
            held_open=sum(
                1
                for r in records
                if r.dependents and r.state is ClientState.RETIRED
            ),
            pending_close=sum(len(s.retired) for s in self.slots.values()),
            resets_refused=self.resets_refused,
            is_overridden=bool(self.overrides),
            retirements=dict(self.retirements),
            backoff=backoff,
            deferred=deferred,
            probes=self.probes,
            probe_failures=self.probe_failures,
            live=sum(s.live is not None for s in self.slots.values()),
        )

    # -- requests and builds -------------------------------------------------

    @locked
    def open_slot(
        self, key: object, loop: Callable[[], object] | None
    ) -> tuple[Slot, Slot | None]:
        """Return the slot for *key*, making it if needed.

        *loop* is the weak reference a new async slot keeps; an existing
        slot whose loop is not the one *loop* refers to (a dead loop whose
        id was reused) is replaced. Returns the slot and the slot it
        replaced, if any, for the driver to drop.
        """
        slot = self.slots.get(key)
        if slot is not None and (loop is None or slot.loop() is loop()):
            return slot, None
        self.slots[key] = new = Slot(key, loop)
        return new, slot

    @locked
    def request(  # noqa: PLR0913, PLR0917 -- what a call knows.
        self,
        slot: Slot,
        compared: Record[T] | None,
        matched: bool,  # noqa: FBT001 -- whether *compared* matched.
        key_hash: int,
        key: object,
        epoch: int,
        owner: object,
        new_done: Callable[[], object],
        *,
        began: int | None = None,
        ended: int = 0,
    ) -> Serve | Probe | Wait | Build | None:
        """Decide what a call for *key*, read at *epoch*, does next.

        The caller compared *key* with the slot's live record, *compared*,
        before, with no lock held (a key's ``__eq__`` is user code): it
        *matched* or not. None means: read the key again and compare
        again; the live record changed meanwhile, or the key the call read
        may be older than the live record's.

        *began* and *ended* number the start and the end of the call's key
        read (``_builds.read_key``; None: no order is known). A call builds
        only for a key it read after the last change pushed (*epoch* is
        still the lifecycle's) and after the live record's own read ended;
        otherwise its key may be older than the live record's, and it
        reads the key again. Without this, a caller that read the key just
        before a change would build the old value, retire the new client,
        and the fresh callers would retire its in turn (a build storm under
        rotation).
        """
        live = slot.live
        if live is not compared:
            return None
        if live is not None and matched:
            probe = slot.probe
            if (
                type(probe) is ProbeDue
                and probe.sequence == live.sequence
                and live.state is ClientState.LIVE
            ):
                # This call probes; the record is held for it. The call's
                # wake-up names it: unwinding before it reported, it gives
                # the probe back (unprobe).
                done = new_done()
                probing = Probing(live.sequence, done, live)
                stores(
                    (live, "leases", live.leases + 1),
                    (live, "prober", done),
                    (slot, "probe", probing),
                )
                return Probe(live)
            # Arm only if no subscribed variable changed since the key was
            # read; _arm checks again once it has stored armed.
            if epoch == self.epoch and not self.overrides:
                self._arm(live.client, live, epoch)
            return Serve(live)
        if slot.build is not None:
            return Wait(slot.build)
        if began is not None and (
            epoch != self.epoch
            or (live is not None and began < live.read_ended)
        ):
            return None
        ticket = Ticket(
            slot, key_hash, key, owner, new_done(), self.name, ended
        )
        slot.build = ticket
        return Build(ticket)

    def build_cause(self, slot: Slot) -> str | None:
        """Why *slot*'s next build builds: "key" while a client is live.

        Otherwise the reason its last client was retired, None for its
        first. Lock-free: a build's reason, read as it begins.
        """
        return "key" if slot.live is not None else slot.cause

    @locked
    def still_live(self, record: Record[T]) -> bool:
        """Whether *record* is still its slot's live client.

        A call that probed it asks before returning it: a retirement
        during the probe (``reset()``, ``retire()``, a rotation's build,
        ``close_all()``) leaves it held only by the probe, and closed
        once the probe is reported; such a call asks ``request`` again.
        """
        return record.slot.live is record and record.state is ClientState.LIVE

    @locked
    def built(
        self,
        ticket: Ticket,
        client: T,
        fingerprint: str | None,
        now: float,
        doomed: list[Record[T]],
    ) -> None:
        """Make the built *client* live and retire the one it replaces.

        Idempotent: a second call for the same ticket does nothing. What
        must be closed is put in *doomed* in the same statement that
        commits, so it cannot be lost between the two.
        """
        if ticket.finished:
            return
        # Replacing a live client disarms first: nobody may be served
        # a client whose close has started.
        self._disarm()
        slot = ticket.slot
        new: Record[T] = Record(client, ticket, self.generation + 1)
        new.fingerprint, new.open = fingerprint, self.lock_free
        build = None if slot.build is ticket else slot.build
        if slot.dropped:
            # The slot's loop ended (or a fork dropped it) meanwhile: the
            # client goes unused, and is closed unless the factory returned
            # an object live in another slot, which keeps it.
            out = [] if self._shared(new, self._holders()) else [new]
            owed, closed = (*self.owed, *out), ClientState.CLOSED
            stores(
                (new, "state", closed),
                (slot, "build", build),
                (ticket, "finished", True),
                (self, "owed", owed),
                items=((doomed, ALL, out),),
            )
            return
        old = slot.live
        retired, out, state, box = self._retire(slot, old, keep=new)
        owed, builds = (*self.owed, *out), self.builds + 1
        counts = self.retirements if old is None else self._counted("key")
        said = None if old is None else self._said(old, "key")
        stores(
            (slot, "live", new),
            (slot, "build", build),
            (slot, "built_at", now),
            (slot, "retired", retired),
            (box, "state", state),
            (self, "generation", new.generation),
            (self, "builds", builds),
            (self, "retirements", counts),
            (slot, "deferred", None),
            (slot, "cause", None),
            (slot, "probe", None),
            (ticket, "record", new),
            (ticket, "retired", said),
            (ticket, "finished", True),
            (self, "owed", owed),
            items=((doomed, ALL, out),),
        )

    @staticmethod
    def _said(record: Record[Any], reason: str) -> Verdict:
        """The verdict of *record*'s retirement now: what its event says.

        For the retirements that no caller's verdict carries (a key
        rotation, ``close_all()``, a loop's end, a fork); mutates nothing.
        """
        return Verdict(
            retired=True,
            delay=None,
            age=time.monotonic() - record.built_at,
            reason=reason,
            error=None,
            sequence=record.sequence,
            key=record.fingerprint,
        )

    @locked
    def failed(self, ticket: Ticket, error: BaseException | None) -> None:
        """Record a build that raised *error* (None: it was cancelled).

        Every error is counted in ``build_failures`` (a ``KeyboardInterrupt``
        too), except a cancellation. Only an ``Exception`` is raised in the
        callers waiting for the build: anything else (``KeyboardInterrupt``,
        ``SystemExit``, cancellation) concerns the builder alone, and its
        waiters retry.
        """
        if ticket.finished:
            return
        counted = error is not None and not isinstance(
            error, asyncio.CancelledError
        )
        if not isinstance(error, Exception):
            error = None
        slot = ticket.slot
        build = None if slot.build is ticket else slot.build
        failures = self.build_failures + counted
        stores(
            (slot, "build", build),
            (self, "build_failures", failures),
            (ticket, "error", error),
            (ticket, "finished", True),
        )

    @locked
    def settle_unbegun(self, slot: Slot | None, done: object) -> bool:
        """Settle the build of a call that unwinds before building.

        A driver calls this when a call ends by an exception. If the slot's
        build is still the one request() made for that call (its wake-up
        is *done*) and is unfinished, the exception came between request()
        and the build taking over, and nothing else would ever settle it:
        it is settled as cancelled (its waiters retry). Returns whether it
        was, for the driver to wake them.
        """
        ticket = None if slot is None else slot.build
        if ticket is None or ticket.done is not done or ticket.finished:
            return False
        self.failed(ticket, None)
        return True

    # -- leases --------------------------------------------------------------

    # The async lease's: *held* holds the record while the lease does, set
    # and cleared in the commit that counts it. A signal's exception can land
    # when these return (as the lock is released), before the caller sees
    # what they did: *held* still says whether the lease is to be ended.

    @locked
    def lease(self, slot: Slot, record: Record[T], held: list[Any]) -> bool:
        """Pin *record* if it is still live; return whether it was."""
        if record is not slot.live or record.state is not ClientState.LIVE:
            return False
        stores(
            (record, "leases", record.leases + 1),
            items=((held, ALL, (record,)),),
        )
        return True

    @locked
    def unlease(self, held: list[Any], doomed: list[Record[T]]) -> None:
        """End the lease *held* holds, if any; idempotent.

        A retired record whose last lease ends is doomed.
        """
        self._unhold(held, doomed, dependent=False)

    def _unhold(
        self, held: list[Any], doomed: list[Record[T]], *, dependent: bool
    ) -> None:
        """End a lease or (*dependent*) an object's hold; one store."""
        if not held:
            return
        record: Record[T] = held[0]
        leases = record.leases - 1
        count: tuple[tuple[object, str, object], ...] = ()
        if dependent:
            count = ((record, "dependents", record.dependents - 1),)
        if leases or record.pins or record.state is not ClientState.RETIRED:
            stores(
                (record, "leases", leases),
                *count,
                items=((held, ALL, ()),),
            )
            return
        retired, close = self._last_lease(record)
        out = [] if close is None else [close]
        r, owed, closed = record, (*self.owed, *out), ClientState.CLOSED
        stores(
            (r, "leases", 0),
            *count,
            (r, "state", closed),
            (r.slot, "retired", retired),
            (self, "owed", owed),
            items=(
                (doomed, ALL, out),
                (held, ALL, ()),
            ),
        )

    # Objects made from a client (see _dependents): each holds its record
    # as an async lease does, counted in leases and told apart in
    # dependents, so that every rule about leases holds for them.

    @locked
    def depend(self, client: object, held: list[Any]) -> bool:
        """Hold the open record of *client*; False if there is none.

        Live or retired and waiting for its leases: a record already
        closed (or closing) cannot be held open.
        """
        for record in self._holders():
            if record.client is client and record.state in _HOLDABLE:
                stores(
                    (record, "leases", record.leases + 1),
                    (record, "dependents", record.dependents + 1),
                    items=((held, ALL, (record,)),),
                )
                return True
        return False

    @locked
    def undepend(self, held: list[Any], doomed: list[Record[T]]) -> None:
        """End the hold *held* holds, if any; idempotent.

        A retired record whose last lease or hold ends is doomed.
        """
        self._unhold(held, doomed, dependent=True)

    # The sync lease's transitions. Its fast paths pin and unpin without
    # the lock (see I3; a pin that finds the record open is seen by its
    # retirement, one that finds it closed comes here). These are the
    # slow paths: a pin after a miss or with the lock (no
    # GIL), the end of the last lease of a retired record, and an end that
    # was cut short.

    def pin(self, slot: Slot, client: object, lease: Holder) -> bool:
        """Pin *slot*'s live record if it holds *client*; say if it did.

        Call with the lock held (through ``under``). The pinned record goes
        to ``lease.pin`` in the commit that adds the pin.
        """
        record = slot.live
        if (
            record is None
            or record.client is not client
            or record.state is not ClientState.LIVE
        ):
            return False
        # Live under the lock: no retirement is half-way, so a flag a
        # retirement cut short left cleared opens again (never without
        # the GIL: there every unpin takes the lock). The one C call of
        # stores(), without its frame: without the GIL every lease pins
        # here (tests/test_hit_frames.py counts its frames).
        pin = ((record, "open", self.lock_free), (lease, "pin", record))
        commit(
            chain(
                starmap(setattr, pin),
                starmap(setitem, ((record.pins, lease, None),)),
            )
        )
        return True

    def unpin(self, lease: Holder) -> bool:
        """End *lease*'s pin, if it holds one; idempotent.

        Call with the lock held (through ``under``). When this was the last
        lease of a retired record, that record goes to ``lease.doomed``.
        Returns whether *lease* was still among its record's pins (an exit
        takes it out before it gets here).
        """
        record = lease.pin
        if not isinstance(record, Record):  # Not pinned, or already ended.
            return False
        pins = record.pins
        held = pins.pop(lease, _ABSENT) is not _ABSENT
        if pins or record.leases or record.state is not ClientState.RETIRED:
            lease.pin = DONE
            return held
        retired, close = self._last_lease(record)
        owed = self.owed if close is None else (*self.owed, close)
        stores(
            (record, "leases", 0),
            (record, "state", ClientState.CLOSED),
            (record.slot, "retired", retired),
            (lease, "pin", DONE),
            (lease, "doomed", close),
            (self, "owed", owed),
        )
        return held

    def _last_lease(
        self, record: Record[T]
    ) -> tuple[tuple[Record[Any], ...], Record[T] | None]:
        """Decide the close of a retired *record* whose last lease ends.

        Returns its slot's new retired tuple and the record to close, or
        None when another holder shares the client; mutates nothing.
        """
        retired = tuple(r for r in record.slot.retired if r is not record)
        shared = self._shared(record, self._holders())
        return retired, None if shared else record

    # -- ends ----------------------------------------------------------------

    @locked
    def close_slot(
        self,
        slot: Slot,
        doomed: list[Record[Any]],
        said: list[Verdict] | None = None,
    ) -> None:
        """Retire everything *slot* holds, leased or not, and forget it.

        For a loop that ends: its clients are closed even if leased. The
        live client's retirement (reason "loop_end") goes to *said* in the
        commit, for the driver's ``retired`` event.
        """
        self._disarm()
        out = [r for r in (slot.live, *slot.retired) if r is not None]
        rest = [r for r in self._holders() if r not in out]
        # One close per object: the slot may hold an object twice (a
        # leased client the factory returned again), or share it with
        # another slot, which then keeps it.
        close: list[Record[Any]] = []
        for record in out:
            if not self._shared(record, (*rest, *close)):
                close.append(record)
        # And the slot's closes owed from before: decided, then cut short
        # before they began (a signal between deciding and awaiting them).
        # The loop's end is their last chance.
        close.extend(r for r in self.owed if r.slot is slot)
        for record in out:
            record.open, record.state = False, ClientState.CLOSED
        if self.slots.get(slot.key) is slot:
            del self.slots[slot.key]
        kept = (r for r in self.owed if r.slot is not slot)
        owed = (*kept, *close)
        live = slot.live
        counts = self._counted("loop_end", 0 if live is None else 1)
        told = () if live is None else (self._said(live, "loop_end"),)
        stores(
            (slot, "live", None),
            (slot, "retired", ()),
            (slot, "dropped", True),
            (slot, "deferred", None),
            (self, "owed", owed),
            (self, "retirements", counts),
            items=(
                (doomed, ALL, close),
                ([] if said is None else said, ALL, told),
            ),
        )

    @locked
    def detach(
        self, doomed: list[Record[T]], said: list[Verdict] | None = None
    ) -> None:
        """Retire every slot's live client, ignoring the rate limit.

        Doom those no lease holds (objects made from them do not hold them
        past this), and the retired ones that only such objects hold.

        Each retirement's verdict goes to *said* in its commit, for the
        driver's ``retired`` event.
        """
        self._disarm()
        out: list[Record[T]] = []
        told: list[Verdict] = [] if said is None else said
        for slot in list(self.slots.values()):
            live = slot.live
            if live is None:
                continue
            retired, more, state, box = self._retire(slot, live, None)
            owed = (*self.owed, *more)
            counts = self._counted("close_all")
            end = len(told)
            stores(
                (slot, "live", None),
                (slot, "retired", retired),
                (slot, "deferred", None),
                (slot, "cause", "close_all"),
                (box, "state", state),
                (self, "owed", owed),
                (self, "retirements", counts),
                items=(
                    (told, slice(end, end), (self._said(live, "close_all"),)),
                ),
            )
            out.extend(more)
        # Retired clients that only objects made from them hold open (see
        # _dependents) close now; those a lease holds wait for it.
        for slot in list(self.slots.values()):
            held = [
                r
                for r in slot.retired
                if r.leases == r.dependents and not r.pins
            ]
            if not held:
                continue
            rest = tuple(r for r in slot.retired if r not in held)
            stores(
                (slot, "retired", rest),
                *((r, "state", ClientState.CLOSED) for r in held),
                (self, "owed", (*self.owed, *held)),
            )
            out.extend(held)
        doomed[:] = out

    @locked
    def claim(
        self, record: Record[Any], taken: list[Record[Any]] | None = None
    ) -> bool:
        """Take *record*'s owed close; False if another close took it.

        With *taken*, the record goes there in the commit that takes it: a
        signal's exception can land after this returns and before its
        caller sees True (when the lock's release returns), and the caller
        still knows it holds the close (see ``Closer._start``).
        """
        owed = self.owed
        rest = tuple(r for r in owed if r is not record)
        if len(rest) == len(owed):
            return False
        if taken is None:
            stores(
                (self, "owed", rest),
            )
            return True
        stores(
            (self, "owed", rest),
            items=((taken, ALL, (record,)),),
        )
        return True

    @locked
    def owe(self, record: Record[Any]) -> None:
        """Owe *record*'s close again: claimed, it never began."""
        if not self.owes(record):
            self.owed = (*self.owed, record)

    def owes(self, record: Record[Any]) -> bool:
        """Whether *record*'s close is owed: decided, not yet claimed."""
        return any(r is record for r in self.owed)

    def owed_besides(self, doomed: list[Record[Any]]) -> list[Record[Any]]:
        """The closes owed from before that are not among *doomed* (I5).

        Lock-free: ``owed`` is replaced in one store. A driver closes these
        with *doomed*: each close claims its record, so none runs twice.
        """
        return [r for r in self.owed if all(r is not d for d in doomed)]

    def holds_on(self, loop: object) -> bool:
        """Whether *loop*'s slot has a client live or owed a close.

        The async driver keys an event loop's slot by ``id(loop)``; a slot
        left by a collected loop whose id was reused is not *loop*'s.
        Lock-free: each attribute is read once.
        """
        slot = self.slots.get(id(loop))
        if slot is None or slot.loop is None or slot.loop() is not loop:
            return False
        return slot.live is not None or any(r.slot is slot for r in self.owed)

    def ended_slots(self) -> list[Slot]:
        """The event loops' slots whose loop was closed or collected.

        Lock-free: the slots are copied in one C call before they are read.
        """
        ended: list[Slot] = []
        for slot in list(self.slots.values()):
            loop = None if slot.loop is None else slot.loop()
            if slot.loop is not None and (loop is None or loop.is_closed()):
                ended.append(slot)
        return ended

    def loop_slot(self, loop: object) -> Slot | None:
        """The slot of event loop *loop*, if it has one.

        Not a slot of an earlier loop that had the same ``id()``. Lock-free:
        one dictionary read, then the slot's weak reference.
        """
        slot = self.slots.get(id(loop))
        if slot is None or slot.loop is None or slot.loop() is not loop:
            return None
        return slot

    def holders(self) -> list[Record[Any]]:
        """The records holding a client: each slot's live and retired ones.

        Lock-free: the slots and each slot's retired records are copied in
        one C call before they are read.
        """
        return [
            record
            for slot in list(self.slots.values())
            for record in (slot.live, *slot.retired)
            if record is not None
        ]

    def census(self) -> Census:
        """Clients live and retired, leases and clients held open, now.

        For the metrics' observers. Lock-free: the slots and each slot's
        retired records are copied in one C call before they are read.
        """
        slots = list(self.slots.values())
        records = self.holders()
        return Census(
            live=sum(slot.live is not None for slot in slots),
            retired=sum(len(slot.retired) for slot in slots),
            leases=sum(r.leases - r.dependents + len(r.pins) for r in records),
            held=sum(1 for r in records if r.dependents and r.is_retired()),
        )

    @locked
    def closed(self, *, ok: bool) -> None:
        """Count a close that ran (*ok*) or failed."""
        if ok:
            self.closes += 1
        else:
            self.close_failures += 1

    # -- healing -------------------------------------------------------------
    # Retirements that heal (retire(), retire_on, a failed probe, max_age)
    # and their backoff, deferrals (the backoff's, and a reset's inside
    # min_rebuild_interval), ageing and probes. The state is the slot's:
    # spacing, deferred (a Deferral) and probe (a ProbeDue or a Probing),
    # each replaced whole in a transition's commit. The driver half (its
    # timers, running a probe) is poolkeeper._healing.

    def has_timers(self) -> bool:
        """Whether each build starts timers: *max_age* or *check* is set.

        Lock-free: both are set once, by the decorator, before any call.
        """
        return self.max_age is not None or self.check_every is not None

    @locked
    def reset(
        self, slot: Slot, now: float, doomed: list[Record[T]]
    ) -> Verdict | None:
        """Retire *slot*'s live client unless rate-limited.

        Returns None when no client is live. Within *min_interval* of the
        last build (on *now*'s clock) the reset is refused, counted in
        ``resets_refused`` and deferred until the interval ends: the
        verdict's *delay* says when, for the driver's timer (None when a
        deferral was already pending).
        """
        live = slot.live
        if live is None:
            return None
        wait = self.min_interval - (now - slot.built_at)
        if wait > 0:
            self.resets_refused += 1
            return self._defer(slot, live, "reset", None, wait)
        return self._retire_live(slot, live, "reset", None, doomed)

    @locked
    def heal(  # noqa: PLR0913, PLR0917 -- what a retirement knows.
        self,
        slot: Slot,
        client: object,
        reason: str,
        error: str | None,
        now: float,
        doomed: list[Record[T]],
    ) -> Verdict | None:
        """Retire *client* for *reason* if it is *slot*'s live client.

        Compare-and-retire: None when *client* is not live in *slot* (a
        stale retirement, an override's stand-in). A client younger than
        its slot's spacing (*now* on the monotonic clock) stays live and
        its retirement is deferred (see the module's docstring); *error*
        is the type name of the exception that caused it.
        """
        live = slot.live
        if (
            live is None
            or live.client is not client
            or live.state is not ClientState.LIVE
        ):
            return None
        age = now - live.built_at
        wait = slot.spacing - age
        pending = slot.deferred
        if (
            pending is not None
            and pending.sequence == live.sequence
            and pending.reason in HEALING
        ):
            if now < pending.due:
                return self._defer(slot, live, reason, error, wait)
            # Due, and its timer has not carried it out yet (late, or cut
            # short): now, as the timer would.
            return self._retire_live(
                slot,
                live,
                pending.reason,
                pending.error,
                doomed,
                deferred=True,
            )
        if wait > 0:
            return self._defer(slot, live, reason, error, wait)
        return self._retire_live(slot, live, reason, error, doomed)

    @locked
    def carry_out(
        self, slot: Slot, sequence: int, doomed: list[Record[T]]
    ) -> Verdict | None:
        """Carry out the retirement deferred for record *sequence*.

        Called by the driver's timer once it is due; None when it no
        longer applies (the client was retired or replaced meanwhile).
        """
        live = slot.live
        pending = slot.deferred
        if (
            live is None
            or pending is None
            or pending.sequence != sequence
            or live.sequence != sequence
        ):
            return None
        return self._retire_live(
            slot, live, pending.reason, pending.error, doomed, deferred=True
        )

    @locked
    def expire(
        self, slot: Slot, sequence: int, now: float, doomed: list[Record[T]]
    ) -> Verdict | None:
        """Retire record *sequence* for its age, if it is still live.

        The end of its *max_age* timer: a healing retirement (reason
        "max_age"), deferred by the backoff as ``heal`` defers; None when
        the client was retired or replaced meanwhile.
        """
        live = slot.live
        if live is None or live.sequence != sequence:
            return None
        return self.heal(slot, live.client, "max_age", None, now, doomed)

    @locked
    def due(self, slot: Slot, sequence: int, count: int) -> bool:
        """Mark record *sequence*'s probe due; False if it is not live.

        The end of its *check_every* timer, started when the record had
        *count* probes reported: a timer from before a later report (a
        probe cut short, then run again) does nothing. Disarms the hit
        path first, so that the next call asks ``request``, which hands
        out the probe. The timer of the probe after one being run (started
        before its report, *count* one more than reported) that ends
        before that report makes the probe due once it is reported.
        """
        live = slot.live
        if (
            live is None
            or live.sequence != sequence
            or live.state is not ClientState.LIVE
        ):
            return False
        probe = slot.probe
        if live.probes != count:
            if (
                live.probes + 1 != count
                or type(probe) is not Probing
                or probe.sequence != sequence
            ):
                return False
            again = Probing(sequence, probe.prober, probe.record, again=True)
            stores(
                (slot, "probe", again),
            )
            return True
        if probe is not None and probe.sequence == sequence:
            return True  # Already due, or being probed.
        self._disarm()
        stores(
            (slot, "probe", ProbeDue(sequence)),
        )
        return True

    @locked
    def probed(  # noqa: PLR0913, PLR0917 -- what a probe knows.
        self,
        slot: Slot,
        record: Record[T],
        ok: bool | None,  # noqa: FBT001 -- the probe's answer.
        error: str | None,
        now: float,
        doomed: list[Record[T]],
    ) -> Verdict | None:
        """Report the probe of *record*: *ok*, failed, or None (cut short).

        Releases the record held for the probe (doomed if it was retired
        meanwhile and this was its last holder), counts the probe, and
        retires a live client that failed it (reason "check", healing).
        A probe cut short (None) is due again, for the next call. Returns
        the retirement's verdict. Idempotent for a probe already reported.

        The hold is the record's (``prober``): released even when the slot
        has moved on meanwhile (the record was retired and another client
        built, which forgets the slot's probe), so that the record closes.
        """
        if record.prober is None:
            return None  # Reported already.
        probe = slot.probe
        current = type(probe) is Probing and probe.sequence == record.sequence
        # The next probe's timer ended before this report (see due).
        again = type(probe) is Probing and current and probe.again
        if (ok is not True or again) and current:
            # Due again, for the next call: the hit path stays disarmed. A
            # failed probe is due again until ``heal`` below retires the
            # client (a second commit): cut between the two, the next call
            # probes again instead of serving a failed client for ever.
            self._disarm()
        # The slot's probe, unless it has moved on to another client.
        due, state = ProbeDue(record.sequence), probe
        if current:
            state = None if ok is True and not again else due
        probes = self.probes + (ok is not None)
        failures = self.probe_failures + (ok is False)
        leases = record.leases - 1
        reported = record.probes + 1
        if leases or record.pins or record.state is not ClientState.RETIRED:
            stores(
                (record, "leases", leases),
                (record, "probes", reported),
                (record, "prober", None),
                (slot, "probe", state),
                (self, "probes", probes),
                (self, "probe_failures", failures),
            )
        else:
            retired, close = self._last_lease(record)
            out = [] if close is None else [close]
            owed = (*self.owed, *out)
            stores(
                (record, "leases", 0),
                (record, "probes", reported),
                (record, "prober", None),
                (record, "state", ClientState.CLOSED),
                (slot, "retired", retired),
                (slot, "probe", state),
                (self, "owed", owed),
                (self, "probes", probes),
                (self, "probe_failures", failures),
                items=((doomed, ALL, out),),
            )
        if ok is not False:
            return None
        verdict = self.heal(slot, record.client, "check", error, now, doomed)
        if slot.probe == state and slot.live is record:
            # Deferred by the backoff: the client stays live until the
            # deferral's timer, and is probed meanwhile (a probe that
            # fails after the deferral is due carries it out, as heal
            # does, should its timer have been lost).
            stores((slot, "probe", None))
        return verdict

    @locked
    def unprobe(
        self, slot: Slot, done: object, doomed: list[Record[T]]
    ) -> None:
        """Give back the probe handed to a call that unwinds unreported.

        A driver calls this when a call ends by an exception. If a record
        of *slot* is still held by the probe ``request`` handed to that
        call (its wake-up is *done*), the exception came between
        ``request`` and the probe's report: it is reported as cut short
        (due again, if the slot's probe is still that one), which releases
        the record held for it.
        """
        if done is None:
            return
        probe = slot.probe
        probing = (probe.record,) if type(probe) is Probing else ()
        for record in (*probing, slot.live, *slot.retired):
            if record is not None and record.prober is done:
                self.probed(slot, record, None, None, 0.0, doomed)
                return

    def _defer(
        self,
        slot: Slot,
        live: Record[T],
        reason: str,
        error: str | None,
        wait: float,
    ) -> Verdict:
        """Defer *live*'s retirement by *wait* seconds; one store.

        A deferral already pending for *live* stands (no new timer).
        """
        pending = slot.deferred
        age = time.monotonic() - live.built_at
        if pending is not None and pending.sequence == live.sequence:
            return Verdict(
                retired=False,
                delay=None,
                age=age,
                reason=pending.reason,
                error=pending.error,
                sequence=live.sequence,
                key=live.fingerprint,
            )
        due = time.monotonic() + wait
        slot.deferred = Deferral(live.sequence, reason, error, due)
        return Verdict(
            retired=False,
            delay=wait,
            age=age,
            reason=reason,
            error=error,
            sequence=live.sequence,
            key=live.fingerprint,
        )

    def _retire_live(  # noqa: PLR0913 -- what a retirement knows.
        self,
        slot: Slot,
        live: Record[T],
        reason: str,
        error: str | None,
        doomed: list[Record[T]],
        *,
        deferred: bool = False,
    ) -> Verdict:
        """Retire *slot*'s *live* record for *reason*; one commit.

        A healing retirement sets the spacing of the next client: one
        that was *deferred* doubles it, up to BACKOFF_CAP; any other
        (the slot had no spacing, or *live* outlived it) starts it at
        BACKOFF_FIRST.
        """
        self._disarm()
        spacing = before = slot.spacing
        age = time.monotonic() - live.built_at
        if reason in HEALING:
            spacing = (
                min(spacing * 2, BACKOFF_CAP)
                if deferred and spacing
                else BACKOFF_FIRST
            )
        retired, out, state, box = self._retire(slot, live, keep=None)
        owed = (*self.owed, *out)
        stores(
            (slot, "live", None),
            (slot, "retired", retired),
            (slot, "deferred", None),
            (slot, "spacing", spacing),
            (slot, "cause", reason),
            (box, "state", state),
            (self, "owed", owed),
            (self, "retirements", self._counted(reason)),
            items=((doomed, ALL, out),),
        )
        return Verdict(
            retired=True,
            delay=None,
            age=age,
            reason=reason,
            error=error,
            sequence=live.sequence,
            key=live.fingerprint,
            spacing_before=before if reason in HEALING else 0.0,
            spacing_after=spacing if reason in HEALING else 0.0,
        )

    # -- changes and overrides -----------------------------------------------

    def invalidate(self) -> None:
        """A subscribed key changed: disarm and outdate keys read before.

        Runs on every write of a subscribed variable, so it is quick: the
        epoch moves first, in one store, then an armed hit path is disarmed
        under the lock, before the write returns. A call arming meanwhile
        (request, under the lock) stores ``armed`` first and reads the
        epoch after, before it switches the hit path on; this stores the
        epoch first and reads ``armed`` after. Under the GIL each sees the
        other's store: either this disarms that arming, or that arming
        sees the new epoch and does not switch. Without the GIL, the epoch
        moves under the lock (taken by ``under``, which releases it on every
        way out).
        """
        if self.lock_free:
            self.epoch = next(epochs)
        else:
            under(self.lock, self._next_epoch)
        if self.armed is not None:
            under(self.lock, self._disarm)

    def _next_epoch(self) -> None:
        self.epoch = next(epochs)

    def subscribed(self) -> None:
        """The key's changes are pushed from now on: the hit path may arm.

        Said once, by the decorator, before the singleton can be called.
        """
        self.pushed = True

    @locked
    def push_override(self, token: object, obj: object) -> None:
        """Serve *obj* until the override named *token* is popped."""
        self.overrides = (*self.overrides, (token, obj))
        if self.pushed:
            self._arm(obj)
        else:
            self._disarm()

    @locked
    def pop_override(self, token: object) -> None:
        """End the override named *token*, wherever it is in the stack.

        Idempotent. Disarms first: cut short before its commit, the
        override is still there (``holds_override``) and a second pop ends
        it; the hit path is never left armed with a popped stand-in.
        """
        self._disarm()
        self.overrides = tuple(o for o in self.overrides if o[0] is not token)

    def override(self) -> tuple[()] | tuple[T]:
        """Overrides win: the newest override's object in a 1-tuple, or ().

        Lock-free: ``overrides`` is replaced in one store, so one read of it
        is a stack that was pushed. Every path that serves a client asks
        this first (``if won := life.override(): return won[0]``); the paths
        every call takes guard it with ``life.overrides and``, so that no
        frame is added while nothing is overridden.
        """
        overrides = self.overrides
        return (cast("T", overrides[-1][1]),) if overrides else ()

    def holds_override(self, token: object) -> bool:
        """Whether the override named *token* is still pushed."""
        return any(t is token for t, _ in self.overrides)

    # -- fork ----------------------------------------------------------------

    def forget_parent(
        self, *, keep: bool, still_owed: Sequence[Record[Any]] = ()
    ) -> list[Record[Any]]:
        """In a forked child: fresh lock, no builds; abandon unless *keep*.

        Takes no lock (another thread of the parent may have held it at the
        fork) and returns the abandoned records, never to be closed. With
        *keep*, the clients of event loops running at the fork are
        abandoned all the same: no thread of the child runs those loops,
        so nothing could use or close them there. The closes owed at the
        fork were the parent's threads' to run: they are dropped and their
        clients abandoned too, but for those among *still_owed* (with
        *keep*): a thread singleton's closes, left to the forking thread's
        next call, which the child makes.
        """
        self.lock = threading.RLock()
        self.arm(None, None, self.pushed)
        self.armed = None
        owed = self.owed
        self.owed = (
            tuple(r for r in owed if any(r is o for o in still_owed))
            if keep
            else ()
        )
        dropped = [r for r in owed if all(r is not o for o in self.owed)]
        for slot in self.slots.values():
            slot.build = None  # Its builder is a parent thread.
        if keep:
            self.pid = os.getpid()
            # A probe in flight ran on a thread the child does not have
            # (one that forked inside its own probe reports into a
            # record no longer held, and probed() ignores it): give back
            # its hold, so that the kept client closes when retired here,
            # and make the probe due again, for the child's next call.
            for record in self._holders():
                if record.prober is not None:
                    record.leases -= 1
                    record.prober = None
            for slot in self.slots.values():
                probe = slot.probe
                if type(probe) is Probing:
                    slot.probe = ProbeDue(probe.sequence)
            # A kept client keeps its deferral, backoff and timers (the
            # fork hook resumes them: _timers.resume).
            slots = [s for s in self.slots.values() if _stranded(s)]
        else:
            slots = list(self.slots.values())
            self._zero()
            self.forked = ()
        for slot in slots:
            # The parent's timers are not the child's: a deferred
            # retirement and a probe are dropped with them, and the backoff
            # starts afresh.
            slot.deferred, slot.spacing, slot.probe = None, 0.0, None
        abandoned = self._abandon(slots)
        # A dropped close's client is abandoned too (no slot holds it any
        # more), but for one still held here under another record.
        held = [r.client for r in self._holders()]
        for record in dropped:
            if record.is_closed() and all(
                c is not record.client for c in held
            ):
                record.open, record.state = False, ClientState.ABANDONED
                abandoned.append(record)
        return abandoned

    def _abandon(self, slots: list[Slot]) -> list[Record[Any]]:
        """Abandon every record of *slots*, in a forked child; drop them.

        The process's slot (key None) stays, empty. The live clients count
        as retired by the fork; their events wait for the child's first use
        of the singleton (take_forked): nothing logs here.
        """
        abandoned = [
            record
            for slot in slots
            for record in (slot.live, *slot.retired)
            if record is not None
        ]
        gone = [s.live for s in slots if s.live is not None]
        for record in abandoned:
            record.open, record.state = False, ClientState.ABANDONED
        for slot in slots:
            if slot.live is not None:
                slot.cause = "fork"
            slot.live, slot.retired, slot.built_at = None, (), float("-inf")
            slot.dropped = slot.key is not None
        self.slots = {
            k: s for k, s in self.slots.items() if k is None or not s.dropped
        }
        self.retirements["fork"] += len(gone)
        self.forked = (
            *self.forked,
            *(self._said(record, "fork") for record in gone),
        )
        return abandoned

    @locked
    def take_forked(self) -> tuple[Verdict, ...]:
        """The fork's retirements not yet said, once: then none.

        Lock-free callers check ``forked`` first (a tuple, replaced in one
        store); this takes it under the lock, so that two threads of the
        child say each retirement once between them.
        """
        forked = self.forked
        if forked:
            stores(
                (self, "forked", ()),
            )
        return forked
