"""Issue 21's outage against the real SDK: a storm of broken TLS.

The emulator serves HTTPS on 127.0.0.1 and, for 10 s, drops TLS
handshakes as they start (the incident's ``SSLEOFError``: "EOF occurred
in violation of protocol") and cuts responses mid-body, while threads
(64 pooled, 16 naive) create sandboxes with the real ``daytona.Daytona``:

- pooled: through ``make_daytona_singleton(config).proxy()`` with the
  adapter's defaults (``retire_on=is_transport_failure``) and the core's
  backoff defaults (1 s, doubling, up to 60 s). Each healing retirement
  (read from the ``retired`` events) keeps the backoff's rule: its client
  lived at least the spacing handed on to it. So healing builds are at
  least 1 s apart whatever the timing, and where each client fails within
  its spacing (as here) they happen at the earliest 0, 1, 3, 7 s after
  the first: at most 4 in the 10 s storm (5 builds in all with the client
  live when it began), whatever the number of failed calls. The open fds
  stay flat: at every sample (every 50 ms), within the connections of the
  clients the singleton has not closed yet and of the one it closed last
  (a bound derived from the SDK's pool and the threads, not from a
  rate), and those clients never more than its builds; every thread
  succeeds again once the faults stop; nothing is left once the
  singleton is closed.
- naive: a new ``daytona.Daytona`` per attempt, kept referenced (as the
  incident's closures kept theirs), over the same storm: its fds grow
  with every attempt (pools, websockets and their threads), past what
  its threads' connections in flight could hold.

A fresh singleton per test: the backoff of a module-level one
(``daytona_client``) would outlive the test.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import ssl
import threading
import time
from typing import TYPE_CHECKING

import daytona
import poolkeeper
import pytest
from daytona_test_helpers import DROPPED_TLS_WEBSOCKETS, fd_count, settle
from poolkeeper import _lifecycle
from poolkeeper._lifecycle import HEALING
from test_transport_failure import _types

from poolkeeper_daytona import (
    close_daytona,
    is_transport_failure,
    make_daytona_singleton,
)
from poolkeeper_daytona._client import _ENV_VARS
from poolkeeper_daytona.testing import DaytonaEmulator

# It breaks TLS connections on purpose.
pytestmark = DROPPED_TLS_WEBSOCKETS

if TYPE_CHECKING:
    from collections.abc import Iterator

STORM = 10.0
#: The pooled run's threads: the issue's 64.
THREADS = 64
# The naive run's: it builds a client, with its threads and websocket, per
# attempt, and 64 of those on 2 loaded cores take minutes; the baseline
# only has to show that its fds grow.
NAIVE_THREADS = 16
#: Slack on top of the backoff for a loaded 2-core machine (seconds).
SLACK = 5.0
#: Every attempt of the storm: most handshakes dropped, some responses cut.
HANDSHAKE_EOF_RATE = 0.6
EOF_RATE = 0.3


def healing_builds_bound(seconds: float, first: float, cap: float) -> int:
    """The most healing builds in *seconds* from the first one.

    The first is immediate; the n-th waits first * 2**(n-2) after the one
    before it (up to *cap*): at 0, 1, 3, 7, 15 s with first = 1 s.
    """
    builds, at, spacing = 1, 0.0, first
    while at + spacing <= seconds:
        at += spacing
        builds += 1
        spacing = min(2 * spacing, cap)
    return builds


class _Retirements(logging.Handler):
    """The healing retirements of one singleton, from its events."""

    def __init__(self, name: str) -> None:
        super().__init__(logging.DEBUG)
        self.name = name
        # (reason, client's age, the spacing handed on to its successor).
        self.seen: list[tuple[str, float, float]] = []

    def emit(self, record: logging.LogRecord) -> None:
        fields = record.__dict__
        if (
            fields.get("poolkeeper_singleton") == self.name
            and fields.get("poolkeeper_event") == "retired"
        ):
            self.seen.append(
                (
                    fields["poolkeeper_reason"],
                    fields["poolkeeper_age"],
                    fields["poolkeeper_backoff"],
                )
            )


@contextlib.contextmanager
def _retirements(name: str) -> Iterator[_Retirements]:
    """Record *name*'s ``retired`` events meanwhile."""
    handler = _Retirements(name)
    logger = logging.getLogger("poolkeeper")
    level = logger.level
    logger.setLevel(logging.DEBUG)
    logger.addHandler(handler)
    try:
        yield handler
    finally:
        logger.removeHandler(handler)
        logger.setLevel(level)


