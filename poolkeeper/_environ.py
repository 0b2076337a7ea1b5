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

import os
import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Iterable


class _Watcher(Protocol):
    def invalidate(self) -> None: ...


_watchers: dict[str, weakref.WeakSet[_Watcher]] = {}


def _changed(name: object) -> None:
    if isinstance(name, bytes):
        name = os.fsdecode(name)
    watchers = _watchers.get(name) if isinstance(name, str) else None
    if watchers:
        for watcher in list(watchers):
            watcher.invalidate()


def _swap(environ: object) -> bool:
    base = type(environ)
    if getattr(base, "_poolkeeper_watched", False):
        return True

    # The notification runs after the store returns: once the assignment
    # (or del) has returned, every watcher is disarmed and outdated.
    def __setitem__(self: object, key: object, value: object) -> None:  # noqa: N807
        base.__setitem__(self, key, value)  # type: ignore[index]
        _changed(key)

    def __delitem__(self: object, key: object) -> None:  # noqa: N807
        base.__delitem__(self, key)  # type: ignore[attr-defined]
        _changed(key)

    watched = type(
        base.__name__,
        (base,),
        {
            "__setitem__": __setitem__,
            "__delitem__": __delitem__,
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
        _watchers.setdefault(name, weakref.WeakSet()).add(watcher)
    return True
