"""Handles: a stand-in for "the client" that follows rebuilds."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

import wrapt

if TYPE_CHECKING:
    from collections.abc import Callable

    _Base = wrapt.ObjectProxy[Any]
else:
    _Base = wrapt.ObjectProxy

_get = object.__getattribute__

# The proxy's own attributes; every other name is looked up on the client.
_OWN = frozenset(
    (
        "_self_last",
        "_self_single",
        "__copy__",
        "__deepcopy__",
        "__reduce__",
        "__reduce_ex__",
        "__repr__",
        "__wrapped_factory__",
        "__wrapped_get__",
    )
)


class ClientProxy(_Base):
    """Resolves to the singleton's live client on every attribute access.

    Code that stores "the client" in a closure or an attribute keeps this
    proxy instead, so it follows key rotation and never reaches a retired
    client through an attribute. Operators that bypass attribute lookup
    (``len()``, ``with``, calling the proxy) use the client resolved at the
    latest attribute access.
    """

    def __init__(self, single: Callable[[], object]) -> None:
        """Follow *single*; nothing is built until the proxy is used."""
        super().__init__(None)
        self._self_single = single
        self._self_last: object = None

    def __wrapped_get__(self) -> object:
        # wrapt calls this while __wrapped__ is unset, i.e. on first use.
        return self._self_single()

    def __wrapped_factory__(self) -> None:
        """Mark the proxy as lazy (wrapt then calls __wrapped_get__)."""

    def __getattribute__(self, name: str) -> Any:  # noqa: ANN401 -- the client's.
        """Look *name* up on the live client, rebuilding first if needed."""
        if name in _OWN:
            return _get(self, name)
        client = _get(self, "_self_single")()
        if client is not _get(self, "_self_last"):
            # Rare: keeps isinstance(), operators and __wrapped__ current.
            self._self_last = client
            self.__wrapped__ = client
        if name == "__wrapped__":
            return client
        return getattr(client, name)

    def __copy__(self) -> ClientProxy:
        """A handle's copy is itself: it stands for the singleton."""
        return self

    def __deepcopy__(self, memo: object) -> ClientProxy:
        """A handle's deep copy is itself, as the singleton's is."""
        return self

    def __reduce_ex__(self, protocol: object) -> tuple[object, ...]:
        """Pickle by reference to the singleton, never the client."""
        return (ClientProxy, (self._self_single,))

    def __repr__(self) -> str:
        """Say what the proxy follows, without building anything."""
        return f"<poolkeeper proxy of {self._self_single!r}>"
