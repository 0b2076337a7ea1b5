"""Test doubles and synchronisation helpers shared by the tests."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import os
import signal
import sys
import sysconfig
import threading
import warnings
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

WAIT = 30.0  # Upper bound, in seconds, on every wait in the tests.

# A free-threaded build (python3.14t): no GIL, so no singleton takes the
# lock-free steps made for the GIL (poolkeeper._lifecycle.gil).
FREE_THREADED = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))

# For a test (or a parametrisation) about the GIL's lock-free steps: a
# free-threaded build never takes them and cannot be made to.
gil_paths_only = pytest.mark.skipif(
    FREE_THREADED,
    reason="about the lock-free steps made for the GIL, which a"
    " free-threaded build never takes",
)


def made_as_free_threaded(monkeypatch) -> None:
    """Make singletons from now on as a free-threaded build makes them.

    They take the lock instead of the lock-free steps, as they do on a
    free-threaded build even when its GIL is on (see _lifecycle.gil).
    """
    from poolkeeper import _lifecycle

    monkeypatch.setattr(_lifecycle, "FREE_THREADED", True)


# Parametrises a test's gil argument: True makes singletons as a build
# with the GIL makes them (skipped on a free-threaded build), False as a
# free-threaded build makes them (see made_as_free_threaded).
GIL_PARAMS = [
    pytest.param(True, id="gil", marks=gil_paths_only),
    pytest.param(False, id="no-gil"),
]


class FakeClient:
    """A client that records who built it and every close() call."""

    def __init__(self, label: object = None) -> None:
        self.label = label
        self.pid = os.getpid()
        self.thread = threading.get_ident()
        self.closes: list[int] = []

    @property
    def closed(self) -> bool:
        return bool(self.closes)

    def close(self) -> None:
        self.closes.append(os.getpid())


class NoCloseClient:
    """A client without a close() method."""


@dataclass
class Factory:
    """A factory that counts builds and can block or fail on demand."""

    gate: threading.Event | None = None
    entered: threading.Event = field(default_factory=threading.Event)
    fail_with: BaseException | None = None
    built: list[FakeClient] = field(default_factory=list)
    calls: int = 0
    label: object = None

    def __call__(self) -> FakeClient:
        self.calls += 1
        self.entered.set()
        if self.gate is not None:
            assert self.gate.wait(WAIT), "factory gate never opened"
        if self.fail_with is not None:
            raise self.fail_with
        client = FakeClient(self.label)
        self.built.append(client)
        return client


def run_threads(target, n: int) -> list[object]:
    """Run *target* in *n* threads released together; return results."""
    barrier = threading.Barrier(n)
    results: list[object] = [None] * n

    def worker(i: int) -> None:
        barrier.wait(WAIT)
        try:
            results[i] = target()
        except BaseException as exc:
            results[i] = exc

    threads = [threading.Thread(target=worker, args=(i,)) for i in range(n)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(WAIT)
        assert not t.is_alive(), "worker thread hung"
    return results


def wait_until(predicate, timeout: float = WAIT) -> bool:
    """Poll *predicate* until it holds or *timeout* passes."""
    done = threading.Event()
    deadline = timeout
    step = 0.005
    while deadline > 0:
        if predicate():
            return True
        done.wait(step)
        deadline -= step
    return bool(predicate())


def _fresh_streams() -> None:
    """In a forked child: logging's file streams, and stdio, made anew.

    A buffered file's lock is not reset at a fork (CPython resets
    logging's handler locks, not the io buffers under them): a parent
    thread writing to one at the fork leaves it held for ever, and the
    child's first log record hangs in its flush (CI saw it: pytest's
    log-file handler, on /dev/null, under a timer thread's WARNING). Each
    gets a new buffer on the same file descriptor.
    """
    import io
    import logging

    def fresh(stream):
        if not isinstance(stream, io.TextIOWrapper):
            return stream
        try:
            return open(
                stream.fileno(),
                "w",
                buffering=1,  # Flushed by line: the child ends in _exit.
                encoding=stream.encoding,
                errors=stream.errors,
                closefd=False,
            )
        except (OSError, ValueError):
            return stream

    loggers = [
        logging.getLogger(),
        *logging.Logger.manager.loggerDict.values(),
    ]
    for logger in loggers:
        for handler in getattr(logger, "handlers", ()):
            if isinstance(handler, logging.StreamHandler):
                handler.stream = fresh(handler.stream)
    sys.stdout, sys.stderr = fresh(sys.stdout), fresh(sys.stderr)


@contextlib.contextmanager
def held_in_retirement(
    name: str, reason: str, event: str = "retired"
) -> Iterator[threading.Event]:
    """Hold the thread retiring singleton *name*'s client for *reason*.

    poolkeeper logs a retirement (*event* "retired"), or its deferral
    ("deferred"), after deciding it and before closing the client or
    starting the deferral's timer: a handler on the "poolkeeper" logger
    holds that thread in its log line (this process only, bounded by WAIT)
    until the block exits. Other singletons' events (another test's, still
    ageing) pass. Yields the event set once a thread is held.
    """
    parent = os.getpid()
    held, released = threading.Event(), threading.Event()
    wanted = (name, event, reason)

    class Hold(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            said = tuple(
                getattr(record, f"poolkeeper_{field}", None)
                for field in ("singleton", "event", "reason")
            )
            if said == wanted and os.getpid() == parent:
                held.set()
                released.wait(WAIT)

    hold = Hold()
    logger = logging.getLogger("poolkeeper")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(hold)
    try:
        yield held
    finally:
        released.set()
        logger.removeHandler(hold)
        logger.setLevel(level)


def fork_and_check(child) -> int:
    """Run *child* in a real forked process; return its exit code.

    The child exits 0 if *child()* returns true, 1 if false, 2 on error.
    """
    with warnings.catch_warnings():
        # Python 3.12+ warns when forking with threads alive; these tests
        # fork with threads alive on purpose.
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover -- runs in the child.
        code = 2
        try:
            _fresh_streams()
            code = 0 if child() else 1
        except BaseException:
            import traceback

            traceback.print_exc()
        finally:
            os._exit(code)
    deadline = WAIT * 3
    step = 0.01
    while deadline > 0:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        threading.Event().wait(step)
        deadline -= step
    # Hung, maybe before its own code ran (in a fork hook): SIGABRT makes
    # faulthandler (pytest enables it; the child inherits its handler)
    # print every thread's stack to fd 2 first.
    os.kill(pid, signal.SIGABRT)
    for _ in range(500):
        if os.waitpid(pid, os.WNOHANG)[0]:
            return -9
        threading.Event().wait(0.01)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -9


def blocked_in(function: str, n: int, timeout: float = WAIT) -> bool:
    """Wait until *n* threads are blocked in a ``wait()`` under *function*.

    Forces a race instead of hoping for it: the test proceeds only once
    the other callers are provably waiting, whatever the scheduler did.
    A builder waiting inside the factory (under ``_build``) is not one of
    them: it is building, not waiting for a build.
    """

    def count() -> int:
        found = 0
        for frame in sys._current_frames().values():
            if frame.f_code.co_name != "wait":
                continue
            back = frame.f_back
            while back is not None and back.f_code.co_name != "_build":
                if back.f_code.co_name == function:
                    found += 1
                    break
                back = back.f_back
        return found

    return wait_until(lambda: count() >= n, timeout)


class LoopThread:
    """An event loop running in a thread of its own until stopped."""

    def __init__(self) -> None:
        self.loop = asyncio.new_event_loop()
        self.thread = threading.Thread(target=self.loop.run_forever)
        self.thread.start()

    def run(self, coro):
        """Run *coro* on the loop and return its result."""
        return asyncio.run_coroutine_threadsafe(coro, self.loop).result(WAIT)

    def stop(self) -> None:
        """Stop the loop, join the thread and close the loop."""
        self.loop.call_soon_threadsafe(self.loop.stop)
        self.thread.join(WAIT)
        assert not self.thread.is_alive()
        self.loop.close()
