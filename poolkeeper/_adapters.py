"""Close and fork hooks that adapters contribute for their SDKs' clients.

An adapter (a distribution of its own, such as ``poolkeeper-daytona``)
declares one entry point in the group ``poolkeeper.adapters``, named after
the top-level module of the client types it knows::

    [project.entry-points."poolkeeper.adapters"]
    daytona = "poolkeeper_daytona._hooks:hooks"

The object it names is called with a client's type and returns an object
with ``close`` and ``after_fork`` attributes (either may be None), or None
for a type it does not know. A singleton written without ``close=`` closes
such clients with the adapter's close (before the client's own
``close()``); one without ``after_fork=`` has the adapter's hook make a
forked child's inherited client inert.

Nothing here runs at import or on the hit path. A type is looked up after
its first build: the entry points are read once per process, and an adapter
is imported only when a client of its SDK has been built. Afterwards a
lookup is one dictionary read, which is all the at-fork hook does.
"""

from __future__ import annotations

import logging
from typing import TYPE_CHECKING, Any, Final, NamedTuple

from poolkeeper._events import failure

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["GROUP", "Hooks", "inherited", "learn", "say_unclosed"]

#: The entry-point group adapters declare their hooks in.
GROUP: Final = "poolkeeper.adapters"

# The adapters poolkeeper knows of, by the top-level module of the client
# types they close: named when such a client has no close.
_KNOWN: Final = {"daytona": "poolkeeper-daytona"}

log = logging.getLogger("poolkeeper")


class Hooks(NamedTuple):
    """What an adapter contributes for one client type."""

    close: Callable[[Any], object] | None
    after_fork: Callable[[Any], object] | None
    adapter: str  # The distribution that gave them; "" if none did.


_NONE: Final = Hooks(None, None, "")
_hooks: dict[type, Hooks] = {}
_points: dict[str, Any] | None = None
_said: set[type] = set()


def learn(client: object) -> Hooks:
    """Return the hooks adapters give for *client*'s type (looked up once).

    No lock: two threads learning one type at once both find the same
    hooks, and a forked child never waits on a parent thread's lock.
    """
    kind = type(client)
    found = _hooks.get(kind)
    if found is None:
        found = _hooks[kind] = _discover(kind)
    return found


def inherited(client: object) -> Callable[[Any], object] | None:
    """Return the adapter's fork hook for *client*, from what was learnt.

    The at-fork hook's lookup: one dictionary read, no import, no lock.
    """
    return _hooks.get(type(client), _NONE).after_fork


def say_unclosed(name: str, client: object) -> None:
    """Say once per client type that poolkeeper knows no close for it."""
    kind = type(client)
    if kind in _said:
        return
    _said.add(kind)
    root = _root(kind)
    adapter = _hooks.get(kind, _NONE).adapter
    if adapter:
        hint = f"{adapter} (installed) has no close for this type either"
    elif root in _KNOWN:
        hint = f"install {_KNOWN[root]}, whose close poolkeeper then uses"
    else:
        hint = "pass close= a function that releases it"
    log.warning(
        "%s built a %s.%s, which has no close(), and poolkeeper knows no "
        "close for it: its retired clients are dropped without being "
        "closed. To close them, %s. (Said once per type.)",
        name,
        kind.__module__,
        kind.__qualname__,
        hint,
        extra={"poolkeeper_factory": name},
    )


def _root(kind: type) -> str:
    return str(getattr(kind, "__module__", "")).partition(".")[0]


def _discover(kind: type) -> Hooks:
    point = _entry_points().get(_root(kind))
    if point is None:
        return _NONE
    adapter = str(getattr(getattr(point, "dist", None), "name", point.value))
    try:
        made = point.load()(kind)
    except Exception as exc:  # noqa: BLE001 -- the adapter's bug, not the build's.
        failure(
            log,
            f"The poolkeeper adapter {adapter} failed to give hooks for "
            f"{kind.__module__}.{kind.__qualname__}; its clients are closed "
            "as if it were not installed.",
            exc,
        )
        return _NONE
    if made is None:
        return Hooks(None, None, adapter)
    return Hooks(
        getattr(made, "close", None),
        getattr(made, "after_fork", None),
        adapter,
    )


def _entry_points() -> dict[str, Any]:
    global _points  # noqa: PLW0603 -- read once per process.
    if _points is None:
        # Imported here: importlib.metadata costs dozens of modules, paid
        # once, at the first build, never at import.
        import importlib.metadata  # noqa: PLC0415

        try:
            found = importlib.metadata.entry_points(group=GROUP)
        except Exception as exc:  # noqa: BLE001 -- broken metadata: no adapters.
            failure(log, f"Reading the {GROUP} entry points failed.", exc)
            found = importlib.metadata.EntryPoints(())
        _points = {point.name: point for point in found}
    return _points
