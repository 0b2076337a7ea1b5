"""Changes from outside: a subscribed variable, and overrides.

``invalidate`` runs on every write of a subscribed environment variable (see
``poolkeeper._environ``); the override stack serves stand-ins.
"""

from __future__ import annotations

from typing import TypeVar

from poolkeeper._lifecycle._state import State, epochs, locked
from poolkeeper._records import under

T = TypeVar("T")


class Changes(State[T]):
    """Key changes (subscriptions) and overrides."""

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

    def holds_override(self, token: object) -> bool:
        """Whether the override named *token* is still pushed."""
        return any(t is token for t, _ in self.overrides)
