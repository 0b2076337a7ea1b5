"""Probes shared by the adapter's tests."""

from __future__ import annotations

import gc
import os
import signal
import subprocess
import sys
import threading
import time
from typing import TYPE_CHECKING

import pytest

from poolkeeper_daytona.testing import DaytonaEmulator

if TYPE_CHECKING:
    from pathlib import Path


#: For the modules that break TLS connections on purpose. The SDK's
#: Socket.IO client (engine.io over websocket-client) does not close the
#: socket of a websocket whose connection broke: the garbage collector's
#: cycle pass does, with a ResourceWarning, whenever it runs, which may be
#: in a later test (CI saw an ``unclosed <ssl.SSLSocket>`` fail an async
#: test on 3.13, with no async code making such sockets). Such a module
#: allows that warning, and collects its garbage when it ends (the
#: ``dropped_tls_websockets`` fixture), so that none is left to a later
#: module. What the adapter leaves open is counted by the fd and thread
#: checks, which no warning filter changes.
UNCLOSED_TLS_SOCKET = "unclosed <ssl.SSLSocket"
DROPPED_TLS_WEBSOCKETS = [
    pytest.mark.filterwarnings(
        f"ignore:{UNCLOSED_TLS_SOCKET}:ResourceWarning"
    ),
    pytest.mark.usefixtures("dropped_tls_websockets"),
]


def fd_count() -> int:
    """Return the number of open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))  # noqa: PTH208 -- a count.


def settle() -> None:
    """Collect garbage, so only resources something still holds remain."""
    gc.collect()
    gc.collect()


def quiet() -> None:
    """Collect garbage and wait (bounded) for poolkeeper's timer threads.

    They end when no timer is left: those of earlier tests' clients, and
    the sweep of objects made from clients (poolkeeper.made_from), which
    ends once they are collected. A test that counts threads starts then.
    """
    ours = {"poolkeeper-timers", "poolkeeper-retire"}
    settle()
    wait_for(lambda: not any(t.name in ours for t in threading.enumerate()), 5)


def wait_for(predicate, timeout: float = 5.0) -> bool:
    """Poll *predicate* for at most *timeout* seconds."""
    return DaytonaEmulator.wait_until(predicate, timeout)


def run_pytest(
    directory: Path, *options: str, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    """Run pytest on *directory* in a process of its own (bounded)."""
    return subprocess.run(
        [
            sys.executable,
            "-m",
            "pytest",
            "-q",
            "-p",
            "no:cacheprovider",
            "-p",
            "no:randomly",
            "-W",
            "error",
            *options,
            "--rootdir",
            str(directory),
            str(directory),
        ],
        cwd=directory,
        env=env,
        capture_output=True,
        text=True,
        timeout=180,
        check=False,
    )


def use_sandbox(sandbox, word: str) -> None:
    """Run what sandbox code runs on *sandbox*; every call must succeed.

    A command (``process.exec``) and a keep-alive (``refresh_activity``),
    as a training loop's episode and keep-alive thread do.
    """
    response = sandbox.process.exec(f"echo {word}")
    assert (0, f"{word}\n") == (response.exit_code, response.result)
    sandbox.refresh_activity()


async def ause_sandbox(sandbox, word: str) -> None:
    """:func:`use_sandbox` for an ``AsyncSandbox``."""
    response = await sandbox.process.exec(f"echo {word}")
    assert (0, f"{word}\n") == (response.exit_code, response.result)
    await sandbox.refresh_activity()


def sandbox_calls(emulator, sandbox_id: str) -> list[tuple[str, str, int]]:
    """Return (method, what, status) of each request on *sandbox_id*.

    *what* is the path after the sandbox id: ``""`` for the sandbox
    itself, ``"/process/execute"``, ``"/last-activity"``, ...
    """
    return [
        (r.method, r.path.partition(sandbox_id)[2], r.status)
        for r in emulator.requests()
        if sandbox_id in r.path
    ]


def wait_child(pid: int, timeout: float) -> int:
    """Return the forked child's exit code; abort it if it outlives *timeout*.

    A hung child gets SIGABRT first (faulthandler, which pytest enables and
    the child inherits, prints its stacks), then SIGKILL; -6 is returned.
    """
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        done, status = os.waitpid(pid, os.WNOHANG)
        if done:
            return os.waitstatus_to_exitcode(status)
        time.sleep(0.01)
    os.kill(pid, signal.SIGABRT)
    time.sleep(1.0)
    os.kill(pid, signal.SIGKILL)
    os.waitpid(pid, 0)
    return -6
