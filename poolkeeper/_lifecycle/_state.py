"""The lifecycle's state, and what every transition shares.

:class:`State` holds one singleton's slots, counters, overrides and
hit-path switch. Its helpers arm and disarm the hit path and decide a
retirement; ``locked`` runs a transition under the lock. The transitions
themselves are grouped by job in this package's other modules, and
:class:`~poolkeeper._lifecycle.Lifecycle` puts them together.
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

from poolkeeper._records import ClientState, Record, Slot
from poolkeeper._stats import Statistics

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

T = TypeVar("T")
L = TypeVar("L", bound="State[Any]")
P = ParamSpec("P")
R = TypeVar("R")

#: How many builds for other keys a call waits out before giving up.
MAX_ROUNDS: Final = 100

# Epochs: each change of a watched variable stores a number never stored
# before (next() on it is atomic), so an epoch that still equals the one a
# call read means no change has been stored since. Not 0, the first epoch.
epochs = itertools.count(1)


class _Sink:
    """Absorbs a state store aimed at no record (see ``_retire``)."""

    __slots__ = ("leases", "open", "state")


def locked(
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


def _nothing(_client: object) -> None:
    """The hit-path switch of a lifecycle that has no hit path."""


class State(Generic[T]):
    """One singleton's state: its slots, counters, overrides, hit path."""

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

    @locked
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
