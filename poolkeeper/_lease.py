"""The sync lease: ``with single.lease() as client:``.

A lease pins the live client, so that its close waits until the last lease
on it ends. Leases are taken around every unit of work, so they are built
for speed: making one runs no Python code (each singleton has its own
:class:`Lease` subclass that carries what its leases need, and its
``lease`` attribute is that class), entering one is a hit (no Python frame
while the hit path is armed) plus one pin, and exiting one is one unpin.
Two Python frames in all, ``__enter__`` and ``__exit__``
(tests/test_hit_frames.py counts them), and no lock.

The protocol is I3 of :mod:`poolkeeper._lifecycle`. A pin is the
lease's entry in its record's ``pins``, added right after the lease
records it, and then checked against the record's ``open`` flag, which
every transition that may retire the record clears before it reads the
pins. Under the GIL, stores and loads happen in one
order, so either the pin finds the record open and its retirement sees
the pin (and leaves the close to the last lease), or the pin finds the
record closed and ends itself under the lock. An unpin removes the entry,
then reads the flag the same way: open, and the retirement will not see
it; closed, and the lock decides who closes. On a free-threaded
build (``Py_GIL_DISABLED``, even while its GIL is on), both steps take
the lifecycle's lock instead: a pin is added under it, and an unpin,
whose first removal of the entry is one dictionary operation (atomic
there too), always finds the flag cleared and ends under it.

A retired record holds its pins weakly (see ``loosen`` below): a lease
dropped without exiting releases its pin when it is collected.

An exception may land at any line (a signal handler's
``KeyboardInterrupt``): no store that adds or removes a pin is separated
from the next by a call, ``__enter__`` ends a pin it cannot return, and
each step of ``__exit__`` is repeated by the next layer if it was cut
short; every step is idempotent, so none runs twice.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import warnings
import weakref
from typing import TYPE_CHECKING, Any, ClassVar, Generic, TypeVar, cast

from poolkeeper._close import close_soon
from poolkeeper._identity import too_many_rounds
from poolkeeper._lifecycle import (
    DONE,
    MAX_ROUNDS,
    Ended,
    Record,
)
from poolkeeper._records import is_owned, under
from poolkeeper.exceptions import PoolkeeperWarning

if TYPE_CHECKING:
    from collections.abc import Callable

    from poolkeeper._close import Closer
    from poolkeeper._lifecycle import Lifecycle, Slot

T = TypeVar("T")

log = logging.getLogger("poolkeeper")

_ONCE = "A lease is entered once; call lease() for another."


class Lease(Generic[T]):
    """A lease of one singleton's live client; enter it once.

    Holds the singleton weakly: a lease entered after its singleton was
    garbage collected raises :class:`ReferenceError`, and a lease entered
    before still ends (and closes its client then), as ``close_all()``
    promises.
    """

    # Set on each singleton's own subclass (see lease_class).
    _life: ClassVar[Lifecycle[Any]]
    _slot: ClassVar[Slot]
    _closer: ClassVar[Closer]
    _name: ClassVar[str]
    # Whether the singleton has retire_on: an exception escaping the with
    # block is then offered to it (see _exit_raising).
    _heals: ClassVar[bool] = False
    # What the fast path reads, in one tuple: a class attribute read
    # through an instance costs a dictionary miss and a type lookup.
    _hot: ClassVar[
        tuple[weakref.ReferenceType[Any], Slot, Lifecycle[Any], bool]
    ]

    # The instance's state, defaults on the class so that making a lease
    # stores nothing: pin is None until entered, then the pinned record,
    # then DONE (also for an override, which pins nothing); doomed is the
    # record whose close this lease owes, once its pin ended.
    pin: Record[Any] | Ended | None = None
    doomed: Record[Any] | None = None

    # A retired record holds its pins weakly (see loosen): this lease's
    # exit finds its entry there, a weak reference to it, by equality. A
    # live record's pins hold the lease itself, found by identity: no
    # Python frame on the fast path.
    def __eq__(self, other: object) -> bool:
        return other is self or (type(other) is PinRef and other() is self)

    __hash__ = object.__hash__

    def __enter__(self) -> T:
        """Pin the live client (building it if needed) and return it."""
        if self.pin is not None:
            # Before the try: refused, a lease still in use keeps its pin.
            raise RuntimeError(_ONCE)
        ref, slot, life, lock_free = self._hot
        single: Callable[[], T] | None = ref()
        try:
            if lock_free and single is not None and not life.overrides:
                # The hit path (armed: no Python frame), then pin the live
                # record if it still holds what the call returned.
                client = single()
                record = slot.live
                if record is not None and record.client is client:
                    # Three stores that call nothing (CPython runs signal
                    # handlers after calls): the lease's record of the pin
                    # first, then the pin, so an exception between them is
                    # ended by __exit__ below. Then the flag, read after.
                    self.pin = record
                    self.doomed = None
                    record.pins[self] = None
                    if record.open:
                        return client
                    # Being retired: end the pin (closing the record if
                    # its retirement saw this pin), then the slow path.
                    self._finish()
                    self.pin = None
            return self._enter(single)
        except BaseException:
            # The with statement runs no __exit__ when __enter__ raises: an
            # exception after the pin (a signal's) must end it here.
            self.__exit__(None, None, None)
            raise

    def _enter(self, single: Callable[[], T] | None) -> T:
        # The slow path: errors, overrides, a client retired meanwhile.
        if single is None:  # Dropped between lease() and entering it.
            msg = (
                f"The singleton {self._name} was garbage collected before "
                "this lease was entered, and its clients were closed; keep "
                "a reference to the singleton (a module-level name, say) "
                "while its leases are in use."
            )
            raise ReferenceError(msg)
        life, slot = self._life, self._slot
        for _ in range(MAX_ROUNDS):
            # Overrides win; the helper is called only when there is one
            # (this is every lease's path without the GIL).
            if life.overrides and (won := life.override()):
                self.pin = DONE
                return cast("T", won[0])
            client = single()
            if under(life.lock, life.pin, slot, client, self):
                return client
        raise too_many_rounds(self._name, "lease")

    def __exit__(self, exc_type: object, exc: object, tb: object) -> None:
        """End the pin; close the client if it was retired meanwhile.

        With *retire_on*, an exception escaping the block that matches it
        retires the leased client once the pin has ended; the exception
        propagates unchanged.
        """
        # Each layer finishes what an exception cut short inside it. Only
        # an exception at this first line, before any of it runs, escapes
        # them (as it escapes any with statement's exit).
        try:
            try:
                record = self.pin
                if type(record) is Record:
                    # The pin ends, then the flag is read: open, and no
                    # retirement will count this lease; closed (always,
                    # without the GIL), and _finish settles it under the
                    # lock. An exception after the pop leaves it to _finish
                    # too.
                    record.pins.pop(self, None)
                    self.pin = DONE if record.open else record
            finally:
                if self.pin is not DONE or self.doomed is not None:
                    self._finish()
        finally:
            if self.pin is not DONE or self.doomed is not None:
                self._finish()
        # The pin has ended. An exception escaping the block (never on the
        # fast path) is offered to retire_on, with the client it ran on.
        if exc is not None and self._heals:
            _offer(self, record, cast("BaseException", exc))

    def _finish(self) -> None:
        # The slow path, idempotent: the last lease of a retired record, or
        # an exit that was cut short.
        life = self._life
        if type(self.pin) is Record:
            under(life.lock, life.unpin, self)
        if self.doomed is not None:
            # Closed, then forgotten: cut between the two, the next layer
            # closes it again, which its claim on the record makes a no-op.
            self._closer.close(self.doomed)
            self.doomed = None


def _offer(
    lease: Lease[Any], record: Record[Any] | Ended | None, exc: BaseException
) -> None:
    """Offer *exc*, escaping *lease*'s block, to its singleton's retire_on.

    A module function, not a method: the lease class's fast path is
    measured in instructions (benchmarks/callgrind_hits.py). The driver's
    retire_on never raises an ``Exception``: the block's exception
    propagates unchanged.
    """
    single = lease._hot[0]()
    if isinstance(record, Record) and single is not None:
        single._retire_on(record.client, exc)


def lease_class(  # noqa: PLR0913 -- what its leases carry.
    single: object,
    life: Lifecycle[T],
    slot: Slot,
    closer: Closer,
    name: str,
    *,
    heals: bool = False,
) -> type[Lease[T]]:
    """Return the lease class of *single*; it holds *single* weakly."""
    return cast(
        "type[Lease[T]]",
        type(
            Lease.__name__,
            (Lease,),
            {
                "__module__": Lease.__module__,
                "__qualname__": Lease.__qualname__,
                "_life": life,
                "_slot": slot,
                "_closer": closer,
                "_name": name,
                "_heals": heals,
                "_hot": (weakref.ref(single), slot, life, life.lock_free),
            },
        ),
    )


# -- leases dropped without exiting ------------------------------------------
#
# A lease entered and never exited (a manual __enter__, an ExitStack never
# closed) would keep its record's pin for ever, and a retired record's
# close with it. So a retired record holds its pins weakly: once a
# transition retired records, the driver calls loosen(), which swaps each
# such record's pins for weak references to the same leases (under the
# lock; lock-free steps on a retired record always end under the lock, see
# the module's docstring). A lease the program still holds keeps its pin;
# one that is garbage collected releases it, with a warning, and its
# record closes if that was its last lease. The weak reference's callback
# runs wherever the collector does: it queues the release, which runs only
# if the lifecycle's lock is free (and not held by this thread), else at
# the next loosen() or close_all().


class PinRef(weakref.ref[Any]):
    """A retired record's weak pin: a lease the program may have dropped."""

    __slots__ = ("doomed", "lease_class", "pin")

    pin: Record[Any] | Ended | None
    doomed: Record[Any] | None
    lease_class: type[Lease[Any]]


