"""What an async singleton offers beside its await.

:class:`AsyncProcessSingleton` is the event-loop driver of the lifecycle
(``_async``); these are its other public methods, each for the running
loop's slot: retiring its live client, leases, and what inspects it (the
live client, the counters, the repr).
"""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Generic, TypeVar

from poolkeeper._identity import too_many_rounds
from poolkeeper._lease import warn_dropped
from poolkeeper._lifecycle import MAX_ROUNDS

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from poolkeeper._lifecycle import Lifecycle, Record, Slot
    from poolkeeper._records import Statistics

T = TypeVar("T")


class AsyncMethods(Generic[T]):
    """The methods of :class:`AsyncProcessSingleton` beside its await."""

    _self_name: str
    _self_life: Lifecycle[T]

    if TYPE_CHECKING:

        def _slot(self) -> Slot: ...
        async def _acquire(self) -> Record[T]: ...
        async def _close(self, doomed: list[Record[T]]) -> None: ...

    async def reset(self) -> bool:
        """Retire the running loop's live client; the next await rebuilds.

        Within *min_rebuild_interval* seconds of the last build on this
        loop nothing is retired.

        Returns:
            Whether a client was retired.
        """
        slot = self._slot()
        now = asyncio.get_running_loop().time()
        doomed: list[Record[T]] = []
        try:
            return self._self_life.reset(slot, now, doomed)
        finally:
            await self._close(doomed)

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
                raise too_many_rounds(self._self_name, "lease")
            yield held[0].client
        except GeneratorExit:
            # Closed at the yield, never exited: collected (the loop's
            # async generator finalizer) or its loop ended. It ends now.
            warn_dropped(self._self_name)
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
        slot = self._self_life.slots.get(id(loop))
        if slot is None or slot.loop is None or slot.loop() is not loop:
            return None
        return slot

    def statistics(self) -> Statistics:
        """Return counters over all loops; live fields for the running one.

        Returns:
            An immutable snapshot.
        """
        return self._self_life.statistics(self._running_slot())

    def __repr__(self) -> str:
        """Name the factory and the number of loops served."""
        life = self._self_life
        return (
            f"<poolkeeper.AsyncProcessSingleton {self._self_name} "
            f"({len(life.slots)} loops, pid {life.pid})>"
        )
