"""AsyncProcessSingleton: the event-loop driver of the lifecycle.

One client per process *and* event loop: async clients bind to the loop
they were built on, so each loop has a slot of its own in the lifecycle,
and a retired client is closed on its own loop, never on another one.
When a loop ends, its slot closes with it (``_loop_end``). The hit path of
a pushed key is armed for one loop at a time (``_loop_hit``); this class's
``__call__`` is the slow path.
"""

from __future__ import annotations

import asyncio
import functools
import weakref
from typing import TYPE_CHECKING, Any, Generic, TypeVar, cast, final

import wrapt

from poolkeeper import _loop_end, _loop_hit
from poolkeeper._async_methods import AsyncMethods
from poolkeeper._close import _LOOP_HINT, Closer, arun_each
from poolkeeper._close_anywhere import aclose_here
from poolkeeper._drive import BuildRun, log_built
from poolkeeper._identity import (
    Identity,
    no_arguments,
    report_fork_errors,
)
from poolkeeper._lifecycle import Build, Lifecycle, Serve
from poolkeeper._rounds import read_key, rounds
from poolkeeper._waits import aended, building, waiting

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

    from poolkeeper._lifecycle import Record, Slot, Ticket

    _Base = wrapt.ObjectProxy[Any]
else:
    _Base = wrapt.ObjectProxy

T = TypeVar("T")


@final
class AsyncProcessSingleton(Identity[T], AsyncMethods[T], _Base, Generic[T]):
    """An ``async def`` factory turned into a per-process, per-loop singleton.

    Made by :func:`~poolkeeper.process_singleton` on an ``async def``
    factory. ``await single()`` returns the client of the running event
    loop: async clients bind to the loop they were built on. Retired
    clients are closed on their own loop, never on another one, and a
    loop's clients are closed on it when ``asyncio.run()`` (or
    ``asyncio.Runner``) ends it.

    .. versionadded:: 0.1
    """

    _self_name: str
    _self_key: Callable[[], object] | None
    _self_life: Lifecycle[T]
    _self_closer: Closer
    # (epoch, slot, sequence): the slot's record built *sequence*-th
    # matched the key read at *epoch* (see _get).
    _self_seen: tuple[int, Slot | None, int]

    def __call__(
        self, *args: object, **kwargs: object
    ) -> Coroutine[Any, Any, T]:
        """Return the running loop's live client, building it if needed.

        Tasks that await first wait for one build and all receive the same
        object; a failed build raises its error in every task waiting for
        that key and caches nothing.

        Raises:
            TypeError: If called with arguments (raised at the call).
            ReentrantBuildError: If the build would wait for itself: the
                factory awaits its own singleton (also through tasks it
                starts), or factories of two tasks need each other.
        """
        if args or kwargs:
            raise TypeError(no_arguments(self._self_name, args, kwargs))
        return self._get()

    async def _get(self) -> T:
        life = self._self_life
        # Overrides win; the helper is called only when there is one (for a
        # polled key this is every call's path).
        if life.overrides and (won := life.override()):
            return won[0]
        # While another running loop keeps the armed hit path, a pushed
        # key's record that matched the key read at an epoch that still
        # stands, and is still live on this loop, is the answer: no key
        # read, no lock. Otherwise _acquire arms this loop. Held by slot
        # and build sequence: a record (its client) is never kept alive
        # from here once its slot lets go of it.
        epoch, slot, sequence = self._self_seen
        if slot is not None and epoch == life.epoch:
            loop = asyncio.get_running_loop()
            live = slot.live
            if (
                live is not None
                and live.sequence == sequence
                and slot.loop() is loop
                and _loop_hit.kept(type(self), loop)
            ):
                return cast("T", live.client)
        return (await self._acquire()).client

    # -- slots --------------------------------------------------------------

    def _slot(self) -> Slot:
        loop = asyncio.get_running_loop()
        life = self._self_life
        slot = life.slots.get(id(loop))
        # Hooked too: a slot made by a call cut short before it hooked the
        # loop's end would never be closed there.
        if (
            slot is not None
            and slot.hook is not None
            and slot.loop is not None
            and slot.loop() is loop
        ):
            return slot
        slot, stale = life.open_slot(id(loop), weakref.ref(loop))
        lost: list[Record[T]] = []
        if stale is not None:
            _loop_end.drop(life, stale, lost)
        _loop_end.prune(life, lost)
        for record in lost:
            self._self_closer.unclosed(
                record, "its event loop was closed first", _LOOP_HINT
            )
        _loop_end.hook(life, self._self_closer, slot)
        return slot

    # -- calls --------------------------------------------------------------

    async def _acquire(self) -> Record[T]:
        life = self._self_life
        if life.fork_errors:
            report_fork_errors(self._self_name, life.fork_errors)
        slot = self._slot()
        first = read_key(life, self._self_key, self._self_name)
        _, key_hash, key = first
        live = slot.live
        # No lock: this slot's clients are only ever closed on this loop,
        # so none can start closing while this code runs. A pushed key's
        # match goes to request(), which arms the hit path.
        if (
            live is not None
            and not life.pushed
            and live.matches(key_hash, key)
        ):
            return live
        owner = asyncio.current_task()
        loop = asyncio.get_running_loop()
        # The slot, wake-up and epoch of this call's latest request.
        asked: list[Any] = [None, None, 0]
        wakeup = loop.create_future
        steps = rounds(self, slot, self._slot, owner, wakeup, asked, first)
        try:
            for step in steps:
                if isinstance(step, Serve):
                    record = step.record
                    if life.pushed:  # Only a pushed key's is reused (_get).
                        seen = (asked[2], record.slot, record.sequence)
                        self._self_seen = seen
                    return record
                if isinstance(step, BaseException):
                    raise step  # noqa: TRY301 -- the key's or its build's error.
                ticket = step.ticket
                if isinstance(step, Build):
                    await self._build(ticket, loop)
                    continue
                with waiting(owner, ticket):
                    await aended(ticket)
        except BaseException:
            if life.settle_unbegun(asked[0], asked[1]):
                asked[1].set_result(None)
            raise
        raise AssertionError  # pragma: no cover -- rounds() ends the call.

    async def _build(
        self, ticket: Ticket, loop: asyncio.AbstractEventLoop
    ) -> None:
        # As in the sync driver (see _drive). A cancelled builder is no
        # failure: its waiters retry, one of them building.
        keyed = self._self_key is not None
        run: BuildRun[T] = BuildRun(
            self._self_life, ticket, keyed, loop.time, _wake
        )
        try:
            with run, building(ticket):
                run.made[None] = await self.__wrapped__()
        finally:
            try:
                run.end()
            finally:
                await self._close(run.doomed)
        if ticket.record is not None:  # pragma: no branch -- injected.
            log_built(self._self_name, ticket.record)

    async def _close(self, doomed: list[Record[T]]) -> None:
        closer = self._self_closer
        await arun_each(
            functools.partial(aclose_here, closer, r) for r in doomed
        )


def _wake(done: asyncio.Future[None]) -> None:
    """Wake the waiters of a build, once."""
    if not done.done():  # pragma: no branch -- an injection sets it twice.
        done.set_result(None)
