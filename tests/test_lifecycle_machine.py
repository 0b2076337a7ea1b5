"""State machines over the I/O-free lifecycle, and one over real loops.

The first machines drive ``poolkeeper._lifecycle.Lifecycle`` directly: no
threads, no loops, so Hypothesis runs thousands of steps a second through
every interleaving of requests, builds (finishing in any order, returning
new or already-held objects), failures, leases, resets, environment
changes, overrides, shutdown, loop ends and fork, over one slot (the sync
rules) or several (the async rules, one slot per loop).

The same rules and invariants also run as byte programs (see
``_run_program``), about ten times as many steps a second.

``POOLKEEPER_MACHINE_EXAMPLES`` sets the number of examples of every
machine here (CI keeps it small); ``HYPOTHESIS_PROFILE=soak`` does too.
"""

from __future__ import annotations

import asyncio
import contextlib
import inspect
import os
import threading
import time
from typing import TYPE_CHECKING

import pytest
from hypothesis import HealthCheck, Phase, given, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
    run_state_machine_as_test,
)

from poolkeeper import _lifecycle, _records, process_singleton
from poolkeeper._lifecycle import (
    DONE,
    HEALING,
    REASONS,
    Build,
    ClientState,
    Lifecycle,
    Record,
    Serve,
    Slot,
    Ticket,
    Wait,
)

if TYPE_CHECKING:
    from collections.abc import Callable

#: The healing rules' backoff, patched (see ``fake_clock``): the spacing
#: reaches its cap after two doublings.
FIRST, CAP = 1.0, 4.0
#: Healing reasons a heal() gives (check and max_age join them later).
HEAL_REASONS = ("retire", "retire_on")
#: How far the fake clock moves in one tick.
TICKS = (0.0, 0.25, 0.5, 1.0, 2.0, 5.0)


class FakeTime:
    """The lifecycle's clock, moved by the machine's ``tick`` rule.

    Only the thread that installed it sees the fake time: a timer left by
    another test's singleton keeps the real clock.
    """

    now = 0.0
    owner = 0

    @classmethod
    def monotonic(cls) -> float:
        if threading.get_ident() == cls.owner:
            return cls.now
        return time.monotonic()


@pytest.fixture
def fake_clock(monkeypatch):
    """The lifecycle and its records read FakeTime; the backoff is small."""
    FakeTime.now, FakeTime.owner = 0.0, threading.get_ident()
    monkeypatch.setattr(_lifecycle, "time", FakeTime)
    monkeypatch.setattr(_records, "time", FakeTime)
    monkeypatch.setattr(_lifecycle, "BACKOFF_FIRST", FIRST)
    monkeypatch.setattr(_lifecycle, "BACKOFF_CAP", CAP)


# Keys compare by value: -1 and -2 share a hash() in CPython.
KEYS = ("a", "b", -1, -2)
# Picks an element of a list, modulo its length.
AT = st.integers(0, 7)


def ask(life: Lifecycle[Client], slot: Slot, key: str, epoch: int):
    """Request *key* as a driver does: compared first, with no lock held."""
    live = slot.live
    matched = live is not None and live.matches(hash(key), key)
    return life.request(
        slot, live, matched, hash(key), key, epoch, None, object
    )


def _examples(default: int) -> int:
    """The examples to run: *default*, or what the environment asks for."""
    wanted = os.environ.get("POOLKEEPER_MACHINE_EXAMPLES")
    if wanted:
        return int(wanted)
    if os.environ.get("HYPOTHESIS_PROFILE") == "soak":
        return 20_000
    return default


class Holder:
    """A sync lease, as the lifecycle sees it: its pin and its close."""

    def __init__(self) -> None:
        self.pin: object = None
        self.doomed: Record[Client] | None = None


class Client:
    """A built object; counts its closes."""

    def __init__(self, key: object) -> None:
        self.key = key
        self.closes = 0


