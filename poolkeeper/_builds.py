"""What both drivers do alike: read the key, ask, wait for a build, run one.

One rule for the sync driver (threads and events) and the async one
(tasks and futures):

- **The rounds** (:class:`Rounds`): a call that missed its hit path asks
  the lifecycle what to do (``Lifecycle.request``), does it, and asks
  again until it is served. The asking is here; the doing stays in each
  driver's ``_acquire`` (a thread blocks where a task awaits).
- **The key** (:func:`read_key`): its value and hash, read after the
  epoch, so that a change between the two keeps the hit path disarmed.
- **Waits** (:func:`waiting`, :func:`ended`, :func:`aended`): reentrancy
  and cycles fail instead of hanging. Before a caller waits for a build in
  progress, two checks run. *Reentrancy*: the build is one the caller's
  own context is running (a factory that calls its own singleton, directly
  or through a task it starts and awaits); the builds a context runs are
  kept in a context variable, which tasks inherit. *Cycles*: A's factory
  waits for B's build while B's factory waits for A's; each waiter records
  the build it waits for, and a caller that reaches itself by following
  build owner to the build that owner waits for would close a cycle. Stale
  entries left by an exception between two lines are harmless: a finished
  build is never part of a cycle or of a reentrant wait. The waits poll the
  build's state too.
- **The build run** (:class:`BuildRun`): the key's fingerprint, recording
  the build's outcome, settling a build that an exception cut short, and
  waking its waiters. A driver runs a build as::

      run = BuildRun(life, ticket, keyed, clock, wake, factory=factory)
      try:
          with run, building(ticket):
              run.made[None]  # Or: run.made[None] = await factory().
      finally:
          try:
              run.end()
          finally:
              close(run.doomed)  # Or: await close(run.doomed).

  Whatever is raised, at whatever line (a signal handler's
  ``KeyboardInterrupt``, a tracer's injected exception), the ticket is
  settled, its waiters are woken and a built client is made live or
  closed: each step is repeated by the next layer if an exception cut it
  short, and every step is idempotent. An exception before the ``try``
  leaves the build unbegun; the driver's :meth:`Lifecycle.settle_unbegun`
  settles it. The client goes to ``made`` as the factory returns it, with
  no Python instruction between (a signal handler's exception lands
  between a call and the instruction after it): a sync factory is called
  by ``made``'s ``__missing__`` (a ``defaultdict``), which stores what it
  returns before control is back in the driver; an awaited one's result is
  stored by the instruction that ends the ``await``.
"""

from __future__ import annotations

import asyncio
import collections
import contextlib
import contextvars
import inspect
import itertools
import sys
import threading
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from poolkeeper import _adapters
from poolkeeper import _events as events
from poolkeeper._healing import give_back
from poolkeeper._identity import (
    evaluate_key,
    hash_key,
    key_fingerprint,
    too_many_rounds,
)
from poolkeeper._lifecycle import MAX_ROUNDS, Serve, constant
from poolkeeper._records import under
from poolkeeper.exceptions import ReentrantBuildError

if TYPE_CHECKING:
    from collections.abc import Callable, Generator
    from types import TracebackType

    from poolkeeper._close import Closer
    from poolkeeper._lifecycle import (
        Build,
        Lifecycle,
        Probe,
        Record,
        Slot,
        Ticket,
        Wait,
    )

    #: What a round answers: serve a record, or what to do before asking
    #: again (see Rounds).
    Step = Serve | Probe | Build | Wait

T = TypeVar("T")
#: A driver's wake-up of a build's waiters: an event or a future.
W = TypeVar("W")

#: No value yet: no client built, no key read.
NOTHING: Final[Any] = object()


