"""Healing by age and by probe (issue 21): max_age, check, check_every.

Real threads and event loops; the timers are poolkeeper's own
(``poolkeeper-retire`` daemon threads). Every wait is bounded; timing
bounds leave room for a busy machine but fail a missing or early timer.
"""

from __future__ import annotations

import asyncio
import os
import sys
import threading
import time

import pytest
from helpers import WAIT, Factory, FakeClient, fork_and_check, wait_until
from test_hit_frames import frames_of

import poolkeeper
from poolkeeper import _healing, _lifecycle, _timers, process_singleton
from poolkeeper._records import ProbeDue

#: Slack for a busy machine (2 cores shared with other agents).
SLACK = 1.0


def _cut_once(call, inject, exc: type[BaseException]) -> None:
    """Call *call* with *inject* armed (the collector off): cut, or not."""
    from attack import no_collector

    with no_collector():
        previous = sys.gettrace()  # coverage's, when it measures.
        sys.settrace(inject.tracer)
        inject.armed = True
        try:
            call()
        except exc:
            pass
        finally:
            sys.settrace(previous)
            inject.armed = False


@pytest.fixture(name="spacing")
def _spacing(monkeypatch):
    """A small backoff: 0.2 s doubling to 0.8 s."""
    monkeypatch.setattr(_lifecycle, "BACKOFF_FIRST", 0.2)
    monkeypatch.setattr(_lifecycle, "BACKOFF_CAP", 0.8)
    return 0.2


class HttpxLike:
    """A client with httpx's ``is_closed``: user code may close it."""

    def __init__(self) -> None:
        self.is_closed = False
        self.closes = 0

    def close(self) -> None:
        self.is_closed = True
        self.closes += 1


def _replaced(single, old, timeout: float = WAIT) -> float | None:
    """Call *single* until it serves another client than *old*; when."""
    start = time.monotonic()
    if wait_until(lambda: single() is not old, timeout):
        return time.monotonic() - start
    return None


class TestMaxAge:
    def test_replaced_after_max_age_within_jitter(self, spacing):
        factory = Factory()
        single = process_singleton(max_age=0.3)(factory)
        start = time.monotonic()
        old = single()
        assert single() is old
        assert wait_until(lambda: single() is not old)
        elapsed = time.monotonic() - start
        # Not before max_age, nor long after max_age plus its 10 % jitter.
        assert 0.3 <= elapsed <= 0.33 + SLACK
        assert wait_until(lambda: old.closed)
        assert [old.pid] == old.closes
        stats = single.statistics()
        assert 1 == stats.retirements["max_age"]
        assert 2 == stats.builds

    def test_jitter_spreads_deadlines_up_to_ten_percent(self):
        limits = [_healing.age_limit(100.0) for _ in range(2000)]
        assert all(100.0 <= x <= 110.0 for x in limits)
        assert max(limits) - min(limits) > 5.0

    def test_a_lease_keeps_the_old_client_until_it_exits(self, spacing):
        factory = Factory()
        single = process_singleton(max_age=0.3)(factory)
        with single.lease() as held:
            assert _replaced(single, held) is not None
            assert not held.closed
            assert 1 == single.statistics().pending_close
        assert held.closed
        assert 0 == single.statistics().pending_close

    def test_hit_path_stays_armed_before_the_deadline(self):
        factory = Factory()
        single = process_singleton(max_age=60.0)(factory)
        client = single()
        single()  # The first hit after a build arms the hit path.
        result: list[object] = []
        assert ["<lambda>"] == frames_of(lambda: result.append(single()))
        assert [client] == result

    def test_max_age_below_the_backoff_is_deferred_by_it(self, spacing):
        # The second client's max_age (0.05 s) falls inside the backoff
        # (0.2 s) its predecessor's healing retirement started: deferred.
        factory = Factory()
        single = process_singleton(max_age=0.05)(factory)
        first = single()
        assert _replaced(single, first) is not None
        second = single()
        start = time.monotonic()
        assert _replaced(single, second) is not None
        assert time.monotonic() - start >= 0.2 - 0.06
        assert 2 <= single.statistics().retirements["max_age"]

    def test_async_replaced_and_closed_on_its_loop(self, spacing):
        factory = Factory()
        loops: list[object] = []

        async def make() -> FakeClient:
            return factory()

        def close(client: FakeClient) -> None:
            loops.append(asyncio.get_running_loop())
            client.close()

        single = process_singleton(max_age=0.3, close=close)(make)

        async def main() -> float:
            start = time.monotonic()
            old = await single()
            for _ in range(int(WAIT / 0.01)):
                if await single() is not old:
                    break
                await asyncio.sleep(0.01)
            elapsed = time.monotonic() - start
            for _ in range(int(WAIT / 0.01)):
                if old.closed:
                    break
                await asyncio.sleep(0.01)
            assert old.closed
            assert [asyncio.get_running_loop()] == loops
            return elapsed

        elapsed = asyncio.run(main())
        assert 0.3 <= elapsed <= 0.33 + SLACK
        assert 1 == single.statistics().retirements["max_age"]


