"""``fork="keep"``: a kept client keeps its healing timers in the child.

A child that keeps its parent's client (``fork="keep"``) used to lose every
timer: its ``max_age``, its next ``check=`` probe, a deferred retirement or
reset never happened there, so a kept client was never aged out, probed or
replaced. The timers are entries of the process's one heap (see
``_timers``); the fork hook keeps the kept clients' entries, at their
deadlines, on a timer thread of the child's own, and drops the others.

Each child checks that the client it holds was built by the parent (the
fork came before any deadline), then that the timer ran in the child: the
client is replaced there and closed there, once.
"""

from __future__ import annotations

import os
import threading

import pytest
from helpers import WAIT, Factory, FakeClient, fork_and_check, wait_until

from poolkeeper import _lifecycle, _timers, process_singleton

#: Longer than a fork takes on a loaded machine; short enough to wait for.
DEADLINE = 1.5


@pytest.fixture(autouse=True)
def _short_backoff(monkeypatch):
    monkeypatch.setattr(_lifecycle, "BACKOFF_FIRST", 0.2)
    monkeypatch.setattr(_lifecycle, "BACKOFF_CAP", 0.8)


def _replaced_in_child(single, kept: FakeClient, parent: int) -> bool:
    """In the child: *kept* (the parent's) is replaced and closed here."""
    if kept.pid != parent or single.current() is not kept:
        return False
    if not wait_until(lambda: single() is not kept, WAIT):
        return False
    # Closed once, here (a kept client is the child's to close).
    return wait_until(lambda: kept.closes == [os.getpid()], WAIT)


class TestKeptClientsKeepTheirTimers:
    def test_max_age_ages_the_kept_client_out_in_the_child(self):
        single = process_singleton(max_age=DEADLINE, fork="keep")(Factory())
        client = single()
        parent = os.getpid()

        def child() -> bool:
            if not _replaced_in_child(single, client, parent):
                return False
            return single.statistics().retirements["max_age"] == 1

        assert 0 == fork_and_check(child)
        single.reset()

    def test_the_next_probe_happens_in_the_child(self):
        parent = os.getpid()
        probed_in: list[int] = []

        def check(client: FakeClient) -> bool:
            probed_in.append(os.getpid())
            return os.getpid() == parent  # The child's probe fails.

        single = process_singleton(
            check=check, check_every=DEADLINE, fork="keep"
        )(Factory())
        client = single()

        def child() -> bool:
            if not _replaced_in_child(single, client, parent):
                return False
            stats = single.statistics()
            return (
                os.getpid() in probed_in
                and stats.retirements["check"] == 1
                and stats.probe_failures == 1
            )

        assert 0 == fork_and_check(child)
        single.reset()

    @pytest.mark.parametrize("how", ["reset", "retire"])
    def test_a_deferred_retirement_is_carried_out_in_the_child(self, how):
        """Within the rebuild interval, or the backoff: deferred, then done."""
        single = process_singleton(min_rebuild_interval=DEADLINE, fork="keep")(
            Factory()
        )
        client = single()
        if how == "reset":
            single.reset()
            assert single.statistics().resets_refused == 1
        else:
            # The first heal after a build is spaced by the backoff; make
            # the spacing the deadline's.
            single._self_slot.spacing = DEADLINE
            assert not single.retire(client)
        assert single.current() is client  # Deferred, not done.
        parent = os.getpid()

        assert 0 == fork_and_check(
            lambda: _replaced_in_child(single, client, parent)
        )
        single.reset()

    def test_a_probe_running_at_the_fork_is_due_again_in_the_child(self):
        """The prober is a parent thread: the child probes at its next call."""
        gate = threading.Event()
        entered = threading.Event()
        parent = os.getpid()

        def check(client: FakeClient) -> bool:
            if os.getpid() != parent:
                return False
            entered.set()
            assert gate.wait(WAIT)
            return True

        single = process_singleton(check=check, check_every=0.05, fork="keep")(
            Factory()
        )
        client = single()
        prober = threading.Thread(
            target=lambda: wait_until(lambda: single() and entered.is_set())
        )
        prober.start()

        def child() -> bool:
            if not _replaced_in_child(single, client, parent):
                return False
            return single.statistics().retirements["check"] == 1

        try:
            assert entered.wait(WAIT)
            assert 0 == fork_and_check(child)
        finally:
            gate.set()
            prober.join(WAIT)
        assert not prober.is_alive()
        single.reset()


class TestAbandonedClientsLoseTheirTimers:
    def test_only_the_kept_clients_timers_are_left_in_the_child(self):
        kept = process_singleton(max_age=3600, fork="keep")(Factory())
        dropped = process_singleton(max_age=3600)(Factory())
        kept_client, dropped_client = kept(), dropped()
        kept_slot, dropped_slot = kept._self_slot, dropped._self_slot

        def child() -> bool:
            owners = {timer.owner for timer in _timers.alive()}
            threads = [
                t
                for t in threading.enumerate()
                if t.name == _timers.THREAD_NAME
            ]
            return (
                kept_slot in owners
                and dropped_slot not in owners
                and len(threads) == 1
                and kept.current() is kept_client
                and dropped() is not dropped_client
            )

        try:
            assert 0 == fork_and_check(child)
        finally:
            kept.reset()
            dropped.reset()
        assert kept_client.closes == [os.getpid()]
        assert dropped_client.closes == [os.getpid()]
