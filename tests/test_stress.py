"""Bounded churn: callers, leases, key rotation, resets and close_all().

Runs for ``POOLKEEPER_STRESS_SECONDS`` (2 by default, so CI stays quick;
set it to 180 for a soak) with ``POOLKEEPER_STRESS_CALLERS`` calling
threads (4 by default) and prints its figures (shown with ``-s``).
Only what the library guarantees is asserted, so the test cannot flake
on a slow or loaded machine:

- no call returns a client whose close started before the call began,
  and no leased client has a close started while the lease is held;
- after close_all(), every client built was closed exactly once;
- every thread ends (bounded joins).

A sibling churn adds healing: a health probe (``check=``, every few
milliseconds) that fails, or raises, on clients that callers marked bad,
and a short ``max_age=``, with a small backoff; the same guarantees hold.
"""

from __future__ import annotations

import itertools
import os
import random
import threading
import time
from collections import Counter

import pytest
from helpers import GIL_PARAMS, WAIT, made_as_free_threaded, wait_until

from poolkeeper import _lifecycle, close_all, keys, process_singleton

NAME = "PK_STRESS_KEY"
SECONDS = float(os.environ.get("POOLKEEPER_STRESS_SECONDS", "2"))
CALLERS = int(os.environ.get("POOLKEEPER_STRESS_CALLERS", "4"))
# A churn of minutes (make stress) outlasts the suite's per-test timeout.
pytestmark = pytest.mark.timeout(2 * SECONDS + 120)
# The least churn a run must see before it may stop.
MINIMUM = {"rotations": 50, "resets": 5, "close_alls": 1}
REASONS = ("check", "max_age")


class Client:
    """A client that records when (on a global clock) its closes started."""

    clock = itertools.count()

    def __init__(self) -> None:
        self.closes: list[int] = []
        # Marked by a caller: the health probe then fails on it.
        self.bad = False

    def close(self) -> None:
        # list.append is atomic: concurrent closes would both be seen.
        self.closes.append(next(Client.clock))


@pytest.fixture(name="env")
def _env(monkeypatch):
    monkeypatch.delenv(NAME, raising=False)
    yield os.environ
    os.environ.pop(NAME, None)


class Churn:
    """The churning threads, and what they saw."""

    def __init__(
        self,
        env,
        key,
        pause: float = 0.0005,
        bad: float = 0.0,
        **healing: object,
    ) -> None:
        self.env = env
        # How often a caller marks the client it was served bad.
        self.bad = bad
        # The rotator's pause between two of its moves, in seconds.
        self.pause = pause
        self.built: list[Client] = []
        self.single = process_singleton(key=key, **healing)(self._factory)
        self.stop = threading.Event()
        self.figures: Counter[str] = Counter()
        self.rotated: Counter[str] = Counter()
        self.violations: list[str] = []
        # The healing retirements a run must see, by reason.
        self.healed: dict[str, int] = {}

    def _factory(self) -> Client:
        # A build that takes a while: rotations land during it, so builds
        # for older keys finish after newer clients went live.
        time.sleep(0.0002)
        client = Client()
        self.built.append(client)
        return client

    def caller(self, seed: int) -> None:
        """Call, or lease now and then, until stopped; check each client."""
        rng = random.Random(seed)
        calls = leases = 0
        while not self.stop.is_set():
            start = next(Client.clock)
            if rng.random() < 0.2:
                self._lease()
                leases += 1
            else:
                client = self.single()
                if client.closes and client.closes[0] < start:
                    self.violations.append("served a closed client")
                if self.bad and rng.random() < self.bad:
                    client.bad = True  # Its next probe fails.
            calls += 1
        self.figures.update(calls=calls, leases=leases)

    def _lease(self) -> None:
        with self.single.lease() as client:
            if client.closes:
                self.violations.append("leased a closed client")
            time.sleep(0)
            if client.closes:
                self.violations.append("closed under a lease")

    def rotator(self) -> None:
        """Rotate the key, reset, close_all() until stopped."""
        rng = random.Random(1)
        # Only this thread writes it; run() reads it to see progress.
        figures = self.rotated
        while not self.stop.is_set():
            roll = rng.random()
            if roll < 0.1:
                self.single.reset()
                figures["resets"] += 1
            elif roll < 0.12:
                close_all()
                figures["close_alls"] += 1
            else:
                self.env[NAME] = str(rng.randrange(3))
                figures["rotations"] += 1
            time.sleep(self.pause)
        self.figures.update(figures)

    def _enough(self) -> bool:
        if not all(self.rotated[k] >= n for k, n in MINIMUM.items()):
            return False
        retirements = self.single.statistics().retirements
        return all(retirements[k] >= self.healed.get(k, 0) for k in REASONS)

    def run(self, seconds: float) -> None:
        """Churn for *seconds*; every thread must end."""
        threads = [
            threading.Thread(target=self.caller, args=(i,), daemon=True)
            for i in range(CALLERS)
        ]
        threads.append(threading.Thread(target=self.rotator, daemon=True))
        for thread in threads:
            thread.start()
        self.stop.wait(seconds)
        # However loaded the machine, the churn really happened.
        assert wait_until(self._enough), "too little churn"
        self.stop.set()
        for thread in threads:
            thread.join(WAIT)
        assert [] == [t.name for t in threads if t.is_alive()], "hung"