def _deadline_wait(predicate, timeout: float) -> bool:
    """Poll *predicate* by the wall clock for at most *timeout* seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def _slope(times: list[float], samples: list[int]) -> float:
    """Least-squares growth of *samples* over *times*, per second."""
    n = len(times)
    mean_t, mean_s = sum(times) / n, sum(samples) / n
    var = sum((t - mean_t) ** 2 for t in times)
    cov = sum(
        (t - mean_t) * (s - mean_s)
        for t, s in zip(times, samples, strict=True)
    )
    return cov / var


class _Storm:
    """Threads creating sandboxes until stopped; fds sampled meanwhile."""

    def __init__(self, create, threads: int) -> None:
        self.create = create
        self.stop = threading.Event()
        self.back = 0.0  # When the faults stopped (monotonic).
        self.warm: set[int] = set()  # Threads that created one.
        self.ok_after: dict[int, float] = {}
        self.errors: list[BaseException] = []  # Kept, as callers do.
        self.unexpected: list[BaseException] = []
        self.lock = threading.Lock()
        self.samples: list[int] = []
        self.times: list[float] = []
        # Clients open at each sample (built and not yet closed), when a
        # singleton serves the storm.
        self.opened: list[int] = []
        self.threads = [
            threading.Thread(target=self.call, args=(i,), daemon=True)
            for i in range(threads)
        ]

    def call(self, i: int) -> None:
        while not self.stop.is_set():
            try:
                self.create()
            except daytona.DaytonaError as exc:
                with self.lock:
                    self.errors.append(exc)
                time.sleep(0.01)  # A caller's own retry loop.
                continue
            except BaseException as exc:
                with self.lock:
                    self.unexpected.append(exc)
                return
            now = time.monotonic()
            with self.lock:
                self.warm.add(i)
                if self.back and i not in self.ok_after:
                    self.ok_after[i] = now

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def sample_for(self, seconds: float, single=None) -> None:
        end = time.monotonic() + seconds
        while time.monotonic() < end:
            before = 0 if single is None else _open_clients(single)
            self.samples.append(fd_count())
            self.times.append(time.monotonic())
            if single is not None:
                # Read on each side of the fds: a client built or closed
                # meanwhile is counted.
                self.opened.append(max(before, _open_clients(single)))
            time.sleep(0.05)

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(60)
        assert not any(t.is_alive() for t in self.threads)
        assert [] == self.unexpected


def _open_clients(single) -> int:
    """Clients *single* built that are not closed yet (closing counts)."""
    stats = single.statistics()
    return stats.builds - stats.closes - stats.close_failures


def _faults(emu: DaytonaEmulator, *, on: bool) -> None:
    emu.faults.handshake_eof_rate = HANDSHAKE_EOF_RATE if on else 0.0
    emu.faults.eof_rate = EOF_RATE if on else 0.0


@pytest.fixture(name="storm_emu")
def _storm_emu(monkeypatch):
    """A TLS emulator the SDK trusts; no DAYTONA_* from the environment."""
    for name in _ENV_VARS:
        monkeypatch.delenv(name, raising=False)
    with DaytonaEmulator(tls=True, seed=21) as emu:
        for name, value in emu.trust_env().items():
            monkeypatch.setenv(name, value)
        yield emu
        # Close the clients while the emulator still answers.
        poolkeeper.close_all()


def _config(emu: DaytonaEmulator, api_key: str) -> dict[str, str]:
    return {"api_key": api_key, "api_url": emu.api_url, "target": "us"}


@dataclasses.dataclass
class _Pooled:
    """What the pooled storm measured (times on the monotonic clock)."""

    storm: _Storm
    before: int = 0  # fds with every thread served, as the storm begins.
    began: float = 0.0
    back: float = 0.0  # The faults stopped.
    builds: int = 0  # Builds during the storm.
    spacing: float = 0.0  # The backoff in force when the faults stopped.
    recovered: bool = False  # Every thread created one since, in time.
    recovery: float = 0.0


def _pooled(emu: DaytonaEmulator, single) -> _Pooled:
    """The storm, through make_daytona_singleton's proxy."""
    run = _Pooled(_Storm(single.proxy().create, THREADS))
    storm = run.storm
    storm.start()
    try:
        assert _deadline_wait(lambda: len(storm.warm) == THREADS, 30)
        run.before = fd_count()
        builds_before = single.statistics().builds
        run.began = time.monotonic()
        _faults(emu, on=True)
        emu.drop_connections("pooled")  # New connections handshake.
        storm.sample_for(STORM, single)
        run.builds = single.statistics().builds - builds_before
        _faults(emu, on=False)
        storm.back = run.back = time.monotonic()
        run.spacing = single.statistics().backoff
        run.recovered = _deadline_wait(
            lambda: len(storm.ok_after) == THREADS, run.spacing + SLACK
        )
        run.recovery = time.monotonic() - run.back
    finally:
        _faults(emu, on=False)
        storm.join()
    return run