class LifecycleRules(RuleBasedStateMachine):
    """Every transition, in any order; the rules' invariants hold.

    The environment holds one key (``env``); a change of it is an
    invalidate(). A call reads the epoch and the key, maybe before the
    latest change (a stale read), and asks the lifecycle what to do.
    """

    steps = 0
    #: The sync rules: the process's one slot, and the hit path.
    sync = False
    #: The async rules with a pushed key: each loop's hit path is armed.
    loop_hit = False
    #: reset()'s rate limit, on the fake clock (see ``FakeTime``).
    min_interval = 0.0

    def __init__(self) -> None:
        super().__init__()
        self.armed: list[object] = [None]
        self.life: Lifecycle[Client] = Lifecycle(
            "machine",
            pushed=self.sync or self.loop_hit,
            min_interval=self.min_interval,
            arm=self._arm,
        )
        self.slots: list[Slot] = []
        self.loops = 0
        if self.sync:
            # The sync rules take the lock-free lease steps a build with
            # the GIL takes (pin, check_pin, unpin). One thread runs them,
            # so they hold, or not, on every build: a free-threaded one
            # runs them too, though its singletons pin under the lock.
            self.life.lock_free = True
            self.slots.append(self.life.open_slot(None, None)[0])
        else:
            self.open_loop_slot()
        self.env: object = KEYS[0]
        # (epoch, key) for every value the environment has held.
        self.history: list[tuple[int, object]] = [(0, self.env)]
        self.pending: list[Ticket] = []
        # Each async lease's held list (see Lifecycle.lease).
        self.leased: list[list[Record[Client]]] = []
        # Sync leases (_lease.py's lock-free steps): pinned, not yet
        # checked against the record's open flag; and pinned, in use.
        self.pinning: list[Holder] = []
        self.pinned: list[Holder] = []
        self.made: list[Client] = []
        self.abandoned: list[Client] = []
        self.closes = 0
        self.generations: list[int] = []
        self.builds = self.failures = 0
        self.tokens = 0
        # Healing: the fake clock, the timers the driver would have armed
        # (slot, record sequence, due), retirements by reason, every
        # record ever live and those retired since.
        FakeTime.now = 0.0
        self.timers: list[tuple[Slot, int, float]] = []
        self.retired_by: dict[str, int] = dict.fromkeys(REASONS, 0)
        self.lived: list[Record[Client]] = []
        self.gone: set[int] = set()

    # -- helpers ------------------------------------------------------------

    def _arm(
        self, client: object, record: Record[Client] | None, pushed: bool
    ) -> bool:
        # The change hook: what it was last armed with (None: disarmed). A
        # loop's hit path is armed with the record, the sync one with the
        # client; a polled key's loop hit path is never armed.
        if record is None:
            self.armed.append(client)
        elif self.loop_hit:
            self.armed.append(record)
        elif pushed:
            self.armed.append(client)
        else:
            return False
        return True

    def _close(self, doomed: list[Record[Client]]) -> None:
        for record in doomed:
            assert ClientState.CLOSED is record.state
            assert record.client not in self.abandoned
            # Owed once: the first claim takes it, a second finds nothing.
            assert self.life.claim(record)
            assert not self.life.claim(record)
            record.client.closes += 1
            self.closes += 1
            self.life.closed(ok=True)

    def _held(self) -> list[Client]:
        """Clients of live or retired records: objects still in use."""
        return [r.client for r in self.life._holders()]

    # -- the async rules: more slots -----------------------------------------

    @precondition(lambda self: not self.sync and len(self.slots) < 3)
    @rule()
    def open_loop_slot(self) -> None:
        """One more slot, as for one more event loop."""
        self.loops += 1
        loop = object()
        slot, replaced = self.life.open_slot(self.loops, lambda: loop)
        assert replaced is None
        self.slots.append(slot)

    @precondition(lambda self: not self.sync and self.slots)
    @rule(at=AT)
    def loop_id_reused(self, at: int) -> None:
        """A new loop has a dead loop's id: its slot replaces the old one."""
        index = at % len(self.slots)
        stale = self.slots[index]
        loop = object()
        slot, replaced = self.life.open_slot(stale.key, lambda: loop)
        assert replaced is stale
        assert slot is self.life.slots[stale.key]
        doomed: list[Record[Client]] = []
        self.retired_by["loop_end"] += stale.live is not None
        self.life.close_slot(stale, doomed)
        assert slot is self.life.slots[stale.key]  # The new one stays.
        self.slots[index] = slot
        self._close(doomed)

    @precondition(lambda self: not self.sync and self.slots)
    @rule(at=AT)
    def loop_ends(self, at: int) -> None:
        """A loop ends: its slot closes everything, leased or not."""
        slot = self.slots.pop(at % len(self.slots))
        doomed: list[Record[Client]] = []
        self.retired_by["loop_end"] += slot.live is not None
        self.life.close_slot(slot, doomed)
        assert self.armed[-1] is None  # A loop's end disarms.
        assert slot.dropped
        assert slot.key not in self.life.slots
        self._close(doomed)

    # -- calls ----------------------------------------------------------------

    @precondition(lambda self: self.slots)
    @rule(at=AT, back=st.integers(0, 3))
    def request(self, at: int, back: int) -> None:
        """A call asks for the key it read, perhaps before a change."""
        slot = self.slots[at % len(self.slots)]
        # back > 0: the call read the epoch and key before a change.
        epoch, key = self.history[max(0, len(self.history) - 1 - back)]
        armed = len(self.armed)
        step = ask(self.life, slot, key, epoch)
        if isinstance(step, Serve):
            record = step.record
            assert ClientState.LIVE is record.state
            assert record is slot.live
            assert record.matches(hash(key), key)
            assert 0 == record.client.closes
            # Never a retired record to a new call (healed or not).
            assert id(record) not in self.gone
        elif isinstance(step, Wait):
            assert step.ticket is slot.build
            assert not step.ticket.finished
        else:
            assert isinstance(step, Build)
            assert step.ticket is slot.build
            self.pending.append(step.ticket)
        if epoch != self.life.epoch or not (self.sync or self.loop_hit):
            # A stale read never arms the hit path, nor a polled key's loop.
            assert armed == len(self.armed)

    @precondition(lambda self: self.pending)
    @rule(at=AT, reuse=st.booleans(), pick=AT)
    def build(self, at: int, reuse: bool, pick: int) -> None:
        """A build finishes: a new object, or one already in use."""
        ticket = self.pending.pop(at % len(self.pending))
        held = self._held()
        if reuse and held:
            client = held[pick % len(held)]
        else:
            client = Client(ticket.key.value)
            self.made.append(client)
        live = ticket.slot.live
        if live is not None and not ticket.slot.dropped:
            self.retired_by["key"] += 1
        doomed: list[Record[Client]] = []
        self.life.built(ticket, client, None, FakeTime.now, doomed)
        assert self.armed[-1] is None  # Replacing a live client disarms.
        assert ticket.finished
        assert ticket.slot.build is not ticket
        if not ticket.slot.dropped:
            assert ticket.record is ticket.slot.live
            generation = ticket.record.generation
            assert all(g < generation for g in self.generations)
            self.generations.append(generation)
            self.builds += 1
        if live is not None and live.client is client:
            # The factory returned the live object: nothing is closed.
            assert [] == doomed
        again: list[Record[Client]] = []
        self.life.built(ticket, client, None, FakeTime.now, again)
        assert [] == again
        self._close(doomed)

    @precondition(lambda self: self.pending)
    @rule(at=AT, cancelled=st.booleans())
    def fail(self, at: int, cancelled: bool) -> None:
        """A build raises (or is cancelled); nothing is cached."""
        ticket = self.pending.pop(at % len(self.pending))
        live = ticket.slot.live
        self.life.failed(ticket, None if cancelled else OSError("down"))
        self.failures += not cancelled
        assert ticket.finished
        assert ticket.slot.build is not ticket
        assert live is ticket.slot.live
        self.life.failed(ticket, None)  # Idempotent.

    @precondition(lambda self: self.slots)
    @rule(at=AT)
    def lease(self, at: int) -> None:
        """Pin a slot's live record, if any."""
        slot = self.slots[at % len(self.slots)]
        record = slot.live
        if record is not None:
            held: list[Record[Client]] = []
            assert self.life.lease(slot, record, held)
            assert [record] == held
            self.leased.append(held)

    @precondition(lambda self: self.leased)
    @rule(at=AT)
    def unlease(self, at: int) -> None:
        """End a lease; a retired record may be closed now."""
        held = self.leased.pop(at % len(self.leased))
        doomed: list[Record[Client]] = []
        self.life.unlease(held, doomed)
        assert [] == held
        self.life.unlease(held, doomed)  # Idempotent.
        self._close(doomed)

    # -- the sync lease's steps, as _lease.py runs them without the lock ----

    def _unpin(self, holder: Holder) -> None:
        # _lease.py's _finish: the slow unpin, then the close it owes.
        self.life.unpin(holder)
        assert holder.pin is DONE
        if holder.doomed is not None:
            doomed, holder.doomed = [holder.doomed], None
            self._close(doomed)

    @precondition(lambda self: self.sync and self.slots[0].live is not None)
    @rule()
    def pin(self) -> None:
        """A lease's first step: its pin goes in the live record's pins."""
        holder, record = Holder(), self.slots[0].live
        holder.pin = record
        record.pins[holder] = None
        self.pinning.append(holder)

    @precondition(lambda self: self.pinning)
    @rule(at=AT)
    def check_pin(self, at: int) -> None:
        """Its second: the flag. Closed: the pin ends (and may close)."""
        holder = self.pinning.pop(at % len(self.pinning))
        record = holder.pin
        assert isinstance(record, Record)
        if record.open:
            self.pinned.append(holder)
        else:
            self._unpin(holder)

    @precondition(lambda self: self.sync and self.slots[0].live is not None)
    @rule()
    def pin_locked(self) -> None:
        """The slow path's pin, under the lock: it opens a live record."""
        holder, slot = Holder(), self.slots[0]
        assert slot.live is not None
        assert self.life.pin(slot, slot.live.client, holder)
        assert slot.live.open
        self.pinned.append(holder)

    @precondition(lambda self: self.pinned)
    @rule(at=AT)
    def unpin(self, at: int) -> None:
        """A lease's exit: the pin ends, then the flag decides the rest."""
        holder = self.pinned.pop(at % len(self.pinned))
        record = holder.pin
        assert isinstance(record, Record)
        record.pins.pop(holder, None)
        holder.pin = DONE if record.open else record
        if holder.pin is not DONE:
            self._unpin(holder)

    @precondition(lambda self: self.sync and self.slots[0].live is not None)
    @rule()
    def retire_cut_short(self) -> None:
        """A retirement cut short after its first store: closed to pins."""
        live = self.slots[0].live
        assert live is not None
        live.open = False

    @precondition(lambda self: self.slots)
    @rule(at=AT)
    def reset(self, at: int) -> None:
        """Retire a slot's live client, or defer it (min_interval)."""
        slot = self.slots[at % len(self.slots)]
        live = slot.live
        doomed: list[Record[Client]] = []
        now = FakeTime.now
        verdict = self.life.reset(slot, now, doomed)
        if live is None:
            assert verdict is None
        elif now - slot.built_at >= self.min_interval:
            assert verdict is not None
            assert verdict.retired
            assert slot.live is None
            self.retired_by["reset"] += 1
        else:
            # Refused for now, not dropped: the client stays live.
            assert verdict is not None
            assert not verdict.retired
            assert live is slot.live
            assert ClientState.LIVE is live.state
            self._deferred(slot, live, verdict)
        self._close(doomed)

    # -- healing ------------------------------------------------------------

    def _deferred(self, slot: Slot, live: Record[Client], verdict) -> None:
        """A deferral: pending for *live*; a new one arms a timer."""
        assert slot.deferred is not None
        sequence, due = slot.deferred.sequence, slot.deferred.due
        assert live.sequence == sequence == verdict.sequence
        assert verdict.reason == slot.deferred.reason
        if verdict.delay is not None:
            assert 0.0 <= verdict.delay <= max(CAP, self.min_interval)
            assert due == FakeTime.now + verdict.delay
            self.timers.append((slot, sequence, due))

    def _spaced(self, before: float, reason: str, *, deferred: bool) -> float:
        """The spacing after a retirement for *reason* (the backoff)."""
        if reason not in HEALING:
            return before
        if deferred and before:
            return min(before * 2, CAP)
        return FIRST

    @precondition(lambda self: self.slots)
    @rule(at=AT)
    def call(self, at: int) -> None:
        """A call for the current key, its build (if any) finishing at once.

        Healing needs a client built soon after the last one was retired:
        this makes one in a step.
        """
        self.request(at, 0)
        slot = self.slots[at % len(self.slots)]
        ticket = slot.build
        if ticket is not None and ticket in self.pending:
            self.build(self.pending.index(ticket), reuse=False, pick=0)

    @precondition(lambda self: self.slots)
    @rule(at=AT, rounds=st.integers(1, 4), dt=st.sampled_from(TICKS))
    def storm(self, at: int, rounds: int, dt: float) -> None:
        """Each new client fails soon: call, heal, time passes, timers fire.

        The backoff doubles towards its cap, and resets when a client
        outlives its spacing (a long *dt*).
        """
        for _ in range(rounds):
            if not self.slots:
                return
            self.call(at)
            self.heal(at, stale=False, pick=0, reason="retire_on")
            self.tick(dt)
            while any(due <= FakeTime.now for _, _, due in self.timers):
                self.fire(0)

    @rule(dt=st.sampled_from(TICKS))
    def tick(self, dt: float) -> None:
        """Time passes."""
        FakeTime.now += dt

    @precondition(lambda self: self.slots)
    @rule(
        at=AT,
        stale=st.booleans(),
        pick=AT,
        reason=st.sampled_from(HEAL_REASONS),
    )
    def heal(self, at: int, stale: bool, pick: int, reason: str) -> None:
        """retire(c) or retire_on, of the live client or a stale one."""
        slot = self.slots[at % len(self.slots)]
        live = slot.live
        if stale or live is None:
            others = self.made + [o for _, o in self.life.overrides]
            if not others:
                return
            client = others[pick % len(others)]
        else:
            client = live.client
        now = FakeTime.now
        before, pending = slot.spacing, slot.deferred
        error = "BrokenError" if reason == "retire_on" else None
        doomed: list[Record[Client]] = []
        verdict = self.life.heal(slot, client, reason, error, now, doomed)
        if live is None or live.client is not client:
            # Compare-and-retire: a stale client retires nothing.
            assert verdict is None
            assert [] == doomed
            assert live is slot.live
            assert (before, pending) == (slot.spacing, slot.deferred)
            return
        assert verdict is not None
        age = now - live.built_at
        mine = (
            pending is not None
            and pending.sequence == live.sequence
            and pending.reason in HEALING
        )
        due = mine and now >= pending.due
        # The first healing is immediate, and so is that of a client that
        # outlived its spacing, or whose deferral is due; else deferred.
        if mine:
            assert verdict.retired is due
        else:
            assert verdict.retired is (age >= before)
        if verdict.retired:
            said = pending.reason if due else reason
            assert said == verdict.reason
            assert slot.live is None
            assert ClientState.LIVE is not live.state
            assert slot.deferred is None
            assert self._spaced(before, said, deferred=due) == slot.spacing
            self.retired_by[said] += 1
        else:
            # Deferred: the client stays live and is served meanwhile.
            assert live is slot.live
            assert ClientState.LIVE is live.state
            assert before == slot.spacing
            self._deferred(slot, live, verdict)
            if pending is None or pending.sequence != live.sequence:
                assert slot.deferred.due == live.built_at + before
        self._close(doomed)

    @precondition(
        lambda self: any(due <= FakeTime.now for _, _, due in self.timers)
    )
    @rule(at=AT)
    def fire(self, at: int) -> None:
        """A deferral's timer ends: carry_out, if it still applies."""
        ready = [t for t in self.timers if t[2] <= FakeTime.now]
        timer = ready[at % len(ready)]
        self.timers.remove(timer)
        slot, sequence, _ = timer
        live, pending, before = slot.live, slot.deferred, slot.spacing
        doomed: list[Record[Client]] = []
        verdict = self.life.carry_out(slot, sequence, doomed)
        applies = (
            live is not None
            and live.sequence == sequence
            and pending is not None
            and pending.sequence == sequence
        )
        if not applies:
            assert verdict is None
            assert [] == doomed
            assert live is slot.live
            return
        assert verdict is not None
        assert pending is not None
        assert verdict.retired
        assert pending.reason == verdict.reason
        assert slot.live is None
        assert slot.deferred is None
        assert self._spaced(before, pending.reason, deferred=True) == (
            slot.spacing
        )
        self.retired_by[pending.reason] += 1
        self._close(doomed)

    # -- environment, overrides, shutdown, fork ----------------------------

    @rule(key=st.sampled_from(KEYS))
    def rotate(self, key: object) -> None:
        """A watched environment variable changes (maybe back)."""
        self.env = key
        self.life.invalidate()
        self.history.append((self.life.epoch, key))
        assert self.armed[-1] is None

    @rule()
    def push_override(self) -> None:
        """An override is pushed; the hit path serves it."""
        self.tokens += 1
        self.life.push_override(self.tokens, Client("override"))

    @precondition(lambda self: self.life.overrides)
    @rule(at=AT)
    def pop_override(self, at: int) -> None:
        """An override ends, maybe out of order."""
        overrides = self.life.overrides
        token, _ = overrides[at % len(overrides)]
        self.life.pop_override(token)
        assert token not in [t for t, _ in self.life.overrides]

    @rule()
    def detach(self) -> None:
        """close_all(): every live client is retired."""
        doomed: list[Record[Client]] = []
        self.retired_by["close_all"] += sum(
            s.live is not None for s in self.life.slots.values()
        )
        self.life.detach(doomed)
        assert self.armed[-1] is None
        assert all(s.live is None for s in self.life.slots.values())
        self._close(doomed)

    @rule(keep=st.booleans())
    def fork(self, keep: bool) -> None:
        """In a forked child: abandon all (or keep it), close nothing."""
        live = sum(s.live is not None for s in self.life.slots.values())
        before = {
            key: (s.spacing, s.deferred) for key, s in self.life.slots.items()
        }
        abandoned = self.life.forget_parent(keep=keep)
        assert self.armed[-1] is None
        assert all(ClientState.ABANDONED is r.state for r in abandoned)
        if keep:
            # Kept clients keep their backoff, deferrals and timers (the
            # fork hook resumes those in the child).
            assert [] == abandoned
            assert before == {
                key: (s.spacing, s.deferred)
                for key, s in self.life.slots.items()
            }
            return
        # The parent's timers are not the child's; the backoff restarts.
        self.timers.clear()
        assert all(
            (0.0, None) == (s.spacing, s.deferred)
            for s in self.life.slots.values()
        )
        self.abandoned.extend(r.client for r in abandoned)
        # The process's slot stays; loops' slots are the parent's.
        self.slots = [s for s in self.slots if s.key is None]
        assert self.slots == list(self.life.slots.values())
        # Leases are held by the parent's threads.
        self.leased.clear()
        self.pinning.clear()
        self.pinned.clear()
        self.generations.clear()  # Counters are per process.
        self.closes = self.builds = self.failures = 0
        self.retired_by = dict.fromkeys(REASONS, 0)
        self.retired_by["fork"] = live

    # -- invariants -----------------------------------------------------------

    @invariant()
    def each_client_closed_at_most_once(self) -> None:
        """No client object is ever closed twice; no inherited one at all."""
        assert all(c.closes <= 1 for c in self.made)
        assert all(0 == c.closes for c in self.abandoned)

    @invariant()
    def nothing_is_owed_between_steps(self) -> None:
        """Every close a transition decided was claimed by its driver."""
        assert () == self.life.owed

    @invariant()
    def live_and_leased_clients_are_open(self) -> None:
        """A live or retired (leased) client is never closed."""
        for slot in self.life.slots.values():
            if slot.live is not None:
                assert ClientState.LIVE is slot.live.state
                assert 0 == slot.live.client.closes
            for record in slot.retired:
                assert ClientState.RETIRED is record.state
                assert record.leases > 0 or record.pins
                assert 0 == record.client.closes
        # A lease that found its record open holds an open client.
        for holder in self.pinned:
            assert isinstance(holder.pin, Record)
            assert 0 == holder.pin.client.closes

    @invariant()
    def armed_only_with_what_a_call_would_get(self) -> None:
        """The hit path serves the top override or the current key's client."""
        armed = self.armed[-1]
        if armed is None:
            return
        if self.life.overrides:
            assert armed is self.life.overrides[-1][1]
            return
        if self.loop_hit:
            # A loop's hit path is armed with a record: its slot's live one.
            assert isinstance(armed, Record)
            assert armed is armed.slot.live
            assert ClientState.LIVE is armed.state
            assert armed.slot.key in self.life.slots
            assert armed.matches(hash(self.env), self.env)
            return
        assert self.sync
        live = self.life.slots[None].live
        assert live is not None
        assert armed is live.client
        # After a change, nothing built for an older value is armed.
        assert live.matches(hash(self.env), self.env)

    @invariant()
    def retired_records_stay_retired(self) -> None:
        """Note every record that stopped being live (never served again)."""
        for slot in self.life.slots.values():
            live = slot.live
            if live is not None and all(r is not live for r in self.lived):
                assert id(live) not in self.gone
                self.lived.append(live)
        current = {id(s.live) for s in self.life.slots.values()}
        for record in self.lived:
            if id(record) not in current:
                self.gone.add(id(record))

    @invariant()
    def backoff_within_bounds(self) -> None:
        """Spacing 0 or in [first, cap]; a deferral is the live client's."""
        for slot in self.life.slots.values():
            assert slot.spacing == 0.0 or FIRST <= slot.spacing <= CAP
            stats = self.life.statistics(slot, FakeTime.now)
            assert 0.0 <= stats.backoff <= CAP
            if slot.deferred is not None:
                assert slot.live is not None
                assert slot.deferred.sequence == slot.live.sequence
                assert slot.deferred.reason == stats.deferred
            else:
                assert stats.deferred is None

    @invariant()
    def retirements_add_up(self) -> None:
        """Retirements by reason: what the machine saw happen."""
        assert self.retired_by == self.life.statistics(None).retirements

    @invariant()
    def count(self) -> None:
        """Count the steps run (for the figures printed)."""
        type(self).steps += 1

    @invariant()
    def counters_add_up(self) -> None:
        """Every close, build and failure is counted; one read shows all."""
        slot = self.slots[0] if self.slots else None
        stats = self.life.statistics(slot)
        holders = list(self.life._holders())
        assert self.closes == stats.closes
        assert self.builds == stats.builds
        assert self.failures == stats.build_failures
        assert sum(r.leases + len(r.pins) for r in holders) == stats.leases
        assert sum(r.state is ClientState.RETIRED for r in holders) == (
            stats.pending_close
        )
        assert bool(self.life.overrides) is stats.is_overridden
        live = None if slot is None else slot.live
        assert (0 if live is None else live.generation) == stats.generation

    def teardown(self) -> None:
        """Drain: builds fail, leases end, everything closes exactly once."""
        for ticket in self.pending:
            self.life.failed(ticket, None)
        for held in self.leased:
            doomed: list[Record[Client]] = []
            self.life.unlease(held, doomed)
            self._close(doomed)
        while self.pinning:
            self.check_pin(0)
        while self.pinned:
            self.unpin(0)
        doomed = []
        self.life.detach(doomed)
        self._close(doomed)
        for slot in self.slots if not self.sync else ():
            self.life.close_slot(slot, doomed)
            self._close(doomed)
        assert [] == list(self.life._holders())
        assert all(1 == c.closes for c in self.made if c not in self.abandoned)
        assert all(0 == c.closes for c in self.abandoned)


