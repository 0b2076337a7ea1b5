"""What a thread singleton offers beside its call.

:class:`ProcessSingleton` is the thread driver of the lifecycle
(``_singleton``); these are its other public methods: retiring the live
client, leases, the proxy handle, and what inspects it (the live client,
its counters, its repr).
"""

from __future__ import annotations

import time
from typing import TYPE_CHECKING, Generic, TypeVar, cast

from poolkeeper._proxy import ClientProxy

if TYPE_CHECKING:
    from collections.abc import Callable
    from contextlib import AbstractContextManager

    from poolkeeper._lifecycle import Lifecycle, Record, Slot
    from poolkeeper._records import Statistics

T = TypeVar("T")


class SyncMethods(Generic[T]):
    """The methods of :class:`ProcessSingleton` beside its call."""

    _self_name: str
    _self_life: Lifecycle[T]
    _self_slot: Slot

    if TYPE_CHECKING:

        def _close(self, doomed: list[Record[T]]) -> None: ...

    def reset(self) -> bool:
        """Retire the live client; the next call builds a new one.

        The retired client is closed now, with no lock held, or when its
        last lease exits. Within *min_rebuild_interval* seconds of the last
        build nothing is retired, so an error handler that resets on every
        failure cannot turn into a build storm.

        Returns:
            Whether a client was retired.
        """
        doomed: list[Record[T]] = []
        try:
            return self._self_life.reset(
                self._self_slot, time.monotonic(), doomed
            )
        finally:
            self._close(doomed)

    def lease(self) -> AbstractContextManager[T]:
        """Pin the live client for the duration of a ``with`` block.

        If the client is retired meanwhile (key change, ``reset()``,
        ``close_all()``), its close waits until the last lease on it exits.
        Use it around work that must not see its client closed underneath.

        Returns:
            A context manager whose ``with`` block gets the live client,
            as a call would return it. Enter it once.
        """
        # Each singleton's class replaces this method (see _make.make).
        leases = type(self).__dict__["lease"]  # pragma: no cover
        return cast("AbstractContextManager[T]", leases())  # pragma: no cover

    def proxy(self) -> T:
        """Return a handle that resolves to the live client on every use.

        Store it where code would store "the client" (a closure, an
        attribute): attribute access on it goes to the live client, so it
        follows key rotation and never reaches a retired client. Nothing is
        built until it is first used. It pickles by reference.

        Returns:
            A transparent proxy, typed as the client.
        """
        single = cast("Callable[[], T]", self)  # A ProcessSingleton.
        return cast("T", ClientProxy(single))

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
        return self._self_life.statistics(self._self_slot)

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
