"""Probes attacked: BaseExceptions from check, clients replaced mid-probe.

A health probe (*check*) holds its client while it runs. Whatever it
raises besides an ``Exception`` (``SystemExit``, ``GeneratorExit``, a
custom ``BaseException``, a cancellation) is the caller's: it propagates
unchanged, the probe is given back (due again, its hold released, the
client not retired), the next call probes again, and ``reset()`` closes
the client exactly once. A client retired and replaced while its probe
runs is closed once the probe ends. Real threads and event loops; every
wait is bounded.
"""

from __future__ import annotations

import asyncio
import os
import threading
import warnings

import pytest
from helpers import WAIT, Factory, FakeClient, wait_until

from poolkeeper import close_all, process_singleton
from poolkeeper._records import ProbeDue, Probing


class Custom(BaseException):
    """A BaseException that no event loop or generator treats specially."""


SYNC_EXCEPTIONS = [SystemExit, GeneratorExit, Custom, KeyboardInterrupt]
ASYNC_EXCEPTIONS = [
    SystemExit,
    GeneratorExit,
    Custom,
    asyncio.CancelledError,
    KeyboardInterrupt,
]


class Raising:
    """A check that raises *exc* on its first run, then passes."""

    def __init__(self, exc: type[BaseException]) -> None:
        self.raised = exc()
        self.runs = 0

    def __call__(self, client: object) -> bool:
        self.runs += 1
        if self.runs == 1:
            raise self.raised
        return True


class ARaising(Raising):
    """As :class:`Raising`, an ``async def`` check."""

    async def __call__(self, client: object) -> bool:  # type: ignore[override]
        await asyncio.sleep(0)
        return Raising.__call__(self, client)


#: check_every of the tests that make the probe due themselves (_due): no
#: timer does it before the test is ready (a loaded machine is slow).
HOUR = 3600.0


def _due(single, slot) -> None:
    """Make the live client's probe due now, as its timer would."""
    live = slot.live
    assert single._self_life.due(slot, live.sequence, live.probes)


async def _until(predicate, timeout: float = WAIT) -> bool:
    """Poll *predicate* on the running loop until it holds, or time out."""
    for _ in range(int(timeout / 0.01)):
        if predicate():
            return True
        await asyncio.sleep(0.01)
    return bool(predicate())


def _lease(single) -> object:
    with single.lease() as client:
        return client


def _proxy(single) -> object:
    return single.proxy().label


WAYS = {"call": lambda s: s(), "lease": _lease, "proxy": _proxy}


class TestSyncCheckRaisesBaseException:
    @pytest.mark.parametrize("way", sorted(WAYS))
    @pytest.mark.parametrize("exc", SYNC_EXCEPTIONS)
    def test_propagates_given_back_and_probed_again(self, exc, way, caplog):
        check = Raising(exc)
        # retire_on matches everything: the exception came before any
        # block ran, so it retires nothing.
        single = process_singleton(
            check=check, check_every=HOUR, retire_on=lambda e: True
        )(Factory())
        client = single()
        slot = single._self_slot
        _due(single, slot)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            with pytest.raises(exc) as raised:
                WAYS[way](single)
        assert raised.value is check.raised
        assert not caplog.records  # Nothing said: the exception is theirs.
        live = slot.live
        assert live.client is client
        assert ProbeDue(live.sequence) == slot.probe
        assert (0, {}) == (live.leases, live.pins)
        stats = single.statistics()
        assert (0, 0) == (stats.probes, stats.probe_failures)
        assert 0 == sum(stats.retirements.values())
        # The next call probes (due again), and is served the client.
        assert single() is client
        assert 2 == check.runs
        assert 1 == single.statistics().probes
        assert single.reset()
        assert wait_until(lambda: client.closed)
        close_all()
        assert [os.getpid()] == client.closes


class TestAsyncCheckRaisesBaseException:
    @pytest.mark.parametrize("kind", ["async-def", "plain"])
    @pytest.mark.parametrize("way", ["call", "lease"])
    @pytest.mark.parametrize("exc", ASYNC_EXCEPTIONS)
    def test_propagates_given_back_and_probed_again(
        self, exc, way, kind, caplog
    ):
        check = ARaising(exc) if kind == "async-def" else Raising(exc)

        async def make() -> FakeClient:
            return FakeClient()

        single = process_singleton(
            check=check, check_every=HOUR, retire_on=lambda e: True
        )(make)

        async def lease() -> object:
            async with single.lease() as client:
                return client

        async def main() -> None:
            client = await single()
            slot = next(iter(single._self_life.slots.values()))
            _due(single, slot)
            with warnings.catch_warnings():
                warnings.simplefilter("error")
                try:
                    await (single() if way == "call" else lease())
                except BaseException as err:
                    caught: BaseException | None = err
                else:
                    caught = None
            assert caught is check.raised
            # Nothing said (no "lease garbage collected"): it is theirs.
            assert not caplog.records
            live = slot.live
            assert live.client is client
            assert ProbeDue(live.sequence) == slot.probe
            assert 0 == live.leases
            stats = single.statistics()
            assert (0, 0) == (stats.probes, stats.probe_failures)
            assert 0 == sum(stats.retirements.values())
            assert await single() is client
            assert 2 == check.runs
            assert 1 == single.statistics().probes
            assert await single.reset()
            assert await _until(lambda: client.closed)
            assert [os.getpid()] == client.closes

        asyncio.run(main())

    def test_a_cancelled_prober_gives_the_probe_back(self):
        """The task awaiting an async check is cancelled: due again."""
        single, gate, runs = _gated_async(every_run=False)

        async def main() -> None:
            gate.append(asyncio.Event())
            client = await single()
            slot = next(iter(single._self_life.slots.values()))
            _due(single, slot)
            prober = asyncio.ensure_future(single())
            assert await _until(lambda: runs)
            assert type(slot.probe) is Probing
            assert await single() is client  # Served meanwhile.
            prober.cancel()
            with pytest.raises(asyncio.CancelledError):
                await prober
            assert ProbeDue(slot.live.sequence) == slot.probe
            assert 0 == slot.live.leases
            assert await single() is client
            assert 2 == len(runs)
            assert (1, 0) == (
                single.statistics().probes,
                single.statistics().probe_failures,
            )
            assert await single.reset()
            assert await _until(lambda: client.closed)
            assert [os.getpid()] == client.closes

        asyncio.run(main())


