"""ProcessSingleton: the thread driver of the lifecycle, and the hit path."""

from __future__ import annotations

import functools
import threading
import time
from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

import wrapt

from poolkeeper._close import Closer, run_each
from poolkeeper._drive import NOTHING, BuildRun, log_built, refuse_coroutine
from poolkeeper._identity import Identity, no_arguments, report_fork_errors
from poolkeeper._lease import loosen
from poolkeeper._lifecycle import Build, Lifecycle, Serve, constant
from poolkeeper._rounds import read_key, rounds
from poolkeeper._sync_methods import SyncMethods
from poolkeeper._waits import building, ended, waiting

if TYPE_CHECKING:
    from collections.abc import Callable

    from poolkeeper._lifecycle import Record, Slot, Ticket

    # wrapt ships no type information: type checkers see this plain class
    # and the generic signature below, the runtime gets wrapt's C proxy.
    class _Proxy:
        def __init__(self, wrapped: object) -> None: ...
else:
    _Proxy = wrapt.CallableObjectProxy

T = TypeVar("T")


@final
class ProcessSingleton(Identity[T], SyncMethods[T], _Proxy, Generic[T]):
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

    # The hit path. Each singleton has its own subclass (see _make), and
    # while a client is live and its key cannot have changed, that class's
    # __call__ is a C callable returning the client (see _hit.armed), so a hit
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

    def _miss(self, value: object) -> T:
        # A polled hit path's miss, with the key value it read: the key is
        # evaluated once per call.
        if won := self._self_life.override():
            return won[0]
        return self._acquire(value).client

    # -- calls --------------------------------------------------------------

    def _acquire(self, value: object) -> Record[T]:
        life = self._self_life
        slot = self._self_slot
        if life.fork_errors:
            report_fork_errors(self._self_name, life.fork_errors)
        me = threading.get_ident()
        first = read_key(life, self._self_key, self._self_name, value)
        # The slot, wake-up and epoch of this call's latest request.
        asked: list[Any] = [None, None, 0]
        # A thread's slot is never dropped: it is its own replacement.
        steps = rounds(
            self, slot, constant(slot), me, threading.Event, asked, first
        )
        try:
            for step in steps:
                if isinstance(step, Serve):
                    return step.record
                if isinstance(step, BaseException):
                    raise step  # noqa: TRY301 -- the key's or its build's error.
                ticket = step.ticket
                if isinstance(step, Build):
                    self._build(ticket)
                    continue
                with waiting(me, ticket):
                    ended(ticket)
        except BaseException:
            if life.settle_unbegun(asked[0], asked[1]):
                asked[1].set()
            raise
        raise AssertionError  # pragma: no cover -- rounds() ends the call.

    def _build(self, ticket: Ticket) -> None:
        # Runs the factory with no lock held; callers for the same slot
        # wait on the ticket instead. Whatever is raised, at whatever line,
        # the build ends (see _drive): tests/test_attack_lines.py and
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
                # no signal lands between the two (see _drive).
                run.made[None]
                refuse_coroutine(self._self_name, run.made)
        finally:
            try:
                run.end()
            finally:
                self._close(run.doomed)
        if ticket.record is not None:  # pragma: no branch -- injected.
            log_built(self._self_name, ticket.record)

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


# The slow path, which a disarmed class gets back as its __call__.
_slow_call: Callable[..., Any] = ProcessSingleton.__dict__["__call__"]
