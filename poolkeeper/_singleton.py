"""ProcessSingleton: one client per process, and the lock-free hit path."""

from __future__ import annotations

import contextlib
import functools
import itertools
import logging
import os
import threading
import time
from typing import TYPE_CHECKING, Generic, TypeVar, cast, final

import wrapt

from poolkeeper import _environ, _registry
from poolkeeper._fingerprint import fingerprint
from poolkeeper._live import (
    MAX_ROUNDS,
    Identity,
    Live,
    abandon,
    evaluate_key,
)
from poolkeeper._proxy import ClientProxy
from poolkeeper._retire import close_client, report_fork_errors
from poolkeeper._stats import Statistics
from poolkeeper.exceptions import PoolkeeperError, ReentrantBuildError
from poolkeeper.keys import EnvKey

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    # wrapt ships no type information: type checkers see this plain class
    # and the generic signature below, the runtime gets wrapt's C proxy.
    class _Proxy:
        def __init__(self, wrapped: object) -> None: ...
else:
    _Proxy = wrapt.CallableObjectProxy

T = TypeVar("T")

log = logging.getLogger("poolkeeper")


class _Build(Generic[T]):
    """A build in progress, which concurrent callers wait for."""

    __slots__ = ("done", "error", "key_hash", "live", "thread")

    def __init__(self, key_hash: int, thread: int) -> None:
        self.key_hash = key_hash
        self.thread = thread
        self.done = threading.Event()
        self.live: Live[T] | None = None
        self.error: BaseException | None = None


