"""Who waits for whose build: reentrancy and cycles fail instead of hanging.

Two checks run before a caller waits for a build in progress:

- *Reentrancy*: the build is one the caller's own context is running. A
  factory that calls its own singleton, directly or through a task it
  starts and awaits (``asyncio.gather``), would wait for itself. The
  builds a context is running are kept in a context variable, which
  tasks inherit from the code that creates them.
- *Cycles*: A's factory waits for B's build while B's factory, on another
  thread or task, waits for A's. Each waiter records the build it waits
  for; following build owner to the build that owner waits for, a caller
  that reaches itself would close a cycle.

Stale entries left by an exception between two lines are harmless: a
finished build is never part of a cycle or of a reentrant wait. The waits
themselves (:func:`ended`, :func:`aended`) poll the build's state too.
"""

from __future__ import annotations

import asyncio
import contextlib
import contextvars
import threading
from typing import TYPE_CHECKING

from poolkeeper._records import under
from poolkeeper.exceptions import ReentrantBuildError

if TYPE_CHECKING:
    from collections.abc import Generator

    from poolkeeper._lifecycle import Ticket

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
