"""Thread singletons (``scope="thread"``): one client per thread.

A thread singleton is a :class:`ProcessSingleton` whose methods go to the
calling thread's own singleton: a full ``ProcessSingleton`` made from the
same factory and options (the thread's *inner* singleton), kept in a
:class:`threading.local`. Keys, healing, leases, proxies and the fork hook
are therefore the inner singleton's, per thread, and every inner singleton
is registered, so that ``close_all()`` reaches it. What this module adds:

- **The hit.** The class's ``__call__`` is a C call reading the thread's
  client from a second local, the *hit local*: ``attrgetter("client")``
  bound to it. A thread with no client there finds the local class's
  ``client`` descriptor instead (``_Miss``), whose Python code asks the
  inner singleton and stores its client there while the inner singleton's
  hit path is armed with it (under the inner's lock). When any inner
  singleton disarms (its client is about to change: a key change, a
  retirement, ``close_all()``, a fork), the hit local is replaced by an
  empty one and the class switched to it, under the scope's lock (``swap``):
  each thread's next call misses once and asks its inner singleton.
- **reset().** A process-wide generation, moved by ``reset()``, which then
  disarms every inner singleton (``Lifecycle.invalidate``, as a watched
  variable's change does). The inner's slow path compares the generation
  it has seen with the current one and resets itself, on its own thread,
  before it serves (``slow``): a retired client is closed on the thread it
  belongs to, never under one of that thread's calls.
- **A thread's end.** The thread's record (``_Thread``) is freed as its
  locals are torn down, on the dying thread (CPython 3.10 to 3.14,
  free-threaded 3.14 too): its ``__del__`` retires and closes that
  thread's clients there. In a forked child, the locals of the parent's
  other threads may be torn down before poolkeeper's fork hook abandoned
  their clients: a record closes nothing while its inner singleton's
  process is not the current one.
- **Overrides** are the thread singleton's own, process-wide: its class's
  ``__call__`` is armed with the stand-in (``arm``), and the miss path and
  each inner singleton's slow path serve it too.
"""

from __future__ import annotations

import contextlib
import functools
import logging
import operator
import os
import threading
from typing import TYPE_CHECKING, Any, TypeVar, cast

from poolkeeper import _events, _registry, _watch
from poolkeeper._close import Closer
from poolkeeper._identity import too_many_rounds
from poolkeeper._lifecycle import MAX_ROUNDS
from poolkeeper._records import Statistics
from poolkeeper._sync import ProcessSingleton, _slow_call, armed
from poolkeeper._timers import THREAD_NAME, WORKER_NAME
from poolkeeper._watch import _census
from poolkeeper._watch._patch import warn_at_caller
from poolkeeper.exceptions import PoolLeakWarning

if TYPE_CHECKING:
    import weakref
    from collections.abc import Callable, Iterable, Sequence

    from poolkeeper._lifecycle import Lifecycle, Record

T = TypeVar("T")
_log = logging.getLogger("poolkeeper")

# Summed over threads (and over the threads that ended, for counters).
_COUNTERS = (
    "builds",
    "build_failures",
    "closes",
    "close_failures",
    "resets_refused",
    "probes",
    "probe_failures",
)
_NOW = ("leases", "pending_close", "dependents", "held_open", "live")
_client = operator.attrgetter("client")


class _Miss:
    """The hit local's ``client`` when the thread has none there.

    A non-data descriptor: a client stored in the thread's dictionary of
    the local wins over it, so a hit reads no Python code.
    """

    __slots__ = ("scope",)

    def __init__(self, scope: Scope) -> None:
        self.scope = scope

    def __get__(self, local: object, owner: object = None) -> Any:  # noqa: ANN401
        return self.scope.miss()


