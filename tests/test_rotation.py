"""Behaviour 1, forced: a call with a stale key never builds over a newer one.

Under ``keys.env`` rotation a call can read the key just before a write
and ask the lifecycle only after a client for the new value went live
(and was armed on the hit path). It used to build for its stale value and
retire (close) the newer client; callers of the new value then retired
its client in turn, a build storm (tests/test_rotation_storm.py). Now it
reads the key again and is served the newer client.
"""

from __future__ import annotations

import os
import threading

import pytest
from attack import Pause
from helpers import WAIT

from poolkeeper import keys, process_singleton

NAME = "PK_ROT_KEY"


class Client:
    """A client that records when its close started."""

    def __init__(self) -> None:
        self.close_started = False


@pytest.fixture(name="env")
def _env(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    yield os.environ
    os.environ.pop(NAME, None)


def _live_key(single: object) -> object:
    return single._self_slot.live.key.value  # type: ignore[attr-defined]


def _join(*threads: threading.Thread) -> None:
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive(), "thread hung"


class TestStaleReadNeverBuilds:
    def _paused_caller(self, single):
        """A caller that read the key, stopped before asking the lifecycle."""
        pause = Pause("ask", "step = life.request(")
        box: list[object] = []
        caller = threading.Thread(
            target=pause.run(lambda: box.append(single()))
        )
        caller.start()
        assert pause.reached.wait(WAIT)
        return pause, caller, box

    def test_a_call_that_read_before_a_write_gets_the_newer_client(self, env):
        """A read, then B built and armed: the A caller is served B."""
        built: list[Client] = []

        def factory() -> Client:
            client = Client()
            built.append(client)
            return client

        def close(client: Client) -> None:
            client.close_started = True

        single = process_singleton(key=keys.env(NAME), close=close)(factory)
        env[NAME] = "A"
        a1 = single()
        env[NAME] = "other"  # Disarms, so the next call is slow (a
        env[NAME] = "A"  # write of the same value would not).
        pause, caller, box = self._paused_caller(single)
        try:
            env[NAME] = "B"
            b1 = single()  # Built, live, and armed by this second call:
            assert b1 is single()
            assert a1.close_started
        finally:
            pause.release.set()
            _join(caller)
        # The A caller read its key again: served B1, built nothing.
        assert [b1] == box
        assert [a1, b1] == built
        assert not b1.close_started
        assert ("B",) == _live_key(single)
        assert b1 is single()

    def test_a_value_written_over_is_not_built_after_the_key_came_back(
        self, env
    ):
        """A, then B read by a caller, then A again: no B is built.

        The B caller's read began after A1's read ended, but a write came
        after it (the epoch moved): its value is older than the live
        client's, whose value is current again, and armed again.
        """
        built: list[Client] = []

        def factory() -> Client:
            client = Client()
            built.append(client)
            return client

        def close(client: Client) -> None:
            client.close_started = True

        single = process_singleton(key=keys.env(NAME), close=close)(factory)
        env[NAME] = "A"
        a1 = single()
        env[NAME] = "B"
        pause, caller, box = self._paused_caller(single)
        try:
            env[NAME] = "A"
            assert a1 is single()  # Served and armed again: A is current.
            assert a1 is single()
        finally:
            pause.release.set()
            _join(caller)
        assert [a1] == box
        assert [a1] == built
        assert not a1.close_started
