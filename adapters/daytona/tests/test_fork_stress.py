"""Forks at random moments while threads use the Daytona clients: no hang.

A forked child inherits every lock as it was at the fork, held or not, and
none of the threads that held them: the SDK's, urllib3's, the Socket.IO
client's, logging's, poolkeeper's. Here 32 threads create, use and delete
sandboxes on the emulator through one ``daytona_client()`` keyed by its key
file (rotated now and then, so clients are retired and closed while the
forks happen); the main thread forks at random moments. Each
child builds its own client, creates a sandbox, closes everything and
exits. Every child must exit 0 within the deadline: one that hangs is
killed with SIGABRT, so that faulthandler prints its stacks.

``POOLKEEPER_DAYTONA_FORK_STRESS`` sets the number of forks (default 8).

No async client here: a retired async client held open by its sandboxes
is closed on its loop once they are gone, and a loop that ends while that
close runs cancels it (asyncio.run cancels every task at its end), leaving
an aiohttp connection unclosed. The core's fork stress forks while an async
singleton is used.
"""

from __future__ import annotations

import os
import random
import threading
import time
import warnings
from typing import TYPE_CHECKING

import poolkeeper
import pytest
from daytona import SandboxState
from daytona_test_helpers import wait_child

from poolkeeper_daytona import daytona_client

if TYPE_CHECKING:
    from typing_extensions import Self

FORKS = int(os.environ.get("POOLKEEPER_DAYTONA_FORK_STRESS", "8"))
THREADS = 32
#: How long a child may take: build, create, close (a loaded machine).
CHILD_DEADLINE = 60.0
JOIN = 60.0

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()"),
    pytest.mark.timeout(120 + FORKS * 10),
    # Python 3.12+ warns when forking with threads alive: on purpose here.
    pytest.mark.filterwarnings(
        "ignore:This process .* is multi-threaded:DeprecationWarning"
    ),
]


def _child() -> int:
    """In the child: a client of its own, one create, everything closed."""
    client = daytona_client()
    state = client.create().state
    poolkeeper.close_all()
    return 0 if state == SandboxState.STARTED else 3


def _fork() -> int:
    """Fork; return the child's exit code (-6 if it had to be aborted)."""
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", DeprecationWarning)
        pid = os.fork()
    if pid == 0:  # pragma: no cover -- reported through the exit code.
        code = 2
        try:
            code = _child()
        except BaseException:  # The exit code says it.
            code = 4
        finally:
            os._exit(code)
    return wait_child(pid, CHILD_DEADLINE)


class _Load:
    """Threads and a loop using the clients until stopped."""

    def __init__(self, key_file) -> None:
        self.key_file = key_file
        self.stop = threading.Event()
        self.errors: list[BaseException] = []
        self.rounds = 0
        self.threads = [
            threading.Thread(target=self._sync, name=f"fork-load-{n}")
            for n in range(THREADS)
        ]
        self.threads.append(
            threading.Thread(target=self._rotate, name="fork-load-keys")
        )

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(JOIN)
            assert not thread.is_alive(), thread.name

    def _sync(self) -> None:
        try:
            while not self.stop.is_set():
                # Leased: a rotation never closes it under the two calls.
                with daytona_client.lease() as client:
                    client.delete(client.create())
                self.rounds += 1
        except BaseException as exc:  # Asserted empty.
            self.errors.append(exc)

    def _rotate(self) -> None:
        # Replaced whole, as a secret mount does: never seen half written.
        n = 0
        fresh = self.key_file.with_name("api_key.new")
        while not self.stop.wait(0.5):
            n += 1
            fresh.write_text(f"fork-stress-{n % 3}\n")
            fresh.replace(self.key_file)


def test_no_child_forked_at_a_random_moment_hangs(sdk_env, tmp_path):
    """Every child builds its own client and exits 0, in time."""
    key_file = tmp_path / "api_key"
    key_file.write_text("fork-stress-0\n")
    assert daytona_client() is not None
    codes: list[int] = []
    with _Load(key_file) as load:
        for _ in range(FORKS):
            time.sleep(random.uniform(0, 0.2))  # A moment.
            codes.append(_fork())
    assert [] == load.errors
    assert [0] * FORKS == codes
    assert load.rounds > 0