class ThreadCloser(Closer):
    """An inner singleton's closer: closes its clients on its thread.

    A close that poolkeeper's timers start (a *max_age* expiry, a deferred
    retirement, the sweep of objects made from clients) waits for the
    thread's next call (``drain``, from its slow path) or its end: it is
    left owed (so ``close_all()`` still closes it, once) and the inner
    singleton is disarmed, so that its next call takes the slow path. Any
    other close (the thread's own, ``close_all()``, a lease's exit) runs
    where it is called, as it does for a process singleton.
    """

    __slots__ = ("alive", "owner", "pending")

    def __init__(self, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401
        """Made, as any closer, on the thread it closes for."""
        super().__init__(*args, **kwargs)
        self.owner = threading.get_ident()
        self.alive = True
        self.pending: list[Record[Any]] = []

    def close(self, record: Record[Any]) -> None:
        """Close *record* here, or on its thread if on a timer's thread."""
        if (
            self.alive
            and threading.get_ident() != self.owner
            and threading.current_thread().name in (THREAD_NAME, WORKER_NAME)
        ):
            self.pending.append(record)
            self.life.invalidate()
            return
        super().close(record)

    def keeps_across_fork(self) -> bool:
        """Only the forking thread's clients are kept by a forked child.

        The child has no other thread: their clients are abandoned there,
        never closed, even with ``fork="keep"`` (their sockets are still
        the parent's threads').
        """
        return threading.get_ident() == self.owner

    def left_here(self) -> Sequence[Record[Any]]:
        """What the timers left to this closer's thread, not yet closed."""
        return self.pending

    def take_over(self, owed: Sequence[Record[Any]]) -> Sequence[Record[Any]]:
        """In a ``fork="keep"`` child of this thread: it runs all of *owed*.

        Every close this thread's singleton owed at the fork is its own to
        run in the child: the timers' threads are gone, and with them the
        closes they had decided but not yet handed over (a fork between
        a retirement and its hand-over), so those are left to this
        thread's next call too, with the ones already handed over.
        """
        self.pending = list(owed)
        return self.pending

    def drain(self) -> None:
        """Close, here, what the timers left to this thread."""
        while self.pending:
            super().close(self.pending.pop())


class _Thread:
    """One thread's inner singleton; closes its clients at the thread's end.

    Only the thread's local holds it, and it holds nothing that holds it,
    so it is freed (and ``__del__`` runs) as the thread's locals are torn
    down, on that thread.
    """

    __slots__ = ("inner", "scope", "seen", "thread")

    def __init__(self, scope: Scope, inner: ProcessSingleton[Any]) -> None:
        self.scope = scope
        self.inner = inner
        self.thread = threading.current_thread()
        self.seen = 0  # The generation this thread's client was reset to.

    def __del__(self) -> None:
        # Anything here may run while the interpreter shuts down: never
        # raise (a close's own failure is logged and counted by the close).
        with contextlib.suppress(BaseException):
            self.scope.ended(self)


class Scope:
    """What a thread singleton keeps beside its own (empty) lifecycle."""

    # The thread singleton's own lifecycle, set once it is made: its
    # overrides.
    life: Lifecycle[Any]

    def __init__(
        self,
        name: str,
        factory: Callable[[], Any],
        make_inner: Callable[..., ProcessSingleton[Any]],
    ) -> None:
        self.name = name
        # Called with factory=, slow= and closing=: an inner singleton.
        self.make_inner = make_inner
        self.factory = self._counted(factory)
        # The count of live clients watch() last warned at (its doubling).
        self.warned_at = 0
        # Each thread's record: its inner singleton.
        self.records = threading.local()
        # Each thread's client while its inner singleton is armed with it;
        # replaced by an empty one (swap) whenever one disarms.
        self.hit_local = type(
            "_HitLocal", (threading.local,), {"client": _Miss(self)}
        )
        self.local = self.hit_local()
        # The thread singleton's class, and whether an override arms it.
        self.cls: weakref.ReferenceType[type] | None = None
        self.overridden = False
        # Moved by reset(), under the lock; read without it.
        self.generation = 0
        # id(record) -> inner singleton, of every thread that has one.
        # Never the records themselves: only the threads hold those.
        self.threads: dict[int, ProcessSingleton[Any]] = {}
        # The counters of threads that ended, and of their clients.
        self.gone: dict[str, int] = dict.fromkeys(_COUNTERS, 0)
        self.gone_retirements: dict[str, int] = {}
        # Taken inside an inner singleton's or the thread singleton's
        # lock (their change hooks), never the other way round.
        self.lock = threading.Lock()
        self.pid = os.getpid()
        # In a forked child: the parent's threads' inner singletons.
        self.stale: list[ProcessSingleton[Any]] = []
        # The ident of a thread closing its clients at its end, if any
        # (another thread's end may overwrite it: a swap more, no harm).
        self.ending: int | None = None

    def hit(self) -> object:
        """The class's ``__call__`` for the current hit local: a C call."""
        return staticmethod(functools.partial(_client, self.local))

    # -- the change hooks ---------------------------------------------------

    def arm(self, client: object, _record: object, _pushed: object) -> bool:
        """The thread singleton's change hook: its overrides only.

        Its own lifecycle never builds: *client* is an override's
        stand-in, or None when the override ends (or in a forked child).
        """
        self._forked()
        with self.lock:
            self.overridden = client is not None
            target = self.hit() if client is None else armed(client, self.name)
            cls = None if self.cls is None else self.cls()
            if cls is not None:  # pragma: no branch -- None: collected.
                type.__setattr__(cls, "__call__", target)
        return True

    def arm_inner(
        self,
        arm: Callable[[object, Record[Any] | None, bool], bool],
        client: object,
        record: Record[Any] | None,
        pushed: bool,  # noqa: FBT001 -- the lifecycle's change hook.
    ) -> bool:
        """An inner singleton's change hook: its own, and a swap to disarm.

        Under the inner singleton's lock: a client is stored in the hit
        local (``miss``) under it too, so no thread's client outlives the
        disarm that precedes its retirement there.
        """
        done = arm(client, record, pushed)
        # A thread's end needs no swap: its hit local entry ends with it.
        if client is None and self.ending != threading.get_ident():
            self.swap()
        return done

    def swap(self) -> None:
        """Give every thread an empty hit local: each asks again, once."""
        self._forked()
        with self.lock:
            self.local = self.hit_local()
            cls = None if self.cls is None else self.cls()
            # None: the singleton was collected; no call can come.
            if cls is not None and not self.overridden:  # pragma: no branch
                type.__setattr__(cls, "__call__", self.hit())

    # -- the calling thread ---------------------------------------------------

    def miss(self) -> Any:  # noqa: ANN401 -- the client.
        """A call whose thread has no client in the hit local.

        The thread's inner singleton serves it (building, catching up with
        a reset, rotating a key); while that inner singleton's hit path is
        armed with the client (a pushed key or none), it goes in the hit
        local, under the inner's lock.
        """
        if won := self.life.override():
            return won[0]
        inner = self.here()
        if inner is None:
            inner = self.enter()
        client = inner()
        life = inner._self_life
        if life.pushed:
            with life.lock:
                if life.armed is client:
                    self.local.client = client
        return client

    def enter(self) -> ProcessSingleton[Any]:
        """Make the calling thread's inner singleton (nothing is built)."""
        self._forked()
        inner = self.make_inner(
            factory=self.factory, slow=self.slow(), closing=ThreadCloser
        )
        life = inner._self_life
        life.arm = functools.partial(self.arm_inner, life.arm)
        record = _Thread(self, inner)
        self.threads[id(record)] = inner
        # Read after the entry is visible: a reset() that moved the
        # generation before this read is seen here, one after it
        # disarms this inner singleton.
        record.seen = self.generation
        self.records.record = record
        return inner

    def here(self) -> ProcessSingleton[Any] | None:
        """The calling thread's inner singleton, if it has one."""
        record: _Thread | None = getattr(self.records, "record", None)
        return None if record is None else record.inner

    def slow(self) -> Callable[..., Any]:
        """Return an inner singleton's slow path (its disarmed call).

        It catches up with ``reset()`` first, on its own thread: a client
        built before the latest reset is retired and closed here (at once,
        or when this thread's lease on it exits). A reset that lands
        while it serves makes it go round again.
        """
        records, name = self.records, self.name

        def slow(
            inner: ProcessSingleton[Any], *args: object, **kwargs: object
        ) -> Any:  # noqa: ANN401 -- the client.
            record: _Thread = records.record
            closer = cast("ThreadCloser", inner._self_closer)
            closer.drain()
            for _ in range(MAX_ROUNDS):
                seen = self.generation
                if record.seen != seen:
                    record.seen = seen
                    inner.reset()
                if won := self.life.override():
                    return won[0]
                client = _slow_call(inner, *args, **kwargs)
                if self.generation == seen:
                    return client
            raise too_many_rounds(name, "retired")

        return slow

    def _counted(self, factory: Callable[[], Any]) -> Callable[[], Any]:
        """Wrap *factory*: each build is counted by watch(), if it watches.

        What the factory builds is this singleton's: the watched classes'
        censuses leave it out (``_census.exempt``), and before the build
        the live clients, with the one to come, are checked against
        watch()'s *thread_limit* (``crowded``).
        """

        def build() -> Any:  # noqa: ANN401 -- the client.
            limit = _watch.watched_thread_limit()
            if limit is not None:
                self.crowded(limit)
            exempt = _census.exempt
            exempt.depth = getattr(exempt, "depth", 0) + 1
            try:
                return factory()
            finally:
                exempt.depth -= 1

        return build

    def crowded(self, limit: int) -> None:
        """Warn if this build makes more than *limit* live clients.

        As the watched classes' warning does: once on crossing the limit,
        again each time the count doubles, anew after it fell back. Only
        the warning may escape (the user's filters made it an error).
        """
        try:
            here = self.here()
            count = 1 + sum(
                inner.current() is not None
                for inner in list(self.threads.values())
                if inner is not here
            )
            with self.lock:
                if count <= limit:
                    self.warned_at = 0
                    return
                if count < max(limit + 1, 2 * self.warned_at):
                    return
                self.warned_at = count
        except Exception as exc:  # noqa: BLE001 -- never break the build.
            _events.failure(
                _log, f"poolkeeper.watch cannot count {self.name}.", exc
            )
            return
        warn_at_caller(PoolLeakWarning(self.name, count, limit, (), "thread"))

    # -- beside the call ----------------------------------------------------

    def reset(self) -> bool:
        """Retire every thread's client; say if this thread's was, now.

        Other threads' clients are retired and closed on their own
        threads, at their next call or their end.
        """
        self._forked()
        with self.lock:
            self.generation += 1
            seen = self.generation
        for inner in list(self.threads.values()):
            inner._self_life.invalidate()
        record: _Thread | None = getattr(self.records, "record", None)
        if record is None:
            return False
        record.seen = seen
        return record.inner.reset()

    def lease(self) -> contextlib.AbstractContextManager[Any]:
        """The calling thread's lease (an override's stand-in, unpinned)."""
        if won := self.life.override():
            return contextlib.nullcontext(won[0])
        inner = self.here()
        if inner is None:
            inner = self.enter()
        return inner.lease()

    def ended(self, record: _Thread) -> None:
        """A thread ended: close its clients here, on that thread.

        In a forked child before its fork hook ran (the parent's other
        threads' locals torn down), the inner singleton's process is still
        the parent's: its clients are the parent's, never closed here.
        """
        inner = record.inner
        life = inner._self_life
        if life.pid != os.getpid():
            return
        self._forked()
        self.threads.pop(id(record), None)
        ident = threading.get_ident()
        # threading.current_thread() (a log record's thread name, a close
        # hook) on a thread whose Thread object threading has already
        # forgotten makes a _DummyThread, which stays behind (3.12 and
        # later: in threading's table, or a clean-up object that fails at
        # exit). The thread's own Thread object stands in during the close.
        active: dict[int, object] = getattr(threading, "_active", {})
        placed = ident not in active
        if placed:
            active[ident] = record.thread
        closer = cast("ThreadCloser", inner._self_closer)
        closer.alive = False
        self.ending = ident
        try:
            # With what the timers left to this thread: owed, so closed
            # here (each close claims its record: none runs twice).
            _registry.close_one(life, closer)
            closer.drain()
        finally:
            self.ending = None
            self._fold(inner.statistics())
            if placed and active.get(ident) is record.thread:
                active.pop(ident, None)

    def _fold(self, stats: Statistics) -> None:
        with self.lock:
            for name in _COUNTERS:
                self.gone[name] += getattr(stats, name)
            for reason, n in stats.retirements.items():
                self.gone_retirements[reason] = (
                    self.gone_retirements.get(reason, 0) + n
                )

    def _forked(self) -> None:
        # In a forked child: only this thread's inner singleton is left
        # (the fork hook abandoned its parent's clients), and the counters
        # start again from zero, as a process singleton's do.
        if self.pid == os.getpid():
            return
        self.pid = os.getpid()
        self.lock = threading.Lock()
        self.gone = dict.fromkeys(_COUNTERS, 0)
        self.gone_retirements = {}
        record = getattr(self.records, "record", None)
        # The parent's other threads' inner singletons stay referenced: one
        # collected before the fork hook abandoned its clients would close
        # them here (the registry closes a collected singleton's clients).
        self.stale = [*self.stale, *self.threads.values()]
        self.threads = {} if record is None else {id(record): record.inner}

    def statistics(self) -> Statistics:
        """Counters summed over threads; live fields are this thread's."""
        self._forked()
        rows = [inner.statistics() for inner in list(self.threads.values())]
        here = self.here()
        mine = None if here is None else here.statistics()
        with self.lock:
            gone, gone_retirements = (
                dict(self.gone),
                dict(self.gone_retirements),
            )
        return _combine(rows, gone, gone_retirements, mine, self.life)

    def live(self) -> int:
        """How many threads have a live client."""
        return sum(
            inner.current() is not None
            for inner in list(self.threads.values())
        )


def _combine(
    rows: Iterable[Statistics],
    gone: dict[str, int],
    gone_retirements: dict[str, int],
    mine: Statistics | None,
    life: Lifecycle[Any],
) -> Statistics:
    totals = dict(gone)
    now = dict.fromkeys(_NOW, 0)
    retirements = dict(gone_retirements)
    for row in rows:
        for name in _COUNTERS:
            totals[name] += getattr(row, name)
        for name in _NOW:
            now[name] += getattr(row, name)
        for reason, n in row.retirements.items():
            retirements[reason] = retirements.get(reason, 0) + n
    return Statistics(
        **totals,
        **now,
        generation=0 if mine is None else mine.generation,
        key_fingerprint=None if mine is None else mine.key_fingerprint,
        pid=os.getpid(),
        is_overridden=bool(life.overrides),
        retirements=retirements,
        backoff=0.0 if mine is None else mine.backoff,
        deferred=None if mine is None else mine.deferred,
    )


# -- the thread singleton's methods (its class's, see _decorator) -------------


def _scope(single: ProcessSingleton[Any]) -> Scope:
    # Only a thread singleton's class has these methods.
    return cast("Scope", single._self_scope)


def reset(self: ProcessSingleton[Any]) -> bool:
    """Retire every thread's client; each closes on its own thread."""
    return _scope(self).reset()


def retire(self: ProcessSingleton[Any], client: object) -> bool:
    """Retire *client* if it is the calling thread's live client."""
    inner = _scope(self).here()
    return False if inner is None else inner.retire(client)


def lease(
    self: ProcessSingleton[Any],
) -> contextlib.AbstractContextManager[Any]:
    """Pin the calling thread's live client for a ``with`` block."""
    return _scope(self).lease()


def current(self: ProcessSingleton[Any]) -> object:
    """The calling thread's live client (or the override), or None."""
    scope = _scope(self)
    if won := scope.life.override():
        return won[0]
    inner = scope.here()
    return None if inner is None else inner.current()


def statistics(self: ProcessSingleton[Any]) -> Statistics:
    """Counters summed over this process's threads."""
    return _scope(self).statistics()


def describe(self: ProcessSingleton[Any]) -> str:
    """Describe the thread singleton: its live clients, never a key."""
    scope = _scope(self)
    return (
        f"<poolkeeper.ProcessSingleton {scope.name} (scope thread, "
        f"{scope.live()} live clients, pid {os.getpid()})>"
    )


#: The methods a thread singleton's class replaces, by name.
METHODS: dict[str, Callable[..., Any]] = {
    "reset": reset,
    "retire": retire,
    "lease": lease,
    "current": current,
    "statistics": statistics,
    "__repr__": describe,
}
