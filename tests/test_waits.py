"""Waiting for another thread's build: polled, bounded, never stranded."""

from __future__ import annotations

import threading

from helpers import WAIT, Factory, blocked_in

from poolkeeper import process_singleton
from poolkeeper._builds import POLL


class TestLongWait:
    def test_waiter_outlasting_many_polls_gets_the_built_client(self):
        """A waiter that re-checks its build many times still gets it."""
        gate = threading.Event()
        factory = Factory(gate=gate)
        single = process_singleton(factory)
        results: list[object] = []
        builder = threading.Thread(target=lambda: results.append(single()))
        builder.start()
        assert factory.entered.wait(WAIT)
        waiter = threading.Thread(target=lambda: results.append(single()))
        waiter.start()
        # The waiter waits for the build (the builder is in its factory).
        assert blocked_in("_acquire", 1)
        # Several poll periods pass while the build is still running.
        assert not gate.wait(POLL * 4)
        gate.set()
        for thread in (builder, waiter):
            thread.join(WAIT)
            assert not thread.is_alive()
        assert 1 == factory.calls
        assert 2 == len(results)
        assert results[0] is results[1]
