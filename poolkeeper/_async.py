"""AsyncProcessSingleton: one client per process *and* event loop."""

from __future__ import annotations

import asyncio
import concurrent.futures
import contextlib
import functools
import inspect
import logging
import os
import threading
import warnings
from typing import TYPE_CHECKING, Any, Generic, TypeVar, final

import wrapt

from poolkeeper import _registry
from poolkeeper._fingerprint import fingerprint
from poolkeeper._live import (
    MAX_ROUNDS,
    Identity,
    Live,
    abandon,
    evaluate_key,
)
from poolkeeper._retire import log_close_failure, report_fork_errors
from poolkeeper._stats import Statistics
from poolkeeper.exceptions import (
    PoolkeeperError,
    ReentrantBuildError,
    UnclosedClientWarning,
)

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Coroutine, Generator

    _Base = wrapt.ObjectProxy[Any]
else:
    _Base = wrapt.ObjectProxy

T = TypeVar("T")

log = logging.getLogger("poolkeeper")

# Distinct classes before Python 3.11, aliases of TimeoutError since.
_TIMEOUTS = (
    TimeoutError,
    asyncio.TimeoutError,
    concurrent.futures.TimeoutError,
)

# How long a close may take on another thread's loop before shutdown gives
# up on it and says so.
CROSS_LOOP_CLOSE_SECONDS = 30.0


class _Slot(Generic[T]):
    """One event loop's share of an async singleton."""

    __slots__ = ("build", "built_at", "live", "loop", "retired")

    def __init__(self, loop: asyncio.AbstractEventLoop) -> None:
        self.loop = loop
        self.built_at = float("-inf")
        self.live: Live[T] | None = None
        self.build: _AsyncBuild[T] | None = None
        self.retired: list[Live[T]] = []


class _AsyncBuild(Generic[T]):
    __slots__ = ("done", "key_hash", "task")

    def __init__(
        self, key_hash: int, done: asyncio.Future[Live[T] | None]
    ) -> None:
        self.key_hash = key_hash
        self.done = done
        self.task = asyncio.current_task()


