"""The sync lease's guarantees under exceptions and races, forced."""

from __future__ import annotations

import gc
import linecache
import sys
import threading
import time

import pytest
from attack import Inject, Pause
from helpers import (
    GIL_PARAMS,
    WAIT,
    Factory,
    FakeClient,
    gil_paths_only,
    made_as_free_threaded,
)

from poolkeeper import close_all, process_singleton

#: Functions of the close path (poolkeeper/_close.py, the adapters' hook
#: lookup it makes, and the counter it reports to): an exception there
#: propagates, by the close path's contract.
CLOSE_PATH = {
    "close",
    "_start",
    "_resolve",
    "learn",  # _adapters: the adapter's close for the client's type.
    "_done",
    "closed",
    "_extra",
    "run",
    "claim",
    "cancel_timers",  # _records: a closed client's max_age/probe timers.
    "_begin",
    "owe",
    "owes",
    "<genexpr>",
}

#: The lines ``__exit__`` opens with, before any statement of it runs.
OPENING = ("try:", "try:")


def traced(inject: Inject, step):
    """Run *step* in a thread under *inject*; return what it raised.

    Garbage collection is held off meanwhile: a dropped singleton's
    finalizer would otherwise run, and be cut, in the traced thread.
    """
    box: list[BaseException | None] = []
    gc.disable()

    def main():
        # Coverage traces this thread too: put its tracer back after.
        previous = sys.gettrace()
        sys.settrace(inject.tracer)
        inject.armed = True
        try:
            step()
        except BaseException as exc:
            box.append(exc)
        else:
            box.append(None)
        finally:
            sys.settrace(previous)

    thread = threading.Thread(target=main)
    try:
        thread.start()
        thread.join(WAIT)
    finally:
        gc.enable()
    assert not thread.is_alive(), "thread hung"
    return box[0]


def every_line(cut, exc) -> list[str]:
    """Call ``cut(n, exc)`` for n = 1, 2, ... until nothing fires."""
    fired = []
    for n in range(1, 1000):
        where = cut(n, exc)
        if where is None:
            return fired
        fired.append(where)
    raise AssertionError("the injection never stopped firing")


def _built():
    factory = Factory()
    single = process_singleton(factory)
    single()
    single()  # Armed: the lease's fast path.
    return single, factory


def _cut_enter(n, exc, *, fresh):
    """Inject at the n-th line of entering a lease (fresh: nothing built)."""
    factory = Factory()
    single = process_singleton(factory)
    if not fresh:
        single()
        single()
    lease = single.lease()
    inject = Inject(n, exc)
    box: list[object] = []
    raised = traced(inject, lambda: box.append(lease.__enter__()))
    if raised is None:
        assert [single()] == box
        assert 1 == single.statistics().leases
        lease.__exit__(None, None, None)
    else:
        assert isinstance(raised, exc)
    # Nothing stays pinned: a reset closes every client now, once.
    assert 0 == single.statistics().leases
    single.reset()
    for client in factory.built:
        assert [client.closes[0]] == client.closes
    return inject.fired


def _cut_exit(n, exc, *, retired):
    """Inject at the n-th line of a lease's exit (retired: after reset)."""
    single, _ = _built()
    lease = single.lease()
    client = lease.__enter__()
    if retired:
        single.reset()
        assert not client.closed
    inject = Inject(n, exc)
    raised = traced(inject, lambda: lease.__exit__(None, None, None))
    assert raised is None or isinstance(raised, exc)
    stats = single.statistics()
    assert (0, 0) == (stats.leases, stats.pending_close), inject.fired
    # Closed once when retired, unless the exception cut the close hook's
    # own path short (the close path's contract: it propagates).
    where = (inject.fired or ":").split(":")[0].split("/")[0]
    in_close = where in CLOSE_PATH
    expected = (0,) if not retired else (0, 1) if in_close else (1,)
    assert len(client.closes) in expected, inject.fired
    # The next close of this singleton does a close that was cut short
    # before it began (still owed); none runs twice. An Exception in the
    # close path before the hook ran is that close's failure: counted, and
    # the client dropped.
    single.reset()
    failures = single.statistics().close_failures
    assert 1 == len(client.closes) + failures, inject.fired
    return inject.fired


