"""FileKey: a file's content fingerprint, pushed by the checker thread.

Defined here and re-exported by :mod:`poolkeeper.keys`, where it is
documented; see :func:`poolkeeper.keys.file`.
"""

from __future__ import annotations

import os
import stat
import threading
import time
from typing import TYPE_CHECKING, Any, Final, cast, final

from poolkeeper import _checker
from poolkeeper._fingerprint import fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable

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
        self._recheck = check_recheck(seconds)
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
        content = read_regular(path)
    except FileNotFoundError:
        return None
    except NotRegularFileError as exc:
        msg = f"keys.file({path!r}) names {exc}; point it at a regular file."
        raise NotRegularFileError(msg) from None
    return fingerprint(content)


class NotRegularFileError(OSError):
    """A path names a named pipe, a device or a directory: never read."""


def read_regular(path: str | os.PathLike[str]) -> bytes:
    """Return the content of the regular file *path*; never block on others.

    Opened without blocking, then checked: a named pipe would block the
    open (and a read) until a writer came, and a device may never end.

    Raises:
        NotRegularFileError: *path* is not a regular file (its message says
            what it is); any other :class:`OSError` of the open or read.
    """
    flags = os.O_RDONLY | os.O_CLOEXEC | getattr(os, "O_NONBLOCK", 0)
    fd = os.open(path, flags)
    with open(fd, "rb") as f:  # noqa: PTH123
        mode = os.fstat(fd).st_mode
        if not stat.S_ISREG(mode):
            msg = f"{_kind(mode)}, not a regular file"
            raise NotRegularFileError(msg)
        return f.read()


def _kind(mode: int) -> str:
    kinds = (
        (stat.S_ISDIR, "a directory"),
        (stat.S_ISFIFO, "a named pipe"),
        (stat.S_ISSOCK, "a socket"),
        (stat.S_ISCHR, "a character device"),
        (stat.S_ISBLK, "a block device"),
    )
    return next((name for test, name in kinds if test(mode)), "no file")


def check_recheck(seconds: float) -> float:
    """Return *seconds* as a float; raise ValueError if negative."""
    if not seconds >= 0:
        msg = f"keys.file() needs recheck_seconds >= 0, got {seconds}."
        raise ValueError(msg)
    return float(seconds)
