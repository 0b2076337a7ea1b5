"""Handles: a stand-in for "the client" that follows rebuilds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import wrapt

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    _Base = wrapt.ObjectProxy[Any]
else:
    _Base = wrapt.ObjectProxy

_get = object.__getattribute__

# The proxy's own attributes; every other name is looked up on the client.
_OWN = frozenset(
    (
        "_self_heal",
        "_self_last",
        "_self_live",
        "_self_single",
        "__copy__",
        "__deepcopy__",
        "__reduce__",
        "__reduce_ex__",
        "__repr__",
    )
)


class ClientProxy(_Base):
    """Resolves to the singleton's live client on every attribute access.

    Code that stores "the client" in a closure or an attribute keeps this
    proxy instead, so it follows key rotation and never reaches a retired
    client through an attribute. The protocols a client commonly speaks
    (truth, ``len()``, iteration, ``in``, indexing, ``str()`` and calling)
    resolve the live client too. Other operators (``with``, arithmetic,
    comparison) use the client resolved at the latest access.
    """

    # Works the same on wrapt 1.17 and 2.x: the proxy starts out wrapping
    # None and never relies on wrapt 2's lazy __wrapped_factory__ hook,
    # which wrapt 1.x ignores (there the first len() would see None).

    def __init__(self, single: Callable[[], object]) -> None:
        """Follow *single*; nothing is built until the proxy is used."""
        super().__init__(None)
        self._self_single = single
        self._self_last: object = None

    def _self_live(self) -> Any:  # noqa: ANN401 -- the client's type.
        client = _get(self, "_self_single")()
        if client is not _get(self, "_self_last"):
            # Rare: keeps isinstance(), operators and __wrapped__ current.
            self._self_last = client
            self.__wrapped__ = client
        return client

    def __getattribute__(self, name: str) -> Any:  # noqa: ANN401 -- the client's.
        """Look *name* up on the live client, rebuilding first if needed."""
        if name in _OWN:
            return _get(self, name)
        # _self_live, inline while the client is the one seen last: one
        # Python frame per access, not two.
        client = _get(self, "_self_single")()
        if client is not _get(self, "_self_last"):
            client = _get(self, "_self_live")()
        if name == "__wrapped__":
            return client
        return getattr(client, name)

    def __copy__(self) -> ClientProxy:
        """A handle's copy is itself: it stands for the singleton."""
        return self

    def __deepcopy__(self, memo: object) -> ClientProxy:
        """A handle's deep copy is itself, as the singleton's is."""
        return self

    def __bool__(self) -> bool:
        """Return the live client's truth value."""
        return bool(self._self_live())

    def __len__(self) -> int:
        """Return ``len()`` of the live client."""
        return len(self._self_live())

    def __iter__(self) -> Iterator[Any]:
        """Iterate over the live client."""
        return iter(self._self_live())

    def __contains__(self, item: object) -> bool:
        """Return whether *item* is in the live client."""
        return item in self._self_live()

    def __getitem__(self, key: object) -> Any:  # noqa: ANN401 -- the client's.
        """Index the live client."""
        return self._self_live()[key]

    def __str__(self) -> str:
        """Return ``str()`` of the live client."""
        return str(self._self_live())

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        """Call the live client."""
        return self._self_live()(*args, **kwargs)

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        """Pickle by reference to the singleton, never the client."""
        return (ClientProxy, (self._self_single,))

    def __repr__(self) -> str:
        """Say what the proxy follows, without building anything."""
        return f"<poolkeeper proxy of {self._self_single!r}>"


class HealingProxy(ClientProxy):
    """A handle of a singleton with *retire_on*: each method call leases.

    Every callable attribute is returned wrapped: a call runs inside a
    lease of the live client (``single.lease()``), so a retirement while
    it runs (a rotation, ``retire()``, another call's failure) closes that
    client only after the call ends; a call that raises leaves the lease
    with its exception, which retires the client it ran on if *retire_on*
    matches, and the exception propagates unchanged. Calling the handle
    itself does the same. The handle of a singleton without *retire_on* is
    a plain :class:`ClientProxy`, unchanged. An awaitable a method returns
    is returned as is: the lease ends when it is returned, and what its
    ``await`` raises is not seen.
    """

    def __getattribute__(self, name: str) -> Any:  # noqa: ANN401 -- the client's.
        """Look *name* up on the live client; wrap a method in a lease."""
        if name in _OWN:
            return _get(self, name)
        client = _get(self, "_self_single")()
        if client is not _get(self, "_self_last"):
            client = _get(self, "_self_live")()
        if name == "__wrapped__":
            return client
        value = getattr(client, name)
        # Methods are wrapped; a class (``__class__``, so that isinstance()
        # sees the client's) or another dunder is the client's, as is.
        if not callable(value) or name[:2] == "__" or isinstance(value, type):
            return value
        return _leased(_get(self, "_self_single"), name, value, client)

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        """Call the live client inside a lease; a failing call heals."""
        client = self._self_live()
        single = _get(self, "_self_single")
        return _leased(single, None, client, client)(*args, **kwargs)

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        """Pickle by reference to the singleton, never the client."""
        return (HealingProxy, (_get(self, "_self_single"),))


def _leased(
    single: Any,  # noqa: ANN401 -- a ProcessSingleton.
    name: str | None,
    method: Callable[..., Any],
    client: object,
) -> Callable[..., Any]:
    """Return *method* (*name* of *client*), called inside a lease.

    The lease pins the live client; if that is no longer *client* (it was
    retired between the look-up and the call), the call goes to the live
    one's *name* instead: a call never runs on a retired client.
    """

    def call(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        with single.lease() as leased:
            if leased is not client:
                client_method = (
                    leased if name is None else getattr(leased, name)
                )
                return client_method(*args, **kwargs)
            return method(*args, **kwargs)

    return call
