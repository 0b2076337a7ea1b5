"""Forced thread switches on the probe paths (check, check_every, max_age).

Threads call and lease a singleton whose client is probed every few
milliseconds (and, in one variant, aged out), while a tracer installed in
every thread (timers included) yields the GIL (``time.sleep(0)``) at each
line of one part of the probe path, and the switch interval is a
microsecond. Clients go bad at random; the probe finds them. Only what the
library guarantees is asserted:

- at most one probe of a client runs at a time, and never on a client
  whose close started;
- no call or lease that starts after a client's retirement gets it, none
  gets a client whose close started, and no leased client is closed
  under its lease;
- with the backoff off and no other retirement, each client that failed a
  probe is retired once (reason "check") and replaced by one build;
- after ``close_all()``, every client built was closed exactly once.
"""

from __future__ import annotations

import itertools
import random
import sys
import threading
import time
from collections import Counter

import pytest
from helpers import WAIT, wait_until

from poolkeeper import (
    _builds,
    _healing,
    _lease,
    _lifecycle,
    _sync,
    _timers,
    close_all,
    process_singleton,
)
from poolkeeper._lifecycle import Lifecycle

#: How long each variant churns, in seconds.
SECONDS = 0.4
CALLERS = 6

_clock = itertools.count()


def _code(fn):
    return getattr(fn, "__wrapped__", fn).__code__


#: The parts of the probe path a tracer switches at, line by line.
PARTS = {
    "request": [Lifecycle.request],
    "due": [Lifecycle.due],
    "probed": [Lifecycle.probed, Lifecycle.unprobe],
    "drive": [
        _healing.run_probe,
        _healing._report,
        _healing._next_probe,
        _healing.closing,
        _healing.schedule,
    ],
    "retire": [
        Lifecycle.heal,
        Lifecycle.expire,
        Lifecycle._retire_live,
        Lifecycle._retire,
        _healing.age_due,
    ],
    "acquire": [
        _sync.ProcessSingleton._acquire,
        _builds.Rounds.ask,
        _builds.Rounds.probed,
        Lifecycle.built,
    ],
    "lease": [
        _lease.Lease.__enter__,
        _lease.Lease._enter,
        _lease.Lease.__exit__,
        _lease.Lease._finish,
        Lifecycle.pin,
        Lifecycle.unpin,
    ],
}
PARTS["all"] = [fn for fns in PARTS.values() for fn in fns]


class Client:
    """Stamps (on one global clock) its retirement and its closes."""

    def __init__(self, *, spared: bool = False) -> None:
        self.bad = False
        self.spared = spared  # It never goes bad.
        self.retired: list[int] = []
        self.closes: list[int] = []

    def close(self) -> None:
        self.closes.append(next(_clock))


class Switcher:
    """A tracer that yields the GIL at every line of some functions."""

    def __init__(self, functions) -> None:
        self.codes = {_code(fn) for fn in functions}
        self.switches = 0

    def tracer(self, frame, event, arg):
        if event == "call" and frame.f_code in self.codes:
            return self._line
        return None

    def _line(self, frame, event, arg):
        if event == "line":
            self.switches += 1
            time.sleep(0)
        return self._line


