"""Noticing ``os.environ`` changes without reading it on every call.

Reading two variables from ``os.environ`` costs more than the whole hit path
should, so an environment key is *pushed* instead of polled: the first
``keys.env`` singleton swaps the class of ``os.environ`` for a subclass whose
``__setitem__`` and ``__delitem__`` notify the singletons that watch the
changed name. Everything that changes the mapping goes through those two
methods (``update``, ``pop``, ``clear``, ``setdefault``, pytest's
``monkeypatch``), so all of it is noticed. ``os.environb`` shares its data
with ``os.environ`` on POSIX, so its class is swapped too and a change
made through it notifies the watchers of the decoded name.

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
from typing import TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable


class _Watcher(Protocol):
    def invalidate(self) -> None: ...


# name -> {id(watcher): weak reference}. A plain dict of references rather
# than a WeakSet: a write iterates only the watchers of the name written,
# without WeakSet's iteration guard.
_watchers: dict[str, dict[int, weakref.ref[_Watcher]]] = {}

# Counts the stores of watched writes (next() on it is atomic).
_stores = itertools.count()


def _changed(name: object) -> None:
    # name passed the store's encodekey: a str, or bytes for os.environb.
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    refs = _watchers.get(name)  # type: ignore[call-overload]
    if refs:
        for ref in list(refs.values()):
            watcher = ref()
            if watcher is not None:
                watcher.invalidate()


def _swap(environ: object) -> bool:
    base = type(environ)
    if getattr(base, "_poolkeeper_watched", False):
        return True

    # The notification runs after the store returns: once the assignment
    # (or del) has returned, every watcher is disarmed and outdated. A
    # write of the value already there changes nothing and notifies no one.
    def set_and_notify(self: Any, key: object, value: object) -> None:  # noqa: ANN401
        name = self.encodekey(key)  # Raises the TypeError base would.
        data = self._data
        before = data.get(name)
        mark = next(_stores)
        base.__setitem__(self, key, value)  # type: ignore[index]
        # Another store between the two reads of the count (on any thread)
        # may have shown a value that was read and armed meanwhile: notify.
        if data.get(name) != before or next(_stores) != mark + 1:
            _changed(key)

    def set_always(self: object, key: object, value: object) -> None:
        # Not the os._Environ layout: every write notifies.
        base.__setitem__(self, key, value)  # type: ignore[index]
        _changed(key)

    def del_and_notify(self: object, key: object) -> None:
        base.__delitem__(self, key)  # type: ignore[attr-defined]
        _changed(key)

    layout = hasattr(environ, "_data") and hasattr(environ, "encodekey")
    watched = type(
        base.__name__,
        (base,),
        {
            "__setitem__": set_and_notify if layout else set_always,
            "__delitem__": del_and_notify,
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "_poolkeeper_watched": True,
        },
    )
    try:
        environ.__class__ = watched
    except TypeError:
        return False
    return True


def _install() -> bool:
    environb = getattr(os, "environb", None)  # POSIX only.
    return _swap(os.environ) and (environb is None or _swap(environb))


def watch(names: Iterable[str], watcher: _Watcher) -> bool:
    """Call ``watcher.invalidate()`` whenever one of *names* changes.

    Returns:
        Whether changes can be pushed; if not, the caller must poll.
    """
    if not _install():
        return False
    for name in names:
        refs = _watchers.setdefault(name, {})
        ident = id(watcher)
        refs[ident] = weakref.ref(watcher, _forgetter(refs, ident))
    return True


def _forgetter(
    refs: dict[int, weakref.ref[_Watcher]], ident: int
) -> Callable[[weakref.ref[_Watcher]], None]:
    def forget(ref: weakref.ref[_Watcher]) -> None:
        if refs.get(ident) is ref:  # Not a newer watcher at the same id.
            del refs[ident]

    return forget