class SyncRules(LifecycleRules):
    """The sync rules: the process's one slot, and the hit path."""

    sync = True


class LoopHitRules(LifecycleRules):
    """The async rules for a pushed key: each loop's hit path is armed."""

    loop_hit = True


class SyncLimitedRules(SyncRules):
    """The sync rules with min_rebuild_interval: resets are deferred too."""

    min_interval = 1.5


def _run(machine: type, examples: int, steps: int) -> None:
    """Run *machine* for *examples*; print its speed (shown with ``-s``)."""
    machine.steps = 0
    start = time.perf_counter()
    run_state_machine_as_test(
        machine,
        settings=settings(
            max_examples=examples,
            stateful_step_count=steps,
            deadline=None,
            suppress_health_check=[HealthCheck.too_slow],
        ),
    )
    elapsed = time.perf_counter() - start
    print(
        f"{machine.__name__}: {examples} examples, "
        f"{machine.steps} steps in {elapsed:.2f}s "
        f"({examples / elapsed:.0f} examples/s, "
        f"{machine.steps / elapsed:.0f} steps/s)"
    )


# -- the same rules as byte programs ------------------------------------------
#
# RuleBasedStateMachine spends most of its time choosing rules. These runs
# hand the machine's own rules and invariants a program instead: a byte
# string, three bytes a step (which rule, two arguments), with every
# invariant checked after each step. Hypothesis draws one string per
# example and shrinks it like any other, so the same transitions run at
# thousands of examples a second.

