"""Count live instances of pool-owning SDK clients and warn about leaks."""

from __future__ import annotations

import collections
import functools
import logging
import os
import sys
import threading
import warnings
import weakref
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import wrapt

from poolkeeper._clients import WATCHED_CLASSES
from poolkeeper.exceptions import PoolLeakWarning

if TYPE_CHECKING:
    from types import FrameType, ModuleType

__all__ = ["unwatch", "watch"]

_log = logging.getLogger("poolkeeper")

_DEFAULT_LIMIT: Final = 3
_TOP_SITES: Final = 3
_MISSING: Final = object()
# Frames in these directories never count as the place a client was built.
_OWN_DIRS: Final = (
    str(Path(__file__).parent) + os.sep,
    str(Path(wrapt.__file__).parent) + os.sep,
)

# Guards every census. Weakref callbacks never take it (see _Census), so a
# plain lock cannot deadlock when garbage collection runs while it is held.
_lock = threading.Lock()
# Guards _targets and _patches. Reentrant: registering a hook for a module
# that is already imported runs the hook at once, in the same thread.
_registry_lock = threading.RLock()


class _Ref(weakref.ref[Any]):
    __slots__ = ("ident", "site")
    ident: int
    site: tuple[str, int]


class _Census:
    """The live instances of one concrete class, and where they were built.

    A weakref callback may run in any thread between any two bytecodes,
    including while :data:`_lock` is held. So it only appends to a deque
    (atomic), and whoever next holds the lock takes the dead out.
    """

    __slots__ = ("dead", "live", "name", "sites", "warned_at")

    def __init__(self, name: str) -> None:
        self.name = name
        self.live: dict[int, _Ref] = {}
        self.sites: dict[tuple[str, int], int] = {}
        self.dead: collections.deque[_Ref] = collections.deque()
        self.warned_at = 0

    def drain(self) -> None:
        while self.dead:
            ref = self.dead.popleft()
            # An id is reused only after its object died, so an entry that
            # is not this very ref belongs to a newer object.
            if self.live.get(ref.ident) is ref:
                del self.live[ref.ident]
                left = self.sites[ref.site] - 1
                if left:
                    self.sites[ref.site] = left
                else:
                    del self.sites[ref.site]


class _Patch:
    """The wrapped ``__init__`` of one watched class."""

    def __init__(self, cls: type, limit: int) -> None:
        self.cls = cls
        self.limit = limit
        self.specs: set[str] = set()
        self.censuses: dict[str, _Census] = {}
        self.untrackable: set[str] = set()
        self.active = True
        self.skip = _OWN_DIRS + _package_paths(cls)
        self.original = cls.__dict__.get("__init__", _MISSING)
        init = next(
            k.__dict__["__init__"]
            for k in cls.__mro__
            if "__init__" in k.__dict__
        )
        track = self._track

        # A plain function, not a wrapt wrapper: type.__call__ calls it
        # directly, which keeps the cost per construction low.
        @functools.wraps(init)
        def wrapper(instance: object, /, *args: Any, **kwargs: Any) -> None:  # noqa: ANN401
            init(instance, *args, **kwargs)
            if self.active:
                # The watchdog must never break the constructor it watches:
                # whatever counting hits is logged once, never raised. Only
                # a PoolLeakWarning that the user's warning filters turned
                # into an error (-W error) propagates, as they asked.
                try:
                    track(instance)
                except PoolLeakWarning:
                    raise
                except Exception:  # noqa: BLE001
                    self._failed(instance)

        self.wrapper = wrapper
        type.__setattr__(cls, "__init__", wrapper)

    def restore(self) -> None:
        self.active = False
        # Whoever patched __init__ after us keeps their patch; ours, now
        # inactive, just calls through.
        if self.cls.__dict__.get("__init__") is self.wrapper:
            if self.original is _MISSING:
                type.__delattr__(self.cls, "__init__")
            else:
                type.__setattr__(self.cls, "__init__", self.original)
        with _lock:
            self.censuses.clear()

    def _track(self, instance: object) -> None:
        cls = type(instance)
        name = f"{cls.__module__}.{cls.__qualname__}"
        census = self.censuses.get(name)
        if census is None:
            with _lock:
                census = self.censuses.setdefault(name, _Census(name))
        try:
            ref = _Ref(instance, census.dead.append)
        except TypeError:
            self._cannot_track(name)
            return
        ref.ident = id(instance)
        frame = _call_site(self.skip)
        ref.site = _UNKNOWN if frame is None else _where(frame)
        sites = census.sites
        with _lock:
            census.drain()
            live = census.live
            known = live.get(ref.ident)
            # A watched subclass calling a watched base's __init__.
            if known is not None and known() is instance:
                return
            live[ref.ident] = ref
            sites[ref.site] = sites.get(ref.site, 0) + 1
            count = len(live)
            if count <= self.limit:
                census.warned_at = 0
                return
            if count < max(self.limit + 1, 2 * census.warned_at):
                return
            census.warned_at = count
            top = sorted(sites.items(), key=lambda item: -item[1])
        where = tuple(
            (f"{file}:{line}", n) for (file, line), n in top[:_TOP_SITES]
        )
        _warn(PoolLeakWarning(name, count, self.limit, where), frame)

    def _failed(self, instance: object) -> None:
        cls = type(instance)
        self._log_once(
            f"{cls.__module__}.{cls.__qualname__}",
            "poolkeeper.watch failed to count a %s instance; the instance "
            "is fine, the count may be low.",
            exc_info=True,
        )

    def _cannot_track(self, name: str) -> None:
        self._log_once(
            name,
            "poolkeeper.watch cannot count %s instances: they do not "
            "support weak references.",
        )

    def _log_once(
        self, name: str, message: str, *, exc_info: bool = False
    ) -> None:
        if name not in self.untrackable:
            self.untrackable.add(name)
            _log.warning(message, name, exc_info=exc_info)