@pytest.fixture(name="gil", params=GIL_PARAMS)
def _gil(request, monkeypatch):
    """Make singletons as with the GIL on, and as on a free-threaded build.

    Without it, leases pin and unpin under the lifecycle's lock. (On a
    build with the GIL, the GIL is still there: this runs those paths, it
    cannot show them right without one; a free-threaded build can.)
    """
    if not request.param:
        made_as_free_threaded(monkeypatch)
    return request.param


class TestLeaseUnderInjectedExceptions:
    @pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
    @pytest.mark.parametrize("fresh", [False, True], ids=["armed", "build"])
    def test_enter_cut_at_every_line_leaks_no_pin(self, exc, fresh, gil):
        """An exception at any line of enter: pinned and returned, or not."""
        fired = every_line(lambda n, e: _cut_enter(n, e, fresh=fresh), exc)
        assert any("__enter__" in where for where in fired)

    @pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
    @pytest.mark.parametrize("retired", [False, True], ids=["live", "retired"])
    def test_exit_cut_at_every_later_line_ends_the_pin(
        self, exc, retired, gil
    ):
        """An exception at any line of exit once it runs: the pin ends once.

        The ``try`` lines that open ``__exit__`` are the exception (see
        the next test): raised there, no statement of the exit has run, as
        for any ``with`` statement's exit.
        """

        def cut(n, e):
            return _cut_exit(n + len(OPENING), e, retired=retired)

        fired = every_line(cut, exc)
        assert any("__exit__" in where for where in fired)
        if retired:
            assert any("_finish" in where for where in fired)
            assert any("unpin" in where for where in fired)

    def test_exit_opens_with_its_try_lines_only(self):
        """What the test above skips: the two ``try:`` lines, nothing else."""
        single, _ = _built()
        lease = single.lease()
        lease.__enter__()
        seen: list[str] = []

        def tracer(frame, event, arg):
            if frame.f_code.co_name != "__exit__":
                return None

            def line(frame, event, arg):
                if event == "line":
                    seen.append(
                        linecache.getline(
                            frame.f_code.co_filename, frame.f_lineno
                        ).strip()
                    )
                return line

            return line

        # Coverage traces this thread too: put its tracer back after.
        previous = sys.gettrace()
        sys.settrace(tracer)
        try:
            lease.__exit__(None, None, None)
        finally:
            sys.settrace(previous)
        assert list(OPENING) == seen[: len(OPENING)]
        assert "try:" not in seen[len(OPENING) :]
        assert 0 == single.statistics().leases


def _stopped_lease(single, at: str, function: str = "__enter__"):
    """Start a lease in a thread, stopped in *function* at *at*.

    Returns the pause (reached), the thread, and the box that gets what the
    lease yielded, whether it was closed then, and the statistics then.
    """
    pause = Pause(function, at)
    box: list[object] = []

    def lease():
        with single.lease() as leased:
            box.append((leased, leased.closed, single.statistics()))

    thread = threading.Thread(target=pause.run(lease))
    thread.start()
    assert pause.reached.wait(WAIT)
    return pause, thread, box


