"""Leases: a pin on a live record, so that its close waits for them.

The async lease counts under the lock (``lease``, ``unlease``); the sync
lease pins without it where the GIL allows (see ``poolkeeper._lease``),
and comes here for its slow paths (``pin``, ``unpin``). Either way, the
last lease of a retired record to end decides its close.
"""

from __future__ import annotations

from itertools import chain, starmap
from operator import setitem
from typing import Any, TypeVar

from poolkeeper._lifecycle._state import State, locked
from poolkeeper._records import (
    ALL,
    DONE,
    ClientState,
    Holder,
    Record,
    Slot,
    commit,
)

T = TypeVar("T")


class Leases(State[T]):
    """Pins and their ends."""

    # The async lease's: *held* holds the record while the lease does, set
    # and cleared in the commit that counts it. A signal's exception can land
    # when these return (as the lock is released), before the caller sees
    # what they did: *held* still says whether the lease is to be ended.

    @locked
    def lease(self, slot: Slot, record: Record[T], held: list[Any]) -> bool:
        """Pin *record* if it is still live; return whether it was."""
        if record is not slot.live or record.state is not ClientState.LIVE:
            return False
        commit(
            chain(
                starmap(setattr, ((record, "leases", record.leases + 1),)),
                starmap(setitem, ((held, ALL, (record,)),)),
            )
        )
        return True

    @locked
    def unlease(self, held: list[Any], doomed: list[Record[T]]) -> None:
        """End the lease *held* holds, if any; idempotent.

        A retired record whose last lease ends is doomed.
        """
        if not held:
            return
        record: Record[T] = held[0]
        leases = record.leases - 1
        if leases or record.pins or record.state is not ClientState.RETIRED:
            commit(
                chain(
                    starmap(setattr, ((record, "leases", leases),)),
                    starmap(setitem, ((held, ALL, ()),)),
                )
            )
            return
        retired, close = self._last_lease(record)
        out = [] if close is None else [close]
        r, owed, closed = record, (*self.owed, *out), ClientState.CLOSED
        commit(
            chain(
                starmap(
                    setattr,
                    (
                        (r, "leases", 0),
                        (r, "state", closed),
                        (r.slot, "retired", retired),
                        (self, "owed", owed),
                    ),
                ),
                starmap(
                    setitem,
                    (
                        (doomed, ALL, out),
                        (held, ALL, ()),
                    ),
                ),
            )
        )

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
        # the GIL: there every unpin takes the lock).
        commit(
            chain(
                starmap(
                    setattr,
                    (
                        (record, "open", self.lock_free),
                        (lease, "pin", record),
                    ),
                ),
                starmap(setitem, ((record.pins, lease, None),)),
            )
        )
        return True

    def unpin(self, lease: Holder) -> None:
        """End *lease*'s pin, if it holds one; idempotent.

        Call with the lock held (through ``under``). When this was the last
        lease of a retired record, that record goes to ``lease.doomed``.
        """
        record = lease.pin
        if not isinstance(record, Record):  # Not pinned, or already ended.
            return
        pins = record.pins
        pins.pop(lease, None)
        if pins or record.leases or record.state is not ClientState.RETIRED:
            lease.pin = DONE
            return
        retired, close = self._last_lease(record)
        owed = self.owed if close is None else (*self.owed, close)
        commit(
            starmap(
                setattr,
                (
                    (record, "leases", 0),
                    (record, "state", ClientState.CLOSED),
                    (record.slot, "retired", retired),
                    (lease, "pin", DONE),
                    (lease, "doomed", close),
                    (self, "owed", owed),
                ),
            )
        )

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
