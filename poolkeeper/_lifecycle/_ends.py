"""Ends: retiring clients, owed closes, a loop's end and a fork.

``reset`` and ``detach`` retire live clients (``close_all`` detaches every
singleton); ``close_slot`` closes what an ended event loop held; ``claim``
and ``owes`` keep each decided close owed until one close takes it;
``forget_parent`` clears a forked child's inheritance without closing it.
"""

from __future__ import annotations

import os
import threading
from itertools import chain, starmap
from operator import setitem
from typing import Any, TypeVar

from poolkeeper._lifecycle._state import State, locked
from poolkeeper._records import ALL, ClientState, Record, Slot, commit

T = TypeVar("T")


class Ends(State[T]):
    """Retirements, closes and the fork."""

    @locked
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
        commit(
            chain(
                starmap(
                    setattr,
                    (
                        (slot, "live", None),
                        (slot, "retired", ()),
                        (slot, "dropped", True),
                        (self, "owed", owed),
                    ),
                ),
                starmap(setitem, ((doomed, ALL, close),)),
            )
        )

    @locked
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
        commit(
            chain(
                starmap(
                    setattr,
                    (
                        (slot, "live", None),
                        (slot, "retired", retired),
                        (box, "state", state),
                        (self, "owed", owed),
                    ),
                ),
                starmap(setitem, ((doomed, ALL, out),)),
            )
        )
        return True

    @locked
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
            commit(
                starmap(
                    setattr,
                    (
                        (slot, "live", None),
                        (slot, "retired", retired),
                        (box, "state", state),
                        (self, "owed", owed),
                    ),
                )
            )
            out.extend(more)
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
            commit(starmap(setattr, ((self, "owed", rest),)))
            return True
        commit(
            chain(
                starmap(setattr, ((self, "owed", rest),)),
                starmap(setitem, ((taken, ALL, (record,)),)),
            )
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

    @locked
    def closed(self, *, ok: bool) -> None:
        """Count a close that ran (*ok*) or failed."""
        if ok:
            self.closes += 1
        else:
            self.close_failures += 1

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