def _naive(emu: DaytonaEmulator) -> tuple[_Storm, int, int]:
    """The same storm, a new client per attempt, each kept referenced.

    Returns the storm, the clients made and the fds as it began.
    """
    clients: list[daytona.Daytona] = []
    config = daytona.DaytonaConfig(**_config(emu, "naive"))

    def per_attempt() -> None:
        client = daytona.Daytona(config)
        clients.append(client)
        client.create()

    storm = _Storm(per_attempt, NAIVE_THREADS)
    storm.start()
    try:
        assert _deadline_wait(lambda: len(storm.warm) == NAIVE_THREADS, 30)
        before = fd_count()
        _faults(emu, on=True)
        storm.sample_for(STORM)
    finally:
        _faults(emu, on=False)
        storm.join()
        for client in clients:
            close_daytona(client)
    return storm, len(clients), before


@pytest.mark.timeout(150)
def test_healing_stays_bounded_where_a_client_per_attempt_leaks(storm_emu):
    """Pooled: <= 4 healing builds, fds flat; per attempt: fds grow."""
    first, cap = _lifecycle.BACKOFF_FIRST, _lifecycle.BACKOFF_CAP
    assert (1.0, 60.0) == (first, cap), "the shipped defaults"
    assert 4 == healing_builds_bound(STORM, first, cap)
    settle()
    baseline = fd_count()
    single = make_daytona_singleton(lambda: _config(storm_emu, "pooled"))

    with _retirements(single._self_name) as retirements:
        run = _pooled(storm_emu, single)
    naive, naive_clients, naive_before = _naive(storm_emu)
    # The retirement deferred at the storm's end has been carried out by
    # its timer meanwhile (8 s after its client's build at the latest).
    quiet = _deadline_wait(lambda: single.statistics().deferred is None, SLACK)
    poolkeeper.close_all()
    released = _deadline_wait(
        lambda: (settle(), fd_count())[1] <= baseline, 15
    )

    bound = healing_builds_bound(run.back - run.began, first, cap)
    errors = run.storm.errors
    ssl_eofs = [e for e in errors if ssl.SSLEOFError in _types(e)]
    samples = run.storm.samples
    growth = _slope(run.storm.times, samples)
    naive_growth = _slope(naive.times, naive.samples)
    print(
        f"\nstorm {run.back - run.began:.1f}s, {THREADS} threads: pooled"
        f" {len(errors)} errors ({len(ssl_eofs)} SSLEOFError), healing"
        f" builds {run.builds} (bound {bound}); fds baseline {baseline},"
        f" before {run.before}, during {min(samples)}..{max(samples)}"
        f" ({growth:+.2f}/s); every thread ok {run.recovery:.2f}s after."
        f"\nnaive, {NAIVE_THREADS} threads: {naive_clients} clients,"
        f" {len(naive.errors)} errors;"
        f" fds {naive_before} -> {naive.samples[-1]} ({naive_growth:+.1f}/s)"
        f"\nhealing retirements (age, spacing handed on): {retirements.seen}"
    )
    # The incident's error, through the real SDK, every one a transport
    # failure (and so retiring the client it ran on).
    assert ssl_eofs, "the incident's SSLEOFError never happened"
    assert any(
        "EOF occurred in violation of protocol" in str(e) for e in errors
    )
    assert all(is_transport_failure(e) for e in errors)
    assert len(errors) > 10 * bound
    # Builds within the backoff's bound, however many calls failed. The
    # rule each healing retirement kept: its client lived at least the
    # spacing its predecessor's retirement handed on (the first client had
    # none), and that spacing is the first one or the one before doubled.
    # So healing builds are at least *first* apart: at most 1 + T/first
    # in T seconds whenever clients fail; and at most the doubling bound
    # (4 in 10 s) when each fails within its spacing, as here, where every
    # thread hammers the new client at once.
    healed = [(a, s) for r, a, s in retirements.seen if r in HEALING]
    assert len(healed) >= run.builds >= 1
    handed = 0.0
    for age, spacing in healed:
        assert age >= handed, (age, handed, healed)
        assert spacing in {first, min(2 * handed, cap)}, healed
        handed = spacing
    assert run.builds <= 1 + int((run.back - run.began) / first)
    failed_fast = all(spacing > first for _, spacing in healed[1:])
    assert run.builds <= bound or not failed_fast, healed
    # Flat, where the incident grew ~17 fds/s: every fd is one of a client
    # the singleton has not closed yet, and those are few. The SDK's
    # urllib3 pool (DaytonaConfig's connection_pool_maxsize, 250, not
    # blocking) opens one connection per request in flight and keeps
    # each, so a client holds at most one per thread, plus its websocket
    # (up to 3 during a reconnect): 2 fds each, both ends being in this
    # process. The client closed last may still hold its server side
    # (the emulator's loop has not seen those closes yet): one client's
    # worth more, and 16 fds of slack.
    # The clients open at a sample are read from the statistics: the live
    # one, and retired ones whose close has not returned (usually one;
    # more when a close outlasts the backoff on a loaded machine). So the
    # bound follows from the code at every sample, whatever the machine's
    # speed (the slope is printed, not asserted: a rate follows the load);
    # and clients are never more than the builds (at most the backoff's
    # bound, asserted above) plus the one live when the storm began.
    per_client = 2 * (THREADS + 3)
    assert len(run.storm.opened) == len(samples)
    over = [
        (fds, opened)
        for fds, opened in zip(samples, run.storm.opened, strict=True)
        if fds > baseline + (opened + 1) * per_client + 16
    ]
    assert [] == over, (baseline, per_client)
    assert max(run.storm.opened) <= run.builds + 1
    # Every thread back.
    assert run.recovered, run.recovery
    assert quiet
    assert released, (fd_count(), baseline)
    # A client per attempt, over the same storm, grows: by more than its
    # threads' connections in flight could explain (both ends of one a
    # thread), and steadily, where the pooled run did not grow.
    assert naive.samples[-1] - naive_before > 2 * NAIVE_THREADS


def test_the_bound_counts_the_doublings():
    """1 s doubling: builds at 0, 1, 3, 7, 15 s."""
    assert 4 == healing_builds_bound(10.0, 1.0, 60.0)
    assert 5 == healing_builds_bound(15.0, 1.0, 60.0)
    assert 6 == healing_builds_bound(10.0, 1.0, 2.0)