#: The machine's invariants, checked after each step.
_INVARIANTS = (
    "nothing_is_owed_between_steps",
    "each_client_closed_at_most_once",
    "live_and_leased_clients_are_open",
    "armed_only_with_what_a_call_would_get",
    "counters_add_up",
    "retired_records_stay_retired",
    "backoff_within_bounds",
    "retirements_add_up",
)
#: Rules and invariants without Hypothesis's wrappers (they cost more than
#: most transitions): a program checks preconditions itself.
_RAW: dict[str, Callable[..., None]] = {
    name: inspect.unwrap(function)
    for name, function in vars(LifecycleRules).items()
    if callable(function) and not name.startswith("__")
}

_OPS: tuple[tuple[Callable[[LifecycleRules], bool], Callable[..., None]], ...]
_OPS = (
    (
        lambda m: not m.sync and len(m.slots) < 3,
        lambda m, a, b: _RAW["open_loop_slot"](m),
    ),
    (
        lambda m: not m.sync and bool(m.slots),
        lambda m, a, b: _RAW["loop_id_reused"](m, a),
    ),
    (
        lambda m: not m.sync and bool(m.slots),
        lambda m, a, b: _RAW["loop_ends"](m, a),
    ),
    (lambda m: bool(m.slots), lambda m, a, b: _RAW["request"](m, a, b % 4)),
    (lambda m: bool(m.slots), lambda m, a, b: _RAW["request"](m, a, 0)),
    (
        lambda m: bool(m.pending),
        lambda m, a, b: _RAW["build"](m, a, bool(b & 1), b >> 1),
    ),
    (
        lambda m: bool(m.pending),
        lambda m, a, b: _RAW["fail"](m, a, bool(b & 1)),
    ),
    (lambda m: bool(m.slots), lambda m, a, b: _RAW["lease"](m, a)),
    (lambda m: bool(m.leased), lambda m, a, b: _RAW["unlease"](m, a)),
    (lambda m: bool(m.slots), lambda m, a, b: _RAW["reset"](m, a)),
    (lambda m: True, lambda m, a, b: _RAW["rotate"](m, KEYS[a % len(KEYS)])),
    (lambda m: True, lambda m, a, b: _RAW["push_override"](m)),
    (
        lambda m: bool(m.life.overrides),
        lambda m, a, b: _RAW["pop_override"](m, a),
    ),
    (lambda m: True, lambda m, a, b: _RAW["detach"](m)),
    (lambda m: True, lambda m, a, b: _RAW["fork"](m, bool(a & 1))),
    (
        lambda m: m.sync and m.slots[0].live is not None,
        lambda m, a, b: _RAW["pin"](m),
    ),
    (lambda m: bool(m.pinning), lambda m, a, b: _RAW["check_pin"](m, a)),
    (
        lambda m: m.sync and m.slots[0].live is not None,
        lambda m, a, b: _RAW["pin_locked"](m),
    ),
    (lambda m: bool(m.pinned), lambda m, a, b: _RAW["unpin"](m, a)),
    (
        lambda m: m.sync and m.slots[0].live is not None,
        lambda m, a, b: _RAW["retire_cut_short"](m),
    ),
    (lambda m: True, lambda m, a, b: _RAW["tick"](m, TICKS[a % len(TICKS)])),
    *[
        (
            lambda m: bool(m.slots),
            lambda m, a, b: _RAW["heal"](
                m, a, b % 4 == 0, b >> 2, HEAL_REASONS[(b >> 1) & 1]
            ),
        ),
        (lambda m: bool(m.slots), lambda m, a, b: _RAW["call"](m, a)),
        (
            lambda m: bool(m.slots),
            lambda m, a, b: _RAW["storm"](
                m, a, 1 + b % 4, TICKS[(b >> 2) % len(TICKS)]
            ),
        ),
    ]
    * 2,
    (
        lambda m: any(due <= FakeTime.now for _, _, due in m.timers),
        lambda m, a, b: _RAW["fire"](m, a),
    ),
)


