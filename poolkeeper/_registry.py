"""Every singleton of the process: shutdown, garbage collection and fork.

The registry holds each singleton's lifecycle strongly and the singleton
itself weakly. A singleton dropped while its client is live (a re-run
notebook cell, a factory decorated inside a function) therefore does not
strand the client: it is closed when the singleton is collected, and
:func:`close_all` still reaches it before the collector runs. A close
hook's ``BaseException`` there has no caller to reach: it is counted and
Python reports it as unraisable, as for any finalizer.
"""

from __future__ import annotations

import asyncio
import atexit
import collections
import contextlib
import functools
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, TypeVar

from poolkeeper import (
    _adapters,
    _builds,
    _dependents,
    _environ,
    _events,
    _filekeys,
    _healing,
    _timers,
)
from poolkeeper._close import (
    aclose_anywhere,
    arun_each,
    close_anywhere,
    close_soon,
    run_each,
)
from poolkeeper._lease import loosen
from poolkeeper._records import Census, Slot, is_owned, under
from poolkeeper.exceptions import PoolkeeperWarning

if TYPE_CHECKING:
    from collections.abc import Callable

    from poolkeeper._close import Closer
    from poolkeeper._lifecycle import Lifecycle, Record
    from poolkeeper._records import Verdict

T = TypeVar("T")


class Entry:
    """What the registry keeps of one singleton (never the singleton)."""

    __slots__ = ("after_fork", "closer", "keep", "life", "orphaned", "prune")

    def __init__(
        self,
        life: Lifecycle[Any],
        closer: Closer,
        after_fork: Callable[[Any], object] | None,
        *,
        keep: bool,
        prune: Callable[[list[Record[Any]]], None] | None = None,
    ) -> None:
        self.life = life
        self.closer = closer
        self.after_fork = after_fork
        self.keep = keep
        self.orphaned = False
        # Async singletons: forgets the slots of loops that were closed
        # without shutting down, putting their clients in its argument.
        self.prune = prune


_entries: set[Entry] = set()
_lock = threading.RLock()
_orphans: collections.deque[Entry] = collections.deque()
# The arguments of a lock's acquire() that never blocks.
_NO_WAIT = (False,)

# Clients a forked child inherited: kept referenced so that no finalizer
# ever runs on them in the child, because their sockets are the parent's.
abandoned: list[object] = []
# While the at-fork hook runs an after_fork hook: what release_sockets has
# to say, logged by the singleton's first call in the child instead.
fork_notes: list[str] | None = None


#: No client, no hold: what a name's count starts from.
NO_CLIENTS = Census()


def census() -> dict[str, Census]:
    """Per singleton name: live and retired clients, leases, held open.

    For OpenTelemetry's observable instruments (see _events), read
    lock-free when a reader collects. Singletons of one name add up. Held
    open: retired clients that objects made from them hold (made_from).
    """
    counts: dict[str, Census] = {}
    for entry in list(_entries):
        life = entry.life
        counts[life.name] = counts.get(life.name, NO_CLIENTS) + life.census()
    return counts


_events.census = census


def register(owner: object, entry: Entry) -> None:
    """Track *entry* until *owner* (its singleton) is collected."""
    _drain()
    under(_lock, _add, entry)
    finalizer = weakref.finalize(owner, _orphan, entry)
    finalizer.atexit = False  # close_all() runs at exit instead.


def _add(entry: Entry) -> None:
    _entries.difference_update(
        [e for e in _entries if e.orphaned and not e.life.holders()]
    )
    _entries.add(entry)


@_events.records_later
def _orphan(entry: Entry) -> None:
    # The singleton was collected: nothing can call it again, so its live
    # clients are retired and closed (leased ones when their lease ends).
    # The collector runs this on whatever thread allocated, perhaps while
    # that thread holds some other lock: it must never block on a lock,
    # nor wait for a close on another thread or loop (which may need the
    # lock this thread holds).
    entry.orphaned = True
    _orphans.append(entry)
    _drain()


def _drain() -> None:
    # Closes what orphans it can without blocking; an orphan whose lock is
    # busy waits for the next registration or close_all().
    for _ in range(len(_orphans)):
        try:
            entry = _orphans.popleft()
        except IndexError:
            return
        lock = entry.life.lock
        # Taken without blocking and noted in one C call: CPython runs
        # signal handlers when a call returns, so a KeyboardInterrupt
        # between an acquire() and the store of its result would leave the
        # lock held for ever. extend() appends acquire's answer before
        # control is back in this frame; the finally reads only the list.
        if is_owned(lock):
            # This thread is inside one of its transitions (the collector
            # ran in the middle): the lock would let it in, mid-change.
            _orphans.append(entry)
            continue
        held: list[bool] = []
        doomed: list[tuple[Record[Any], Closer]] = []
        said: list[tuple[str, Verdict]] = []
        try:
            held.extend(map(lock.acquire, _NO_WAIT))
            if held[0]:
                # Only the decision is made under the lock: a close needs it
                # (to claim its record), perhaps on another loop's thread.
                doomed = _detach([entry], said)
            else:
                _orphans.append(entry)
        finally:
            if held and held[0]:
                lock.release()
        # Said, then closed, with no lock held, and never waited for on
        # another thread or loop. Cut short before they began, they stay
        # owed to close_all().
        run_each(
            (
                functools.partial(_say, said),
                *(functools.partial(close_soon, c, r) for r, c in doomed),
            )
        )