class TestCheck:
    def test_closed_client_replaced_within_one_check_every(self, spacing):
        single = process_singleton(
            check=lambda c: not c.is_closed, check_every=0.2
        )(HttpxLike)
        old = single()
        # Passing probes re-arm the next one: two pass before the close.
        assert wait_until(lambda: single() and single.statistics().probes >= 2)
        assert 0 == single.statistics().probe_failures
        old.close()
        elapsed = _replaced(single, old)
        assert elapsed is not None
        assert elapsed <= 0.2 + SLACK
        stats = single.statistics()
        assert 1 == stats.probe_failures
        assert 1 == stats.retirements["check"]
        assert not single().is_closed
        assert 2 == old.closes  # The user's close, then the retirement's.

    def test_hit_path_stays_armed_between_probes(self):
        single = process_singleton(check=lambda c: True, check_every=60)(
            Factory()
        )
        client = single()
        single()
        result: list[object] = []
        assert ["<lambda>"] == frames_of(lambda: result.append(single()))
        assert [client] == result
        assert 0 == single.statistics().probes

    def test_a_probe_that_raises_retires(self, spacing):
        def check(client: FakeClient) -> bool:
            raise ConnectionError

        single = process_singleton(check=check, check_every=0.1)(Factory())
        old = single()
        assert _replaced(single, old) is not None
        assert wait_until(lambda: old.closed)
        stats = single.statistics()
        assert stats.probe_failures >= 1
        assert stats.retirements["check"] >= 1

    def test_a_lease_finds_the_probe_due(self, spacing):
        single = process_singleton(
            check=lambda c: not c.closed, check_every=0.1
        )(Factory())
        old = single()
        old.close()

        def leased() -> object:
            with single.lease() as client:
                return client

        assert wait_until(lambda: leased() is not old)
        assert 1 == single.statistics().retirements["check"]

    def test_keyboard_interrupt_in_a_probe_propagates_settled(self):
        raised = [KeyboardInterrupt()]

        def check(client: FakeClient) -> bool:
            if raised:
                raise raised.pop()
            return True

        single = process_singleton(check=check, check_every=0.1)(Factory())
        client = single()
        slot = single._self_slot
        assert wait_until(lambda: slot.probe is not None)
        with pytest.raises(KeyboardInterrupt):
            single()
        # Due again, not stuck probing; the client was not retired.
        assert (client, ProbeDue) == (slot.live.client, type(slot.probe))
        assert 0 == slot.live.leases
        assert single() is client
        stats = single.statistics()
        assert (1, 0) == (stats.probes, stats.probe_failures)

    def test_one_prober_while_sixteen_threads_call(self):
        gate = threading.Event()
        entered = threading.Event()
        probes: list[int] = []

        def check(client: FakeClient) -> bool:
            probes.append(threading.get_ident())
            entered.set()
            assert gate.wait(WAIT)
            return True

        single = process_singleton(check=check, check_every=0.1)(Factory())
        client = single()
        slot = single._self_slot
        assert wait_until(lambda: slot.probe is not None)
        barrier = threading.Barrier(16)
        results: list[object] = []

        def call() -> None:
            barrier.wait(WAIT)
            for _ in range(20):
                results.append(single())  # noqa: PERF401 -- seen one by one.

        threads = [threading.Thread(target=call) for _ in range(16)]
        for t in threads:
            t.start()
        try:
            assert entered.wait(WAIT)
            # All but the prober are served the current client meanwhile.
            assert wait_until(lambda: len(results) >= 15 * 20)
            assert 1 == len(probes)
            assert all(r is client for r in results)
        finally:
            gate.set()
            for t in threads:
                t.join(WAIT)
        assert not any(t.is_alive() for t in threads)
        assert 16 * 20 == len(results)
        assert all(r is client for r in results)
        assert 1 == single.statistics().probes
        assert 0 == single.statistics().probe_failures

    def test_async_closed_client_replaced(self, spacing):
        async def make() -> HttpxLike:
            return HttpxLike()

        single = process_singleton(
            check=lambda c: not c.is_closed, check_every=0.1
        )(make)

        async def main() -> None:
            old = await single()
            old.close()
            for _ in range(int(WAIT / 0.01)):
                if await single() is not old:
                    break
                await asyncio.sleep(0.01)
            assert await single() is not old

        asyncio.run(main())
        stats = single.statistics()
        assert 1 == stats.retirements["check"]
        assert 1 == stats.probe_failures


