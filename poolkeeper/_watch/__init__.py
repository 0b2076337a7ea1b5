"""Count live instances of pool-owning SDK clients and warn about leaks.

Here are :func:`watch`, :func:`unwatch` and :func:`live_counts`, the
registry of watched ``module:Class`` names (each patched once its module
is imported), and ``POOLKEEPER_WATCH``, read when this module is imported
(the ``poolkeeper-watch.pth`` file imports it at interpreter startup).
Patching a class is :mod:`._patch`; counting, :mod:`._census`.
"""

from __future__ import annotations

import logging
import os
import threading
from typing import TYPE_CHECKING, Final

import wrapt

from poolkeeper import _events
from poolkeeper._clients import WATCHED_CLASSES
from poolkeeper._watch import _census
from poolkeeper._watch._patch import Patch

if TYPE_CHECKING:
    from types import ModuleType

__all__ = ["unwatch", "watch"]

_log = logging.getLogger("poolkeeper")

_DEFAULT_LIMIT: Final = 3
_DEFAULT_THREAD_LIMIT: Final = 128

# The thread_limit of the latest watch(), None when nothing is watched:
# read by each build of a thread singleton (poolkeeper._threads).
_thread_limit: int | None = None

# Guards _targets and _patches. Reentrant: registering a hook for a module
# that is already imported runs the hook at once, in the same thread.
_registry_lock = threading.RLock()


class _Target:
    """One ``module:Class`` given to :func:`watch`."""

    def __init__(self, spec: str, limit: int) -> None:
        self.spec = spec
        self.module, _, self.attr = spec.partition(":")
        self.limit = limit
        self.classes: list[type] = []

    def hook(self, module: ModuleType) -> None:
        """Patch the class once its module is imported, if still wanted.

        Runs inside the user's ``import``, so nothing it hits may escape.
        """
        try:
            self._hook(module)
        except Exception as exc:  # noqa: BLE001
            _events.failure(
                _log, f"poolkeeper.watch cannot patch {self.spec}.", exc
            )

    def _hook(self, module: ModuleType) -> None:
        with _registry_lock:
            if _targets.get(self.spec) is not self:
                return  # Unwatched before the module was imported.
            obj: object = module
            for part in self.attr.split("."):
                obj = getattr(obj, part, None)
            if not isinstance(obj, type):
                _log.warning("poolkeeper.watch: %s is not a class.", self.spec)
                return
            patch = _patches.get(obj)
            if patch is None:
                try:
                    patch = Patch(obj, self.limit)
                except TypeError:
                    _log.warning(
                        "poolkeeper.watch cannot patch %s.", self.spec
                    )
                    return
                _patches[obj] = patch
            patch.limit = self.limit
            patch.specs.add(self.spec)
            self.classes.append(obj)


_targets: dict[str, _Target] = {}
_patches: dict[type, Patch] = {}


