"""Assembling a singleton: a class of its own, its lifecycle and its hooks.

Each singleton is an instance of a subclass of its own, so that its hit
path can be switched by one class-attribute store (``_hit`` arms a sync
singleton's class, ``_loop_hit`` an async one's). Both drivers are wired
the same way around their lifecycle: a close path, an entry in the
registry (the fork hook, ``close_all()``) and, for a key whose changes
are pushed (``keys.env``, ``keys.file``), a subscription.
"""

from __future__ import annotations

import functools
import weakref
from typing import TYPE_CHECKING, Any, TypeVar, cast

from poolkeeper import _loop_end, _loop_hit, _registry, keys
from poolkeeper._async import AsyncProcessSingleton
from poolkeeper._close import Closer
from poolkeeper._hit import arm_polled, switch
from poolkeeper._lease import lease_class
from poolkeeper._lifecycle import Lifecycle
from poolkeeper._singleton import ProcessSingleton, _slow_call

if TYPE_CHECKING:
    from collections.abc import Callable, Coroutine

T = TypeVar("T")
S = TypeVar("S", ProcessSingleton[Any], AsyncProcessSingleton[Any])


def make(  # noqa: PLR0913 -- mirrors the keyword-only options.
    factory: Callable[[], T],
    *,
    key: Callable[[], object] | None,
    close: Callable[[T], object] | None,
    after_fork: Callable[[T], object] | None,
    fork: str,
    min_rebuild_interval: float,
) -> ProcessSingleton[T]:
    """Return a new thread singleton for *factory*."""
    single: ProcessSingleton[T] = _own(ProcessSingleton, factory)
    own = type(single)
    name = _name(factory)
    # Where the polled hit path finds the key (see _hit.arm_polled).
    type.__setattr__(own, "_poolkeeper_key", key)
    # The lifecycle outlives a dropped singleton (the registry holds it),
    # so it holds the singleton's class weakly: the class's polled
    # __call__ holds the key, and a key may reach the singleton.
    cls: weakref.ReferenceType[type] = weakref.ref(own)
    life: Lifecycle[T] = Lifecycle(
        name,
        pushed=key is None,
        min_interval=min_rebuild_interval,
        switch=functools.partial(switch, cls, name, _slow_call),
        arm_polled=None
        if key is None
        else functools.partial(arm_polled, cls, _slow_call),
    )
    slot = single._self_slot = life.open_slot(None, None)[0]
    closer = Closer(life, close, is_async=False)
    _wire(single, name, key, life, closer)
    # Making a lease runs no Python code: lease() is replaced by this
    # singleton's own lease class.
    leases = lease_class(single, life, slot, closer, name)
    type.__setattr__(own, "lease", leases)
    entry = _registry.Entry(life, closer, after_fork, keep=fork == "keep")
    _register(single, key, entry)
    return single


def make_async(  # noqa: PLR0913 -- mirrors the keyword-only options.
    factory: Callable[[], Coroutine[Any, Any, T]],
    *,
    key: Callable[[], object] | None,
    close: Callable[[T], object] | None,
    after_fork: Callable[[T], object] | None,
    fork: str,
    min_rebuild_interval: float,
) -> AsyncProcessSingleton[T]:
    """Return a new per-loop singleton for the ``async def`` *factory*."""
    single: AsyncProcessSingleton[T] = _own(AsyncProcessSingleton, factory)
    name = _name(factory)
    # Held weakly, as for a thread singleton.
    cls: weakref.ReferenceType[type] = weakref.ref(type(single))
    life: Lifecycle[T] = Lifecycle(
        name,
        pushed=key is None,
        min_interval=min_rebuild_interval,
        switch=functools.partial(_loop_hit.disarm, cls),
        arm_slot=functools.partial(
            _loop_hit.arm, cls, weakref.ref(single), name
        ),
    )
    single._self_seen = (-1, None, 0)
    closer = Closer(life, close, is_async=True)
    _wire(single, name, key, life, closer)
    entry = _registry.Entry(
        life,
        closer,
        after_fork,
        keep=fork == "keep",
        prune=functools.partial(_loop_end.prune, life),
    )
    _register(single, key, entry)
    return single


def _own(cls: type[S], factory: object) -> S:
    """Wrap *factory* in an instance of a subclass of *cls* of its own."""
    own = type(cls.__name__, (cls,), {"__module__": cls.__module__})
    return cast("S", own(factory))


def _name(factory: object) -> str:
    return getattr(factory, "__qualname__", repr(factory))


def _wire(
    single: ProcessSingleton[T] | AsyncProcessSingleton[T],
    name: str,
    key: Callable[[], object] | None,
    life: Lifecycle[T],
    closer: Closer,
) -> None:
    # wrapt keeps attributes named _self_* on the proxy itself.
    single._self_name = name
    single._self_key = key
    single._self_life = life
    single._self_closer = closer


def _register(
    single: ProcessSingleton[T] | AsyncProcessSingleton[T],
    key: Callable[[], object] | None,
    entry: _registry.Entry,
) -> None:
    _registry.register(single, entry)
    # Changes of keys.env and keys.file keys (and tuples of them) are
    # pushed, not polled: the hit path stays armed until one changes.
    if key is not None and keys.subscribe(key, entry.life):
        entry.life.subscribed()
