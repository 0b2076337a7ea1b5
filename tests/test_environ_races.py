"""Concurrent writes of a watched variable: the last one is always noticed."""

from __future__ import annotations

import os

import pytest
from attack import Pause, join, run
from helpers import WAIT

from poolkeeper import keys, process_singleton

NAME = "PK_ENV_RACE"


@pytest.fixture(name="env")
def _env(monkeypatch):
    monkeypatch.setenv(NAME, "a")
    yield os.environ
    os.environ.pop(NAME, None)


class TestConcurrentWrites:
    def test_a_write_back_to_the_old_value_is_noticed(self, env):
        """a -> b (served) -> a by a writer that read "a" first: not stale."""
        single = process_singleton(key=keys.env(NAME))(
            lambda: os.environ.get(NAME)
        )
        assert "a" == single()
        # This writer reads the value before it ("a") and pauses there.
        pause = Pause("set_and_notify", "os.putenv(name, encoded)")
        writer, _ = run(pause.run(lambda: env.__setitem__(NAME, "a")))
        assert pause.reached.wait(WAIT)
        env[NAME] = "b"
        assert "b" == single()  # Built for "b", and the hit path armed.
        pause.release.set()
        join(writer)
        assert "a" == env[NAME]
        assert "a" == single()
