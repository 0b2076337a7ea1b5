"""Key functions: what identifies the configuration a client was built for.

When a singleton's *key* value differs from the one the live client was
built with, the client is rebuilt and the old one retired. Pass one key
function or a tuple of them to ``@process_singleton(key=...)``.

What each kind notices, and how fast:

- :func:`env`: a change through ``os.environ``, pushed at once; a call
  reads nothing.
- :func:`file`: a rewrite, rename over, creation or deletion of the file,
  seen by the file-key thread within *recheck_seconds*; a call reads
  nothing. With ``recheck_seconds=0``: one ``stat()`` per call, noticed by
  the next call.
- A tuple: pushed when every part is, as its parts; otherwise evaluated on
  every call (its pushing parts answer from their last value).
- Any other function: evaluated on every call, so it notices what it reads.

.. versionadded:: 0.1
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, final

from poolkeeper import _environ
from poolkeeper._filekeys import _UNSEEN, FileKey, valid_recheck

if TYPE_CHECKING:
    from collections.abc import Callable

    from poolkeeper import _filekeys

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

    def _subscribe(self, subscriber: _filekeys.Subscriber) -> bool:
        """Have changes pushed to *subscriber*; say whether they will be."""
        return _environ.subscribe(self.names, subscriber)

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
    _validate_names(names)
    return EnvKey(tuple(dict.fromkeys(names)))


def _validate_names(names: tuple[object, ...]) -> None:
    for name in names:
        if not isinstance(name, str):
            msg = (
                "keys.env() takes variable names as strings, got "
                f"{type(name).__name__}."
            )
            raise TypeError(msg)


def file(
    path: str | os.PathLike[str] | Callable[[], str | os.PathLike[str]],
    *,
    recheck_seconds: float = 5.0,
) -> FileKey:
    """Key a singleton on the content of a file, such as an API key file.

    With *recheck_seconds* > 0 the file is looked at by poolkeeper's file-key
    thread, one daemon thread for the whole process: every *recheck_seconds* it
    ``stat()``-s the file and re-reads it when its modification time,
    size, inode or device changed. When the content changed, it disarms
    the singletons using the key, so the hit path itself reads nothing
    (it costs the same as with no key). Rotating the file, in place or by
    rename, is therefore noticed within *recheck_seconds* (plus the time
    the file-key thread takes for the other keys), and at once by a call
    that is on the slow path anyway. A missing file is a valid key value
    of its own, and creating or deleting the file is a change.

    With ``recheck_seconds=0`` the file is ``stat()``-ed on every call
    instead, and a change is noticed by the next call.

    Not noticed: a rewrite that keeps the modification time, size and
    inode all equal (within the file system's timestamp resolution).

    The key itself raises :class:`OSError` when *path* names something
    other than a regular file (a named pipe, a device, a directory): it
    never reads one, so it never blocks on a pipe with no writer.

    Args:
        path: The file, or a function returning its path: that
            function is called on every evaluation of the key (on the slow
            path only, while changes are pushed) and by the file-key thread,
            so a path that depends on the environment or the working directory
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
       A file-key thread pushes changes; *path* may be a function.
    """
    seconds = valid_recheck(recheck_seconds)
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
        self.parts: tuple[Callable[[], object], ...] = parts
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

    def _subscribe(self, subscriber: _filekeys.Subscriber) -> bool:
        if self._evaluate is not self.parts:
            return False
        # A list, not a generator: every part registers, even after one
        # that cannot push (a spare notification only costs a slow call).
        pushed = [subscribe(part, subscriber) for part in self.parts]
        return all(pushed)

    def __repr__(self) -> str:
        """Show the parts' reprs (names and paths, never values)."""
        return f"poolkeeper.keys.KeyTuple({self.parts!r})"


@final
class _Kept:
    """A pushed key's value, evaluated again only after it changed.

    The part of a polled tuple that can push: it subscribes to its key like
    a singleton does, so the tuple's every-call cost is its other parts.
    """

    __slots__ = ("__weakref__", "_epoch", "_key", "_pushed", "_value")

    def __init__(self, key: EnvKey | FileKey | KeyTuple) -> None:
        self._key = key
        self._value: object = _UNSEEN
        self._epoch = 0
        self._pushed = subscribe(key, self)

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


def subscribe(key: object, subscriber: _filekeys.Subscriber) -> bool:
    """Have *key*'s changes pushed to *subscriber*; say whether they will be.

    Internal: called by the drivers once per singleton. A key that cannot
    push (a plain function, a tuple holding one, ``recheck_seconds=0``)
    returns False and is evaluated on every call.
    """
    if isinstance(key, _PUSHABLE):
        return key._subscribe(subscriber)
    return False
