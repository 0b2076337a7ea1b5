"""FileKey: a file's content fingerprint, pushed by the file-key thread.

Defined here and re-exported by :mod:`poolkeeper.keys`, where it is
documented; see :func:`poolkeeper.keys.file`.
"""

from __future__ import annotations

import os
import threading
import time
from typing import TYPE_CHECKING, Any, Final, cast, final

from poolkeeper import _filekeys
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
        "_pushed",
        "_recheck",
        "_resolve",
        "_state",
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
        # reaches the subscribers. Never taken by a call within its recheck
        # interval, nor by an armed hit (which does not call the key).
        self._lock = threading.Lock()
        self._pushed = False
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

        Settable; the file-key thread applies a new value at once.
        """
        return self._recheck

    @recheck_seconds.setter
    def recheck_seconds(self, seconds: float) -> None:
        self._recheck = valid_recheck(seconds)
        _filekeys.wake()

    def __call__(self) -> tuple[str, str | None]:
        """Return ``(path, fingerprint of the content or None if absent)``."""
        if self._pushed:
            # Pushed: only slow paths get here. After a fork the child has
            # no file-key thread yet; this starts one.
            _filekeys.ensure()
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
            # Under the lock: a subscriber armed with the old value is
            # disarmed before anyone can see the new one.
            if self._pushed and old is not _UNSEEN and value != old:
                _filekeys.changed(self)
            return cast("tuple[str, str | None]", value)

    def _refresh(self) -> None:
        """Look now, whatever the schedule (for the file-key thread)."""
        self._look()

    def _subscribe(self, subscriber: _filekeys.Subscriber) -> bool:
        """Have changes pushed to *subscriber*; say whether they will be."""
        if self._recheck <= 0:
            return False
        self._pushed = True
        _filekeys.subscribe(self, subscriber)
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


def valid_recheck(seconds: float) -> float:
    """Return *seconds* as a float; raise ValueError if negative."""
    if not seconds >= 0:
        msg = f"keys.file() needs recheck_seconds >= 0, got {seconds}."
        raise ValueError(msg)
    return float(seconds)