_UNKNOWN: Final = ("<unknown>", 0)


def _package_paths(cls: type) -> tuple[str, ...]:
    """Return where the package that defines *cls* lives, as prefixes."""
    module = sys.modules.get(cls.__module__.partition(".")[0])
    paths: list[str] = list(getattr(module, "__path__", ()))
    if paths:
        return tuple(path.rstrip(os.sep) + os.sep for path in paths)
    file: str | None = getattr(module, "__file__", None)
    return () if file is None else (file,)


def _call_site(skip: tuple[str, ...]) -> FrameType | None:
    frame: FrameType | None = sys._getframe(1)
    while frame is not None and frame.f_code.co_filename.startswith(skip):
        frame = frame.f_back
    return frame


def _where(frame: FrameType) -> tuple[str, int]:
    return frame.f_code.co_filename, frame.f_lineno


def _warn(warning: PoolLeakWarning, frame: FrameType | None) -> None:
    """Emit *warning* as if raised at *frame*, the crossing construction."""
    if frame is None:
        warnings.warn(warning, stacklevel=4)
        return
    module_globals = frame.f_globals
    emit = functools.partial(
        warnings.warn_explicit,
        warning,
        PoolLeakWarning,
        frame.f_code.co_filename,
        frame.f_lineno,
        module=module_globals.get("__name__"),
        registry=module_globals.setdefault("__warningregistry__", {}),
    )
    try:
        # module_globals lets the warning show the source line, read
        # through the module's loader. Code run by `python -c`, from stdin
        # or in the REPL has BuiltinImporter as __main__'s loader, whose
        # get_source() raises ImportError (CPython 3.11-3.13).
        emit(module_globals=module_globals)
    except PoolLeakWarning:
        raise  # The user's filters made the warning an error.
    except Exception:  # noqa: BLE001, S110
        pass  # Warn again below, outside this block: no chained traceback.
    else:
        return
    emit()


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
        except Exception:  # noqa: BLE001
            _log.warning(
                "poolkeeper.watch cannot patch %s.", self.spec, exc_info=True
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
                    patch = _Patch(obj, self.limit)
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
_patches: dict[type, _Patch] = {}


def watch(*names: str, limit: int = _DEFAULT_LIMIT) -> None:
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

    Only construction is slowed down, by a few microseconds; method calls
    on the clients are untouched.

    Args:
        *names: Classes to watch, as ``"module:Class"``.
        limit: The most instances of one class expected alive at once.

    Raises:
        ValueError: If a name is not ``"module:Class"``, or *limit* is
            less than 1.
        TypeError: If *limit* is not an integer.

    .. versionadded:: 0.1
    """
    limit = _checked_limit(limit)
    specs = names or WATCHED_CLASSES
    for spec in specs:
        module, _, attr = spec.partition(":")
        if not module or not attr or ":" in attr:
            msg = f"{spec!r} is not 'module:Class', e.g. 'httpx:Client'."
            raise ValueError(msg)
    with _registry_lock:
        for spec in specs:
            target = _targets.get(spec)
            if target is not None:
                target.limit = limit
                for cls in target.classes:
                    _patches[cls].limit = limit
                continue
            target = _targets[spec] = _Target(spec, limit)
            wrapt.register_post_import_hook(target.hook, target.module)


def _checked_limit(limit: object) -> int:
    if isinstance(limit, bool) or not isinstance(limit, int):
        msg = f"watch(limit=...) must be an integer, not {limit!r}."
        raise TypeError(msg)
    if limit < 1:
        msg = f"watch(limit=...) must be at least 1, not {limit}."
        raise ValueError(msg)
    return limit


def unwatch(*names: str) -> None:
    """Stop watching *names*, or every watched class when none are given.

    Each patched ``__init__`` is restored; a module not yet imported is
    no longer patched when it is.

    Args:
        *names: Classes given to :func:`watch`, as ``"module:Class"``.

    .. versionadded:: 0.1
    """
    with _registry_lock:
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


def live_counts() -> dict[str, int]:
    """Return the live instances of each watched class (for tests)."""
    counts: dict[str, int] = {}
    with _registry_lock:
        patches = list(_patches.values())
    with _lock:
        for patch in patches:
            for name, census in patch.censuses.items():
                census.drain()
                counts[name] = len(census.live)
    return counts


def _after_fork_in_child() -> None:
    # The parent's lock may have been held by a thread that does not exist
    # here; the counts stay right, since the child has copies of the live
    # instances.
    global _lock, _registry_lock  # noqa: PLW0603
    _lock = threading.Lock()
    _registry_lock = threading.RLock()


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
except Exception:  # noqa: BLE001 - Importing poolkeeper must not fail.
    _log.warning("POOLKEEPER_WATCH is set but watch() failed.", exc_info=True)
