"""What both drivers do the same way around a build.

The sync driver (``_singleton``) calls its factory and closes what a build
retired; the async one (``_async``) awaits both. Everything between is one
rule, kept here in :class:`BuildRun`: the key's fingerprint, recording the
build's outcome, settling a build that an exception cut short, and waking
its waiters. A driver runs a build as::

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
settled, its waiters are woken and a built client is made live or closed:
each step is repeated by the next layer if an exception cut it short, and
every step is idempotent. An exception before the ``try`` leaves the build
unbegun; the driver's :meth:`Lifecycle.settle_unbegun` settles it.

The client goes to ``made`` as the factory returns it, with no Python
instruction between (a signal handler's exception lands between a call
and the instruction after it): a sync factory is called by ``made``'s
``__missing__`` (a ``defaultdict``), which stores what it returns before
control is back in the driver; an awaited one's result is stored by the
instruction that ends the ``await``.
"""

from __future__ import annotations

import collections
import inspect
import logging
import sys
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar

from poolkeeper import _adapters
from poolkeeper._identity import key_fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import TracebackType

    from poolkeeper._lifecycle import Lifecycle, Record, Ticket

T = TypeVar("T")

log = logging.getLogger("poolkeeper")

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


def log_built(name: str, record: Record[Any]) -> None:
    """Log a build that made *record* live; learn its type's hooks."""
    # After the build, off the hit path: adapters' hooks for the client's
    # type are known before any fork that inherits it (see _adapters).
    _adapters.learn(record.client)
    log.debug(
        "Built %s (generation %d, key %s).",
        name,
        record.generation,
        record.fingerprint,
        extra={
            "poolkeeper_factory": name,
            "poolkeeper_generation": record.generation,
            "poolkeeper_key": record.fingerprint,
        },
    )
