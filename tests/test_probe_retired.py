"""A call that probes returns only a client that is live when it returns.

While a slow ``check=`` runs on one thread (the call that probes), another
thread calls ``reset()``, ``retire(c)``, rotates the key, or runs
``close_all()`` / ``aclose_all()``. The probing call used to return the
client it probed, retired meanwhile and closed once its probe ended. Now it
asks again: it gets the client live after the retirement (built for it).
Sync and async; every wait bounded.
"""

from __future__ import annotations

import asyncio
import os
import threading

import pytest
from helpers import WAIT

import poolkeeper
from poolkeeper import keys, process_singleton

NAME = "PK_PROBE_RETIRED"
HOUR = 3600.0


class Client:
    """A client that records its close."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True

    async def aclose(self) -> None:
        self.closed = True


class Gate:
    """A check that blocks its first run until released, then passes."""

    def __init__(self) -> None:
        self.entered = threading.Event()
        self.release = threading.Event()
        self.runs = 0

    def __call__(self, client: object) -> bool:
        self.runs += 1
        if self.runs == 1:
            self.entered.set()
            assert self.release.wait(WAIT), "the probe was never released"
        return True


def _due(single, slot=None) -> None:
    """Make the live client's probe due now, as its timer would."""
    slot = slot or single._self_slot
    live = slot.live
    assert single._self_life.due(slot, live.sequence, live.probes)


def _rotate() -> None:
    os.environ[NAME] = "two"


ACTIONS = {
    "reset": lambda single, old: single.reset(),
    "retire": lambda single, old: single.retire(old),
    "rotation": lambda single, old: _rotate(),
    "close_all": lambda single, old: poolkeeper.close_all(),
}


@pytest.fixture(autouse=True)
def _env():
    os.environ[NAME] = "one"
    yield
    os.environ.pop(NAME, None)


@pytest.mark.parametrize("action", sorted(ACTIONS))
def test_sync_call_never_returns_a_client_retired_during_its_probe(action):
    gate = Gate()
    single = process_singleton(
        key=keys.env(NAME), check=gate, check_every=HOUR
    )(Client)
    old = single()
    _due(single)
    box: list[object] = []
    caller = threading.Thread(target=lambda: box.append(single()))
    caller.start()
    try:
        assert gate.entered.wait(WAIT)
        ACTIONS[action](single, old)
        if action == "rotation":
            # The rotation's build replaces the client under the probe.
            assert single() is not old
    finally:
        gate.release.set()
        caller.join(WAIT)
    assert not caller.is_alive()
    (got,) = box
    assert got is not old, f"{action}: returned the client retired mid-probe"
    assert old.closed
    assert not got.closed
    assert got is single()


@pytest.mark.parametrize(
    "action", ["reset", "retire", "rotation", "aclose_all"]
)
def test_async_call_never_returns_a_client_retired_during_its_probe(action):
    """The probing task awaits a check on the loop; a thread acts meanwhile.

    The loop keeps running during the probe (its check awaits an event set
    from the thread), so the thread's action runs on the loop when it must.
    """

    async def main() -> None:
        entered, release = asyncio.Event(), asyncio.Event()
        runs = []

        async def check(client: object) -> bool:
            runs.append(client)
            if len(runs) == 1:
                entered.set()
                await asyncio.wait_for(release.wait(), WAIT)
            return True

        async def make() -> Client:
            return Client()

        single = process_singleton(
            key=keys.env(NAME), check=check, check_every=HOUR
        )(make)
        old = await single()
        _due(single, single._self_life.slots[id(asyncio.get_running_loop())])
        probing = asyncio.create_task(single())
        await asyncio.wait_for(entered.wait(), WAIT)
        if action == "reset":
            await single.reset()
        elif action == "retire":
            await single.retire(old)
        elif action == "rotation":
            _rotate()
            assert await single() is not old
        else:
            await poolkeeper.aclose_all()
        release.set()
        got = await asyncio.wait_for(probing, WAIT)
        assert got is not old, f"{action}: returned the client retired"
        assert old.closed
        assert not got.closed
        assert got is await single()
        await poolkeeper.aclose_all()

    asyncio.run(main())