_dropped: collections.deque[PinRef] = collections.deque()
_NO_WAIT = (False,)


def _on_drop(ref: PinRef) -> None:
    _dropped.append(ref)
    release_dropped()


def loosen(life: Lifecycle[Any]) -> None:
    """Hold the pins of *life*'s retired records weakly (see above)."""
    under(life.lock, _loosen, life)
    release_dropped()


def _loosen(life: Lifecycle[Any]) -> None:
    for slot in list(life.slots.values()):
        for record in slot.retired:
            pins = record.pins
            keys = list(pins)
            if all(type(k) is PinRef for k in keys):
                continue
            loose: dict[object, None] = {}
            for key in keys:
                if type(key) is not PinRef:
                    ref = PinRef(key, _on_drop)
                    ref.pin, ref.doomed = record, None
                    ref.lease_class = cast("type[Lease[Any]]", type(key))
                    key = ref  # noqa: PLW2901 -- its weak form.
                loose[key] = None
            # One store: a lease exiting meanwhile without the lock finds
            # the record closed and ends its pin under the lock, here.
            record.pins = loose


def release_dropped() -> None:
    """Release the pins of collected leases; never blocks."""
    for _ in range(len(_dropped)):
        try:
            ref = _dropped.popleft()
        except IndexError:
            return
        cls = ref.lease_class
        lock = cls._life.lock
        if is_owned(lock):
            _dropped.append(ref)  # Inside a transition of this thread's.
            continue
        held: list[bool] = []
        pinned: list[bool] = []
        try:
            held.extend(map(lock.acquire, _NO_WAIT))
            if held[0]:
                pinned.append(cls._life.unpin(ref))
            else:
                _dropped.append(ref)
        finally:
            if held and held[0]:
                lock.release()
        if pinned and pinned[0]:
            # Not when the lease exited and its entry outlived it (freed
            # late, as on a free-threaded build): it was not dropped.
            warn_dropped(cls._name)
        if held[0] and ref.doomed is not None:
            record, ref.doomed = ref.doomed, None
            close_soon(cls._closer, record)


def warn_dropped(name: str) -> None:
    """Say that a lease of *name* ended without being exited."""
    message = (
        f"A lease of {name} was garbage collected without being exited; "
        "its pin was released so that its retired client can close. Use "
        "the lease in a with statement (or exit it)."
    )
    log.warning(message, extra={"poolkeeper_factory": name})
    # Perhaps in the collector's callback: a warnings filter that makes it
    # an error has no caller to reach (the log record above says it).
    with contextlib.suppress(Exception):
        warnings.warn(message, PoolkeeperWarning, stacklevel=2)
