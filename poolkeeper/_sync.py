"""ProcessSingleton: the thread driver of the lifecycle, and its hit path.

A call that misses the hit path asks the lifecycle what to do next and
serves, waits or builds (the build run and the waits are shared with the
async driver, in ``_builds``; healing's timers and probes, in
``_healing``). Beside the call: ``reset``, ``lease``, ``proxy``,
``current``, ``statistics``. The hit path is the
class's ``__call__``, which the lifecycle's change hook switches (see
``arm``, under the lifecycle's lock).
"""

from __future__ import annotations

import functools
import threading
import time
from typing import TYPE_CHECKING, Any, Generic, Protocol, TypeVar, cast, final

import wrapt

from poolkeeper import _events as events
from poolkeeper._builds import (
    NOTHING,
    BuildRun,
    Rounds,
    building,
    ended,
    read_key,
    refuse_coroutine,
    report,
    waiting,
)
from poolkeeper._close import Closer, run_each
from poolkeeper._healing import (
    error_name,
    monotonic,
    run_probe,
    schedule,
    start_timers,
)
from poolkeeper._identity import (
    Identity,
    no_arguments,
    report_fork_errors,
)
from poolkeeper._lease import loosen
from poolkeeper._lifecycle import (
    Build,
    ClientState,
    Lifecycle,
    Probe,
    Serve,
    Wait,
)
from poolkeeper._proxy import ClientProxy, HealingProxy

if TYPE_CHECKING:
    import weakref
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from poolkeeper._lifecycle import Record, Slot, Ticket
    from poolkeeper._records import Statistics, Verdict
    from poolkeeper._threads import Scope

    # wrapt ships no type information: type checkers see this plain class
    # and the generic signature below, the runtime gets wrapt's C proxy.
    class _Proxy:
        def __init__(self, wrapped: object) -> None: ...
else:
    _Proxy = wrapt.CallableObjectProxy

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Missing(Protocol[T_co]):
    def _miss(self, value: object, began: int) -> T_co: ...


def arm(  # noqa: PLR0913, PLR0917 -- bound to the first three.
    cls_ref: weakref.ReferenceType[type],
    name: str,
    slow: Callable[..., Any],
    client: object,
    record: Record[Any] | None,
    pushed: bool,  # noqa: FBT001 -- the lifecycle's change hook.
) -> bool:
    """The change hook of a thread singleton: switch its class's call.

    Disarms (*client* None), arms with *client* (an override's stand-in,
    or a pushed key's live client), or arms the polled hit path with
    *record*. Always arms: a thread singleton has one hit path.
    """
    cls = cls_ref()
    if cls is None:  # The singleton is gone; no call can come.
        return True
    if client is not None and record is not None and not pushed:
        _arm_polled(cls, slow, record)
        return True
    target = slow if client is None else armed(client, name)
    # A plain class attribute store: callers on other threads see the old
    # or the new target, never neither.
    type.__setattr__(cls, "__call__", target)
    return True


def _arm_polled(
    cls: type, slow: Callable[..., Any], record: Record[T]
) -> None:
    """Arm *cls*'s hit path for a key that is polled on every call.

    The armed ``__call__`` evaluates the key and returns *record*'s client
    while the value is the one it was built for (by value, as
    :meth:`Record.matches` compares) and the record is live; anything else
    takes the slow path. One Python frame, plus the key's own.
    """
    key = cast("Callable[[], object]", cls.__dict__["_poolkeeper_key"])
    client = record.client
    value = record.key.value
    value_hash = record.key_hash
    live = ClientState.LIVE

    def polled(self: _Missing[T], *args: object, **kwargs: object) -> T:
        if args or kwargs:
            return cast("T", slow(self, *args, **kwargs))
        now = key()
        same = now is value or (now == value and hash(now) == value_hash)
        # A retirement after this check is one after the return: a lease
        # pins and checks the record again (see _lease).
        if same and record.state is live:
            return client
        return self._miss(now, record.read_ended)

    type.__setattr__(cls, "__call__", polled)


def armed(client: object, name: str) -> object:
    """Return a ``__call__`` that returns *client* without Python frames.

    An ``lru_cache`` seeded with the no-argument call answers it in C. A
    call with arguments misses the cache and reaches ``hit``, which raises
    the same error as the slow path; the staticmethod keeps the singleton
    itself out of the arguments.
    """

    def hit(*args: object, **kwargs: object) -> object:
        if args or kwargs:
            raise TypeError(no_arguments(name, args, kwargs))
        return client

    cached = functools.lru_cache(maxsize=None)(hit)
    cached()
    return staticmethod(cached)


