"""The armed hit paths: what a singleton's class gets as its ``__call__``.

Each singleton has a class of its own, so its ``__call__`` can be switched
by one class-attribute store (atomic under the GIL: a caller on another
thread sees the old or the new target, never neither). The lifecycle
switches it, under its lock, through :func:`switch` and
:func:`arm_polled`, bound to the class by a weak reference: the lifecycle
outlives a dropped singleton (the registry holds it).
"""

from __future__ import annotations

import functools
from typing import TYPE_CHECKING, Any, Protocol, TypeVar, cast

from poolkeeper._identity import no_arguments
from poolkeeper._lifecycle import ClientState

if TYPE_CHECKING:
    import weakref
    from collections.abc import Callable

    from poolkeeper._lifecycle import Record

T = TypeVar("T")
T_co = TypeVar("T_co", covariant=True)


class _Missing(Protocol[T_co]):
    def _miss(self, value: object) -> T_co: ...


def switch(
    cls_ref: weakref.ReferenceType[type],
    name: str,
    slow: Callable[..., Any],
    client: object,
) -> None:
    """Arm the class's hit path with *client*, or disarm it (None)."""
    cls = cls_ref()
    if cls is None:  # The singleton is gone; no call can come.
        return
    target = slow if client is None else armed(client, name)
    # A plain class attribute store: callers on other threads see the old
    # or the new target, never neither.
    type.__setattr__(cls, "__call__", target)


def arm_polled(
    cls_ref: weakref.ReferenceType[type],
    slow: Callable[..., Any],
    record: Record[T],
) -> None:
    """Arm *cls*'s hit path for a key that is polled on every call.

    The armed ``__call__`` evaluates the key and returns *record*'s client
    while the value is the one it was built for (by value, as
    :meth:`Record.matches` compares) and the record is live; anything else
    takes the slow path. One Python frame, plus the key's own.
    """
    cls = cls_ref()
    if cls is None:  # The singleton is gone; no call can come.
        return
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
        return self._miss(now)

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
