"""A watched write racing a call that arms the hit path: never stale.

``invalidate()`` stores the new epoch, then reads ``armed`` without the
lock; a call arming stores ``armed``, then reads the epoch again before it
switches the hit path on. These tests stop the arming call between its
first check of the epoch and its store of ``armed`` (the interleaving in
which the write sees nothing armed and returns at once), let the write
return, and check that no call starting afterwards gets the old client.
"""

from __future__ import annotations

import asyncio
import os
import sys

import pytest
from attack import Pause, join, run
from helpers import GIL_PARAMS, WAIT, made_as_free_threaded

from poolkeeper import keys, process_singleton

NAME = "PK_ARMING_RACE"


@pytest.fixture(name="env")
def _env(monkeypatch):
    """os.environ, with NAME at "a" (as monkeypatch leaves it after)."""
    monkeypatch.setenv(NAME, "a")
    return os.environ


def _disarmed_but_matching(env, single) -> None:
    # Away and back: the hit path is disarmed, the live client matches,
    # so the next call asks the lifecycle, which arms.
    env[NAME] = "b"
    env[NAME] = "a"


class TestSyncArming:
    @pytest.mark.parametrize("gil", GIL_PARAMS)
    def test_write_while_a_call_arms_is_never_missed(
        self, env, gil, monkeypatch
    ):
        """A call stopped before it stores armed; a write returns: fresh.

        no-gil: made as on a free-threaded build, the write moves the epoch
        under the lock, so it waits for the stopped call instead.
        """
        if not gil:
            made_as_free_threaded(monkeypatch)
        single = process_singleton(key=keys.env(NAME))(
            lambda: [os.environ.get(NAME)]
        )
        assert gil is single._self_life.lock_free
        first = single()
        assert ["a"] == first
        _disarmed_but_matching(env, single)
        pause = Pause("_arm", "before, self.armed = self.armed, client")
        caller, box = run(pause.run(single))
        assert pause.reached.wait(WAIT)
        writer, _ = run(lambda: env.__setitem__(NAME, "c"))
        if gil:
            join(writer)  # Sees nothing armed: returns without the lock.
        pause.release.set()
        join(caller, writer)
        # The stopped call read its key before the write: the old client
        # is a fair answer for it. Not for any call after the write.
        assert [first] == box
        assert ["c"] == single()
        assert ["c"] == single()  # And the hit path, if armed, agrees.


class TestAsyncArming:
    @pytest.mark.parametrize("gil", GIL_PARAMS)
    def test_write_while_a_loop_arms_is_never_missed(
        self, env, gil, monkeypatch
    ):
        """The same, for an async singleton's per-loop hit path.

        no-gil: made as on a free-threaded build, the write waits for the
        stopped call's lock, so the call goes on before the write returns.
        """
        if not gil:
            made_as_free_threaded(monkeypatch)

        @process_singleton(key=keys.env(NAME))
        async def single():
            return [os.environ.get(NAME)]

        assert gil is single._self_life.lock_free
        pause = Pause("_arm", "before, self.armed = self.armed, client")

        async def main():
            first = await single()
            assert ["a"] == first
            _disarmed_but_matching(env, single)
            loop = asyncio.get_running_loop()
            # A thread waits for the call to stop (the loop with it), then
            # writes and lets it go on.
            stopped = loop.run_in_executor(
                None, _stop_and_write, pause, env, gil
            )
            served = await _traced(pause, single)
            await stopped
            assert served is first
            assert ["c"] == await single()
            assert ["c"] == await single()

        asyncio.run(main())


def _stop_and_write(pause: Pause, env, gil: bool) -> None:
    assert pause.reached.wait(WAIT)
    writer, _ = run(lambda: env.__setitem__(NAME, "c"))
    if gil:
        join(writer)  # Sees nothing armed: returns without the lock.
    pause.release.set()
    join(writer)


async def _traced(pause: Pause, single):
    # Coverage traces this thread too: put its tracer back after.
    previous = sys.gettrace()
    sys.settrace(pause.tracer)
    try:
        return await single()
    finally:
        sys.settrace(previous)