class Probing:
    """The singleton, its churning threads, and what they saw."""

    def __init__(
        self, *, max_age: float | None, bad: float = 0.02, spare: int = 0
    ) -> None:
        # How often a caller marks the client it was served bad.
        self.bad = bad
        # Every spare-th client built never goes bad (0: none is spared).
        self.spare = spare
        self.built: list[Client] = []
        self.failed: set[int] = set()
        self.violations: list[str] = []
        self.figures: Counter[str] = Counter()
        self.inflight: set[int] = set()
        self.lock = threading.Lock()
        self.stop = threading.Event()
        self.single = process_singleton(
            check=self.check, check_every=0.002, max_age=max_age
        )(self.factory)
        life = self.single._self_life
        retire = life._retire

        def stamped(slot, old, keep):
            # Under the lock, the hit path already disarmed: a call that
            # starts after this stamp cannot be served *old*.
            decided = retire(slot, old, keep)
            if old is not None:
                old.client.retired.append(next(_clock))
            return decided

        life._retire = stamped

    def factory(self) -> Client:
        spare = self.spare
        client = Client(spared=spare > 0 and len(self.built) % spare == 0)
        self.built.append(client)
        return client

    def check(self, client: Client) -> bool:
        with self.lock:
            if id(client) in self.inflight:
                self.violations.append("two probes of one client at once")
            self.inflight.add(id(client))
        if client.closes:
            self.violations.append("probed a closed client")
        time.sleep(0)
        ok = not client.bad
        with self.lock:
            self.inflight.discard(id(client))
            if not ok:
                self.failed.add(id(client))
        self.figures["probes"] += 1
        return ok

    def _served(self, client: Client, start: int, how: str) -> None:
        retired = client.retired
        if retired and retired[0] < start:
            self.violations.append(f"{how} a client retired before")
        closes = client.closes
        if closes and closes[0] < start:
            self.violations.append(f"{how} a client closed before")

    def caller(self, seed: int) -> None:
        rng = random.Random(seed)
        while not self.stop.is_set():
            start = next(_clock)
            if rng.random() < 0.3:
                with self.single.lease() as client:
                    self._served(client, start, "leased")
                    time.sleep(0)
                    if client.closes:
                        self.violations.append("closed under a lease")
            else:
                client = self.single()
                self._served(client, start, "served")
            if not client.spared and rng.random() < self.bad:
                client.bad = True  # It goes bad; a probe will find it.
            self.figures["calls"] += 1

    def _enough(self) -> bool:
        retirements = self.single.statistics().retirements
        aged = self.single._self_life.max_age is None or retirements["max_age"]
        return len(self.failed) >= 2 and bool(aged)

    def run(self, tracer) -> None:
        threads = [
            threading.Thread(target=self.caller, args=(i,), daemon=True)
            for i in range(CALLERS)
        ]
        interval = sys.getswitchinterval()
        sys.setswitchinterval(1e-6)
        # Every thread started from now on is traced: the callers and the
        # retirements' workers (expire). The process's one timer thread
        # may have started before: its callbacks (due) are traced by hand.
        found = threading.gettrace()  # Coverage's, under coverage.
        threading.settrace(tracer)
        run_quietly = _timers._run_quietly

        def traced(timer: _timers.Timer) -> None:
            previous = sys.gettrace()
            sys.settrace(tracer)
            try:
                run_quietly(timer)
            finally:
                sys.settrace(previous)

        _timers._run_quietly = traced
        try:
            for thread in threads:
                thread.start()
            self.stop.wait(SECONDS)
            # However loaded the machine, clients went bad and were found
            # out, and (with max_age) one aged out.
            assert wait_until(self._enough), "too little churn"
        finally:
            self.stop.set()
            _timers._run_quietly = run_quietly
            threading.settrace(found)  # type: ignore[arg-type]
            for thread in threads:
                thread.join(WAIT)
            sys.setswitchinterval(interval)
        assert [] == [t.name for t in threads if t.is_alive()], "hung"


@pytest.fixture(name="no_backoff")
def _no_backoff(monkeypatch):
    """Healing retirements at once: one per failed client, one build."""
    monkeypatch.setattr(_lifecycle, "BACKOFF_FIRST", 0.0)
    monkeypatch.setattr(_lifecycle, "BACKOFF_CAP", 0.0)


@pytest.mark.usefixtures("no_backoff")
class TestProbeSwitches:
    @pytest.mark.parametrize("part", sorted(PARTS))
    def test_switches_on_the_probe_path(self, part):
        """check only: every failed client retired once, one build each."""
        probing = Probing(max_age=None)
        switcher = Switcher(PARTS[part])
        probing.run(switcher.tracer)
        single = probing.single
        stats = single.statistics()
        assert [] == probing.violations
        assert switcher.switches > 0
        # Every thread has ended: each probe that failed was reported.
        retired = stats.retirements["check"]
        assert len(probing.failed) == retired
        assert {"check": retired} == {
            k: v for k, v in stats.retirements.items() if v
        }
        assert len(probing.built) == stats.builds
        # One build each: the first, and one per retirement, but for the
        # last retirement's if no call came after it.
        assert stats.builds == retired + (stats.generation != 0)
        _closed_once(probing)

    @pytest.mark.parametrize("part", ["due", "retire", "all"])
    def test_switches_with_max_age(self, part):
        """check and max_age: the same, retirements by either reason.

        Every second client never goes bad: it lives to age out, however
        many calls a churn of this part makes. *max_age* is 100 ms: with
        the backoff off, nothing else keeps a client alive until the call
        that built it or waited for it asks for it, and a call whose
        clients all age out first fails after ``MAX_ROUNDS`` requests.
        Under this tracer on a loaded machine, a request took longer than
        a 10 ms *max_age* 100 times in a row (CI on 3.13); outside this
        test the backoff's spacing (1 s) is what keeps a client that long.
        """
        probing = Probing(max_age=0.1, spare=2)
        probing.run(Switcher(PARTS[part]).tracer)
        single = probing.single
        assert [] == probing.violations
        stats = single.statistics()
        healed = stats.retirements["check"] + stats.retirements["max_age"]
        assert stats.retirements["max_age"] > 0
        assert healed == sum(stats.retirements.values())
        assert stats.retirements["check"] <= len(probing.failed)
        assert len(probing.built) == stats.builds
        assert stats.builds == healed + (stats.generation != 0)
        _closed_once(probing)


def _closed_once(probing: Probing) -> None:
    """close_all(): every client built closed exactly once."""
    close_all()
    built = probing.built
    assert wait_until(lambda: all(c.closes for c in built))
    time.sleep(0.01)  # A second close would come now.
    assert {1: len(built)} == dict(Counter(len(c.closes) for c in built))
    stats = probing.single.statistics()
    assert len(built) == stats.closes
    assert 0 == stats.pending_close
