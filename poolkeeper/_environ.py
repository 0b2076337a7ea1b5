"""Noticing ``os.environ`` changes without reading it on every call.

Reading two variables from ``os.environ`` costs more than the whole hit path
should, so an environment key is *pushed* instead of polled: the first
``keys.env`` singleton swaps the class of ``os.environ`` for a subclass whose
``__setitem__`` and ``__delitem__`` notify the singletons subscribed to the
changed name. Everything that changes the mapping goes through those two
methods (``update``, ``pop``, ``clear``, ``setdefault``, pytest's
``monkeypatch``), so all of it is noticed. ``os.environb`` shares its data
with ``os.environ`` on POSIX, so its class is swapped too and a change
made through it notifies the subscribers of the decoded name.

Not noticed, by design: ``os.putenv``/``os.unsetenv`` and C code calling
``setenv`` (``os.environ`` does not see them either), edits of the private
``os.environ._data``, and rebinding ``os.environ`` to another object. When
the class swap is impossible, ``keys.env`` falls back to reading the
environment on every call.
"""

from __future__ import annotations

import itertools
import os
import weakref
from typing import TYPE_CHECKING, Any, Protocol, cast

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


class _Subscriber(Protocol):
    def invalidate(self) -> None: ...


# name -> {id(subscriber): weak reference}, and name -> those references as a
# tuple, rebuilt when a subscriber comes or goes: a write iterates the tuple
# of the name written (nothing else, without a copy or WeakSet's guard).
_refs: dict[str, dict[int, weakref.ref[_Subscriber]]] = {}
_subscribers: dict[str, tuple[weakref.ref[_Subscriber], ...]] = {}

_MISSING = object()

# A name from os.environb (bytes; encodekey accepted it) to its str.
_decode = cast("Callable[[object], str]", os.fsdecode)

# Counts the stores of subscribed writes (next() on it is atomic).
_stores = itertools.count()


def _changed(name: object) -> None:
    # name passed the store's encodekey: a str, or bytes for os.environb.
    named = name if isinstance(name, str) else _decode(name)
    for ref in _subscribers.get(named, ()):
        subscriber = ref()
        if subscriber is not None:
            subscriber.invalidate()


def _notify_after(
    key: object, store: Callable[..., object], *args: object
) -> None:
    # The two layers of set_and_notify, for a store that is a call: the
    # subscribers of *key* are notified whether or not *store* raised, and
    # again if the first notification was cut short.
    notified = False
    try:
        try:
            store(*args)
        finally:
            _changed(key)
            notified = True
    finally:
        if not notified:
            _changed(key)


def _swap(environ: object) -> bool:
    base = type(environ)
    if getattr(base, "_poolkeeper_subscribed", False):
        return True

    # The notification runs after the store returns: once the assignment
    # (or del) has returned, every subscriber is disarmed and outdated. A
    # write of the value already there changes nothing and notifies no one.
    # The store is os._Environ.__setitem__'s own four steps, inline (its
    # class is checked below), so the value is encoded once.
    #
    # An exception after the store (a signal's, which CPython raises after
    # any call) must not leave the subscribers armed with the old value's
    # client: the notification is a finally of the store, and a second
    # layer notifies every subscriber again if the first was cut short (as a
    # lease's exit does). A write that raised before its store may notify:
    # harmless, the next call reads the key and keeps its client. On the
    # normal path the layers cost a flag (try blocks are free).
    def set_and_notify(self: Any, key: object, value: object) -> None:  # noqa: ANN401
        name = self.encodekey(key)  # Raises the TypeError base would.
        encoded = self.encodevalue(value)
        data = self._data
        before = data.get(name, _MISSING)
        mark = next(_stores)
        notified = False
        try:
            try:
                os.putenv(name, encoded)
                data[name] = encoded
            finally:
                # Another store between the two reads of the count (on any
                # thread) may have shown a value that was read and armed
                # meanwhile: notify then too, even if this store left the
                # value as it was.
                if before != encoded or next(_stores) != mark + 1:
                    # The subscribers of this name only, no frame for _changed.
                    named = key if isinstance(key, str) else _decode(key)
                    for ref in _subscribers.get(named, ()):
                        subscriber = ref()
                        if subscriber is not None:
                            subscriber.invalidate()
                notified = True
        finally:
            if not notified:
                _changed(key)

    def set_always(self: object, key: object, value: object) -> None:
        # Not the os._Environ layout: every write notifies.
        _notify_after(key, base.__setitem__, self, key, value)  # type: ignore[index]

    def del_and_notify(self: object, key: object) -> None:
        _notify_after(key, base.__delitem__, self, key)  # type: ignore[attr-defined]

    # Stores inline only where __setitem__ is os._Environ's own.
    own = getattr(getattr(os, "_Environ", None), "__setitem__", _MISSING)
    layout = getattr(base, "__setitem__", None) is own and all(
        hasattr(environ, name)
        for name in ("_data", "encodekey", "encodevalue")
    )
    subscribed = type(
        base.__name__,
        (base,),
        {
            "__setitem__": set_and_notify if layout else set_always,
            "__delitem__": del_and_notify,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "_poolkeeper_subscribed": True,
        },
    )
    try:
        environ.__class__ = subscribed
    except TypeError:
        return False
    return True


def _install() -> bool:
    environb = getattr(os, "environb", None)  # POSIX only.
    return _swap(os.environ) and (environb is None or _swap(environb))


def subscribe(names: Iterable[str], subscriber: _Subscriber) -> bool:
    """Call ``subscriber.invalidate()`` whenever one of *names* changes.

    Returns:
        Whether changes can be pushed; if not, the caller must poll.
    """
    if not _install():
        return False
    for name in names:
        refs = _refs.setdefault(name, {})
        ident = id(subscriber)
        refs[ident] = weakref.ref(subscriber, _forgetter(name, ident))
        _subscribers[name] = tuple(refs.values())
    return True


def _forgetter(
    name: str, ident: int
) -> Callable[[weakref.ref[_Subscriber]], None]:
    def forget(ref: weakref.ref[_Subscriber]) -> None:
        refs = _refs.get(name, {})
        if refs.get(ident) is ref:  # Not a newer subscriber at the same id.
            del refs[ident]
            _subscribers[name] = tuple(refs.values())

    return forget
