"""Forks at random moments while threads use singletons: no child hangs.

A forked child inherits every lock in the state it was at the fork, held
or not, and none of the threads that held them. Threads here keep using a
sync singleton keyed by ``keys.env`` and ``keys.file`` (read on every call,
so its lock is taken all the time), with healing on (``check=``,
``max_age=``, ``retire_on``), an async singleton on a loop of its own, and
a writer rotating the key; the main thread forks at random moments. Each
child calls both singletons (building its own clients), reads the key,
closes everything and exits. The parent requires every child to exit 0
within the deadline: a hung child (a lock held by a thread that is not in
the child) fails the test, its stacks dumped by faulthandler.

``POOLKEEPER_FORK_STRESS`` sets the number of forks (default 60; ``make
stress`` runs more).
"""

from __future__ import annotations

import asyncio
import contextlib
import os
import random
import threading
import time
from typing import TYPE_CHECKING

import pytest
from helpers import WAIT, fork_and_check

import poolkeeper
from poolkeeper import keys, process_singleton

if TYPE_CHECKING:
    from typing_extensions import Self

FORKS = int(os.environ.get("POOLKEEPER_FORK_STRESS", "60"))
NAME = "PK_FORK_STRESS"

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()"),
    pytest.mark.timeout(max(120, FORKS * 3)),
]


class BrokenError(Exception):
    """What a client raises now and then: retire_on matches it."""


class Client:
    """A client whose build and close take a moment, as real ones do."""

    def __init__(self) -> None:
        time.sleep(0.001)
        self.pid = os.getpid()
        self.closed = False

    def use(self) -> None:
        if random.random() < 0.02:
            raise BrokenError

    def close(self) -> None:
        time.sleep(0.001)
        self.closed = True

    async def aclose(self) -> None:
        await asyncio.sleep(0.001)
        self.closed = True


async def _amake() -> Client:
    await asyncio.sleep(0.001)
    return Client()


class Made:
    """An object made from a client (poolkeeper.made_from holds it open)."""

    def __init__(self, client: Client) -> None:
        self.client = client


class Workload:
    """Threads using the singletons, a writer rotating the key, a loop."""

    def __init__(
        self, single: object, asingle: object, kept: object, path: object
    ) -> None:
        self.single, self.asingle, self.path = single, asingle, path
        self.kept = kept
        self.stop = threading.Event()
        self.loop = asyncio.new_event_loop()
        self.threads = [
            threading.Thread(target=self.loop.run_forever, name="stress-loop"),
            *(threading.Thread(target=self.caller) for _ in range(3)),
            threading.Thread(target=self.keeper),
            threading.Thread(target=self.writer),
        ]

    def caller(self) -> None:
        while not self.stop.is_set():
            with contextlib.suppress(BrokenError), self.single.lease() as c:
                c.use()

    def keeper(self) -> None:
        """The fork="keep" singleton, and objects made from its clients."""
        made: list[Made] = []
        while not self.stop.is_set():
            with self.kept.lease() as client:
                made.append(poolkeeper.made_from(Made(client), client))
            if len(made) > 8:
                del made[: random.randrange(8)]
            time.sleep(0.0005)

    async def acaller(self) -> None:
        while not self.stop.is_set():
            await self.asingle()
            await asyncio.sleep(0.0005)

    def writer(self) -> None:
        n = 0
        while not self.stop.is_set():
            n += 1
            os.environ[NAME] = f"v{n % 3}"
            self.path.write_text(f"key {n % 2}")
            time.sleep(0.003)

    def __enter__(self) -> Self:
        for thread in self.threads:
            thread.start()
        self.task = asyncio.run_coroutine_threadsafe(self.acaller(), self.loop)
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.stop.set()
        self.task.result(WAIT)
        done = asyncio.run_coroutine_threadsafe(
            poolkeeper.aclose_all(), self.loop
        )
        done.result(WAIT)
        self.loop.call_soon_threadsafe(self.loop.stop)
        for thread in self.threads:
            thread.join(WAIT)
        self.loop.close()


def test_no_child_forked_at_a_random_moment_hangs(tmp_path):
    path = tmp_path / "key"
    path.write_text("one")
    os.environ[NAME] = "a"
    healing = {
        "check": lambda c: not c.closed,
        "check_every": 0.01,
        "max_age": 0.05,
        "retire_on": BrokenError,
    }
    single = process_singleton(
        key=(keys.env(NAME), keys.file(path, recheck_seconds=0)), **healing
    )(Client)
    asingle = process_singleton(key=keys.env(NAME), **healing)(_amake)
    # Its clients, their timers and the objects made from them are kept
    # by a child: its max_age timer ages the parent's client out there.
    kept = process_singleton(fork="keep", **healing)(Client)

    async def achild() -> Client:
        client = await asingle()
        await poolkeeper.aclose_all()
        return client

    def child() -> bool:
        client = single()
        assert client.pid == os.getpid()
        assert single.current() is client
        assert asyncio.run(achild()).pid == os.getpid()
        deadline = time.monotonic() + WAIT
        while kept().pid != os.getpid():
            assert time.monotonic() < deadline, "the kept client never aged"
            time.sleep(0.005)
        poolkeeper.close_all()
        return True

    try:
        with Workload(single, asingle, kept, path):
            codes = []
            for _ in range(FORKS):
                time.sleep(random.uniform(0, 0.01))
                codes.append(fork_and_check(child))
                assert codes[-1] != -9, f"a child hung (fork {len(codes)})"
        assert [0] * FORKS == codes
    finally:
        os.environ.pop(NAME, None)