def _run_program(machine: type[LifecycleRules], program: bytes) -> int:
    """Run *program* through a fresh *machine*; return the steps it ran.

    Every invariant is checked after each step.
    """
    m = machine()
    checks = tuple(_RAW[name].__get__(m) for name in _INVARIANTS)
    ran = 0
    for at in range(0, len(program) - 2, 3):
        op, a, b = program[at : at + 3]
        # The first enabled rule from the chosen one on (rotate always is).
        for enabled, step in _OPS[op % len(_OPS) :] + _OPS:
            if enabled(m):
                step(m, a, b)
                break
        ran += 1
        for check in checks:
            check()
    m.teardown()
    return ran


def _run_programs(machine: type[LifecycleRules], examples: int) -> None:
    """Run *examples* programs of 10 to 40 steps; print the speed."""
    counted = {"examples": 0, "steps": 0}

    @settings(
        max_examples=examples,
        deadline=None,
        suppress_health_check=[HealthCheck.too_slow],
        database=None,
        # Generate and, on a failure, shrink: the other phases find nothing
        # here and cost a third of the time of each example.
        phases=(Phase.generate, Phase.shrink),
    )
    @given(st.binary(min_size=30, max_size=120))
    def programs(program: bytes) -> None:
        counted["examples"] += 1
        counted["steps"] += _run_program(machine, program)

    start = time.perf_counter()
    programs()
    elapsed = time.perf_counter() - start
    print(
        f"{machine.__name__} programs: {counted['examples']} examples, "
        f"{counted['steps']} steps in {elapsed:.2f}s "
        f"({counted['examples'] / elapsed:.0f} examples/s, "
        f"{counted['steps'] / elapsed:.0f} steps/s)"
    )


