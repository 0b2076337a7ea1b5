"""The registry: orphaned singletons are closed without ever blocking."""

from __future__ import annotations

import gc
import threading

from helpers import WAIT, FakeClient

from poolkeeper import process_singleton


class TestOrphans:
    def test_orphan_with_a_busy_lock_is_closed_at_the_next_registration(
        self,
    ):
        """The collector never waits for a lock: the close is put off."""
        single = process_singleton(FakeClient)
        client = single()
        # The lifecycle's lock is the documented seam: a thread holding it
        # stands for any transition in progress when the collector runs.
        lock = single._self_life.lock
        held, release = threading.Event(), threading.Event()

        def hold():
            with lock:
                held.set()
                assert release.wait(WAIT)

        thread = threading.Thread(target=hold)
        thread.start()
        try:
            assert held.wait(WAIT)
            del single
            gc.collect()
            assert not client.closed  # Put off, not waited for.
        finally:
            release.set()
            thread.join(WAIT)
        assert not thread.is_alive()
        assert not client.closed
        process_singleton(FakeClient)  # Any registration drains orphans.
        assert client.closed
