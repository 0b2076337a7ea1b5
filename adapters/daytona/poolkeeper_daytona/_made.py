"""Sandboxes keep the client that made them open, across its retirement.

A ``Sandbox`` (``AsyncSandbox``) holds its client's API objects: its
``delete()``, ``process.exec()`` and ``refresh_activity()`` (and
``daytona.delete(sandbox)``, which runs ``sandbox.delete()``) go through
the client that made it. When the singleton retires that client (a
broken connection, a key rotation, ``reset()``), a sandbox made before
must go on working, so each sandbox the client hands out is registered
with :func:`poolkeeper.made_from`: the retired client closes once its last
lease has ended and its last sandbox is gone (collected), or at
``close_all()``.

The SDK's event dispatcher keeps each sandbox's event handler (a bound
method) until the sandbox is deleted or its subscription expires (300 s
after its last use): a sandbox dropped without being deleted would keep
its retired client open that long, and a storm of healing retirements
would pile clients up. The client's dispatcher is given a subclass of its
own class that keeps a handler's sandbox weakly: a dropped sandbox is
collected at once, its handler left to do nothing until its subscription
ends.

The client's methods that hand out sandboxes (``create``, ``get``,
``find_one``, ``list``) are wrapped on the client instance itself, once,
at its build: whatever a method returns (a sandbox, a list or a page of
them, an iterator, or a coroutine or async iterator of any of those) is
returned unchanged, each sandbox in it registered as it comes out.
"""

from __future__ import annotations

import functools
import inspect
import weakref
from collections.abc import AsyncIterator, Awaitable, Iterator
from typing import Any, Final, TypeVar

import poolkeeper

__all__ = ["hold_sandboxes"]

T = TypeVar("T")

#: The client methods that hand out sandboxes, in every SDK release.
MAKERS: Final = ("create", "get", "find_one", "list")
#: The sandbox classes, by name (the SDK is imported only at a build).
_SANDBOXES: Final = frozenset({"Sandbox", "AsyncSandbox"})


def hold_sandboxes(client: object) -> None:
    """Have every sandbox *client* hands out keep *client* open.

    Args:
        client: A just-built ``daytona.Daytona`` or ``AsyncDaytona``.
    """
    for name in MAKERS:
        method = getattr(client, name, None)
        if callable(method):
            setattr(client, name, _holding(method, client))
    dispatcher: Any = getattr(client, "_event_dispatcher", None)
    if callable(getattr(dispatcher, "subscribe", None)):
        dispatcher.__class__ = _weakly(dispatcher.__class__)


@functools.cache
def _weakly(base: Any) -> type:  # noqa: ANN401 -- the SDK's class.
    """The subclass of dispatcher class *base* that holds handlers weakly."""

    def subscribe(
        self: object, resource_id: str, handler: object, events: object
    ) -> object:
        return base.subscribe(self, resource_id, _weak(handler), events)

    return type(
        base.__name__,
        (base,),
        {
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "subscribe": subscribe,
        },
    )


def _weak(handler: object) -> object:
    """*handler*, holding its object weakly if it is a bound method."""
    if not inspect.ismethod(handler):
        return handler
    method = weakref.WeakMethod(handler)

    def weak_handler(*args: object) -> object:
        target = method()
        return None if target is None else target(*args)

    return weak_handler


def _holding(method: Any, client: object) -> Any:  # noqa: ANN401
    @functools.wraps(method)
    def maker(*args: object, **kwargs: object) -> object:
        return _held(method(*args, **kwargs), client)

    return maker


def _is_sandbox(obj: object) -> bool:
    kind = type(obj)
    return kind.__name__ in _SANDBOXES and kind.__module__.startswith(
        "daytona"
    )


def _held(result: T, client: object) -> T:
    """Register each sandbox in *result*; return it as the SDK made it."""
    if _is_sandbox(result):
        return poolkeeper.made_from(result, client)
    if inspect.isawaitable(result):
        return _awaited(result, client)  # type: ignore[return-value]
    if isinstance(result, AsyncIterator):
        return _async_items(result, client)  # type: ignore[return-value]
    if isinstance(result, Iterator):
        return _items(result, client)  # type: ignore[return-value]
    # A list of sandboxes, or a page of them (older releases' list()).
    items = result if isinstance(result, list) else getattr(result, "items", 0)
    if isinstance(items, list):
        for item in items:
            if _is_sandbox(item):
                poolkeeper.made_from(item, client)
    return result


async def _awaited(result: Awaitable[T], client: object) -> T:
    return _held(await result, client)


def _items(result: Iterator[T], client: object) -> Iterator[T]:
    for item in result:
        yield _held(item, client)


async def _async_items(
    result: AsyncIterator[T], client: object
) -> AsyncIterator[T]:
    async for item in result:
        yield _held(item, client)
