"""Behaviour 1, forced: no call returns a client whose close has started.

Under ``keys.env`` rotation a build for an older key can finish after a
client for a newer key went live and was armed on the hit path; that build
retires (and closes) the newer client. Replacing a live client must disarm
first, so while that close runs every call takes the slow path.
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


class TestOlderBuildFinishingLast:
    def test_newer_client_closed_by_an_older_build_is_never_served(self, env):
        """An A build finishing after B went live: no call gets B closing."""
        built: list[Client] = []
        in_close = threading.Event()
        finish_close = threading.Event()

        def factory() -> Client:
            client = Client()
            built.append(client)
            return client

        def close(client: Client) -> None:
            client.close_started = True
            if client is built[1]:  # B's first client: hold its close.
                in_close.set()
                assert finish_close.wait(WAIT), "close never released"

        single = process_singleton(key=keys.env(NAME), close=close)(factory)
        env[NAME] = "A"
        a1 = single()
        env[NAME] = "other"  # Disarms, so the next call is slow (a
        env[NAME] = "A"  # write of the same value would not).
        # The A caller reads key A, then stops before asking the lifecycle.
        pause = Pause("_acquire", "step = life.request(")
        box: list[object] = []
        caller = threading.Thread(
            target=pause.run(lambda: box.append(single()))
        )
        caller.start()
        try:
            assert pause.reached.wait(WAIT)
            env[NAME] = "B"
            b1 = single()  # Built, live, and armed by this second call:
            assert b1 is single()
            assert ("B",) == _live_key(single)
            assert a1.close_started
            # The A caller resumes: its build finishes last, retires B1, and
            # its thread stops inside B1's close.
            pause.release.set()
            assert in_close.wait(WAIT)
            assert built[2] is single._self_slot.live.client
            assert ("A",) == _live_key(single)
            assert b1.close_started
            # While B1's close runs, every call gets a client not closing.
            served = [single() for _ in range(5)]
            assert b1 not in served, "served a closing client"
            assert not any(c.close_started for c in served)
            assert [built[3]] * 5 == served
            assert ("B",) == _live_key(single)
        finally:
            pause.release.set()
            finish_close.set()
            _join(caller)
        # The A caller got what was live when it returned, never B1.
        (got,) = box
        assert isinstance(got, Client)
        assert got is not b1
        assert not got.close_started
        # The scenario really happened: A1, B1, A2, B2 built (and perhaps
        # A3 for the stale caller), every displaced one closed once.
        assert len(built) >= 4
        live = single._self_slot.live.client
        assert all(c.close_started for c in built if c is not live)

    def test_without_disarming_the_close_would_be_served(self, env):
        """The test above fails if built() forgets to disarm first."""
        from poolkeeper import _lifecycle

        original = _lifecycle.Lifecycle.built
        source = original.__wrapped__  # type: ignore[attr-defined]

        def careless(self, *args):
            arm = self.arm
            self.arm = lambda *_: True  # Never disarms here.
            try:
                with self.lock:
                    source(self, *args)
            finally:
                self.arm = arm

        _lifecycle.Lifecycle.built = careless  # type: ignore[method-assign]
        try:
            with pytest.raises(
                AssertionError, match="served a closing client"
            ):
                self.test_newer_client_closed_by_an_older_build_is_never_served(
                    env
                )
        finally:
            _lifecycle.Lifecycle.built = original  # type: ignore[method-assign]
