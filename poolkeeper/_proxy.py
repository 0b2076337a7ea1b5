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
    """A handle of a singleton with *retire_on*: methods that fail heal.

    Every callable attribute is returned wrapped: a call that raises has
    *heal* called with the client it was looked up on and the exception
    (which retires that client if *retire_on* matches), and the exception
    then propagates unchanged. Calling the handle itself does the same.
    The handle of a singleton without *retire_on* is a plain
    :class:`ClientProxy`, unchanged. An awaitable a method returns is
    returned as is: what its ``await`` raises is not seen.
    """

    def __init__(
        self,
        single: Callable[[], object],
        heal: Callable[[object, BaseException], object],
    ) -> None:
        """Follow *single*; report failing calls to *heal*."""
        super().__init__(single)
        self._self_heal = heal

    def __getattribute__(self, name: str) -> Any:  # noqa: ANN401 -- the client's.
        """Look *name* up on the live client; wrap a method so it heals."""
        if name in _OWN:
            return _get(self, name)
        client = _get(self, "_self_single")()
        if client is not _get(self, "_self_last"):
            client = _get(self, "_self_live")()
        if name == "__wrapped__":
            return client
        value = getattr(client, name)
        if not callable(value):
            return value
        return _healing(value, client, _get(self, "_self_heal"))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        """Call the live client; a failing call heals."""
        client = self._self_live()
        return _healing(client, client, _get(self, "_self_heal"))(
            *args, **kwargs
        )

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        """Pickle by reference to the singleton, never the client."""
        heal = _get(self, "_self_heal")
        return (HealingProxy, (_get(self, "_self_single"), heal))


def _healing(
    method: Callable[..., Any],
    client: object,
    heal: Callable[[object, BaseException], object],
) -> Callable[..., Any]:
    """Return *method*, calling *heal* with *client* when it raises."""

    def call(*args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        try:
            return method(*args, **kwargs)
        except BaseException as exc:
            heal(client, exc)
            raise

    return call