class TestProbeAtFork:
    def test_a_kept_client_probed_at_the_fork_closes_in_the_child(self):
        """fork="keep": a probe running on another thread at the fork.

        The child keeps the client, but not the probing thread: the
        probe's hold on the client is given back in the child, so that a
        retirement there closes it (before, it stayed held for ever).
        """
        gate = threading.Event()
        entered = threading.Event()

        def check(client: FakeClient) -> bool:
            entered.set()
            assert gate.wait(WAIT)
            return True

        factory = Factory()
        single = process_singleton(check=check, check_every=0.05, fork="keep")(
            factory
        )
        client = single()
        prober = threading.Thread(
            target=lambda: wait_until(lambda: single() and entered.is_set())
        )
        prober.start()

        def child() -> bool:
            held = single.statistics().leases
            retired = single.retire(client)
            return (held, retired, client.closes) == (0, True, [os.getpid()])

        try:
            assert entered.wait(WAIT)
            # The parent's probe holds the client, as a lease would.
            assert 1 == single.statistics().leases
            assert 0 == fork_and_check(child)
        finally:
            gate.set()
            prober.join(WAIT)
        assert not prober.is_alive()
        # The parent's probe reported; nothing of the child's here.
        assert wait_until(lambda: single.statistics().probes == 1)
        assert 0 == single.statistics().leases
        assert [] == client.closes
        assert single() is client


class TestAsyncChecks:
    def test_an_async_check_is_awaited_while_other_tasks_are_served(
        self, spacing
    ):
        """An ``async def`` probe is awaited; the loop keeps serving."""
        gate: list[asyncio.Event] = []
        verdicts = [True, False]

        async def check(client: HttpxLike) -> bool:
            await gate[0].wait()
            return verdicts.pop(0)

        async def make() -> HttpxLike:
            return HttpxLike()

        single = process_singleton(check=check, check_every=0.1)(make)

        async def main() -> tuple[list[object], object]:
            gate.append(asyncio.Event())
            old = await single()
            slot = next(iter(single._self_life.slots.values()))
            for _ in range(int(WAIT / 0.01)):
                if slot.probe is not None:
                    break
                await asyncio.sleep(0.01)
            prober = asyncio.ensure_future(single())
            await asyncio.sleep(0.05)
            assert not prober.done()  # Awaiting the probe.
            served = [await single() for _ in range(5)]
            gate[0].set()
            assert await asyncio.wait_for(prober, WAIT) is old
            # The next probe fails: replaced on the loop, old closed there.
            for _ in range(int(WAIT / 0.01)):
                if await single() is not old:
                    break
                await asyncio.sleep(0.01)
            for _ in range(int(WAIT / 0.01)):  # Closed soon, on this loop.
                if old.is_closed:
                    break
                await asyncio.sleep(0.01)
            assert old.is_closed
            return served, old

        served, old = asyncio.run(main())
        assert all(c is old for c in served)
        stats = single.statistics()
        assert (2, 1) == (stats.probes, stats.probe_failures)
        assert 1 == stats.retirements["check"]

    def test_an_async_check_on_a_thread_singleton_is_refused(self):
        async def check(client: FakeClient) -> bool:
            return True

        with pytest.raises(
            TypeError, match=r"check=.*for Factory.* is an async function"
        ):
            process_singleton(check=check)(Factory())

    def test_a_check_returning_an_awaitable_in_a_thread_is_refused(
        self, recwarn
    ):
        """Said to the caller that probes; the probe stays due, uncounted."""

        async def ping() -> bool:
            return True

        single = process_singleton(check=lambda c: ping(), check_every=0.1)(
            Factory()
        )
        client = single()
        slot = single._self_slot
        assert wait_until(lambda: slot.probe is not None)
        with pytest.raises(TypeError, match=r"Factory.* returned an await"):
            single()
        assert (client, ProbeDue) == (slot.live.client, type(slot.probe))
        assert 0 == slot.live.leases
        assert 0 == single.statistics().probes
        assert not [w for w in recwarn if "never awaited" in str(w.message)]