class TestLifecycleMachines:
    """The I/O-free lifecycle, under every interleaving Hypothesis finds."""

    @pytest.mark.parametrize(
        ("machine", "default"),
        [
            (SyncRules, 50),
            (LifecycleRules, 100),
            (LoopHitRules, 100),
            (SyncLimitedRules, 50),
        ],
        ids=["sync", "async", "async armed", "sync limited"],
    )
    @pytest.mark.usefixtures("fake_clock")
    def test_rules_hold(self, machine, default):
        """No sequence of transitions breaks the lifecycle's invariants."""
        _run(machine, _examples(default), 50)

    @pytest.mark.parametrize(
        "machine",
        [SyncRules, LifecycleRules, SyncLimitedRules],
        ids=["sync", "async", "sync limited"],
    )
    @pytest.mark.usefixtures("fake_clock")
    def test_rules_hold_for_programs(self, machine):
        """The same rules and invariants, fed thousands of byte programs."""
        _run_programs(machine, _examples(100) * 20)


class TestRegressions:
    """Counterexamples the machine found, kept as plain tests."""

    def _life(self) -> tuple[Lifecycle[Client], Slot]:
        life: Lifecycle[Client] = Lifecycle(
            "regression", pushed=False, min_interval=0.0
        )
        loop = object()
        return life, life.open_slot(1, lambda: loop)[0]

    def _build(
        self, life: Lifecycle[Client], slot: Slot, client: Client
    ) -> list[Record[Client]]:
        step = ask(life, slot, "a", life.epoch)
        assert isinstance(step, Build)
        doomed: list[Record[Client]] = []
        life.built(step.ticket, client, None, 0.0, doomed)
        return doomed

    def test_build_after_fork_returning_a_live_object_closes_nothing(self):
        """A parent's build ending in the child with a live object keeps it."""
        life, old = self._life()
        step = ask(life, old, "a", life.epoch)
        assert isinstance(step, Build)
        life.forget_parent(keep=False)
        assert old.dropped
        loop = object()
        new = life.open_slot(2, lambda: loop)[0]
        shared = Client("a")
        assert [] == self._build(life, new, shared)
        doomed: list[Record[Client]] = []
        life.built(step.ticket, shared, None, 0.0, doomed)
        assert [] == doomed
        assert old.build is None
        assert shared is new.live.client
        life.close_slot(new, doomed)
        assert [shared] == [r.client for r in doomed]

    def test_build_after_its_loop_ended_closes_what_nobody_holds(self):
        """A build whose loop ended meanwhile closes its client once."""
        life, old = self._life()
        step = ask(life, old, "a", life.epoch)
        assert isinstance(step, Build)
        doomed: list[Record[Client]] = []
        life.close_slot(old, doomed)
        assert [] == doomed
        client = Client("a")
        life.built(step.ticket, client, None, 0.0, doomed)
        assert [client] == [r.client for r in doomed]
        assert ClientState.CLOSED is doomed[0].state
        assert old.build is None

    def test_loop_end_closes_an_object_held_twice_once(self):
        """A leased client the factory returned again is closed once."""
        life, slot = self._life()
        client = Client("a")
        self._build(life, slot, client)
        leased = slot.live
        held: list[Record[Client]] = []
        assert life.lease(slot, leased, held)
        step = ask(life, slot, "b", life.epoch)
        assert isinstance(step, Build)
        doomed: list[Record[Client]] = []
        life.built(step.ticket, client, None, 0.0, doomed)
        assert [] == doomed
        assert (leased,) == slot.retired
        life.close_slot(slot, doomed)
        assert [client] == [r.client for r in doomed]
        after: list[Record[Client]] = []
        life.unlease(held, after)
        assert [] == after