def _detach(
    entries: list[Entry], said: list[tuple[str, Verdict]]
) -> list[tuple[Record[Any], Closer]]:
    # What it retired goes to *said*, for the caller to say (_say) before
    # it closes the records returned, with no lock held.
    doomed: list[tuple[Record[Any], Closer]] = []
    for entry in entries:
        life = entry.life
        out: list[Record[Any]] = []
        if entry.prune is not None:
            entry.prune(out)
        more: list[Record[Any]] = []
        told: list[Verdict] = [*life.take_forked()] if life.forked else []
        life.detach(more, told)
        said.extend((life.name, verdict) for verdict in told)
        out.extend(more)
        # A lease dropped without exiting releases its pin when collected.
        loosen(entry.life)
        # With the closes owed from before: decided, then cut short before
        # they began (each close claims its record, so none runs twice).
        out.extend(entry.life.owed_besides(out))
        doomed.extend((record, entry.closer) for record in out)
    doomed.sort(key=lambda pair: pair[0].sequence, reverse=True)
    return doomed


def _say(said: list[tuple[str, Verdict]]) -> None:
    run_each(functools.partial(_events.say, *pair) for pair in said)


def _close(entries: list[Entry]) -> None:
    said: list[tuple[str, Verdict]] = []
    doomed = _detach(entries, said)
    run_each(
        (
            functools.partial(_say, said),
            *(
                functools.partial(close_anywhere, closer, record)
                for record, closer in doomed
            ),
        )
    )


def close_one(life: Lifecycle[Any], closer: Closer) -> None:
    """Retire and close one singleton's clients here, as close_all() does.

    For a thread singleton's thread at its end (see _threads).
    """
    _close([Entry(life, closer, None, keep=False)])


def close_all() -> None:
    """Retire and close the live client of every singleton.

    Clients are closed in reverse build order across all singletons, so a
    client built from another one is closed first. Async clients are
    closed on their own event loop: handed to it when another thread runs
    it, or owns it (a loop idle between two steps of its thread's
    ``asyncio.run()``, say, closes the client at its next step; the call
    waits up to 30 seconds), run here when it is idle and its thread is
    this one or ended. Leased clients are closed when their last lease
    exits. Afterwards every singleton builds afresh on its next
    call. Registered with :mod:`atexit`; call it yourself at the end of a
    worker's life.

    It never raises for a client: a failing close is logged at WARNING and
    counted, and every other client is still closed. Only a
    ``BaseException`` that is no ``Exception`` (``KeyboardInterrupt``,
    ``SystemExit``) from a close hook propagates, once, after all the
    other clients were closed, even when that close ran on another
    thread's event loop.

    Raises:
        RuntimeError: If called inside a running event loop that has live
            async clients: a synchronous call cannot await their close
            there (``asyncio.run`` would cancel a close it scheduled). It
            closes nothing then; ``await aclose_all()`` instead.

    .. versionadded:: 0.1
    """
    entries = under(_lock, list, _entries)
    _refuse_in_loop(entries)
    _close(entries)


def _refuse_in_loop(entries: list[Entry]) -> None:
    try:
        loop = asyncio.get_running_loop()
    except RuntimeError:
        return
    names = sorted({e.life.name for e in entries if e.life.holds_on(loop)})
    if names:
        msg = (
            "close_all() was called inside a running event loop whose async "
            f"clients ({', '.join(names)}) it cannot close: a synchronous "
            "call cannot await their close on the loop it runs on. Nothing "
            "was closed; in async code, await poolkeeper.aclose_all() "
            "instead."
        )
        raise RuntimeError(msg)


async def aclose_all() -> None:
    """Close every live client of every singleton, async ones on their loop.

    The asynchronous counterpart of :func:`close_all`, for the end of an
    ``asyncio`` program: async clients built on the running loop are
    awaited closed here, those of loops running in other threads are closed
    there; a client whose loop is gone is reported with an
    :class:`~poolkeeper.UnclosedClientWarning`. Synchronous singletons are
    closed too. Clients close in reverse build order. Like
    :func:`close_all`, it never raises for a client.

    .. versionadded:: 0.1
    """
    entries = under(_lock, list, _entries)
    said: list[tuple[str, Verdict]] = []
    doomed = _detach(entries, said)
    try:
        _say(said)
    finally:
        await arun_each(
            functools.partial(aclose_anywhere, closer, record)
            for record, closer in doomed
        )


