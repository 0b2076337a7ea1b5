"""Patch a watched class's ``__init__`` to count its instances and warn.

Each construction is entered in the class's census with the line that
built it (the first frame outside poolkeeper, wrapt and the class's own
package); when too many are alive, a :class:`PoolLeakWarning` points at
the construction that crossed the limit.
"""

from __future__ import annotations

import functools
import logging
import os
import sys
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final

import wrapt

from poolkeeper import _events
from poolkeeper._watch import _census
from poolkeeper._watch._census import Census, Ref
from poolkeeper.exceptions import PoolLeakWarning

if TYPE_CHECKING:
    from types import FrameType

__all__ = ["Patch", "warn_at_caller"]

_log = logging.getLogger("poolkeeper")

_TOP_SITES: Final = 3
_MISSING: Final = object()
# Frames in these directories never count as the place a client was built:
# the poolkeeper package (this file is in its _watch/) and wrapt.
_OWN_DIRS: Final = (
    str(Path(__file__).parent.parent) + os.sep,
    str(Path(wrapt.__file__).parent) + os.sep,
)


class Patch:
    """The wrapped ``__init__`` of one watched class."""

    def __init__(self, cls: type, limit: int) -> None:
        self.cls = cls
        self.limit = limit
        self.specs: set[str] = set()
        self.censuses: dict[str, Census] = {}
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
        with _census.lock:
            self.censuses.clear()

    def _track(self, instance: object) -> None:
        if getattr(_census.exempt, "depth", 0):
            return  # A thread singleton's client: counted there.
        cls = type(instance)
        name = f"{cls.__module__}.{cls.__qualname__}"
        census = self.censuses.get(name)
        if census is None:
            with _census.lock:
                census = self.censuses.setdefault(name, Census(name))
        try:
            ref = Ref(instance, census.dead.append)
        except TypeError:
            self._cannot_track(name)
            return
        ref.ident = id(instance)
        frame = _call_site(self.skip)
        ref.site = _UNKNOWN if frame is None else _where(frame)
        sites = census.sites
        with _census.lock:
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
            error=sys.exc_info()[1],
        )

    def _cannot_track(self, name: str) -> None:
        self._log_once(
            name,
            "poolkeeper.watch cannot count %s instances: they do not "
            "support weak references.",
        )

    def _log_once(
        self, name: str, message: str, *, error: BaseException | None = None
    ) -> None:
        if name not in self.untrackable:
            self.untrackable.add(name)
            _events.failure(_log, message % name, error)


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


def warn_at_caller(warning: PoolLeakWarning) -> None:
    """Emit *warning* at the first frame outside poolkeeper and wrapt."""
    _warn(warning, _call_site(_OWN_DIRS))


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
