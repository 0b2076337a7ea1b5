"""File keys: ``keys.file``'s key, and the thread that looks at them.

:class:`FileKey` is defined here and re-exported by
:mod:`poolkeeper.keys`, where it is documented (see
:func:`poolkeeper.keys.file`). Only a fingerprint of the content is kept,
never the content itself.

A ``keys.file`` key would otherwise be polled on every call. Instead, each
singleton using one subscribes its lifecycle here, and the file-key thread
calls the key's ``_refresh()`` every ``recheck_seconds``. The key compares
what it sees (a ``stat()`` signature, re-reading the file only when that
changed) with what it last saw, and when its value changed it calls
:func:`changed`, which disarms the subscribed singletons' hit paths: their
next call evaluates the key again on the slow path.

The thread starts at the first read of a subscribed key (a build's: a
singleton subscribes when it is decorated, maybe at import, and nothing
needs watching before a client is built) and exits as soon as no key has a
living subscriber (subscribers are held weakly); the next read starts it
again. It never raises: a key whose refresh fails
is logged (once per streak of failures) and its subscribers are disarmed,
so their next call evaluates the key and meets the error itself, as with a
polled key.

It takes no lock that a hit takes: only this module's registry lock, the
key's own lock, and a lifecycle's lock inside ``invalidate()``. The only
user code it runs is a ``keys.file`` path function, and never under a
lifecycle's lock (``invalidate()`` runs none).

After a fork the child has no file-key thread. The runtime's fork hook
(in :mod:`._registry`) calls :func:`after_fork_in_child`, which only
resets this module's state (no join, no lock); the next slow-path call of
a pushed file key (every singleton's first call in the child is one)
starts a new thread through :func:`ensure`.
"""

from __future__ import annotations

import logging
import os
import stat
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Final, Protocol, cast, final

from poolkeeper._events import failure
from poolkeeper._fingerprint import fingerprint

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("poolkeeper")

# The longest the thread sleeps without looking at its schedule again, and
# the shortest interval it honours (a recheck_seconds of 0 is polled).
_MAX_SLEEP = 1.0
_MIN_INTERVAL = 0.01


class Subscriber(Protocol):
    """What a key notifies: a singleton's lifecycle."""

    def invalidate(self) -> None:
        """Disarm the hit path; the next call evaluates the key."""


class _Entry:
    """One pushed file key: its subscribers (weakly), when it was looked at."""

    __slots__ = ("failing", "looked", "subscribers")

    def __init__(self, looked: float) -> None:
        self.subscribers: weakref.WeakSet[Subscriber] = weakref.WeakSet()
        self.looked = looked
        self.failing = False


_entries: dict[FileKey, _Entry] = {}
# The forks this process has seen (the fork hook counts them): a key whose
# lock was made before the last one makes a fresh lock (FileKey._fresh).
_forks = 0
# Guards _entries and _thread; never held while a key is refreshed.
_lock = threading.Lock()
_wake = threading.Event()
_thread: threading.Thread | None = None


def subscribe(key: FileKey, subscriber: Subscriber) -> None:
    """Check *key* every ``recheck_seconds``; tell *subscriber* of changes.

    Starts no thread: a singleton subscribes when it is decorated, often at
    import, in a process that may never build it. The key's first read
    (the first build's) starts the file-key thread: until a client was
    built from the key, no change of it needs telling.
    """
    with _lock:
        entry = _entries.get(key)
        if entry is None:
            entry = _entries[key] = _Entry(time.monotonic())
        entry.subscribers.add(subscriber)
    _wake.set()


def changed(key: FileKey) -> None:
    """Disarm every singleton subscribed to *key*: its value changed."""
    # Copied under the lock: a registration on another thread must not
    # change the set while it is iterated.
    with _lock:
        entry = _entries.get(key)
        subscribers = [] if entry is None else list(entry.subscribers)
    for subscriber in subscribers:
        subscriber.invalidate()


def ensure() -> None:
    """Start the thread if keys have subscribers but none runs (after fork)."""
    if _thread is None and _entries:
        with _lock:
            _start()


def wake() -> None:
    """Make the thread look at its schedule now (an interval changed)."""
    _wake.set()