def _gated_async(*, every_run: bool):
    """An async singleton whose check waits on ``gate[0]`` (made in the loop).

    Returns the singleton, the gate and the check's runs; with
    *every_run* false only the first run waits.
    """
    gate: list[asyncio.Event] = []
    runs: list[int] = []

    async def check(client: FakeClient) -> bool:
        runs.append(1)
        if every_run or len(runs) == 1:
            await gate[0].wait()
        return True

    async def make() -> FakeClient:
        return FakeClient()

    single = process_singleton(check=check, check_every=HOUR)(make)
    return single, gate, runs


class TestReplacedWhileProbed:
    """The probed client is retired, and a new one built, mid-probe."""

    @pytest.mark.parametrize("retire", ["reset", "close_all"])
    def test_sync_the_old_client_closes_when_its_probe_ends(self, retire):
        gate, entered = threading.Event(), threading.Event()

        def check(client: FakeClient) -> bool:
            entered.set()
            assert gate.wait(WAIT)
            return True

        single = process_singleton(check=check, check_every=HOUR)(Factory())
        old = single()
        slot = single._self_slot
        _due(single, slot)
        box: list[object] = []
        prober = threading.Thread(target=lambda: box.append(single()))
        prober.start()
        try:
            assert entered.wait(WAIT)
            if retire == "reset":
                assert single.reset()
            else:
                close_all()
            new = single()
            assert new is not old
            assert not old.closed  # Held by its probe.
        finally:
            gate.set()
            prober.join(WAIT)
        assert not prober.is_alive()
        # The prober returns the live client, not the one it probed.
        assert [new] == box
        assert wait_until(lambda: old.closed)
        assert 0 == single.statistics().pending_close
        close_all()
        assert [os.getpid()] == old.closes
        assert [os.getpid()] == new.closes

    def test_async_the_old_client_closes_when_its_probe_ends(self):
        single, gate, entered = _gated_async(every_run=True)

        async def main() -> None:
            gate.append(asyncio.Event())
            old = await single()
            slot = next(iter(single._self_life.slots.values()))
            _due(single, slot)
            prober = asyncio.ensure_future(single())
            assert await _until(lambda: entered)
            assert await single.reset()
            new = await single()
            assert new is not old
            assert not old.closed
            gate[0].set()
            # The prober returns the live client, not the one it probed.
            assert await asyncio.wait_for(prober, WAIT) is new
            assert await _until(lambda: old.closed)
            assert [os.getpid()] == old.closes
            assert 0 == single.statistics().pending_close

        asyncio.run(main())


class TestNextProbeTimerEndsFirst:
    """The next probe's timer, armed before the report, ends before it."""

    def test_sync_probes_go_on(self):
        """A thread switch between arming and reporting, longer than
        check_every: the probe after it still runs, so a client that goes
        bad later is replaced.
        """
        from attack import Pause, join, run

        single = process_singleton(
            check=lambda c: not c.closed, check_every=0.05
        )(Factory())
        old = single()
        slot = single._self_slot
        assert wait_until(lambda: slot.probe is not None)
        pause = Pause("run_probe", "verdict = _report(")
        caller, box = run(pause.run(single))
        assert pause.reached.wait(WAIT)
        timer = slot.live.timers["probe"]
        timer.join(WAIT)  # It ended while the report waits.
        assert not timer.is_alive()
        pause.release.set()
        join(caller)
        assert [old] == box
        old.closes.append(-1)  # Now it goes bad.
        assert wait_until(lambda: single() is not old, 10.0)
        assert 1 == single.statistics().retirements["check"]

    def test_async_probes_go_on(self):
        """As above, for a task's probe (an async check)."""
        runs: list[int] = []

        async def check(client: FakeClient) -> bool:
            runs.append(1)
            return not client.closed

        async def make() -> FakeClient:
            return FakeClient()

        single = process_singleton(check=check, check_every=0.05)(make)
        life = single._self_life
        probed = life.probed

        def late(slot, record, *args):
            # The report comes after the next probe's timer ended.
            timer = record.timers["probe"]
            timer.join(WAIT)
            assert not timer.is_alive()
            return probed(slot, record, *args)

        async def main() -> None:
            old = await single()
            slot = next(iter(life.slots.values()))
            assert await _until(lambda: slot.probe is not None)
            life.probed = late  # type: ignore[method-assign]
            try:
                assert await single() is old
            finally:
                del life.probed
            assert 1 == len(runs)
            old.closes.append(-1)
            for _ in range(int(10.0 / 0.01)):
                if await single() is not old:
                    break
                await asyncio.sleep(0.01)
            assert await single() is not old

        asyncio.run(main())
