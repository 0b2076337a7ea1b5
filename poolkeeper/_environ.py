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

import collections
import itertools
import os
import threading
import weakref
from typing import TYPE_CHECKING, Any, Protocol, cast

from poolkeeper._records import is_owned, under

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


class _Subscriber(Protocol):
    def invalidate(self) -> None: ...


# name -> {id(subscriber): weak reference}, and name -> those references as a
# tuple, rebuilt when a subscriber comes or goes: a write iterates the tuple
# of the name written (nothing else, without a copy or WeakSet's guard).
# Both change under _lock only. A subscriber's weakref callback may run at
# any allocation, on any thread, inside a change (the collector's), so it
# never changes them itself nor waits for the lock: it queues the dead
# reference in _dead, which whoever holds the lock next empties.
_refs: dict[str, dict[int, weakref.ref[_Subscriber]]] = {}
_subscribers: dict[str, tuple[weakref.ref[_Subscriber], ...]] = {}
_dead: collections.deque[tuple[str, int, weakref.ref[_Subscriber]]] = (
    collections.deque()
)
_lock = threading.RLock()
# The arguments of a lock's acquire() that never blocks.
_NO_WAIT = (False,)

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
    ident = id(subscriber)
    added = [
        (name, weakref.ref(subscriber, _forgetter(name, ident)))
        for name in names
    ]
    under(_lock, _add, ident, added)
    _sweep()
    return True


def _add(
    ident: int, added: list[tuple[str, weakref.ref[_Subscriber]]]
) -> None:
    # Under _lock: callbacks only queue, so nothing else changes the dicts.
    _forget_dead()
    for name, ref in added:
        refs = _refs.setdefault(name, {})
        refs[ident] = ref
        _subscribers[name] = tuple(refs.values())


def _forget_dead() -> None:
    # Under _lock.
    while _dead:
        name, ident, ref = _dead.popleft()
        refs = _refs.get(name, {})
        if refs.get(ident) is ref:  # Not a newer subscriber at this id.
            del refs[ident]
            _subscribers[name] = tuple(refs.values())


def _sweep() -> None:
    # Forgets the queued dead without blocking: if another holds the lock,
    # it empties the queue before letting go (see subscribe), or the next
    # change does; so does this thread if the collector ran inside its own
    # change (the lock is reentrant: it would let this in, mid-change).
    # Taken and noted in one C call (as _registry's _drain does): no
    # signal's exception between the acquire and its note.
    while _dead:
        if is_owned(_lock):
            return
        held: list[bool] = []
        try:
            held.extend(map(_lock.acquire, _NO_WAIT))
            if not held[0]:
                return
            _forget_dead()
        finally:
            if held and held[0]:
                _lock.release()


def _forgetter(
    name: str, ident: int
) -> Callable[[weakref.ref[_Subscriber]], None]:
    def forget(ref: weakref.ref[_Subscriber]) -> None:
        _dead.append((name, ident, ref))
        _sweep()

    return forget


def after_fork_in_child() -> None:
    """Give the child a fresh lock (from the runtime's one fork hook).

    The parent's may have been held by a thread that does not exist here.
    """
    global _lock  # noqa: PLW0603
    _lock = threading.RLock()
