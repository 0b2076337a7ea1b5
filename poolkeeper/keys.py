"""Key functions: what identifies the configuration a client was built for.

A singleton's *key* is evaluated on every call. When its value differs from
the one the live client was built with, the client is rebuilt and the old
one retired. Pass one key function or a tuple of them to
``@process_singleton(key=...)``.

.. versionadded:: 0.1
"""

from __future__ import annotations

import os
import time
from typing import final

from poolkeeper._fingerprint import fingerprint

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


@final
class FileKey:
    """The content of a file, re-read only when it changes; see :func:`file`.

    Only a fingerprint of the content is kept, never the content itself.
    """

    __slots__ = ("_path", "_recheck", "_state")

    def __init__(self, path: str, recheck_seconds: float) -> None:
        """Remember the file and how often to look at it."""
        self._path = path
        self._recheck = recheck_seconds
        # (next check, stat signature, key value), replaced as one tuple so
        # that a concurrent caller never sees a new signature with an old
        # value.
        self._state: tuple[float, object, tuple[str, str | None]] = (
            float("-inf"),
            object(),
            (path, None),
        )

    def __call__(self) -> tuple[str, str | None]:
        """Return ``(path, fingerprint of the content or None if absent)``."""
        due, signature, value = self._state
        now = time.monotonic()
        if now < due:
            return value
        try:
            st = os.stat(self._path)  # noqa: PTH116 -- str path, no Path object.
        except FileNotFoundError:
            current: object = None
        else:
            current = (st.st_mtime_ns, st.st_size, st.st_ino, st.st_dev)
        if current != signature:
            value = (self._path, self._read())
        self._state = (now + self._recheck, current, value)
        return value

    def _read(self) -> str | None:
        try:
            with open(self._path, "rb") as f:  # noqa: PTH123
                return fingerprint(f.read())
        except FileNotFoundError:
            return None

    def __repr__(self) -> str:
        """Name the file, never its content."""
        return f"poolkeeper.keys.file({self._path!r})"


def file(
    path: str | os.PathLike[str], *, recheck_seconds: float = 5.0
) -> FileKey:
    """Key a singleton on the content of a file, such as an API key file.

    The file is ``stat()``-ed at most once every *recheck_seconds* and read
    again only when its modification time, size or inode changed, so
    rotating the file (in place or by rename) is noticed within
    *recheck_seconds*. A missing file is a valid key value of its own.

    Args:
        path: The file to watch.
        recheck_seconds: The longest a change may go unnoticed.

    Returns:
        A key function returning ``(path, content fingerprint)``.

    Raises:
        ValueError: If *recheck_seconds* is negative.

    .. versionadded:: 0.1
    """
    if recheck_seconds < 0:
        msg = f"keys.file() needs recheck_seconds >= 0, got {recheck_seconds}."
        raise ValueError(msg)
    return FileKey(os.fspath(path), float(recheck_seconds))
