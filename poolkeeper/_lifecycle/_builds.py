"""Calls and builds: what a call does next, and how a build ends.

A call asks ``request`` what to do (serve the live record, wait for a
build, or build now); the build it runs ends in ``built`` (the client goes
live, the one it replaces is retired) or ``failed``; ``abandon`` settles a
build whose call unwound before building.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, TypeVar

from poolkeeper._lifecycle._state import State, locked
from poolkeeper._records import (
    Build,
    ClientState,
    Record,
    Serve,
    Slot,
    Ticket,
    Wait,
)

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")


class Builds(State[T]):
    """Slots, requests, and the end of each build."""

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
    ) -> Serve | Wait | Build | None:
        """Decide what a call for *key*, read at *epoch*, does next.

        The caller compared *key* with the slot's live record, *compared*,
        before, with no lock held (a key's ``__eq__`` is user code): it
        *matched* or not. None means the live record changed meanwhile:
        compare again.
        """
        live = slot.live
        if live is not compared:
            return None
        if live is not None and matched:
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
            new.state, slot.build, ticket.finished, doomed[:], self.owed = closed, build, True, out, owed  # noqa: E501  # fmt: skip
            return
        old = slot.live
        retired, out, state, box = self._retire(slot, old, keep=new)
        owed, builds = (*self.owed, *out), self.builds + 1
        # One statement, its targets on one line: a tracer's line event
        # comes at each target's line, so none may land between stores.
        slot.live, slot.build, slot.built_at, slot.retired, box.state, self.generation, self.builds, ticket.record, ticket.finished, doomed[:], self.owed = new, build, now, retired, state, new.generation, builds, new, True, out, owed  # noqa: E501  # fmt: skip

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
        (
            slot.build, self.build_failures, ticket.error, ticket.finished,
        ) = (build, failures, error, True)  # fmt: skip

    @locked
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