class TestFailedProbeCutShort:
    @pytest.mark.parametrize("n", range(1, 60))
    def test_a_failed_probe_cut_anywhere_still_retires_its_client(
        self, spacing, n
    ):
        """KeyboardInterrupt at the n-th line after a probe said no.

        Whatever line it lands on, the failed client is replaced by a
        later call and closed exactly once: never served for ever.
        """
        from attack import Inject

        single = process_singleton(
            check=lambda c: not c.closed, check_every=0.05
        )(Factory())
        old = single()
        slot = single._self_slot
        old.closes.append(-1)  # Broken, as the probe will find.
        assert wait_until(lambda: slot.probe is not None)
        inject = Inject(n, KeyboardInterrupt, after="check(record.client)")
        _cut_once(single, inject, KeyboardInterrupt)
        if inject.fired is None:
            pytest.skip(f"the probe runs fewer than {n} lines")
        assert _replaced(single, old) is not None, inject.fired
        assert wait_until(lambda: len(old.closes) == 2), inject.fired
        time.sleep(0.05)
        assert [-1, os.getpid()] == old.closes, inject.fired
        assert not single().closed


class TestPassedProbeCutShort:
    @pytest.mark.parametrize("n", range(1, 60))
    def test_probes_go_on_after_a_cut_anywhere(self, spacing, n):
        """KeyboardInterrupt at the n-th line after a probe said yes.

        Whatever line it lands on, the client is probed again later: once
        it goes bad it is replaced (the next probe was armed before the
        report, or the probe is due again).
        """
        from attack import Inject

        single = process_singleton(
            check=lambda c: not c.closed, check_every=0.05
        )(Factory())
        old = single()
        slot = single._self_slot
        assert wait_until(lambda: slot.probe is not None)
        inject = Inject(n, KeyboardInterrupt, after="check(record.client)")
        _cut_once(single, inject, KeyboardInterrupt)
        if inject.fired is None:
            pytest.skip(f"the probe runs fewer than {n} lines")
        assert single() is old, inject.fired
        old.closes.append(-1)  # Now it goes bad.
        assert _replaced(single, old) is not None, inject.fired
        assert wait_until(lambda: len(old.closes) == 2), inject.fired


class TestTimersEndWithTheirClient:
    def test_a_retired_client_leaves_no_timer_thread(self):
        """max_age=3600 and check_every=3600: retired, their timers end.

        Counts only this singleton's timers (those holding its slot):
        timers of earlier tests' singletons may end while this one runs.
        """
        single = process_singleton(
            max_age=3600, check=lambda c: True, check_every=3600
        )(Factory())
        slot = single._self_slot

        def timers() -> int:
            return sum(any(a is slot for a in t.args) for t in _timers.alive())

        assert timers() == 0
        for _ in range(5):
            single()
            assert wait_until(lambda: timers() == 2)
            assert single.reset()
        assert wait_until(lambda: timers() == 0)

    def test_a_stale_probe_timer_does_nothing(self):
        """A timer started for an earlier probe count is moot."""
        single = process_singleton(check=lambda c: True, check_every=3600)(
            Factory()
        )
        single()
        life, slot = single._self_life, single._self_slot
        record = slot.live
        assert not life.due(slot, record.sequence, record.probes + 1)
        assert slot.probe is None
        assert life.due(slot, record.sequence, record.probes)
        assert ProbeDue(record.sequence) == slot.probe


