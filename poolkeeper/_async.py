"""AsyncProcessSingleton: the event-loop driver of the lifecycle.

One client per process *and* event loop: async clients bind to the loop
they were built on, so each loop has a slot of its own in the lifecycle,
and a retired client is closed on its own loop, never on another one.
When a loop ends, its slot closes with it, and the hit path of a pushed
key is armed for one loop at a time (both in ``_loops``); this class's
``__call__`` is the slow path. Beside the await: ``reset``, ``lease``,
``current``, ``statistics``.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import weakref
from typing import TYPE_CHECKING, Any, Final, Generic, TypeVar, cast, final

import wrapt

from poolkeeper import _events as events
from poolkeeper import _loops
from poolkeeper._builds import (
    BuildRun,
    Rounds,
    aended,
    building,
    read_key,
    report,
    waiting,
)
from poolkeeper._close import _LOOP_HINT, Closer, aclose_here, arun_each
from poolkeeper._healing import (
    arun_probe,
    error_name,
    monotonic,
    schedule,
    start_timers,
)
from poolkeeper._identity import (
    Identity,
    no_arguments,
    report_fork_errors,
    too_many_rounds,
)
from poolkeeper._lease import warn_dropped
from poolkeeper._lifecycle import (
    MAX_ROUNDS,
    Build,
    Lifecycle,
    Probe,
    Serve,
    Wait,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Coroutine

    from poolkeeper._lifecycle import Record, Slot, Ticket
    from poolkeeper._records import Statistics, Verdict

    _Base = wrapt.ObjectProxy[Any]
else:
    _Base = wrapt.ObjectProxy

T = TypeVar("T")


@final
class AsyncProcessSingleton(Identity[T], _Base, Generic[T]):
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
    _self_retire_on: Callable[[BaseException], bool] | None
    # The record a pushed key's call was last served (see _get).
    _self_seen: Seen

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
        seen = self._self_seen
        slot = seen.slot
        if slot is not None and seen.epoch == life.epoch:
            loop = asyncio.get_running_loop()
            live = slot.live
            if (
                live is not None
                and live.sequence == seen.sequence
                and slot.probe is None
                and slot.loop() is loop
                and _loops.kept(type(self), loop)
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
            _loops.drop(life, stale, lost)
        _loops.prune(life, lost)
        for record in lost:
            self._self_closer.unclosed(
                record, "its event loop was closed first", _LOOP_HINT
            )
        _loops.hook(life, self._self_closer, slot)
        return slot

    # -- calls --------------------------------------------------------------

    async def _acquire(self) -> Record[T]:
        life, closer = self._self_life, self._self_closer
        name, key = self._self_name, self._self_key
        if life.fork_errors:
            report_fork_errors(name, life.fork_errors)
        slot = self._slot()
        epoch, key_hash, value, began, until = read_key(life, key, name)
        live = slot.live
        # No lock: this slot's clients are only ever closed on this loop,
        # so none can start closing while this code runs. A pushed key's
        # match goes to request(), which arms the hit path.
        if (
            live is not None
            and not life.pushed
            and slot.probe is None
            and live.matches(key_hash, value)
        ):
            return live
        # Then ask the lifecycle and act on its answer, as the sync driver
        # does (the asking is _builds.Rounds'); a slot dropped meanwhile
        # (its loop ended) is replaced.
        owner = asyncio.current_task()
        loop = asyncio.get_running_loop()
        with Rounds(
            life,
            slot,
            key,
            name,
            closer,
            owner,
            loop.create_future,
            _wake,
            (epoch, key_hash, value, began, until),
            reslot=self._slot,
        ) as rounds:
            step = rounds.ask()
            while True:  # Bounded: ask() gives up after MAX_ROUNDS.
                match step:
                    case Serve(record=record):
                        if life.pushed:  # Only a pushed key's is reused.
                            self._self_seen = Seen(
                                rounds.epoch, record.slot, record.sequence
                            )
                        return record
                    case Probe(record=record):
                        again = await arun_probe(life, closer, record)
                        step = rounds.probed(record, again=again)
                    case Build(ticket=ticket):
                        await self._build(ticket, loop)
                        step = rounds.built(ticket)
                    case Wait(ticket=ticket):
                        with waiting(owner, ticket):
                            await aended(ticket)
                        step = rounds.waited(ticket)

    async def _build(
        self, ticket: Ticket, loop: asyncio.AbstractEventLoop
    ) -> None:
        # As in the sync driver (see _builds). A cancelled builder is no
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
                # Said (built, and what it retired), then closed.
                try:
                    report(self._self_name, run, is_async=True)
                finally:
                    await self._close(run.doomed)
        life = self._self_life
        # Without max_age or check, healing's module runs nothing here.
        if ticket.record is not None and life.has_timers():
            start_timers(life, self._self_closer, ticket.record)

    async def _close(self, doomed: list[Record[T]]) -> None:
        closer = self._self_closer
        await arun_each(
            functools.partial(aclose_here, closer, r) for r in doomed
        )

    # -- beside the call ----------------------------------------------------

    async def reset(self) -> bool:
        """Retire the running loop's live client; the next await rebuilds.

        Within *min_rebuild_interval* seconds of the last build on this
        loop nothing is retired now: the reset is deferred until the
        interval ends (a timer carries it out, closing the client on its
        loop) and ``False`` is returned.

        Returns:
            Whether a client was retired now.
        """
        slot = self._slot()
        now = asyncio.get_running_loop().time()
        reset = functools.partial(self._self_life.reset, slot, now)
        return await self._retire(slot, reset)

    async def retire(self, client: T) -> bool:
        """Retire *client* if it is still the running loop's live client.

        Compare-and-retire, as :meth:`ProcessSingleton.retire`: any number
        of tasks (or threads) retiring the same client cause one
        retirement and one build, a stale call retires nothing, and
        healing rebuilds back off (a retirement within the backoff is
        deferred, carried out by a timer). The retired client is closed on
        its loop, after its last lease; awaited here when it closes now.

        Returns:
            Whether *client* was retired now.
        """
        return await self._heal(client, "retire", None)

    async def _heal(
        self, client: object, reason: str, error: BaseException | None
    ) -> bool:
        slot = self._running_slot()
        if slot is None:
            return False
        name = error_name(error)
        heal = functools.partial(
            self._self_life.heal, slot, client, reason, name
        )
        return await self._retire(slot, functools.partial(heal, monotonic()))

    async def _retire(
        self,
        slot: Slot,
        decide: Callable[[list[Record[T]]], Verdict | None],
    ) -> bool:
        # As the sync driver's: said, closed (on this loop), scheduled.
        doomed: list[Record[T]] = []
        verdict: Verdict | None = None
        try:
            verdict = decide(doomed)
        finally:
            try:
                events.say(self._self_name, verdict)
            finally:
                await self._close(doomed)
        return schedule(self._self_life, self._self_closer, slot, verdict)

    async def _retire_on(self, client: object, error: BaseException) -> None:
        # As the sync driver's: never raises an Exception.
        matches = self._self_retire_on
        try:
            if matches is not None and matches(error):
                await self._heal(client, "retire_on", error)
        except Exception as exc:  # noqa: BLE001 -- logged; theirs goes on.
            events.retire_on_failed(self._self_name, error, exc)

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncGenerator[T, None]:
        """Pin the running loop's live client for an ``async with`` block.

        Yields:
            The live client; if it is retired meanwhile, its close waits
            until the last lease on it exits.
        """
        life = self._self_life
        if won := life.override():
            yield won[0]
            return
        # The leased record, set and cleared under the lock by the lines
        # that count the lease (see Lifecycle.lease).
        held: list[Record[T]] = []
        try:
            for _ in range(MAX_ROUNDS):
                candidate = await self._acquire()
                if life.lease(candidate.slot, candidate, held):
                    break
            else:
                raise too_many_rounds(  # noqa: TRY301 -- before the block.
                    self._self_name, "lease"
                )
            yield held[0].client
        except GeneratorExit:
            # Closed at the yield, never exited: collected (the loop's
            # async generator finalizer) or its loop ended. It ends now.
            # Before the yield (nothing held) it was raised by the factory
            # or a probe: the caller's, said by nothing here.
            if held:
                warn_dropped(self._self_name)
            raise
        except BaseException as exc:
            # Escaping the block: retire_on may retire the leased client
            # (its close waits for this lease's end, below).
            if held and self._self_retire_on is not None:
                await self._retire_on(held[0].client, exc)
            raise
        finally:
            # Each layer ends the lease if an exception cut the one before
            # short (unlease is idempotent), then the doomed are closed.
            doomed: list[Record[T]] = []
            try:
                try:
                    life.unlease(held, doomed)
                finally:
                    life.unlease(held, doomed)
            finally:
                await self._close(doomed)

    def current(self) -> T | None:
        """Return the running loop's live client without building one.

        Returns:
            The client, or ``None`` (also when no loop is running).
        """
        if won := self._self_life.override():
            return won[0]
        slot = self._running_slot()
        live = None if slot is None else slot.live
        return None if live is None else live.client

    def _running_slot(self) -> Slot | None:
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        return self._self_life.loop_slot(loop)

    def statistics(self) -> Statistics:
        """Return counters over all loops; live fields for the running one.

        Returns:
            An immutable snapshot.
        """
        return self._self_life.statistics(self._running_slot(), monotonic())

    def __repr__(self) -> str:
        """Name the factory and the number of loops served."""
        life = self._self_life
        return (
            f"<poolkeeper.AsyncProcessSingleton {self._self_name} "
            f"({len(life.slots)} loops, pid {life.pid})>"
        )


@final
class Seen:
    """The record a pushed key's call was last served, by slot and number.

    It matched the key read at *epoch*: while that epoch stands (no key
    changed since) and the slot's live record is still the *sequence*-th it
    built, an await on the slot's loop is served it without reading the key
    (see ``_get``). Held by number, so that a record (its client) is never
    kept alive from here once its slot lets go of it. Replaced whole.
    """

    __slots__ = ("epoch", "sequence", "slot")

    def __init__(self, epoch: int, slot: Slot | None, sequence: int) -> None:
        self.epoch = epoch
        self.slot = slot
        self.sequence = sequence


#: Nothing served yet: no epoch is -1.
NOT_SEEN: Final = Seen(-1, None, 0)


def _wake(done: asyncio.Future[None]) -> None:
    """Wake the waiters of a build, once."""
    if not done.done():  # pragma: no branch -- an injection sets it twice.
        done.set_result(None)