@final
class AsyncProcessSingleton(Identity, _Base, Generic[T]):
    """An ``async def`` factory turned into a per-process, per-loop singleton.

    Made by :func:`~poolkeeper.process_singleton` on an ``async def``
    factory. ``await single()`` returns the client of the running event
    loop: async clients bind to the loop they were built on. Retired
    clients are closed on their own loop, never on another one.

    .. versionadded:: 0.1
    """

    _self_name: str
    _self_key: Callable[[], object] | None
    _self_close: Callable[[T], object] | None
    _self_after_fork: Callable[[T], object] | None
    _self_fork_mode: str
    _self_min_interval: float
    _self_lock: threading.Lock
    # Loops are held strongly: a loop that ends with live clients is
    # reported by close_all(), never silently forgotten.
    _self_slots: dict[asyncio.AbstractEventLoop, _Slot[T]]
    _self_overrides: tuple[T, ...]
    _self_counts: dict[str, int]
    _self_pid: int
    _self_fork_errors: list[Exception]

    def __init__(  # noqa: PLR0913 -- mirrors the keyword-only options.
        self,
        factory: Callable[[], Coroutine[Any, Any, T]],
        *,
        key: Callable[[], object] | None,
        close: Callable[[T], object] | None,
        after_fork: Callable[[T], object] | None,
        fork: str,
        min_rebuild_interval: float,
    ) -> None:
        """Wrap *factory*; use :func:`~poolkeeper.process_singleton`."""
        super().__init__(factory)
        self._self_name = getattr(factory, "__qualname__", repr(factory))
        self._self_key = key
        self._self_close = close
        self._self_after_fork = after_fork
        self._self_fork_mode = fork
        self._self_min_interval = min_rebuild_interval
        self._self_overrides = ()
        self._self_fork_errors = []
        self._forget_all()
        _registry.register(self)

    def _forget_all(self) -> None:
        self._self_lock = threading.Lock()
        self._self_slots = {}
        self._self_pid = os.getpid()
        self._self_counts = dict.fromkeys(
            (
                "builds",
                "build_failures",
                "closes",
                "close_failures",
                "resets_refused",
            ),
            0,
        )

    def _slot(self) -> _Slot[T]:
        loop = asyncio.get_running_loop()
        slot = self._self_slots.get(loop)
        if slot is None:
            # Loops of other threads touch the dict too.
            with self._self_lock:
                slot = self._self_slots.setdefault(loop, _Slot(loop))
        return slot

    async def __call__(self) -> T:
        """Return the running loop's live client, building it if needed.

        Tasks that await first wait for one build and all receive the same
        object; a failed build raises its error in every one of them and
        caches nothing.

        Raises:
            ReentrantBuildError: If the factory awaits its own singleton.
        """
        overrides = self._self_overrides
        if overrides:
            return overrides[-1]
        if self._self_fork_errors:
            report_fork_errors(self._self_name, self._self_fork_errors)
        slot = self._slot()
        key_hash, key_value = evaluate_key(self._self_key, self._self_name)
        live = slot.live
        if live is not None and live.key_hash == key_hash:
            return live.client
        return (await self._acquire(slot, key_hash, key_value)).client

    async def _acquire(
        self, slot: _Slot[T], key_hash: int, key_value: object
    ) -> Live[T]:
        # Everything here runs on one loop's thread: no lock is needed.
        for _ in range(MAX_ROUNDS):
            live = slot.live
            if live is not None and live.key_hash == key_hash:
                return live
            build = slot.build
            if build is None:
                build = slot.build = _AsyncBuild(
                    key_hash, slot.loop.create_future()
                )
                return await self._run_build(slot, build, key_value)
            if build.task is asyncio.current_task():
                raise ReentrantBuildError(self._self_name)
            # A cancelled waiter must not cancel the build it waits for.
            result = await asyncio.shield(build.done)
            if result is not None and build.key_hash == key_hash:
                return result
        msg = (
            f"The key of {self._self_name} changed during each of "
            f"{MAX_ROUNDS} builds; make the key function return a value "
            "that only changes with the configuration."
        )
        raise PoolkeeperError(msg)

    async def _run_build(
        self, slot: _Slot[T], build: _AsyncBuild[T], key_value: object
    ) -> Live[T]:
        try:
            client = await self.__wrapped__()
        except asyncio.CancelledError:
            # The builder was cancelled, not the build's waiters: wake them
            # to retry, one of them becoming the builder.
            slot.build = None
            build.done.set_result(None)
            raise
        except BaseException as exc:
            slot.build = None
            self._self_counts["build_failures"] += 1
            build.done.set_exception(exc)
            build.done.exception()  # Retrieved: waiters may be none.
            raise
        self._self_counts["builds"] += 1
        fp = None if self._self_key is None else fingerprint(key_value)
        new = Live(client, build.key_hash, fp, self._self_counts["builds"])
        old, slot.live, slot.build = slot.live, new, None
        slot.built_at = slot.loop.time()
        build.done.set_result(new)
        log.debug(
            "Built %s (generation %d, key %s) on loop %#x.",
            self._self_name,
            new.generation,
            fp,
            id(slot.loop),
            extra={"poolkeeper_factory": self._self_name},
        )
        if old is not None:
            await self._retire(slot, old)
        return new

    # -- retirement ---------------------------------------------------------

    def _retire_now(self, slot: _Slot[T], live: Live[T]) -> bool:
        """Mark *live* retired; return whether it must be closed now."""
        if live.leases:
            live.state = "retired"
            slot.retired.append(live)
            return False
        live.state = "closed"
        return True

    async def _retire(self, slot: _Slot[T], live: Live[T]) -> None:
        if self._retire_now(slot, live):
            # Shielded: a caller cancelled mid-close must not leak it.
            await asyncio.shield(self._aclose(live))

    async def _aclose(self, live: Live[T]) -> None:
        client = live.client
        hook: object = (
            functools.partial(self._self_close, client)
            if self._self_close is not None
            else getattr(client, "aclose", None)
            or getattr(client, "close", None)
        )
        if not callable(hook):
            log.debug("Retired %s client has no close().", self._self_name)
            return
        try:
            result: object = hook()
            if inspect.isawaitable(result):
                await result
        except Exception as exc:  # noqa: BLE001 -- logged, counted, not raised.
            self._self_counts["close_failures"] += 1
            log_close_failure(self._self_name, live.generation, exc)
        else:
            self._self_counts["closes"] += 1

    async def reset(self) -> bool:
        """Retire the running loop's live client; the next await rebuilds.

        Within *min_rebuild_interval* seconds of the last build on this
        loop nothing is retired.

        Returns:
            Whether a client was retired.
        """
        slot = self._slot()
        live = slot.live
        if live is None:
            return False
        if slot.loop.time() - slot.built_at < self._self_min_interval:
            self._self_counts["resets_refused"] += 1
            return False
        slot.live = None
        await self._retire(slot, live)
        return True

    @contextlib.asynccontextmanager
    async def lease(self) -> AsyncGenerator[T]:
        """Pin the running loop's live client for an ``async with`` block.

        Yields:
            The live client; if it is retired meanwhile, its close waits
            until the last lease on it exits.
        """
        slot = self._slot()
        client = await self()
        live = slot.live
        if self._self_overrides or live is None or live.client is not client:
            yield client
            return
        live.leases += 1
        try:
            yield client
        finally:
            live.leases -= 1
            if not live.leases and live.state == "retired":
                live.state = "closed"
                slot.retired.remove(live)
                await asyncio.shield(self._aclose(live))

    @contextlib.contextmanager
    def override(self, obj: T) -> Generator[T]:
        """Make every ``await single()`` return *obj*, on every loop.

        Args:
            obj: What awaits return inside the block; never closed.

        Yields:
            *obj*.
        """
        self._self_overrides = (*self._self_overrides, obj)
        try:
            yield obj
        finally:
            stack = list(self._self_overrides)
            stack.reverse()
            stack.remove(obj)
            stack.reverse()
            self._self_overrides = tuple(stack)

    def current(self) -> T | None:
        """Return the running loop's live client without building one.

        Returns:
            The client, or ``None`` (also when no loop is running).
        """
        overrides = self._self_overrides
        if overrides:
            return overrides[-1]
        try:
            loop = asyncio.get_running_loop()
        except RuntimeError:
            return None
        slot = self._self_slots.get(loop)
        live = None if slot is None else slot.live
        return None if live is None else live.client

    def statistics(self) -> Statistics:
        """Return counters over all loops; live fields for the running one.

        Returns:
            An immutable snapshot.
        """
        slots = list(self._self_slots.values())
        try:
            slot = self._self_slots.get(asyncio.get_running_loop())
        except RuntimeError:
            slot = None
        live = None if slot is None else slot.live
        counts = self._self_counts
        return Statistics(
            builds=counts["builds"],
            build_failures=counts["build_failures"],
            closes=counts["closes"],
            close_failures=counts["close_failures"],
            generation=0 if live is None else live.generation,
            key_fingerprint=None if live is None else live.fingerprint,
            pid=self._self_pid,
            leases=sum(
                r.leases
                for s in slots
                for r in [*s.retired, *([s.live] if s.live else [])]
            ),
            pending_close=sum(len(s.retired) for s in slots),
            resets_refused=counts["resets_refused"],
            is_overridden=bool(self._self_overrides),
        )

    # -- shutdown and fork ---------------------------------------------------

    def _take_all(self) -> list[tuple[_Slot[T], Live[T]]]:
        with self._self_lock:
            slots = list(self._self_slots.values())
        taken: list[tuple[_Slot[T], Live[T]]] = []
        for slot in slots:
            live, slot.live = slot.live, None
            if live is not None and self._retire_now(slot, live):
                taken.append((slot, live))
        return taken

    def _detach(self) -> list[tuple[int, Callable[[], None]]]:
        """For the synchronous close_all(): close on each client's loop."""
        return [
            (live.sequence, functools.partial(self._close_from_sync, s, live))
            for s, live in self._take_all()
        ]

    def _adetach(
        self,
    ) -> list[tuple[int, Callable[[], Coroutine[Any, Any, None]]]]:
        """For aclose_all(): close on each client's own loop."""
        return [
            (live.sequence, functools.partial(self._close_on_loop, s, live))
            for s, live in self._take_all()
        ]

    def _close_from_sync(self, slot: _Slot[T], live: Live[T]) -> None:
        loop = slot.loop
        try:
            running = asyncio.get_running_loop()
        except RuntimeError:
            running = None
        if loop.is_running() and loop is not running:
            future = asyncio.run_coroutine_threadsafe(self._aclose(live), loop)
            try:
                future.result(CROSS_LOOP_CLOSE_SECONDS)
            except _TIMEOUTS:
                self._unclosed(live, "its close did not finish in time")
            return
        if not loop.is_closed() and not loop.is_running():
            loop.run_until_complete(self._aclose(live))
            return
        reason = (
            "its event loop is closed"
            if loop.is_closed()
            else "close_all() was called on its own event loop"
        )
        self._unclosed(live, reason)

    async def _close_on_loop(self, slot: _Slot[T], live: Live[T]) -> None:
        loop = slot.loop
        if loop is asyncio.get_running_loop():
            await self._aclose(live)
        elif loop.is_running():
            future = asyncio.run_coroutine_threadsafe(self._aclose(live), loop)
            try:
                await asyncio.wait_for(
                    asyncio.wrap_future(future), CROSS_LOOP_CLOSE_SECONDS
                )
            except _TIMEOUTS:
                self._unclosed(live, "its close did not finish in time")
        else:
            self._unclosed(live, "its event loop is not running")

    def _unclosed(self, live: Live[T], reason: str) -> None:
        self._self_counts["close_failures"] += 1
        warnings.warn(
            f"Could not close a retired {self._self_name} client "
            f"(generation {live.generation}): {reason}; await "
            "poolkeeper.aclose_all() on its loop before the loop ends.",
            UnclosedClientWarning,
            stacklevel=3,
        )

    def _forget_parent(self) -> None:
        # At-fork hook, in the child: no lock, no logging, never raises.
        if self._self_fork_mode == "keep":
            self._self_lock = threading.Lock()
            return
        inherited = [
            live
            for slot in list(self._self_slots.values())
            for live in [slot.live, *slot.retired]
            if live is not None
        ]
        self._forget_all()
        abandon(inherited, self._self_after_fork, self._self_fork_errors)

    def _invalidate(self) -> None:
        """Nothing to switch: the async hit path always checks its key."""

    def __repr__(self) -> str:
        """Name the factory and the number of loops served."""
        return (
            f"<poolkeeper.AsyncProcessSingleton {self._self_name} "
            f"({len(self._self_slots)} loops, pid {self._self_pid})>"
        )


async def aclose_all() -> None:
    """Close every live client of every singleton, async ones on their loop.

    The asynchronous counterpart of :func:`close_all`, for the end of an
    ``asyncio`` program: async clients built on the running loop are
    awaited closed here, those of loops running in other threads are closed
    there; a client whose loop is gone is reported with an
    :class:`~poolkeeper.UnclosedClientWarning`. Synchronous singletons are
    closed too. Clients close in reverse build order.

    .. versionadded:: 0.1
    """
    closers: list[tuple[int, Callable[[], object]]] = []
    for member in _registry.members():
        if isinstance(member, AsyncProcessSingleton):
            closers.extend(member._adetach())
        else:
            closers.extend(member._detach())
    closers.sort(key=lambda pair: pair[0], reverse=True)
    for _, close in closers:
        result = close()
        if inspect.isawaitable(result):
            await result