class BuildRun(Generic[T]):
    """One build of *ticket*: its outcome, recorded in *life*."""

    __slots__ = (
        "clock",
        "doomed",
        "fingerprint",
        "keyed",
        "life",
        "made",
        "reason",
        "started",
        "ticket",
        "wake",
    )

    def __init__(  # noqa: PLR0913 -- a sync driver's factory too.
        self,
        life: Lifecycle[T],
        ticket: Ticket,
        keyed: bool,  # noqa: FBT001 -- the singleton has a key function.
        clock: Callable[[], float],
        wake: Callable[[Any], object],
        *,
        factory: Callable[[], T] | None = None,
    ) -> None:
        self.life = life
        self.ticket = ticket
        self.keyed = keyed
        self.clock = clock
        self.wake = wake
        #: What the factory returned, under the key None: stored there by
        #: the driver (async), or by looking it up (sync: the factory).
        self.made: dict[None, Any] = (
            {} if factory is None else collections.defaultdict(factory)
        )
        self.fingerprint: str | None = None
        #: The records the build retired: the driver closes them.
        self.doomed: list[Record[T]] = []
        #: Why it builds (see report()), and when it began on *clock*.
        self.reason = life.build_cause(ticket.slot) or events.FIRST
        self.started = clock()

    def __enter__(self) -> None:
        """Fingerprint the key before the factory runs."""
        self.fingerprint = key_fingerprint(self.keyed, self.ticket.key.value)

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Record the outcome: the client made live, or the failure."""
        made = self.made
        if exc is None:
            now = self.clock()
            self.life.built(
                self.ticket, made[None], self.fingerprint, now, self.doomed
            )
        elif None not in made:
            self.life.failed(self.ticket, exc)

    def end(self) -> None:
        """Settle the build if an exception cut it short; wake its waiters.

        A built client is made live (or closed, through ``doomed``);
        without one the build failed with the exception in flight, and
        anything but an ``Exception`` (a ``KeyboardInterrupt``, a
        cancellation) lets its waiters retry (see :meth:`Lifecycle.failed`).
        """
        life, ticket = self.life, self.ticket
        try:
            if not ticket.finished:
                if None not in self.made:
                    life.failed(ticket, sys.exc_info()[1])
                else:
                    client = self.made[None]
                    fingerprint = key_fingerprint(self.keyed, ticket.key.value)
                    now = self.clock()
                    life.built(ticket, client, fingerprint, now, self.doomed)
        finally:
            self.wake(ticket.done)


class Rounds(Generic[W]):
    """One call's rounds with the lifecycle, alike for both drivers.

    A call that missed its hit path asks the lifecycle what to do
    (:meth:`Lifecycle.request`), does it, and asks again, until it is
    served: at most ``MAX_ROUNDS`` times. The asking is here: the key read
    between rounds, the comparison with the live record, the request and
    its wake-up (an event or a future, made by *wakeup*). The doing is the
    driver's, and all that differs between the two: in a ``with`` block of
    the rounds, the driver matches the step :meth:`ask` answered. It
    returns a ``Serve``'s record; it probes a ``Probe``'s record, builds a
    ``Build``'s ticket or waits for a ``Wait``'s (a thread blocks where a
    task awaits), then takes the next step from :meth:`probed`,
    :meth:`built` or :meth:`waited`, which ask again.

    A call unwinding by an exception, at whatever line, leaves the block
    through ``__exit__``, which settles what its latest request began and
    nothing else would: a build not begun (its waiters retry), a probe
    handed to it and not reported (given back).

    *read* is the call's first read of the key (see :func:`read_key`),
    made by the driver, before the rounds: an async call first compares
    it with its loop's live record without asking. *reslot* gives a new
    slot for one the lifecycle dropped meanwhile (an async call's: its
    loop's slot, when the loop ended); a thread's slot is never dropped.
    """

    __slots__ = (
        "began",
        "closer",
        "done",
        "ended",
        "epoch",
        "key",
        "key_hash",
        "life",
        "name",
        "owner",
        "reslot",
        "rounds",
        "slot",
        "value",
        "wake",
        "wakeup",
    )

    def __init__(  # noqa: PLR0913, PLR0917 -- what a call has, as it has it.
        self,
        life: Lifecycle[Any],
        slot: Slot,
        key: Callable[[], object] | None,
        name: str,
        closer: Closer,
        owner: object,
        wakeup: Callable[[], W],
        wake: Callable[[W], object],
        read: tuple[int, int, object, int, int],
        reslot: Callable[[], Slot] | None = None,
    ) -> None:
        self.life = life
        self.slot = slot
        self.key = key
        self.name = name
        self.closer = closer
        self.owner = owner  # The thread's id, or the task.
        self.wakeup = wakeup
        self.wake = wake
        self.reslot = reslot
        self.epoch, self.key_hash, self.value, self.began, self.ended = read
        # The wake-up of the latest request, made on self.slot (an async
        # call's slot changes only between requests, whose steps are done).
        self.done: W | None = None
        self.rounds = 0

    def __enter__(self) -> Rounds[W]:
        """Return the rounds."""
        return self

    def __exit__(
        self,
        kind: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Settle what the latest request began, if the call unwinds."""
        if exc is None:
            return
        life, slot, done = self.life, self.slot, self.done
        try:
            if done is not None and life.settle_unbegun(slot, done):
                self.wake(done)
        finally:
            give_back(life, self.closer, slot, done)

    def ask(self) -> Step:
        """Ask the lifecycle until it answers a step; read the key between.

        Raises:
            PoolkeeperError: After ``MAX_ROUNDS`` requests: the client was
                retired, or its key changed, before each could be served.
        """
        life = self.life
        while self.rounds < MAX_ROUNDS:
            self.rounds += 1
            slot = self.slot
            if slot.dropped and self.reslot is not None:
                self.slot = self.reslot()
                self.read()
                continue
            done = self.wakeup()
            self.done = done
            live = slot.live
            # Compared here, with no lock held (a key's __eq__ is user
            # code); request() says if the live record changed meanwhile.
            matched = live is not None and live.matches(
                self.key_hash, self.value
            )
            step = life.request(
                slot,
                live,
                matched,
                self.key_hash,
                self.value,
                self.epoch,
                self.owner,
                constant(done),
                began=self.began,
                ended=self.ended,
            )
            if step is not None:
                return step
            self.read()  # Read the key and compare again.
        raise too_many_rounds(
            self.name, "retired" if self.key is None else "build"
        )

    def probed(self, record: Record[Any], *, again: bool) -> Step:
        """The call probed *record*: serve it, or ask again.

        *again*: the probe retired it (it failed; see ``run_probe``). A
        record another call retired while the probe ran is no longer live,
        and is not served either: the key is read and the call asks again.
        """
        if again:
            return self.ask()
        if self.life.still_live(record):
            return Serve(record)
        self.read()
        return self.ask()

    def built(self, ticket: Ticket) -> Step:
        """The call ran *ticket*'s build: ask to be served what it built.

        A build that made its client live is asked for with its own key
        (the key may have changed while it ran); one that did not, with
        the key read anew.
        """
        if ticket.record is not None:
            self.key_hash, self.value = ticket.key_hash, ticket.key.value
        else:
            self.read()
        return self.ask()

    def waited(self, ticket: Ticket) -> Step:
        """The call waited for *ticket*'s build: ask again.

        Raises:
            BaseException: The build's error, as is, if it was a build for
                this call's key (another key's failure is not the call's).
        """
        error = ticket.error_for(self.key_hash, self.value)
        if error is not None:
            raise error
        self.read()
        return self.ask()

    def read(self) -> None:
        """Read the key anew (see :func:`read_key`)."""
        self.epoch, self.key_hash, self.value, self.began, self.ended = (
            read_key(self.life, self.key, self.name)
        )


def refuse_coroutine(name: str, made: dict[None, Any]) -> None:
    """Fail a sync build whose factory returned a coroutine; keep nothing.

    Cached, the coroutine would be served to every call, and the second
    ``await`` of it fails with "cannot reuse already awaited coroutine".
    """
    if not inspect.iscoroutine(made[None]):
        return
    # Out of made first: the build then ends as failed, never as built.
    coroutine = made.pop(None)
    coroutine.close()  # Never to be awaited: no "never awaited" warning.
    msg = (
        f"The factory {name} returned a coroutine: it is async, so a "
        "synchronous singleton cannot build with it. Make it an `async "
        "def` function (a lambda or functools.partial hides that it is "
        f"async), and await the singleton: `client = await {name}()`."
    )
    raise TypeError(msg)


def report(name: str, run: BuildRun[Any], *, is_async: bool) -> None:
    """Say how a build ended: the one place builds' events are sent.

    Called by each driver as its build unwinds (no lock held), before it
    closes what the build retired. A build that made its client live is
    ``built``, then ``retired`` for the client it replaced (reason
    "key"); one that raised is ``build_failed``, except a cancellation
    (no failure, as in ``statistics()``); one cut short otherwise says
    nothing. A forked child's first build first says the retirements of
    the clients it abandoned at the fork (see ``forked``).
    """
    ticket = run.ticket
    duration = run.clock() - run.started
    events.forked(run.life)
    record = ticket.record
    if record is not None:
        # Off the hit path: adapters' hooks for the client's type are
        # known before any fork that inherits it (see _adapters).
        _adapters.learn(record.client)
        events.built(
            name,
            record.fingerprint,
            record.generation,
            run.reason,
            duration,
            is_async=is_async,
        )
        events.say(name, ticket.retired)
        return
    error = sys.exc_info()[1]
    if error is not None and not isinstance(error, asyncio.CancelledError):
        fingerprint = key_fingerprint(run.keyed, ticket.key.value)
        events.build_failed(
            name, fingerprint, run.reason, duration, error, is_async=is_async
        )


# -- the key ------------------------------------------------------------


#: Numbers the start and the end of every key read (next() on it is
#: atomic): a read that began after another ended saw a value at least as
#: new as that one did (see Lifecycle.request).
_reads = itertools.count(1)


def read_key(
    life: Lifecycle[Any],
    key: Callable[[], object] | None,
    name: str,
    value: object = NOTHING,
    began: int = 0,
) -> tuple[int, int, object, int, int]:
    """Return ``(epoch, hash, value, began, ended)`` of a read of the key.

    The epoch is read before the key: a change between the two keeps the
    hit path disarmed (see :meth:`Lifecycle.request`). *began* and *ended*
    number the read's start and end on one count for the process. A
    *value* the polled hit path already read is used instead of calling
    *key* again, with *began*: a number its read began after (the armed
    record's read end); 0, the oldest, when not known.
    """
    epoch = life.epoch
    if value is NOTHING:
        began = next(_reads)
        key_hash, value = evaluate_key(key, name)
        return epoch, key_hash, value, began, next(_reads)
    return (epoch, *hash_key(value, name), began, next(_reads))


# -- waits --------------------------------------------------------------

#: A waiter re-checks its build this often, so a build whose wake-up was
#: cut short by an exception cannot strand it.
POLL = 0.05

# The longest chain of waits followed when looking for a cycle.
_MAX_CHAIN = 64

_building: contextvars.ContextVar[tuple[Ticket, ...]] = contextvars.ContextVar(
    "poolkeeper_building", default=()
)
_lock = threading.RLock()
_waiting: dict[object, Ticket] = {}


@contextlib.contextmanager
def building(ticket: Ticket) -> Generator[None, None, None]:
    """Mark *ticket* as built by the current context for the block."""
    token = _building.set((*_building.get(), ticket))
    try:
        yield
    finally:
        _building.reset(token)


@contextlib.contextmanager
def waiting(owner: object, ticket: Ticket) -> Generator[None, None, None]:
    """Record that *owner* waits for *ticket* for the block.

    Raises:
        ReentrantBuildError: If the wait could never end: *ticket* is built
            by the caller's own context, or waiting would close a cycle.
    """
    if not ticket.finished and ticket in _building.get():
        raise ReentrantBuildError(ticket.name)
    # Entered inside the try: _leave is idempotent, so a wait cut short
    # anywhere after it was recorded is forgotten (``under`` releases the
    # lock on every way out).
    try:
        cycle = under(_lock, _enter, owner, ticket)
        if cycle is not None:
            raise ReentrantBuildError(ticket.name, cycle)
        yield
    finally:
        under(_lock, _leave, owner, ticket)


def ended(ticket: Ticket) -> None:
    """Block the calling thread until *ticket*'s build has ended."""
    while not ticket.done.wait(POLL) and not ticket.finished:
        pass


async def aended(ticket: Ticket) -> None:
    """Wait until *ticket*'s build has ended, in a task.

    ``asyncio.wait`` never cancels what it waits for, so a cancelled waiter
    does not cancel the build.
    """
    while not (ticket.finished or ticket.done.done()):
        await asyncio.wait((ticket.done,), timeout=POLL)


def _enter(owner: object, ticket: Ticket) -> tuple[str, ...] | None:
    cycle = _cycle(owner, ticket)
    if cycle is None:
        _waiting[owner] = ticket
    return cycle


def _leave(owner: object, ticket: Ticket) -> None:
    if _waiting.get(owner) is ticket:
        del _waiting[owner]


def _cycle(owner: object, ticket: Ticket) -> tuple[str, ...] | None:
    names = [ticket.name]
    current = ticket
    for _ in range(_MAX_CHAIN):
        if current.owner == owner:
            return (*names, names[0]) if len(names) > 1 else (*names, *names)
        nxt = _waiting.get(current.owner)
        if nxt is None or nxt.finished:
            return None
        names.append(nxt.name)
        current = nxt
    return None


def forget() -> None:
    """In a forked child: the parent's other threads wait for nothing here."""
    global _lock  # noqa: PLW0603 -- replaced, never shared with the parent.
    _lock = threading.RLock()
    _waiting.clear()