def watch(
    *names: str,
    limit: int = _DEFAULT_LIMIT,
    thread_limit: int = _DEFAULT_THREAD_LIMIT,
) -> None:
    """Warn when too many instances of a pool-owning client are alive.

    Patches the ``__init__`` of each class named ``"module:Class"`` to count
    its live instances (through weak references, so counting never keeps
    one alive). When more than *limit* instances of one class are alive at
    once, a :class:`PoolLeakWarning` names the class, the count and the
    lines that built the live ones; it is emitted again each time the count
    doubles, and anew after the count falls back to *limit*. Frames inside
    the class's own package are skipped, so the lines are yours.

    A module not yet imported is patched when it is imported; nothing is
    imported here. With no *names*, the well-known clients are watched:
    ``daytona.Daytona`` and ``AsyncDaytona``, ``httpx.Client`` and
    ``AsyncClient``, ``requests.Session``, ``urllib3.PoolManager``,
    ``openai.OpenAI`` and ``AsyncOpenAI``, ``anthropic.Anthropic`` and
    ``AsyncAnthropic``, boto3 clients (``botocore.client.BaseClient``) and
    ``redis.Redis``. Watching a name again sets its *limit*. Setting the
    environment variable ``POOLKEEPER_WATCH=1`` calls ``watch()`` at
    interpreter startup, through the ``poolkeeper-watch.pth`` file the
    wheel installs, so it works in programs that never import poolkeeper
    (``POOLKEEPER_WATCH_LIMIT`` sets the limit).

    The watchdog never breaks the program it watches: a failure inside it
    is logged once on the ``poolkeeper`` logger, never raised. Only the
    warning itself can become an error, if the warning filters say so.

    A ``scope="thread"`` singleton holds one client per thread that called
    it and has not ended, so its clients are not counted against *limit*
    (nor is anything else its factory builds): while anything is watched,
    each build of such a singleton counts its live clients instead, and a
    :class:`PoolLeakWarning` names the singleton when they are more than
    *thread_limit*: threads are piling up (each new thread builds a client
    that lives as long as the thread), or the limit is below the number of
    threads that use it. It is emitted before the build, again each time
    the count doubles, and anew after the count fell back to the limit.

    Only construction is slowed down, by a few microseconds; method calls
    on the clients are untouched.

    With the ``otel`` extra, it also reports the process's open file
    descriptors and threads as OpenTelemetry gauges
    (``process.open_file_descriptor.count``, ``process.thread.count``;
    see the observability page of the docs).

    Args:
        *names: Classes to watch, as ``"module:Class"``.
        limit: The most instances of one class expected alive at once.
        thread_limit: The most live clients one ``scope="thread"``
            singleton is expected to hold at once: your most threads.

    Raises:
        ValueError: If a name is not ``"module:Class"``, or *limit* or
            *thread_limit* is less than 1.
        TypeError: If *limit* or *thread_limit* is not an integer.

    .. versionadded:: 0.1
    """
    global _thread_limit  # noqa: PLW0603
    limit = _valid_limit(limit)
    threads = _valid_limit(thread_limit, "thread_limit")
    specs = names or WATCHED_CLASSES
    for spec in specs:
        module, _, attr = spec.partition(":")
        if not module or not attr or ":" in attr:
            msg = f"{spec!r} is not 'module:Class', e.g. 'httpx:Client'."
            raise ValueError(msg)
    _events.watched()
    with _registry_lock:
        _thread_limit = threads
        for spec in specs:
            target = _targets.get(spec)
            if target is not None:
                target.limit = limit
                for cls in target.classes:
                    _patches[cls].limit = limit
                continue
            target = _targets[spec] = _Target(spec, limit)
            wrapt.register_post_import_hook(target.hook, target.module)


def _valid_limit(limit: object, name: str = "limit") -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        msg = f"watch({name}=...) must be an integer, not {limit!r}."
        raise TypeError(msg)
    if limit < 1:
        msg = f"watch({name}=...) must be at least 1, not {limit}."
        raise ValueError(msg)
    return limit


def unwatch(*names: str) -> None:
    """Stop watching *names*, or every watched class when none are given.

    Each patched ``__init__`` is restored; a module not yet imported is
    no longer patched when it is. With no *names*, the live clients of
    ``scope="thread"`` singletons are no longer counted either.

    Args:
        *names: Classes given to :func:`watch`, as ``"module:Class"``.

    .. versionadded:: 0.1
    """
    global _thread_limit  # noqa: PLW0603
    with _registry_lock:
        if not names:
            _thread_limit = None
        for spec in names or tuple(_targets):
            target = _targets.pop(spec, None)
            if target is None:
                continue
            for cls in target.classes:
                patch = _patches[cls]
                patch.specs.discard(spec)
                if not patch.specs:
                    del _patches[cls]
                    patch.restore()


def watched_thread_limit() -> int | None:
    """Return watch()'s thread_limit, or None while nothing is watched."""
    return _thread_limit


def live_counts() -> dict[str, int]:
    """Return the live instances of each watched class (for tests)."""
    counts: dict[str, int] = {}
    with _registry_lock:
        patches = list(_patches.values())
    with _census.lock:
        for patch in patches:
            for name, census in patch.censuses.items():
                census.drain()
                counts[name] = len(census.live)
    return counts


def _after_fork_in_child() -> None:
    # The watchdog's one fork hook. The parent's locks may have been held
    # by a thread that does not exist here: fresh ones. The counts stay
    # right, since the child has copies of the live instances.
    global _registry_lock  # noqa: PLW0603
    _registry_lock = threading.RLock()
    _census.lock = threading.Lock()


def _watch_from_environment() -> None:
    if os.environ.get("POOLKEEPER_WATCH", "0").strip() in {"", "0"}:
        return
    raw = os.environ.get("POOLKEEPER_WATCH_LIMIT", "").strip()
    try:
        limit = int(raw) if raw else _DEFAULT_LIMIT
        watch(limit=limit)
    except ValueError:
        _log.warning(
            "POOLKEEPER_WATCH_LIMIT=%r is not a positive integer; "
            "watching with limit %d.",
            raw,
            _DEFAULT_LIMIT,
        )
        watch()


if hasattr(os, "register_at_fork"):  # pragma: no branch -- not on Windows.
    os.register_at_fork(after_in_child=_after_fork_in_child)
try:
    _watch_from_environment()
except Exception as exc:  # noqa: BLE001 - Importing poolkeeper must not fail.
    _events.failure(_log, "POOLKEEPER_WATCH is set but watch() failed.", exc)
