"""The lifecycle rules of every singleton, sync and async, in one place.

Everything that decides what happens to a client lives here: when to
build, who waits, what is served, what is retired, what must be closed,
what a forked child abandons. This module does no I/O. It never calls the
factory, a key, a close hook or ``after_fork``; it never waits and never
logs. Each transition takes the lifecycle's lock, decides, records, and
tells the driver (``_singleton`` for threads, ``_async`` for event loops)
what to do next: serve this record, wait for this ticket, build now, or
close these records.

Each transition computes in locals and commits in a single statement, so
an exception injected between two lines (a signal handler's
``KeyboardInterrupt``, a tracer) leaves the state as it was before the
transition or as it is after it, never half-way. Transitions that may be
cut short by such an exception in the driver are idempotent, so the
driver's ``finally`` can run them again.
"""

from __future__ import annotations

import functools
import itertools
import os
import sys
import threading
from typing import (
    TYPE_CHECKING,
    Any,
    Concatenate,
    Final,
    Generic,
    ParamSpec,
    TypeVar,
)

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
from poolkeeper._stats import Statistics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

T = TypeVar("T")
L = TypeVar("L", bound="Lifecycle[Any]")
P = ParamSpec("P")
R = TypeVar("R")

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
]

#: How many builds for other keys a call waits out before giving up.
MAX_ROUNDS: Final = 100

# Epochs: each change of a watched variable stores a number never stored
# before (next() on it is atomic), so an epoch that still equals the one a
# call read means no change has been stored since. Not 0, the first epoch.
_epochs = itertools.count(1)


class _Sink:
    """Absorbs a state store aimed at no record (see ``_retire``)."""

    __slots__ = ("leases", "open", "state")


def _locked(
    method: Callable[Concatenate[L, P], R],
) -> Callable[Concatenate[L, P], R]:
    """Run a transition under its lifecycle's lock.

    Taking the lock, running the transition and releasing the lock share
    one line on purpose: an exception injected at a line event (a tracer,
    or a signal handler on the way out) could otherwise land between the
    end of a ``with`` block's body and its exit, and leave the lock held.
    """

    @functools.wraps(method)
    def run(self: L, /, *args: P.args, **kwargs: P.kwargs) -> R:
        with self.lock: return method(self, *args, **kwargs)  # noqa: E701  # fmt: skip

    return run


def constant(obj: R) -> Callable[[], R]:
    """Return a callable returning *obj*: a wake-up made ahead of request()."""
    return lambda: obj


def gil() -> bool:
    """Whether the GIL is on. It may turn on at run time, never off."""
    enabled = getattr(sys, "_is_gil_enabled", None)
    return enabled is None or bool(enabled())


def _nothing(_client: object) -> None:
    """The hit-path switch of a lifecycle that has no hit path."""


