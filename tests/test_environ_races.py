"""Concurrent writes of a watched variable: the last one is always noticed."""

from __future__ import annotations

import os
import sys

import pytest
from attack import Inject, Pause, join, no_collector, run
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


def _cut(n: int, write) -> str | None:
    """Run *write* with a KeyboardInterrupt at poolkeeper's *n*-th line."""
    inject = Inject(n, KeyboardInterrupt)
    with no_collector():
        # Coverage traces this thread too: put its tracer back after.
        previous = sys.gettrace()
        sys.settrace(inject.tracer)
        try:
            inject.armed = True
            write()
        except KeyboardInterrupt:
            pass
        finally:
            sys.settrace(previous)
    return inject.fired


class TestWriteCutShort:
    """A write cut short after its store still outdates the old client."""

    @pytest.mark.parametrize("op", ["set", "del"])
    def test_every_line(self, env, op):
        """Cut at each line of the write: what was stored is what is served.

        Issue 9, item 2: once the store happened, no call starting after
        the write (even one that raised) returns a client built for the
        value before it.
        """

        def write() -> None:
            if op == "set":
                env[NAME] = "b"
            else:
                del env[NAME]

        single = process_singleton(key=keys.env(NAME))(
            lambda: [os.environ.get(NAME)]
        )
        stored_cuts = 0
        for n in range(1, 200):
            env[NAME] = "a"
            assert ["a"] == single()
            assert ["a"] == single()  # Armed: no key read on a hit.
            fired = _cut(n, write)
            if fired is None:
                break  # Past the write's last line: every line was cut.
            stored = env.get(NAME)
            stored_cuts += stored != "a"
            assert [stored] == single(), fired
            assert [stored] == single(), fired
        else:
            pytest.fail("the write ran more lines than the sweep covers")
        assert stored_cuts > 0