def _after_fork_in_child() -> None:
    # The runtime's one fork hook. Runs in the child with one thread: take
    # no lock, log nothing, never raise, whatever a hook raises. The
    # file-key thread, the environment subscriptions' lock and the waits
    # start afresh; each singleton gets a fresh lock and abandons its
    # parent's clients, never closing them.
    global _lock  # noqa: PLW0603 -- the parent's may be held by a thread.
    _lock = threading.RLock()
    _filekeys.after_fork_in_child()
    _environ.after_fork_in_child()
    _events.after_fork_in_child()
    _timers.after_fork_in_child()
    _dependents.after_fork_in_child()
    _builds.forget()
    kept: list[Entry] = []
    for entry in list(_entries):
        try:
            keep = entry.keep and entry.closer.keeps_across_fork()
            # A thread singleton's closes owed by the forking thread stay
            # owed: its next call in the child runs them.
            still_owed = (
                entry.closer.take_over(entry.life.owed) if keep else ()
            )
            inherited = entry.life.forget_parent(
                keep=keep, still_owed=still_owed
            )
        except BaseException:  # noqa: BLE001, S112 -- never abort the others.
            continue
        if keep:
            kept.append(entry)
        for record in inherited:
            _abandon(entry, record)
    # The timers of the clients kept (fork="keep") stay due; the others go.
    _timers.resume(_kept)
    # And those a parent thread was about to start for a kept client start
    # here.
    for entry in kept:
        with contextlib.suppress(BaseException):
            _healing.rearm(entry.life, entry.closer)


def _kept(timer: _timers.Timer) -> bool:
    """Whether *timer* is for a slot that kept its client in this child."""
    slot = timer.owner
    if slot is _dependents.SWEEP:
        return True  # Objects made from kept clients still hold them.
    return isinstance(slot, Slot) and slot.has_client()


def made_from(obj: T, client: object) -> T:
    """Say that *obj* was made from *client*: it keeps *client* open.

    For objects that go on using the client that made them after they are
    returned: a Daytona ``Sandbox``, a boto3 resource, a redis ``PubSub``,
    an httpx streaming response. Once the singleton retires *client*
    (healing, a key change, ``reset()``), *obj* keeps working: *client* is
    closed when its last lease has ended **and** the last object made from
    it is gone (collected, checked every half second), or at
    :func:`close_all`, :func:`aclose_all` or exit, whichever comes first.
    ``statistics()`` counts such objects (``dependents``) and the retired
    clients they hold open (``held_open``).

    Returns *obj*. A client that no singleton holds open (an
    ``override()`` stand-in, a client already closed, one no singleton
    built) is not held: there is nothing to keep open. An adapter calls it
    for the objects its SDK makes (the Daytona adapter does for sandboxes).

    Raises:
        TypeError: *obj* takes no weak reference, so poolkeeper could not
            tell when it is gone.

    .. versionadded:: 0.1
    """
    try:
        weakref.ref(obj)
    except TypeError:
        name = type(obj).__qualname__
        msg = (
            f"poolkeeper.made_from(): a {name} takes no weak reference, so "
            "poolkeeper cannot tell when it is gone and would keep its "
            "client open for ever. Pass an object that does, or hold a "
            "lease (single.lease()) for as long as you use it."
        )
        raise TypeError(msg) from None
    for entry in list(_entries):
        if any(
            r.client is client for r in entry.life.holders()
        ) and _dependents.hold(entry.life, entry.closer, obj, client):
            break
    return obj


def kept_clients() -> list[object]:
    """Return the clients of the ``fork="keep"`` singletons; no lock taken.

    Each container is copied in one C call before it is read, so another
    thread changing it makes no difference here.
    """
    return [
        record.client
        for entry in list(_entries)
        if entry.keep and entry.closer.keeps_across_fork()
        for record in entry.life.holders()
    ]


def _abandon(entry: Entry, record: Record[Any]) -> None:
    global fork_notes  # noqa: PLW0603 -- read by release_sockets().
    abandoned.append(record.client)
    hook = entry.after_fork
    if hook is None:  # An adapter's, learnt at the build (a dict read).
        hook = _adapters.inherited(record.client)
    if hook is None or not record.is_abandoned():
        return
    notes: list[str] = []
    fork_notes = notes
    try:
        hook(record.client)
    except BaseException as exc:  # noqa: BLE001 -- logged on first use.
        entry.life.fork_errors.append(exc)
    finally:
        fork_notes = None
        entry.life.fork_errors.extend(map(PoolkeeperWarning, notes))


if hasattr(os, "register_at_fork"):  # pragma: no branch -- not on Windows.
    os.register_at_fork(
        before=_events.before_fork, after_in_child=_after_fork_in_child
    )
atexit.register(close_all)
