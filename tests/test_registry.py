"""The registry: orphaned singletons are closed without ever blocking."""

from __future__ import annotations

import gc
import sys
import threading

import pytest
from attack import AfterCall, join, no_collector, run
from helpers import WAIT, FakeClient

from poolkeeper import _registry, close_all, process_singleton


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


def _free(lock) -> bool:
    """Whether another thread can take *lock* now (it is an RLock)."""
    thread, box = run(
        lambda: lock.acquire(blocking=False) and [lock.release()]
    )
    join(thread)
    return bool(box[0])


class TestOrphanCloseInterrupted:
    def test_a_signal_after_any_call_leaves_the_lock_free(self):
        """A KeyboardInterrupt where a signal can land never keeps the lock.

        The orphan close takes the singleton's lock without blocking; an
        exception right after any call it makes (as a signal handler's,
        which CPython runs when a call returns) must not leave the lock
        held, and close_all() still closes the orphan's client, once.
        """
        drain = _registry._drain.__code__
        fired: list[str] = []
        for n in range(1, 100):
            single = process_singleton(FakeClient)
            client = single()
            life = single._self_life
            entry = next(e for e in _registry._entries if e.life is life)
            entry.orphaned = True
            _registry._orphans.append(entry)
            inject = AfterCall(drain, n, KeyboardInterrupt)
            with no_collector():
                # Coverage traces this thread too: put its tracer back.
                previous = sys.gettrace()
                sys.settrace(inject.tracer)
                try:
                    _registry._drain()
                except KeyboardInterrupt:
                    pass
                finally:
                    sys.settrace(previous)
            assert _free(life.lock), inject.fired
            if entry in _registry._orphans:
                _registry._orphans.remove(entry)
            close_all()
            assert 1 == len(client.closes), inject.fired
            if inject.fired is None:
                break  # Past the last call: a cut after each was tried.
            fired.append(inject.fired)
        else:
            pytest.fail("the orphan close made more calls than swept")
        assert any("acquire" in point for point in fired), fired