def _start() -> None:
    # Under _lock. The thread clears _thread under the same lock when it
    # exits, so a registration either sees it running or starts another.
    global _thread  # noqa: PLW0603 -- the one file-key thread of the process.
    if _thread is not None or not _entries:
        return
    _thread = threading.Thread(
        target=_run, name="poolkeeper-filekeys", daemon=True
    )
    _thread.start()


def _due() -> list[tuple[FileKey, _Entry]] | None:
    """Return the live entries, or None after retiring the thread."""
    global _thread  # noqa: PLW0603 -- the one file-key thread of the process.
    with _lock:
        for key in [k for k, e in _entries.items() if not e.subscribers]:
            del _entries[key]
        if not _entries:
            _thread = None
            return None
        return list(_entries.items())


def _run() -> None:
    me = threading.current_thread()
    while _thread is me:
        # Cleared before looking: a registration made while this pass runs
        # sets it again, so the wait below returns at once.
        _wake.clear()
        entries = _due()
        if entries is None:
            return
        wake_at = time.monotonic() + _MAX_SLEEP
        for key, entry in entries:
            # Read on every pass, so a changed interval applies at once.
            interval = max(key.recheck_seconds, _MIN_INTERVAL)
            if time.monotonic() >= entry.looked + interval:
                _refresh(key, entry)
                entry.looked = time.monotonic()
            wake_at = min(wake_at, entry.looked + interval)
        _wake.wait(max(wake_at - time.monotonic(), 0.0))


def _refresh(key: FileKey, entry: _Entry) -> None:
    try:
        key._refresh()
    except Exception as exc:  # noqa: BLE001 -- said, then the next call.
        if not entry.failing:
            failure(
                log,
                f"Checking the key {key!r} failed; its singletons evaluate "
                "it on their next call.",
                exc,
            )
        entry.failing = True
        try:
            changed(key)
        except Exception:
            log.debug("Disarming after a failed look failed.", exc_info=True)
    else:
        entry.failing = False


def after_fork_in_child() -> None:
    """Forget the parent's thread and locks (the runtime's fork hook)."""
    # The parent's thread does not exist here and its lock may be held:
    # fresh ones, nothing joined. So may each key's own lock (the thread,
    # or a call on another thread, was looking at the file at the fork):
    # each key makes itself a fresh one at its first look in this process
    # (see FileKey._fresh). The keys stay registered; ensure() starts a
    # thread on the child's first slow-path call of one. No lock taken:
    # one thread runs here.
    global _lock, _wake, _thread, _forks  # noqa: PLW0603 -- see above.
    _lock = threading.Lock()
    _wake = threading.Event()
    _thread = None
    _forks += 1


# The state of a file key that was never looked at.
_UNSEEN: Final[Any] = object()


@final
class FileKey:
    """The content of a file, re-read only when it changes; see :func:`file`.

    Only a fingerprint of the content is kept, never the content itself.
    """

    __slots__ = (
        "_fork",
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
        self._fork = _forks  # The forks its lock was made after.
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
        wake()

    def __call__(self) -> tuple[str, str | None]:
        """Return ``(path, fingerprint of the content or None if absent)``."""
        if self._pushed:
            # Pushed: only slow paths get here (a build, first). Starts
            # the file-key thread the first time, and in a forked child.
            ensure()
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

    def _fresh(self) -> None:
        """In a forked child: replace the lock made in the parent.

        A parent thread may have held it at the fork; that thread is not
        here to release it. Made once, under the module's lock (fresh in
        the child): the lock first, then the count that says it is new.
        """
        with _lock:
            if self._fork != _forks:
                self._lock = threading.Lock()
                self._fork = _forks

    def _look(self) -> tuple[str, str | None]:
        """Stat the file, re-read it if it changed, notify if the value did."""
        if self._fork != _forks:
            self._fresh()
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
                changed(self)
            return cast("tuple[str, str | None]", value)

    def _refresh(self) -> None:
        """Look now, whatever the schedule (for the file-key thread)."""
        self._look()

    def _subscribe(self, subscriber: Subscriber) -> bool:
        """Have changes pushed to *subscriber*; say whether they will be."""
        if self._recheck <= 0:
            return False
        self._pushed = True
        subscribe(self, subscriber)
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


def valid_recheck(seconds: float) -> float:
    """Return *seconds* as a float; raise ValueError if negative."""
    if not seconds >= 0:
        msg = f"keys.file() needs recheck_seconds >= 0, got {seconds}."
        raise ValueError(msg)
    return float(seconds)