class Lifecycle(Generic[T]):
    """The state of one singleton: its slots, counters and overrides."""

    def __init__(  # noqa: PLR0913 -- one hook each.
        self,
        name: str,
        *,
        pushed: bool,
        min_interval: float,
        switch: Callable[[object], None] | None = None,
        arm_polled: Callable[[Record[T]], None] | None = None,
        arm_slot: Callable[[Record[T]], bool] | None = None,
    ) -> None:
        self.name = name
        self.lock = threading.RLock()
        # Lock-free steps rely on the GIL ordering every store and load
        # (see pin and invalidate); without it they take the lock.
        self.lock_free = gil()
        # The key is pushed (no key, or keys.env): the hit path may be armed.
        self.pushed = pushed
        self.min_interval = min_interval
        # Arms the hit path with a client, or disarms it with None; armed
        # is what it was last armed with (see _arm and _disarm).
        self.switch = switch or _nothing
        # Arms the hit path of a polled key with a record: it serves that
        # record's client while the key still returns what it was built for.
        self.arm_polled = arm_polled
        # The async driver's: arms the hit path of one slot (one event
        # loop) with its live record, for a pushed key, and says whether
        # it did; switch disarms it.
        self.arm_slot = arm_slot
        self.armed: object = None
        self.slots: dict[object, Slot] = {}
        self.overrides: tuple[tuple[object, object], ...] = ()
        # Bumped by every change of a watched environment variable.
        self.epoch = 0
        self.fork_errors: list[BaseException] = []
        # Closes decided but not started: a close claims its record first
        # (see claim), so one cut short before it began is still owed, and
        # close_all() does it.
        self.owed: tuple[Record[Any], ...] = ()
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
        if record is not None and self.arm_slot is not None:
            # Another loop may keep the arming: then armed stays as it was.
            if self.pushed:
                before, self.armed = self.armed, client
                if self.epoch != epoch or not self.arm_slot(record):
                    self.armed = before
            return
        self.armed = client
        if epoch is not None and self.epoch != epoch:
            self._disarm()
            return
        if record is None or self.pushed:
            self.switch(client)
        elif self.arm_polled is not None:
            self.arm_polled(record)

    def _disarm(self) -> None:
        if self.armed is not None:
            self.switch(None)
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

    # -- slots --------------------------------------------------------------

    @_locked
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

    @_locked
    def close_slot(self, slot: Slot, doomed: list[Record[Any]]) -> None:
        """Retire everything *slot* holds, leased or not, and forget it.

        For a loop that ends: its clients are closed even if leased.
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
        for record in out:
            record.open, record.state = False, ClientState.CLOSED
        if self.slots.get(slot.key) is slot:
            del self.slots[slot.key]
        owed = (*self.owed, *close)
        slot.live, slot.retired, slot.dropped, doomed[:], self.owed = None, (), True, close, owed  # noqa: E501  # fmt: skip

    # -- calls --------------------------------------------------------------

    @_locked
    def request(  # noqa: PLR0913, PLR0917 -- what a call knows.
        self,
        slot: Slot,
        key_hash: int,
        key: object,
        epoch: int,
        owner: object,
        new_done: Callable[[], object],
    ) -> Serve | Wait | Build:
        """Decide what a call for *key*, read at *epoch*, does next."""
        live = slot.live
        if live is not None and live.matches(key_hash, key):
            # Arm only if no watched variable changed since the key was
            # read; _arm checks again once it has stored armed.
            if epoch == self.epoch and not self.overrides:
                self._arm(live.client, live, epoch)
            return Serve(live)
        if slot.build is not None:
            return Wait(slot.build)
        ticket = Ticket(slot, key_hash, key, owner, new_done(), self.name)
        slot.build = ticket
        return Build(ticket)

    @_locked
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
            new.state, slot.build, ticket.finished, doomed[:], self.owed = closed, build, True, out, owed  # noqa: E501  # fmt: skip
            return
        old = slot.live
        retired, out, state, box = self._retire(slot, old, keep=new)
        owed, builds = (*self.owed, *out), self.builds + 1
        # One statement, its targets on one line: a tracer's line event
        # comes at each target's line, so none may land between stores.
        slot.live, slot.build, slot.built_at, slot.retired, box.state, self.generation, self.builds, ticket.record, ticket.finished, doomed[:], self.owed = new, build, now, retired, state, new.generation, builds, new, True, out, owed  # noqa: E501  # fmt: skip

    @_locked
    def failed(self, ticket: Ticket, error: BaseException | None) -> None:
        """Record a build that raised *error* (None: it was cancelled).

        Only an ``Exception`` is the build's failure, raised in the callers
        waiting for it. Anything else (``KeyboardInterrupt``, ``SystemExit``,
        cancellation) concerns the builder alone: its waiters retry.
        """
        if ticket.finished:
            return
        if not isinstance(error, Exception):
            error = None
        slot = ticket.slot
        build = None if slot.build is ticket else slot.build
        failures = self.build_failures + (error is not None)
        (
            slot.build, self.build_failures, ticket.error, ticket.finished,
        ) = (build, failures, error, True)  # fmt: skip

    @_locked
    def abandon(self, slot: Slot | None, done: object) -> bool:
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

    @_locked
    def lease(self, slot: Slot, record: Record[T]) -> bool:
        """Pin *record* if it is still live; return whether it was."""
        if record is not slot.live or record.state is not ClientState.LIVE:
            return False
        record.leases += 1
        return True

    @_locked
    def unlease(self, record: Record[T], doomed: list[Record[T]]) -> None:
        """End a lease; a retired record whose last lease ends is doomed."""
        leases = record.leases - 1
        if leases or record.pins or record.state is not ClientState.RETIRED:
            record.leases = leases
            return
        retired, close = self._last_lease(record)
        out = [] if close is None else [close]
        r, owed, closed = record, (*self.owed, *out), ClientState.CLOSED
        r.leases, r.state, r.slot.retired, doomed[:], self.owed = 0, closed, retired, out, owed  # noqa: E501  # fmt: skip

    # The sync lease's transitions. Its fast paths pin and unpin without
    # the lock (see _lease.py): the lease goes in the record's pins, then
    # the record's open flag is read; a transition that may retire the
    # record clears that flag, then reads the pins (_retire). Under the
    # GIL each side sees the other's store: a pin that finds the record
    # open is seen by its retirement; one that finds it closed comes here.
    # These are the slow paths: a pin after a miss or with the lock (no
    # GIL), the end of the last lease of a retired record, and an end that
    # was cut short.

    def pin(self, slot: Slot, client: object, lease: Holder) -> bool:
        """Pin *slot*'s live record if it holds *client*; say if it did.

        Call with the lock held, on the line that takes it. The pinned
        record goes to ``lease.pin`` on the line that adds the pin.
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
        # the GIL: there every unpin takes the lock).
        record.open = self.lock_free; lease.pin = record; record.pins[lease] = None  # noqa: E501, E702  # fmt: skip
        return True

    def unpin(self, lease: Holder) -> None:
        """End *lease*'s pin, if it holds one; idempotent.

        Call with the lock held, on the line that takes it (as _locked
        does, without its wrapper's frame). When this was the last lease
        of a retired record, that record goes to ``lease.doomed``.
        """
        record = lease.pin
        if not isinstance(record, Record):  # Not pinned, or already ended.
            return
        pins = record.pins
        if lease in pins: del pins[lease]  # noqa: E701  # fmt: skip
        if pins or record.leases or record.state is not ClientState.RETIRED:
            lease.pin = DONE
            return
        retired, close = self._last_lease(record)
        # The targets share one line: each store is a line event of its own
        # target's line, and no exception may land between them.
        r, closed = record, ClientState.CLOSED
        owed = self.owed if close is None else (*self.owed, close)
        r.leases, r.state, r.slot.retired, lease.pin, lease.doomed, self.owed = 0, closed, retired, DONE, close, owed  # noqa: E501  # fmt: skip

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

    @_locked
    def reset(self, slot: Slot, now: float, doomed: list[Record[T]]) -> bool:
        """Retire *slot*'s live client unless rate-limited; say if it was."""
        live = slot.live
        if live is None:
            return False
        if now - slot.built_at < self.min_interval:
            self.resets_refused += 1
            return False
        self._disarm()
        retired, out, state, box = self._retire(slot, live, keep=None)
        owed = (*self.owed, *out)
        slot.live, slot.retired, box.state, doomed[:], self.owed = None, retired, state, out, owed  # noqa: E501  # fmt: skip
        return True

    @_locked
    def detach(self, doomed: list[Record[T]]) -> None:
        """Retire every slot's live client, ignoring the rate limit."""
        self._disarm()
        out: list[Record[T]] = []
        for slot in list(self.slots.values()):
            live = slot.live
            if live is None:
                continue
            retired, more, state, box = self._retire(slot, live, None)
            owed = (*self.owed, *more)
            slot.live, slot.retired, box.state, self.owed = None, retired, state, owed  # noqa: E501  # fmt: skip
            out.extend(more)
        doomed[:] = out

    @_locked
    def claim(self, record: Record[Any]) -> bool:
        """Take *record*'s owed close; False if another close took it."""
        owed = self.owed
        rest = tuple(r for r in owed if r is not record)
        if len(rest) == len(owed):
            return False
        # One line: no exception lands between taking it and saying so.
        self.owed = rest; return True  # noqa: E702  # fmt: skip

    def owes(self, record: Record[Any]) -> bool:
        """Whether *record*'s close is owed: decided, not yet claimed."""
        return any(r is record for r in self.owed)

    @_locked
    def closed(self, *, ok: bool) -> None:
        """Count a close that ran (*ok*) or failed."""
        if ok:
            self.closes += 1
        else:
            self.close_failures += 1

    def _retire(
        self, slot: Slot, old: Record[Any] | None, keep: Record[Any] | None
    ) -> tuple[tuple[Record[Any], ...], list[Record[Any]], ClientState, Any]:
        """Decide *old*'s retirement; one store (below), nothing else.

        Returns the slot's new retired tuple, what to close now, the state
        to give *old* and the object to store it on (a sink when there is
        no *old*), so the caller commits all of it in one statement.

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

    # -- environment, overrides ---------------------------------------------

    def invalidate(self) -> None:
        """A watched variable changed: disarm and outdate keys read before.

        Runs on every write of a watched variable, so it is quick: the
        epoch moves first, in one store, then an armed hit path is disarmed
        under the lock, before the write returns. A call arming meanwhile
        (request, under the lock) stores ``armed`` first and reads the
        epoch after, before it switches the hit path on; this stores the
        epoch first and reads ``armed`` after. Under the GIL each sees the
        other's store: either this disarms that arming, or that arming
        sees the new epoch and does not switch. Without the GIL, the epoch
        moves under the lock (on one line, as ``_locked`` does).
        """
        if self.lock_free:
            self.epoch = next(_epochs)
        else:
            with self.lock: self.epoch = next(_epochs)  # noqa: E701  # fmt: skip
        if self.armed is not None:
            with self.lock: self._disarm()  # noqa: E701  # fmt: skip

    @_locked
    def push_override(self, token: object, obj: object) -> None:
        """Serve *obj* until the override named *token* is popped."""
        self.overrides = (*self.overrides, (token, obj))
        if self.pushed:
            self._arm(obj)
        else:
            self._disarm()

    @_locked
    def pop_override(self, token: object) -> None:
        """End the override named *token*, wherever it is in the stack.

        Idempotent. Disarms first: cut short before its commit, the
        override is still there (``holds_override``) and a second pop ends
        it; the hit path is never left armed with a popped stand-in.
        """
        self._disarm()
        self.overrides = tuple(o for o in self.overrides if o[0] is not token)

    def holds_override(self, token: object) -> bool:
        """Whether the override named *token* is still pushed."""
        return any(t is token for t, _ in self.overrides)

    # -- fork ---------------------------------------------------------------

    def forget_parent(self, *, keep: bool) -> list[Record[Any]]:
        """In a forked child: fresh lock, no builds; abandon unless *keep*.

        Takes no lock (another thread of the parent may have held it at the
        fork) and returns the abandoned records, never to be closed.
        """
        self.lock = threading.RLock()
        self.switch(None)
        self.armed = None
        self.owed = ()  # The parent's to close, never the child's.
        for slot in self.slots.values():
            slot.build = None
        if keep:
            self.pid = os.getpid()
            return []
        abandoned = list(self._holders())
        for record in abandoned:
            record.open, record.state = False, ClientState.ABANDONED
        for slot in self.slots.values():
            slot.live, slot.retired, slot.built_at = None, (), float("-inf")
            slot.dropped = slot.key is not None
        self.slots = {k: s for k, s in self.slots.items() if k is None}
        self._zero()
        return abandoned

    # -- inspection ---------------------------------------------------------

    @_locked
    def statistics(self, slot: Slot | None) -> Statistics:
        """Return a snapshot; live fields describe *slot*."""
        live = None if slot is None else slot.live
        records = list(self._holders())
        return Statistics(
            builds=self.builds,
            build_failures=self.build_failures,
            closes=self.closes,
            close_failures=self.close_failures,
            generation=0 if live is None else live.generation,
            key_fingerprint=None if live is None else live.fingerprint,
            pid=self.pid,
            leases=sum(r.leases + len(r.pins) for r in records),
            pending_close=sum(len(s.retired) for s in self.slots.values()),
            resets_refused=self.resets_refused,
            is_overridden=bool(self.overrides),
        )