def _polled() -> str | None:
    return os.environ.get(NAME)


class TestChurn:
    # keys.env is pushed (the armed hit path); a plain callable is polled
    # on every call (the armed polled hit path).
    @pytest.mark.parametrize(
        "key", [keys.env(NAME), _polled], ids=["pushed", "polled"]
    )
    @pytest.mark.parametrize("gil", GIL_PARAMS)
    def test_churn_serves_no_closing_client_and_closes_each_once(
        self, env, key, gil, monkeypatch
    ):
        """Threads churn for a while; every guarantee holds throughout.

        no-gil: the singleton is made as on a free-threaded build, where
        leases pin and watched changes move the epoch under the lock (on a
        build with the GIL, the GIL is still there: this runs those paths,
        it cannot show them right without one; a free-threaded build can).
        """
        if not gil:
            made_as_free_threaded(monkeypatch)
        env[NAME] = "0"
        churn = Churn(env, key)
        assert gil is churn.single._self_life.lock_free
        churn.run(SECONDS)
        built = churn.built
        live = churn.single.current()
        assert all(1 == len(c.closes) for c in built if c is not live)
        close_all()
        figures = churn.figures
        figures.update(
            builds=len(built), closes=sum(len(c.closes) for c in built)
        )
        print(
            f"churn ({'polled' if key is _polled else 'pushed'}, "
            f"{'gil' if gil else 'no-gil'}) "
            f"for {SECONDS:g}s, {CALLERS} callers: {dict(figures)}, "
            f"violations={len(churn.violations)}"
        )
        assert [] == churn.violations
        assert {1: len(built)} == dict(Counter(len(c.closes) for c in built))
        stats = churn.single.statistics()
        assert len(built) == stats.builds
        assert len(built) == stats.closes
        assert figures["calls"] > 0


def _check(client: Client) -> bool:
    """The health probe: a bad client fails it, or makes it raise."""
    if client.bad and random.random() < 0.5:
        raise ConnectionError
    return not client.bad


class TestChurnHealing:
    @pytest.mark.parametrize(
        "key", [keys.env(NAME), _polled], ids=["pushed", "polled"]
    )
    @pytest.mark.parametrize("gil", GIL_PARAMS)
    def test_churn_with_check_and_max_age_closes_each_once(
        self, env, key, gil, monkeypatch
    ):
        """The churn above, with probes that fail and clients that age.

        A small backoff (5 ms doubling to 10 ms, no more than max_age),
        so that healing retires many clients in a short run, and a slower
        rotator (every 10 ms), so that clients live long enough to age
        out.
        """
        if not gil:
            made_as_free_threaded(monkeypatch)
        monkeypatch.setattr(_lifecycle, "BACKOFF_FIRST", 0.005)
        monkeypatch.setattr(_lifecycle, "BACKOFF_CAP", 0.01)
        env[NAME] = "0"
        churn = Churn(
            env,
            key,
            pause=0.01,
            bad=0.0005,
            check=_check,
            check_every=0.002,
            max_age=0.01,
        )
        churn.healed = {"check": 3, "max_age": 3}
        assert gil is churn.single._self_life.lock_free
        churn.run(SECONDS)
        built = churn.built
        close_all()
        # A timer's close may still be running: closed once, when it is.
        assert wait_until(lambda: all(c.closes for c in built))
        stats = churn.single.statistics()
        figures = churn.figures
        figures.update(
            builds=len(built),
            closes=sum(len(c.closes) for c in built),
            probes=stats.probes,
            probe_failures=stats.probe_failures,
            **{k: v for k, v in stats.retirements.items() if v},
        )
        print(
            f"healing churn ({'polled' if key is _polled else 'pushed'}, "
            f"{'gil' if gil else 'no-gil'}) "
            f"for {SECONDS:g}s, {CALLERS} callers: {dict(figures)}, "
            f"violations={len(churn.violations)}"
        )
        assert [] == churn.violations
        assert {1: len(built)} == dict(Counter(len(c.closes) for c in built))
        assert len(built) == stats.builds
        assert len(built) == stats.closes
        assert 0 == stats.pending_close
        assert stats.probe_failures > 0
