"""A key rotated under callers: one build per value, never an older one.

Eight threads call a ``keys.env`` singleton while the variable is written
20 times, 50 ms apart, each time a new value. A call that read the key
just before a write used to build for that stale value, retire the newer
client and loop on with the same value, while the fresh callers retired
its client in turn: 327-641 builds with a ``check=``, 392 with a
``max_age`` whose timer never fires, and ``PoolkeeperError`` ("changed
... before each of 100 builds could be served") with a close that sleeps
2 ms. Anything that lets another thread run between a call's key read
and its build opened it, so the fakes here are slow: a build and a close
that sleep, timers started per build.

The rule asserted: the values built are in the order they were written,
each at most once (so at most one build per write, plus the first), and
no call fails.
"""

from __future__ import annotations

import asyncio
import logging
import os
import threading
import time

import pytest
from helpers import WAIT

import poolkeeper
from poolkeeper import keys, process_singleton
from poolkeeper._identity import key_fingerprint

NAME = "PK_STORM_KEY"
ROTATIONS = 20
CALLERS = 8


class Client:
    """A client that counts its closes."""

    def __init__(self) -> None:
        self.closes = 0


class Fakes:
    """A factory and a close as slow as asked; what they built and closed."""

    def __init__(self, build_s: float, close_s: float) -> None:
        self.build_s, self.close_s = build_s, close_s
        self.built: list[Client] = []

    def factory(self) -> Client:
        time.sleep(self.build_s)
        client = Client()
        self.built.append(client)
        return client

    def close(self, client: Client) -> None:
        time.sleep(self.close_s)
        client.closes += 1


def _callers(single: object, stop: threading.Event) -> tuple[list, list]:
    """Start CALLERS threads calling *single* until *stop*; their errors."""
    errors: list[BaseException] = []

    def caller() -> None:
        try:
            while not stop.is_set():
                single()
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=caller) for _ in range(CALLERS)]
    for thread in threads:
        thread.start()
    return threads, errors


def _rotate(
    options: dict[str, object], *, build_s: float, close_s: float
) -> tuple[list[BaseException], list[Client]]:
    fakes = Fakes(build_s, close_s)
    os.environ[NAME] = "v00"
    single = process_singleton(
        key=keys.env(NAME), close=fakes.close, **options
    )(fakes.factory)
    single()
    stop = threading.Event()
    threads, errors = _callers(single, stop)
    try:
        for n in range(1, ROTATIONS + 1):
            time.sleep(0.05)
            os.environ[NAME] = f"v{n:02}"
        time.sleep(0.05)
    finally:
        stop.set()
        for thread in threads:
            thread.join(WAIT)
    assert not any(t.is_alive() for t in threads), "a caller hung"
    # A last call serves the last value's client, built already.
    assert single() is fakes.built[-1]
    return errors, fakes.built


def _values_built(records: list[logging.LogRecord]) -> list[int]:
    """The value (its number) each build was for, from the built events.

    A build's key is in its event as a fingerprint only; the values are
    known, so each fingerprint maps back to its value's number.
    """
    numbers = {
        key_fingerprint(True, (f"v{n:02}",)): n for n in range(ROTATIONS + 1)
    }
    built = sorted(
        (r.poolkeeper_generation, numbers[r.poolkeeper_key])
        for r in records
        if getattr(r, "poolkeeper_event", None) == "built"
    )
    # In the order of the builds (their generations), not of the events:
    # a thread may log its build's event after the next build's.
    return [number for _, number in built]


@pytest.fixture(autouse=True)
def _env():
    yield
    os.environ.pop(NAME, None)


@pytest.mark.parametrize(
    ("options", "build_s", "close_s"),
    [
        pytest.param({}, 0.0, 0.0, id="instant"),
        pytest.param({}, 0.0, 0.002, id="close-2ms"),
        pytest.param({}, 0.003, 0.0, id="build-3ms"),
        pytest.param(
            {"check": lambda c: True, "check_every": 0.5}, 0.0, 0.0, id="check"
        ),
        pytest.param({"max_age": 3600}, 0.0, 0.0, id="max_age"),
        pytest.param(
            {"check": lambda c: True, "check_every": 0.5, "max_age": 3600},
            0.003,
            0.002,
            id="all",
        ),
    ],
)
def test_one_build_per_value_in_the_order_written(
    options, build_s, close_s, caplog
):
    caplog.set_level(logging.DEBUG, logger="poolkeeper")
    errors, built = _rotate(options, build_s=build_s, close_s=close_s)
    assert [] == errors
    values = _values_built(caplog.records)
    assert len(values) == len(built)
    # Strictly increasing: never a value older than the one built before
    # it (which would retire the newer client), never one built twice.
    assert values == sorted(set(values)), str(values)
    assert len(values) <= ROTATIONS + 1
    # Every client but the live one was closed, once.
    assert all(c.closes == 1 for c in built[:-1]), [c.closes for c in built]


class AsyncFakes(Fakes):
    """The same, async: the close awaits, the build awaits."""

    async def afactory(self) -> Client:
        await asyncio.sleep(self.build_s)
        client = Client()
        self.built.append(client)
        return client

    async def aclose(self, client: Client) -> None:
        await asyncio.sleep(self.close_s)
        client.closes += 1


def test_async_tasks_build_once_per_value(caplog):
    """Eight tasks on one loop; the writes come from another thread.

    The async driver awaits nothing between its key read and its request,
    so tasks of one loop cannot read a stale key there: this guards that
    (an await added there would open the storm to tasks too).
    """
    caplog.set_level(logging.DEBUG, logger="poolkeeper")
    fakes = AsyncFakes(0.003, 0.002)
    os.environ[NAME] = "v00"
    single = process_singleton(
        key=keys.env(NAME),
        close=fakes.aclose,
        check=lambda c: True,
        check_every=0.5,
        max_age=3600,
    )(fakes.afactory)

    def rotate() -> None:
        for n in range(1, ROTATIONS + 1):
            time.sleep(0.05)
            os.environ[NAME] = f"v{n:02}"
        time.sleep(0.05)

    async def main() -> list[BaseException | Client]:
        await single()
        stop = asyncio.Event()

        async def caller() -> None:
            while not stop.is_set():
                await single()
                await asyncio.sleep(0)

        tasks = [asyncio.create_task(caller()) for _ in range(CALLERS)]
        await asyncio.to_thread(rotate)
        stop.set()
        done = await asyncio.gather(*tasks, return_exceptions=True)
        last = await single()
        await poolkeeper.aclose_all()
        return [*[d for d in done if d is not None], last]

    *errors, last = asyncio.run(asyncio.wait_for(main(), WAIT * 3))
    assert [] == errors
    assert last is fakes.built[-1]
    values = _values_built(caplog.records)
    assert values == sorted(set(values)), str(values)
    assert values[-1] == ROTATIONS
    assert all(c.closes == 1 for c in fakes.built), [
        c.closes for c in fakes.built
    ]