@final
class ProcessSingleton(Identity[T], _Proxy, Generic[T]):
    """A factory turned into a process-wide singleton.

    Made by :func:`~poolkeeper.process_singleton`; never instantiated
    directly. It is a wrapt proxy of the factory, so ``__wrapped__``,
    ``__name__``, ``__doc__`` and :func:`inspect.signature` are the
    factory's.

    .. versionadded:: 0.1
    """

    if TYPE_CHECKING:
        __wrapped__: Callable[[], T]

    # wrapt keeps attributes named _self_* on the proxy itself.
    _self_name: str
    _self_key: Callable[[], object] | None
    _self_life: Lifecycle[T]
    _self_slot: Slot
    _self_closer: Closer
    _self_retire_on: Callable[[BaseException], bool] | None
    # A thread singleton's threads (scope="thread"; see _threads); None
    # for a process singleton.
    _self_scope: Scope | None = None

    # The hit path. Each singleton has its own subclass (see _decorator), and
    # while a client is live and its key cannot have changed, that class's
    # __call__ is a C callable returning the client (see armed), so a hit
    # runs no Python code and takes no lock. The lifecycle disarms it,
    # under its lock, before anything replaces or retires that client, and
    # a subscribed key's change and the fork hook disarm it too.

    def __call__(self, *args: object, **kwargs: object) -> T:
        """Return the live client for the current key, building it if needed.

        Concurrent first callers wait for one build and all receive the
        same object. A factory or key error propagates unchanged, caches
        nothing and leaves the previous client live; the next call tries
        again.

        Raises:
            TypeError: If called with arguments.
            ReentrantBuildError: If the build would wait for itself: the
                factory calls its own singleton, or factories on two
                threads need each other.
        """
        if args or kwargs:
            raise TypeError(no_arguments(self._self_name, args, kwargs))
        if won := self._self_life.override():
            return won[0]
        return self._acquire(NOTHING).client

    def _miss(self, value: object, began: int) -> T:
        # A polled hit path's miss, with the key value it read: the key is
        # evaluated once per call. That read began once the armed record's
        # own read had ended (*began*: the end's number).
        if won := self._self_life.override():
            return won[0]
        return self._acquire(value, began).client

    # -- calls --------------------------------------------------------------

    def _acquire(self, value: object, began: int = 0) -> Record[T]:
        # Ask the lifecycle, act on its answer, until served (the asking,
        # alike for both drivers, is _builds.Rounds'). The first read of
        # the key is the polled hit path's, if it made one (*value*).
        life, closer = self._self_life, self._self_closer
        name, key = self._self_name, self._self_key
        if life.fork_errors:
            report_fork_errors(name, life.fork_errors)
        me = threading.get_ident()
        read = read_key(life, key, name, value, began)
        with Rounds(
            life,
            self._self_slot,
            key,
            name,
            closer,
            me,
            threading.Event,
            threading.Event.set,
            read,
        ) as rounds:
            step = rounds.ask()
            while True:  # Bounded: ask() gives up after MAX_ROUNDS.
                match step:
                    case Serve(record=record):
                        return record
                    case Probe(record=record):
                        # This call runs the probe; others are served
                        # meanwhile.
                        again = run_probe(life, closer, record)
                        step = rounds.probed(record, again=again)
                    case Build(ticket=ticket):
                        self._build(ticket)
                        step = rounds.built(ticket)
                    case Wait(ticket=ticket):
                        with waiting(me, ticket):
                            ended(ticket)
                        step = rounds.waited(ticket)

    def _build(self, ticket: Ticket) -> None:
        # Runs the factory with no lock held; callers for the same slot
        # wait on the ticket instead. Whatever is raised, at whatever line,
        # the build ends (see _builds): tests/test_attack_lines.py and
        # test_guarantees.py cut it at each line.
        keyed = self._self_key is not None
        wake = threading.Event.set
        factory = self.__wrapped__
        run = BuildRun(
            self._self_life,
            ticket,
            keyed,
            time.monotonic,
            wake,
            factory=factory,
        )
        try:
            with run, building(ticket):
                # The factory runs and its client is stored in one lookup:
                # no signal lands between the two (see _builds).
                run.made[None]
                refuse_coroutine(self._self_name, run.made)
        finally:
            try:
                run.end()
            finally:
                # Said (built, and what it retired), then closed.
                try:
                    report(self._self_name, run, is_async=False)
                finally:
                    self._close(run.doomed)
        life = self._self_life
        # Without max_age or check, healing's module runs nothing here.
        if ticket.record is not None and life.has_timers():
            start_timers(life, self._self_closer, ticket.record)

    def _close(self, doomed: list[Record[T]]) -> None:
        # With any close owed from before (decided, then cut short before
        # it began): each close claims its record, so none runs twice.
        owed = self._self_life.owed_besides(doomed)
        close = self._self_closer.close
        run_each(
            (
                *(functools.partial(close, r) for r in (*doomed, *owed)),
                # Retired records hold their leases weakly: a lease dropped
                # without exiting releases its pin when collected.
                functools.partial(loosen, self._self_life),
            )
        )

    # -- beside the call ----------------------------------------------------

    def reset(self) -> bool:
        """Retire the live client; the next call builds a new one.

        The retired client is closed now, with no lock held, or when its
        last lease exits. Within *min_rebuild_interval* seconds of the last
        build the reset is deferred, not dropped: it returns ``False``
        (counted in ``statistics().resets_refused``), the client stays
        live, and a timer retires it when the interval ends. An error
        handler that resets on every failure thus cannot turn into a build
        storm, and still gets its rebuild.

        Returns:
            Whether a client was retired now.
        """
        life, slot = self._self_life, self._self_slot
        return self._retire(
            slot, functools.partial(life.reset, slot, monotonic())
        )

    def retire(self, client: T) -> bool:
        """Retire *client* if it is still the live client: compare-and-retire.

        For a client found broken (closed by user code, a pool that no
        longer recovers). Any number of callers retiring the same client
        cause one retirement and one build; a stale call, for a client
        already replaced (or an override's stand-in), retires nothing. The
        retired client is closed as ``reset()`` closes it: with no lock
        held, after its last lease. It is logged at WARNING on the
        ``poolkeeper`` logger.

        Healing rebuilds back off: the first is immediate, but a client
        retired within the backoff of its build (1 s after a first healing
        retirement, doubling up to 60 s while each new client fails as
        fast; see ``statistics().backoff``) stays live until the backoff
        ends, when a timer retires it (``statistics().deferred`` says
        so). No caller waits and none is refused.

        Returns:
            Whether *client* was retired now: ``False`` when it is not the
            live client, or when its retirement was deferred.
        """
        return self._heal(client, "retire", None)

    def _heal(
        self, client: object, reason: str, error: BaseException | None
    ) -> bool:
        life, slot = self._self_life, self._self_slot
        name = error_name(error)
        heal = functools.partial(life.heal, slot, client, reason, name)
        return self._retire(slot, functools.partial(heal, monotonic()))

    def _retire(
        self,
        slot: Slot,
        decide: Callable[[list[Record[T]]], Verdict | None],
    ) -> bool:
        # A retirement the lifecycle decides (reset, heal) is said (retired,
        # or deferred), then its client closed, then a deferral's timer
        # started.
        doomed: list[Record[T]] = []
        verdict: Verdict | None = None
        try:
            verdict = decide(doomed)
        finally:
            try:
                events.say(self._self_name, verdict)
            finally:
                self._close(doomed)
        return schedule(self._self_life, self._self_closer, slot, verdict)

    def _retire_on(self, client: object, error: BaseException) -> None:
        # An exception escaping a lease or a proxy's method: retire its
        # client if retire_on matches it. Never raises an Exception, so
        # that the caller's propagates unchanged.
        matches = self._self_retire_on
        try:
            if matches is not None and matches(error):
                self._heal(client, "retire_on", error)
        except Exception as exc:  # noqa: BLE001 -- logged; theirs goes on.
            events.retire_on_failed(self._self_name, error, exc)

    def lease(self) -> AbstractContextManager[T]:
        """Pin the live client for the duration of a ``with`` block.

        If the client is retired meanwhile (key change, ``reset()``,
        ``close_all()``), its close waits until the last lease on it exits.
        Use it around work that must not see its client closed underneath.

        Returns:
            A context manager whose ``with`` block gets the live client,
            as a call would return it. Enter it once.
        """
        # Each singleton's class replaces this method (see _decorator.make).
        leases = type(self).__dict__["lease"]  # pragma: no cover
        return cast("AbstractContextManager[T]", leases())  # pragma: no cover

    def proxy(self) -> T:
        """Return a handle that resolves to the live client on every use.

        Store it where code would store "the client" (a closure, an
        attribute): attribute access on it goes to the live client, so it
        follows key rotation and never reaches a retired client. Nothing is
        built until it is first used. It pickles by reference.

        With *retire_on* set, a method called through the handle (or the
        handle called) runs inside a lease of the live client, so a
        retirement closes that client only after the call ends; a call
        that raises a matching exception retires the client it ran on (as
        ``retire()`` does), and the exception propagates unchanged. Hold
        the handle, not a client, for hours: healing then reaches the code
        that uses it.

        Returns:
            A transparent proxy, typed as the client.
        """
        single = cast("Callable[[], T]", self)  # A ProcessSingleton.
        if self._self_retire_on is None:
            return cast("T", ClientProxy(single))
        # With retire_on: a method called through it runs inside a lease,
        # whose exit retires the client when a matching exception escapes.
        return cast("T", HealingProxy(single))

    def current(self) -> T | None:
        """Return the live client without building one.

        Returns:
            The live client (or the override), ``None`` if none is live.
        """
        if won := self._self_life.override():
            return won[0]
        live = self._self_slot.live
        return None if live is None else live.client

    def statistics(self) -> Statistics:
        """Return an immutable snapshot of this singleton's counters.

        Returns:
            The counters of this process.
        """
        return self._self_life.statistics(self._self_slot, monotonic())

    def __repr__(self) -> str:
        """Describe the singleton with its key fingerprint, never the key."""
        live = self._self_slot.live
        state = (
            "no live client"
            if live is None
            else f"generation {live.generation}, key {live.fingerprint}"
        )
        return (
            f"<poolkeeper.ProcessSingleton {self._self_name} "
            f"({state}, pid {self._self_life.pid})>"
        )


# The slow path, which a disarmed class gets back as its __call__.
_slow_call: Callable[..., Any] = ProcessSingleton.__dict__["__call__"]
