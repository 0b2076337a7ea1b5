"""Key functions: what identifies the configuration a client was built for.

When a singleton's *key* value differs from the one the live client was
built with, the client is rebuilt and the old one retired. Pass one key
function or a tuple of them to ``@process_singleton(key=...)``.

What each kind notices, and how fast:

- :func:`env`: a change through ``os.environ``, pushed at once; a call
  reads nothing.
- :func:`file`: a rewrite, rename over, creation or deletion of the file,
  seen by the checker thread within *recheck_seconds*; a call reads
  nothing. With ``recheck_seconds=0``: one ``stat()`` per call, noticed by
  the next call.
- A tuple: pushed when every part is, as its parts; otherwise evaluated on
  every call (its pushing parts answer from their last value).
- Any other function: evaluated on every call, so it notices what it reads.

.. versionadded:: 0.1
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Final, cast, final

from poolkeeper import _checker, _environ
from poolkeeper._fingerprint import fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["env", "file"]


@final
class EnvKey:
    """The values of some environment variables; made by :func:`env`.

    Changes made through ``os.environ`` are pushed to the singletons that
    use this key, so its hit path reads nothing; see :func:`env`.
    """

    __slots__ = ("names",)

    def __init__(self, names: tuple[str, ...]) -> None:
        """Remember which variables make up the key."""
        self.names: tuple[str, ...] = names

    def __call__(self) -> tuple[str | None, ...]:
        """Return the current value of each variable, ``None`` if unset."""
        get = os.environ.get
        return tuple([get(name) for name in self.names])

    def _watch(self, watcher: _checker.Watcher) -> bool:
        """Have changes pushed to *watcher*; say whether they will be."""
        return _environ.watch(self.names, watcher)

    def __repr__(self) -> str:
        """Name the variables, never their values."""
        return f"poolkeeper.keys.env{self.names!r}"


def env(*names: str) -> EnvKey:
    """Key a singleton on environment variables.

    A change to any of them through ``os.environ`` (assignment, ``del``,
    ``update()``, ``pop()``, pytest's ``monkeypatch``...) makes the next
    call rebuild. Changes are pushed rather than polled, so the hit path
    costs the same as with no key at all.

    Not noticed: ``os.putenv()``/``os.unsetenv()`` and native code calling
    ``setenv()`` (``os.environ`` does not see them either, so neither does
    an SDK reading it), and rebinding ``os.environ`` to another object.

    Args:
        *names: The variables, e.g. ``"API_KEY", "API_URL"``.

    Returns:
        A key function returning a tuple of the variables' values.

    Raises:
        ValueError: If no name is given.
        TypeError: If a name is not a string.

    .. versionadded:: 0.1
    """
    if not names:
        msg = "keys.env() needs at least one variable name."
        raise ValueError(msg)
    _check_names(names)
    return EnvKey(tuple(dict.fromkeys(names)))


def _check_names(names: tuple[object, ...]) -> None:
    for name in names:
        if not isinstance(name, str):
            msg = (
                "keys.env() takes variable names as strings, got "
                f"{type(name).__name__}."
            )
            raise TypeError(msg)


# The state of a file key that was never looked at.
_UNSEEN: Final[Any] = object()


@final
class FileKey:
    """The content of a file, re-read only when it changes; see :func:`file`.

    Only a fingerprint of the content is kept, never the content itself.
    """

    __slots__ = (
        "_lock",
        "_path",
        "_recheck",
        "_resolve",
        "_state",
        "_watched",
    )

    def __init__(
        self,
        path: str | Callable[[], str | os.PathLike[str]],
        recheck_seconds: float,
    ) -> None:
        """Remember the file (or how to find it) and how often to look."""
        self._path = path if isinstance(path, str) else None
        self._resolve = None if isinstance(path, str) else path
        self._recheck = recheck_seconds
        # Serializes looking, storing and notifying, so that the stored
        # value is always the latest one seen and every change of it
        # reaches the watchers. Never taken by a call within its recheck
        # interval, nor by an armed hit (which does not call the key).
        self._lock = threading.Lock()
        self._watched = False
        # (next look, path, stat signature, key value), replaced as one
        # tuple so that a concurrent caller never sees a new signature with
        # an old value.
        self._state: tuple[float, str | None, object, Any] = (
            float("-inf"),
            None,
            _UNSEEN,
            _UNSEEN,
        )

    @property
    def recheck_seconds(self) -> float:
        """The longest a change of the file may go unnoticed, in seconds.

        Settable; a pushed key's checker applies a new value at once.
        """
        return self._recheck

    @recheck_seconds.setter
    def recheck_seconds(self, seconds: float) -> None:
        self._recheck = _check_recheck(seconds)
        _checker.wake()

    def __call__(self) -> tuple[str, str | None]:
        """Return ``(path, fingerprint of the content or None if absent)``."""
        if self._watched:
            # Pushed: only slow paths get here. After a fork the child has
            # no checker thread yet; this starts one.
            _checker.ensure()
        due, path, _, value = self._state
        if self._resolve is not None and self._where() != path:
            return self._look()
        if time.monotonic() < due:
            return cast("tuple[str, str | None]", value)
        return self._look()

    def _where(self) -> str:
        if self._resolve is None:
            return cast("str", self._path)
        return os.fspath(self._resolve())

    def _look(self) -> tuple[str, str | None]:
        """Stat the file, re-read it if it changed, notify if the value did."""
        with self._lock:
            _, seen_path, seen, old = self._state
            path = self._where()
            try:
                st = os.stat(path)  # noqa: PTH116 -- str path, no Path object.
            except FileNotFoundError:
                signature: object = None
            else:
                signature = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)
            if path == seen_path and signature == seen:
                value = old
            else:
                value = (path, _read(path))
            self._state = (
                time.monotonic() + self._recheck,
                path,
                signature,
                value,
            )
            # Under the lock: a watcher armed with the old value is
            # disarmed before anyone can see the new one.
            if self._watched and old is not _UNSEEN and value != old:
                _checker.changed(self)
            return cast("tuple[str, str | None]", value)

    def _check(self) -> None:
        """Look now, whatever the schedule (the checker's entry point)."""
        self._look()

    def _watch(self, watcher: _checker.Watcher) -> bool:
        """Have the checker push changes to *watcher*; say if it will."""
        if self._recheck <= 0:
            return False
        self._watched = True
        _checker.watch(self, watcher)
        return True

    def __repr__(self) -> str:
        """Name the file, never its content."""
        where = self._path if self._resolve is None else self._resolve
        return f"poolkeeper.keys.file({where!r})"


def _read(path: str) -> str | None:
    try:
        with open(path, "rb") as f:  # noqa: PTH123
            return fingerprint(f.read())
    except FileNotFoundError:
        return None


def _check_recheck(seconds: float) -> float:
    if not seconds >= 0:
        msg = f"keys.file() needs recheck_seconds >= 0, got {seconds}."
        raise ValueError(msg)
    return float(seconds)


def file(
    path: str | os.PathLike[str] | Callable[[], str | os.PathLike[str]],
    *,
    recheck_seconds: float = 5.0,
) -> FileKey:
    """Key a singleton on the content of a file, such as an API key file.

    With *recheck_seconds* > 0 the file is watched by poolkeeper's checker,
    one daemon thread for the whole process: every *recheck_seconds* it
    ``stat()``-s the file and re-reads it when its modification time,
    size, inode or device changed. When the content changed, it disarms
    the singletons using the key, so the hit path itself reads nothing
    (it costs the same as with no key). Rotating the file, in place or by
    rename, is therefore noticed within *recheck_seconds* (plus the time
    the checker takes for the other keys), and at once by a call that is
    on the slow path anyway. A missing file is a valid key value of its
    own, and creating or deleting the file is a change.

    With ``recheck_seconds=0`` the file is ``stat()``-ed on every call
    instead, and a change is noticed by the next call.

    Not noticed: a rewrite that keeps the modification time, size and
    inode all equal (within the file system's timestamp resolution).

    Args:
        path: The file to watch, or a function returning its path: that
            function is called on every evaluation of the key (on the slow
            path only, while changes are pushed) and by the checker, so a
            path that depends on the environment or the working directory
            is followed. Relative paths are resolved against the working
            directory at each look.
        recheck_seconds: The longest a change may go unnoticed; 0 to look
            on every call.

    Returns:
        A key function returning ``(path, content fingerprint)``, with
        ``None`` as the fingerprint of a missing file.

    Raises:
        ValueError: If *recheck_seconds* is negative.

    .. versionadded:: 0.1
    .. versionchanged:: 0.1
       A checker thread pushes changes; *path* may be a function.
    """
    seconds = _check_recheck(recheck_seconds)
    if callable(path):
        return FileKey(path, seconds)
    return FileKey(os.fspath(path), seconds)


@final
class KeyTuple:
    """Key functions combined: the tuple of their values.

    Made by ``process_singleton(key=(...))``. Its changes are pushed when
    every part's are (``keys.env`` and ``keys.file`` with a non-zero
    *recheck_seconds*); otherwise it is evaluated on every call, and its
    pushed parts answer from a value kept until they change, so only the
    other parts are evaluated on every call.
    """

    __slots__ = ("_evaluate", "parts")

    def __init__(self, parts: tuple[Callable[[], object], ...]) -> None:
        """Remember the parts, in order."""
        self.parts = parts
        self._evaluate = (
            parts
            if all(isinstance(p, _PUSHABLE) for p in parts)
            else tuple(
                _Kept(p) if isinstance(p, _PUSHABLE) else p for p in parts
            )
        )

    def __call__(self) -> tuple[object, ...]:
        """Return the tuple of the parts' values."""
        return tuple([part() for part in self._evaluate])

    def _watch(self, watcher: _checker.Watcher) -> bool:
        if self._evaluate is not self.parts:
            return False
        # A list, not a generator: every part registers, even after one
        # that cannot push (a spare notification only costs a slow call).
        pushed = [watch(part, watcher) for part in self.parts]
        return all(pushed)

    def __repr__(self) -> str:
        """Show the parts' reprs (names and paths, never values)."""
        return f"poolkeeper.keys.KeyTuple({self.parts!r})"


@final
class _Kept:
    """A pushed key's value, evaluated again only after it changed.

    The part of a polled tuple that can push: it watches its key like a
    singleton would, so the tuple's every-call cost is its other parts.
    """

    __slots__ = ("__weakref__", "_epoch", "_key", "_pushed", "_value")

    def __init__(self, key: EnvKey | FileKey | KeyTuple) -> None:
        self._key = key
        self._value: object = _UNSEEN
        self._epoch = 0
        self._pushed = watch(key, self)

    def invalidate(self) -> None:
        """The key changed: forget the kept value."""
        self._epoch += 1
        self._value = _UNSEEN

    def __call__(self) -> object:
        value = self._value
        if value is _UNSEEN or not self._pushed:
            epoch = self._epoch
            value = self._value = self._key()
            # A change while the key was read: keep nothing. Either its
            # invalidate() stored _UNSEEN after this store, or the epoch
            # moved before this check.
            if self._epoch != epoch:
                self._value = _UNSEEN
        return value


_PUSHABLE = (EnvKey, FileKey, KeyTuple)


def watch(key: object, watcher: _checker.Watcher) -> bool:
    """Have *key*'s changes pushed to *watcher*; say whether they will be.

    Internal: called by the drivers once per singleton. A key that cannot
    push (a plain function, a tuple holding one, ``recheck_seconds=0``)
    returns False and is evaluated on every call.
    """
    if isinstance(key, _PUSHABLE):
        return key._watch(watcher)
    return False