class TestProbeHandedOutCutShort:
    @pytest.mark.parametrize("n", range(1, 40))
    def test_a_probe_cut_before_its_report_is_given_back(self, n):
        """KeyboardInterrupt at the n-th line after request() hands out a
        probe: the probe is reported (or due again), never stuck holding
        its client, which reset() then closes exactly once.
        """
        from attack import Inject

        single = process_singleton(check=lambda c: True, check_every=0.05)(
            Factory()
        )
        client = single()
        slot = single._self_slot
        assert wait_until(lambda: slot.probe is not None)
        inject = Inject(n, KeyboardInterrupt, after="return Probe(live)")
        _cut_once(single, inject, KeyboardInterrupt)
        if inject.fired is None:
            pytest.skip(f"fewer than {n} lines follow the hand-out")
        probe = slot.probe
        assert probe is None or type(probe) is ProbeDue, (inject.fired, probe)
        assert 0 == slot.live.leases, inject.fired
        assert single() is client
        assert single.reset()
        assert [os.getpid()] == client.closes, inject.fired


class Cut(BaseException):
    """Injected: a BaseException no event loop treats specially."""


class TestAsyncProbeHandedOutCutShort:
    @pytest.mark.parametrize("n", range(1, 40))
    def test_an_async_probe_cut_before_its_report_is_given_back(self, n):
        """As the thread test above, in a task on an event loop."""
        from attack import Inject, no_collector

        async def make() -> FakeClient:
            return FakeClient()

        single = process_singleton(check=lambda c: True, check_every=0.05)(
            make
        )

        async def main() -> None:
            client = await single()
            slot = next(iter(single._self_life.slots.values()))
            for _ in range(int(WAIT / 0.01)):
                if slot.probe is not None:
                    break
                await asyncio.sleep(0.01)
            inject = Inject(n, Cut, after="return Probe(live)")
            with no_collector():
                previous = sys.gettrace()
                sys.settrace(inject.tracer)
                inject.armed = True
                try:
                    await single()
                except Cut:
                    pass
                finally:
                    sys.settrace(previous)
                    inject.armed = False
            if inject.fired is None:
                pytest.skip(f"fewer than {n} lines follow the hand-out")
            probe = slot.probe
            assert probe is None or type(probe) is ProbeDue, (
                inject.fired,
                probe,
            )
            assert 0 == slot.live.leases, inject.fired
            assert await single() is client
            assert await single.reset()
            for _ in range(int(WAIT / 0.01)):
                if client.closes:
                    break
                await asyncio.sleep(0.01)
            assert [os.getpid()] == client.closes, inject.fired

        asyncio.run(main())


class TestTimers:
    def test_timers_of_retired_clients_end_with_them(self):
        # Each build arms a max_age and a check timer. A retired client's
        # timers find nothing to do when they fire; until then they wait
        # in the heap. Twenty resets, then close_all(): none of this
        # singleton's timers should be left waiting.
        single = process_singleton(
            max_age=60.0, check=lambda c: True, check_every=30.0
        )(Factory())
        life = single._self_life

        def timers() -> int:
            return sum(
                life in t.args or getattr(t.function, "__self__", None) is life
                for t in _timers.alive()
            )

        for _ in range(20):
            single()
            assert single.reset()
        single()
        # The live client's two; the retired ones' were cancelled at close.
        assert wait_until(lambda: 2 == timers(), 2.0), timers()
        poolkeeper.close_all()
        assert wait_until(lambda: 0 == timers(), 2.0), timers()


class TestValidation:
    @pytest.mark.parametrize("value", [0, -1, float("nan"), "5", True])
    def test_max_age_must_be_positive_seconds(self, value):
        with pytest.raises(ValueError, match=r"max_age=.*for Factory"):
            process_singleton(max_age=value)(Factory())

    @pytest.mark.parametrize("value", [0, -0.5, float("inf"), "5"])
    def test_check_every_must_be_positive_seconds(self, value):
        with pytest.raises(ValueError, match=r"check_every=.*for Factory"):
            process_singleton(check=bool, check_every=value)(Factory())

    def test_check_every_needs_check(self):
        with pytest.raises(ValueError, match="needs a check"):
            process_singleton(check_every=5)(Factory())

    def test_check_must_be_callable(self):
        with pytest.raises(TypeError, match=r"check=.*for Factory"):
            process_singleton(check=5)(Factory())  # type: ignore[arg-type]

    def test_check_every_defaults_to_thirty_seconds(self):
        single = process_singleton(check=bool)(Factory())
        assert 30.0 == single._self_life.check_every