class TestLeaseRaces:
    def test_reset_between_hit_and_pin_pins_the_new_client(self, gil):
        """reset() after the lease's hit, before its pin: it pins anew.

        no-gil: the pin is made under the lock, after the hit.
        """
        single, _ = _built()
        first = single()
        if gil:
            at = ("self.pin = record", "__enter__")
        else:
            at = ("if under(life.lock, life.pin, slot,", "_enter")
        pause, thread, box = _stopped_lease(single, *at)
        assert single.reset()
        pause.release.set()
        thread.join(WAIT)
        assert not thread.is_alive()
        leased, was_closed, stats = box[0]
        assert leased is not first
        assert first.closed
        assert not was_closed
        assert 1 == stats.leases
        assert 0 == single.statistics().leases

    @gil_paths_only  # Without the GIL, the pin and the flag are one step.
    def test_reset_between_pin_and_flag_closes_once_and_pins_anew(self):
        """reset() after the pin, before the flag is read: it sees the pin.

        The retirement counts the lease, so it does not close the client;
        the lease finds the record closed to pins, ends its pin (the last:
        it closes the client, once) and pins the new client instead.
        """
        single, factory = _built()
        first = single()
        pause, thread, box = _stopped_lease(single, "if record.open:")
        assert single.reset()
        assert not first.closed  # The retirement saw the pin.
        assert 1 == single.statistics().pending_close
        pause.release.set()
        thread.join(WAIT)
        assert not thread.is_alive()
        leased, was_closed, stats = box[0]
        assert leased is not first
        assert leased is factory.built[-1]
        assert 1 == len(first.closes)
        assert not was_closed
        assert (1, 0) == (stats.leases, stats.pending_close)
        assert 0 == single.statistics().leases

    def test_retirement_cut_after_closing_to_pins_leaves_leases_working(
        self, gil
    ):
        """An exception right after ``_retire`` closes a record to pins.

        The reset raises and the client stays live; the next lease pins it
        under the lock and opens it again, and the one after pins without.
        no-gil: every lease pins under the lock, and never opens it.
        """
        single, _ = _built()
        client = single()
        record = single._self_slot.live
        inject = Inject(1, KeyboardInterrupt, after="old.open = False")
        assert isinstance(traced(inject, single.reset), KeyboardInterrupt)
        assert inject.fired
        assert (record, False) == (single._self_slot.live, record.open)
        with single.lease() as leased:
            assert leased is client
            assert gil is record.open
        with single.lease() as leased:
            assert leased is client
        assert (0, 0) == (single.statistics().leases, len(client.closes))

    def test_retire_between_unpin_and_close_closes_once(self):
        """Two leases on a retired client exiting together: one close."""
        single, _ = _built()
        leases = [single.lease() for _ in range(2)]
        client = leases[0].__enter__()
        assert client is leases[1].__enter__()
        single.reset()
        pause = Pause("__exit__", "record.pins.pop(self, None)")
        thread = threading.Thread(
            target=pause.run(lambda: leases[0].__exit__(None, None, None))
        )
        thread.start()
        assert pause.reached.wait(WAIT)
        leases[1].__exit__(None, None, None)  # Not the last: no close.
        assert not client.closed
        pause.release.set()
        thread.join(WAIT)
        assert not thread.is_alive()
        assert 1 == len(client.closes)

    def test_many_threads_leasing_through_resets(self, gil):
        """Leases never see a closed client; every retired one closes once."""
        factory = Factory()
        single = process_singleton(factory)
        assert gil is single._self_life.lock_free
        stop = threading.Event()
        bad: list[object] = []

        def leaser():
            for _ in range(2000):
                if stop.is_set():
                    return
                with single.lease() as client:
                    if client.closed:
                        bad.append(client)

        threads = [threading.Thread(target=leaser) for _ in range(4)]
        for thread in threads:
            thread.start()
        for _ in range(300):
            single.reset()
            # A breath between resets: back to back, they can outrun a
            # caller for MAX_ROUNDS rounds (it then gives up, by design);
            # this test is about what leases see, not about that bound.
            time.sleep(0.001)
        stop.set()
        for thread in threads:
            thread.join(WAIT)
            assert not thread.is_alive()
        close_all()
        assert [] == bad
        assert 0 == single.statistics().leases
        for client in factory.built:
            assert 1 == len(client.closes)


class TestLeaseObject:
    def test_entered_twice_even_after_exit(self):
        """A lease object is entered once: again is a RuntimeError."""
        single, _ = _built()
        lease = single.lease()
        with lease:
            pass
        with pytest.raises(RuntimeError, match="entered once"):
            lease.__enter__()
        assert 0 == single.statistics().leases

    def test_entering_a_lease_again_inside_it_keeps_its_pin(self):
        """A second enter, refused, leaves the first one's pin in place.

        The refusal ended the pin of the lease still in use, so a reset
        closed the client under the with block.
        """
        single, _ = _built()
        lease = single.lease()
        with lease as client:
            with pytest.raises(RuntimeError, match="entered once"):
                lease.__enter__()
            assert 1 == single.statistics().leases
            assert single.reset()
            assert not client.closed
        assert 1 == len(client.closes)
        assert 0 == single.statistics().leases

    def test_override_lease_is_entered_once_too(self):
        """An overridden lease pins nothing and is still entered once."""
        single, _ = _built()
        fake = FakeClient()
        with single.override(fake):
            lease = single.lease()
            assert fake is lease.__enter__()
            with pytest.raises(RuntimeError, match="entered once"):
                lease.__enter__()
            lease.__exit__(None, None, None)
        assert 0 == single.statistics().leases

    def test_making_a_lease_pins_nothing(self):
        """lease() alone pins nothing; exit without enter does nothing."""
        single, _ = _built()
        lease = single.lease()
        lease.__exit__(None, None, None)
        assert 0 == single.statistics().leases
        single.reset()
        assert 1 == single.statistics().closes