@final
class ProcessSingleton(Identity, _Proxy, Generic[T]):
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
    _self_close: Callable[[T], object] | None
    _self_after_fork: Callable[[T], object] | None
    _self_fork_mode: str
    _self_min_interval: float
    _self_lock: threading.RLock
    _self_live: Live[T] | None
    _self_build: _Build[T] | None
    _self_retired: list[Live[T]]
    # A tuple, replaced whole: readers without the lock see old or new.
    _self_overrides: tuple[T, ...]
    _self_fork_errors: list[Exception]
    _self_built_at: float
    _self_pushed: bool
    _self_slow: Callable[..., T]
    _self_pid: int
    _self_builds: int
    _self_build_failures: int
    _self_closes: int
    _self_close_failures: int
    _self_resets_refused: int

    # The hit path. Each singleton has its own subclass (see make), and
    # while a client is live and its key cannot have changed, that class's
    # __call__ is ``itertools.repeat(client).__next__``: a C callable, so a
    # hit runs no Python code and takes no lock. Anything that could make
    # the live client wrong (a build, reset(), an environment change, a
    # fork) puts the slow path back first.

    def __call__(self) -> T:
        """Return the live client for the current key, building it if needed.

        Concurrent first callers wait for one build and all receive the
        same object. A factory or key error propagates unchanged, caches
        nothing and leaves the previous client live; the next call tries
        again.

        Raises:
            ReentrantBuildError: If the factory calls its own singleton.
        """
        return self._call_slow()

    def _setup(
        self,
        *,
        key: Callable[[], object] | None,
        close: Callable[[T], object] | None,
        after_fork: Callable[[T], object] | None,
        fork: str,
        min_rebuild_interval: float,
    ) -> None:
        factory = self.__wrapped__
        self._self_name = getattr(factory, "__qualname__", repr(factory))
        self._self_key = key
        self._self_close = close
        self._self_after_fork = after_fork
        self._self_fork_mode = fork
        self._self_min_interval = min_rebuild_interval
        self._self_lock = threading.RLock()
        self._self_live = None
        self._self_build = None
        self._self_retired = []
        self._self_overrides = ()
        self._self_fork_errors = []
        self._self_built_at = float("-inf")
        self._reset_counters()
        # None: no key. True: changes are pushed (environment). False: the
        # key is polled on every call, so the Python hit path stays.
        self._self_pushed = key is None or (
            isinstance(key, EnvKey) and _environ.watch(key.names, self)
        )
        self._self_slow = (
            type(self)._call_slow
            if self._self_pushed
            else type(self)._call_polled
        )
        _set_call(self, self._self_slow)
        _registry.register(self)

    def _reset_counters(self) -> None:
        self._self_pid = os.getpid()
        self._self_builds = 0
        self._self_build_failures = 0
        self._self_closes = 0
        self._self_close_failures = 0
        self._self_resets_refused = 0

    # -- the hit path switch ------------------------------------------------

    def _arm(self, client: T) -> None:
        if self._self_pushed:
            _set_call(self, itertools.repeat(client).__next__)

    def _invalidate(self) -> None:
        # Called without the lock (environment watcher, fork hook): a plain
        # attribute store, atomic under the GIL.
        _set_call(self, self._self_slow)

    # -- calls --------------------------------------------------------------

    def _call_slow(self) -> T:
        if self._self_overrides:
            return self._serve_override()
        if self._self_fork_errors:
            self._report_fork_errors()
        version = _environ.version()
        key_hash, key_value = self._evaluate_key()
        live = self._self_live
        if live is None or live.key_hash != key_hash:
            live = self._acquire(key_hash, key_value)
        with self._self_lock:
            if self._self_live is live and not self._self_overrides:
                self._arm(live.client)
        # An environment change between reading the key and arming would
        # be lost: its invalidation may have run before the arm above.
        if _environ.version() != version:
            self._invalidate()
        return live.client

    def _call_polled(self) -> T:
        overrides = self._self_overrides
        if overrides:
            return overrides[-1]
        key_hash, key_value = self._evaluate_key()
        live = self._self_live
        if live is None or live.key_hash != key_hash:
            if self._self_fork_errors:
                self._report_fork_errors()
            live = self._acquire(key_hash, key_value)
        return live.client

    def _serve_override(self) -> T:
        with self._self_lock:
            overrides = self._self_overrides
            if overrides:
                self._arm(overrides[-1])
                return overrides[-1]
        return self()  # The block ended meanwhile.

    def _evaluate_key(self) -> tuple[int, object]:
        return evaluate_key(self._self_key, self._self_name)

    def _acquire(self, key_hash: int, key_value: object) -> Live[T]:
        me = threading.get_ident()
        for _ in range(MAX_ROUNDS):
            with self._self_lock:
                live = self._self_live
                if live is not None and live.key_hash == key_hash:
                    return live
                build = self._self_build
                if build is not None and build.thread == me:
                    raise ReentrantBuildError(self._self_name)
                mine = build is None
                if build is None:
                    build = self._self_build = _Build(key_hash, me)
            if mine:
                return self._run_build(build, key_value)
            # Wait with no lock held for the build in progress; it always
            # ends by setting the event, success or failure.
            build.done.wait()
            if build.key_hash == key_hash:
                if build.error is not None:
                    raise build.error
                if build.live is not None:
                    return build.live
        msg = (
            f"The key of {self._self_name} changed during each of "
            f"{MAX_ROUNDS} builds; make the key function return a value "
            "that only changes with the configuration."
        )
        raise PoolkeeperError(msg)

    def _run_build(self, build: _Build[T], key_value: object) -> Live[T]:
        # Build outside the lock: callers for the same key wait on the
        # build's event instead, and the lock stays free for reset() and
        # statistics(). Only one build runs at a time, so a losing duplicate
        # client is never made.
        try:
            client = self.__wrapped__()
        except BaseException as exc:
            with self._self_lock:
                self._self_build_failures += 1
                if self._self_build is build:
                    self._self_build = None
            build.error = exc
            build.done.set()
            raise
        fp = None if self._self_key is None else fingerprint(key_value)
        with self._self_lock:
            self._self_builds += 1
            new = Live(client, build.key_hash, fp, self._self_builds)
            old = self._self_live
            self._self_live = new
            if self._self_build is build:
                self._self_build = None
            self._self_built_at = time.monotonic()
            doomed = self._retire_locked(old)
        build.live = new
        build.done.set()
        log.debug(
            "Built %s (generation %d, key %s).",
            self._self_name,
            new.generation,
            fp,
            extra={
                "poolkeeper_factory": self._self_name,
                "poolkeeper_generation": new.generation,
                "poolkeeper_key": fp,
            },
        )
        if doomed is not None:
            self._close(doomed)
        return new

    # -- retirement ---------------------------------------------------------

    def _retire_locked(self, live: Live[T] | None) -> Live[T] | None:
        """Retire *live*; return it if it must be closed now."""
        if live is None:
            return None
        if live.leases:
            live.state = "retired"
            self._self_retired.append(live)
            return None
        live.state = "closed"
        return live

    def _close(self, live: Live[T]) -> None:
        ok = close_client(
            self._self_name,
            live.client,
            self._self_close,  # type: ignore[arg-type] # Contravariant hook.
            live.generation,
        )
        if ok is not None:
            with self._self_lock:
                if ok:
                    self._self_closes += 1
                else:
                    self._self_close_failures += 1

    def reset(self) -> bool:
        """Retire the live client; the next call builds a new one.

        The retired client is closed now, with no lock held, or when its
        last lease exits. Within *min_rebuild_interval* seconds of the last
        build nothing is retired, so an error handler that resets on every
        failure cannot turn into a build storm.

        Returns:
            Whether a client was retired.
        """
        with self._self_lock:
            live = self._self_live
            if live is None:
                return False
            waited = time.monotonic() - self._self_built_at
            if waited < self._self_min_interval:
                self._self_resets_refused += 1
                log.debug(
                    "Refused to reset %s %.3f s after its last build.",
                    self._self_name,
                    waited,
                    extra={"poolkeeper_factory": self._self_name},
                )
                return False
            self._self_live = None
            self._invalidate()
            doomed = self._retire_locked(live)
        if doomed is not None:
            self._close(doomed)
        return True

    def _detach(self) -> list[tuple[int, Callable[[], None]]]:
        """Retire the live client for close_all(), ignoring rate limits."""
        with self._self_lock:
            live = self._self_live
            self._self_live = None
            self._invalidate()
            doomed = self._retire_locked(live)
        if doomed is None:
            return []
        return [(doomed.sequence, functools.partial(self._close, doomed))]

    # -- leases, overrides, inspection ---------------------------------------

    @contextlib.contextmanager
    def lease(self) -> Generator[T]:
        """Pin the live client for the duration of a ``with`` block.

        If the client is retired meanwhile (key change, ``reset()``,
        ``close_all()``), its close waits until the last lease on it exits.
        Use it around work that must not see its client closed underneath.

        Yields:
            The live client, as a call would return it.
        """
        live = self._lease()
        try:
            yield self.current() if live is None else live.client  # type: ignore[misc]
        finally:
            if live is not None:
                self._unlease(live)

    def _lease(self) -> Live[T] | None:
        for _ in range(MAX_ROUNDS):
            client = self()
            with self._self_lock:
                if self._self_overrides:
                    return None
                live = self._self_live
                if live is not None and live.client is client:
                    live.leases += 1
                    return live
        msg = (
            f"{self._self_name} was retired during each of {MAX_ROUNDS} "
            "attempts to lease it; stop resetting it in a loop."
        )
        raise PoolkeeperError(msg)

    def _unlease(self, live: Live[T]) -> None:
        with self._self_lock:
            live.leases -= 1
            if live.leases or live.state != "retired":
                return
            live.state = "closed"
            self._self_retired.remove(live)
        self._close(live)

    @contextlib.contextmanager
    def override(self, obj: T) -> Generator[T]:
        """Make every call return *obj* inside a ``with`` block; for tests.

        poolkeeper never closes *obj*. The live client, if any, is left
        alone and served again after the block. Overrides nest.

        Args:
            obj: What calls return inside the block.

        Yields:
            *obj*.
        """
        with self._self_lock:
            self._self_overrides = (*self._self_overrides, obj)
            self._arm(obj)
        try:
            yield obj
        finally:
            with self._self_lock:
                stack = list(self._self_overrides)
                for i in range(len(stack) - 1, -1, -1):
                    if stack[i] is obj:
                        del stack[i]
                        break
                self._self_overrides = tuple(stack)
                self._invalidate()

    def proxy(self) -> T:
        """Return a handle that resolves to the live client on every use.

        Store it where code would store "the client" (a closure, an
        attribute): attribute access on it goes to the live client, so it
        follows key rotation and never reaches a retired client. Nothing is
        built until it is first used. It pickles by reference.

        Returns:
            A transparent proxy, typed as the client.
        """
        return cast("T", ClientProxy(self))

    def current(self) -> T | None:
        """Return the live client without building one.

        Returns:
            The live client (or the override), ``None`` if none is live.
        """
        overrides = self._self_overrides
        if overrides:
            return overrides[-1]
        live = self._self_live
        return None if live is None else live.client

    def statistics(self) -> Statistics:
        """Return an immutable snapshot of this singleton's counters.

        Returns:
            The counters of this process.
        """
        with self._self_lock:
            live = self._self_live
            retired = self._self_retired
            return Statistics(
                builds=self._self_builds,
                build_failures=self._self_build_failures,
                closes=self._self_closes,
                close_failures=self._self_close_failures,
                generation=0 if live is None else live.generation,
                key_fingerprint=None if live is None else live.fingerprint,
                pid=self._self_pid,
                leases=(0 if live is None else live.leases)
                + sum(r.leases for r in retired),
                pending_close=len(retired),
                resets_refused=self._self_resets_refused,
                is_overridden=bool(self._self_overrides),
            )

    # -- fork ---------------------------------------------------------------

    def _forget_parent(self) -> None:
        # In a forked child, from the at-fork hook: one thread, no lock
        # taken, nothing logged, nothing raised. The parent's client is
        # abandoned, never closed: its sockets are the parent's too.
        self._self_lock = threading.RLock()
        self._self_build = None
        self._invalidate()
        if self._self_fork_mode == "keep":
            self._self_pid = os.getpid()
            return
        inherited = [self._self_live, *self._self_retired]
        self._self_live = None
        self._self_retired = []
        self._reset_counters()
        abandon(
            [live for live in inherited if live is not None],
            self._self_after_fork,
            self._self_fork_errors,
        )

    def _report_fork_errors(self) -> None:
        report_fork_errors(self._self_name, self._self_fork_errors)

    # -- identity -----------------------------------------------------------

    def __repr__(self) -> str:
        """Describe the singleton with its key fingerprint, never the key."""
        live = self._self_live
        state = (
            "no live client"
            if live is None
            else f"generation {live.generation}, key {live.fingerprint}"
        )
        return (
            f"<poolkeeper.ProcessSingleton {self._self_name} "
            f"({state}, pid {self._self_pid})>"
        )


def make(  # noqa: PLR0913 -- mirrors the keyword-only options.
    factory: Callable[[], T],
    *,
    key: Callable[[], object] | None,
    close: Callable[[T], object] | None,
    after_fork: Callable[[T], object] | None,
    fork: str,
    min_rebuild_interval: float,
) -> ProcessSingleton[T]:
    """Return a new singleton for *factory*, in a subclass of its own."""
    own = cast(
        "type[ProcessSingleton[T]]",
        type(
            ProcessSingleton.__name__,
            (ProcessSingleton,),
            {"__module__": ProcessSingleton.__module__},
        ),
    )
    self = own(factory)
    self._setup(
        key=key,
        close=close,
        after_fork=after_fork,
        fork=fork,
        min_rebuild_interval=min_rebuild_interval,
    )
    return self


def _set_call(singleton: object, target: Callable[..., object]) -> None:
    # A plain class attribute store: atomic under the GIL, so callers on
    # other threads see either the old or the new target, never neither.
    type.__setattr__(type(singleton), "__call__", target)