class AsyncClient:
    """An async client that records the loop it was closed on."""

    def __init__(self, key: str) -> None:
        self.key = key
        self.closed_on: list[object] = []

    async def aclose(self) -> None:
        self.closed_on.append(asyncio.get_running_loop())


class LoopRules(RuleBasedStateMachine):
    """An async singleton on a real event loop, against a plain model."""

    steps = 0

    def __init__(self) -> None:
        super().__init__()
        self.loop = asyncio.new_event_loop()
        self.key = "k0"
        self.failing = False
        self.built: list[AsyncClient] = []
        self.stack = contextlib.AsyncExitStack()
        self.leased: list[AsyncClient] = []
        machine = self

        async def factory() -> AsyncClient:
            await asyncio.sleep(0)
            if machine.failing:
                raise OSError("down")
            client = AsyncClient(machine.key)
            machine.built.append(client)
            return client

        self.single = process_singleton(key=lambda: self.key)(factory)

    def run(self, coro):
        return self.loop.run_until_complete(asyncio.wait_for(coro, 30))

    @rule(n=st.integers(1, 4))
    def call(self, n: int) -> None:
        """N tasks await at once: one object for all, or one error."""

        async def many():
            live = self.single.current()
            results = await asyncio.gather(
                *(self.single() for _ in range(n)), return_exceptions=True
            )
            return live, results

        live, results = self.run(many())
        if self.failing and (live is None or live.key != self.key):
            assert all(isinstance(r, OSError) for r in results)
            return
        assert 1 == len({id(r) for r in results})
        client = results[0]
        assert self.key == client.key
        assert [] == client.closed_on

    @rule(key=st.sampled_from(["k0", "k1", "k2"]))
    def rotate(self, key: str) -> None:
        """The key changes."""
        self.key = key

    @rule(failing=st.booleans())
    def set_failing(self, failing: bool) -> None:
        """Builds start or stop failing."""
        self.failing = failing

    @rule()
    def reset(self) -> None:
        """Retire the live client."""
        self.run(self.single.reset())

    @precondition(lambda self: not self.failing and len(self.leased) < 3)
    @rule()
    def lease(self) -> None:
        """Hold a lease across later steps."""
        client = self.run(self.stack.enter_async_context(self.single.lease()))
        assert [] == client.closed_on
        self.leased.append(client)

    @rule()
    def release(self) -> None:
        """End every lease."""
        self.run(self.stack.aclose())
        self.stack = contextlib.AsyncExitStack()
        self.leased.clear()

    @invariant()
    def count(self) -> None:
        """Count the steps run (for the figures printed)."""
        type(self).steps += 1

    @invariant()
    def closes_are_single_and_never_under_a_lease(self) -> None:
        """Closed at most once, on this loop, never while leased or live."""
        slots = self.single._self_life.slots
        current = {id(s.live.client) for s in slots.values() if s.live}
        for client in self.built:
            assert len(client.closed_on) <= 1
            if client.closed_on:
                assert [self.loop] == client.closed_on
                assert id(client) not in current
        for client in self.leased:
            assert [] == client.closed_on

    def teardown(self) -> None:
        """The loop's end closes every client on it, exactly once."""
        self.run(self.stack.aclose())
        self.loop.run_until_complete(self.loop.shutdown_asyncgens())
        self.loop.close()
        assert all([self.loop] == c.closed_on for c in self.built)


class TestLoopMachine:
    """The async driver on a real loop keeps the same rules."""

    def test_rules_hold(self):
        """Calls, rotations, failures, resets and leases on a real loop."""
        _run(LoopRules, max(1, _examples(60) // 3), 15)
