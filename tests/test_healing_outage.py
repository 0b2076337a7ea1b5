"""Issue 21's outage: 10 s without a server, 64 threads through the proxy.

A real ``httpx.Client`` against a real HTTP server on 127.0.0.1 (the one
of ``test_healing_servers``), with the backoff's real defaults
(``BACKOFF_FIRST`` = 1 s, doubling, ``BACKOFF_CAP`` = 60 s). The server
goes away for 10 s, listening again afterwards on the same port, while 64
threads call ``GET /`` through ``api.proxy()`` with
``retire_on=httpx.TransportError``: every call of the outage fails and
retires the client it ran on.

The bound. The first healing retirement is carried out at once; each
client built by healing after it is given a spacing (1 s, then 2 s, 4 s,
8 s...) before which its own retirement waits, and it is retired within
that spacing since every thread keeps failing on it. So healing builds
happen at the earliest 0, 1, 3, 7, 15 s after the first: at most 4 in the
10 s of the outage (:func:`healing_builds_bound`), 5 builds in all with
the client that was live when it began, whatever the number of threads
(the incident's client per attempt made one per failed call: here some
30,000). The client live when the server returns was built at 7 s at the
earliest and has an 8 s spacing: its deferred retirement is carried out
by a timer when that spacing ends, one more build, not one per caller.

Recovery. That client itself is not broken (a refused connection leaves
nothing behind in httpx's pool), so callers succeed again as soon as the
server listens; the system promises it within one spacing (the one in
force when the server returns, at most 8 s here) plus scheduling slack.

File descriptors, sampled every 50 ms. Before the outage the process
holds both ends of the threads' keep-alive connections; during it, the
first client's pool until that client is closed, then at most a socket
per thread, while its connect is refused: flat (the least-squares slope
is near 0), where the incident grew ~17 fds/s. Nothing is left once the
client is reset.
"""

from __future__ import annotations

import dataclasses
import itertools
import time

import pytest
from helpers import WAIT
from test_healing_servers import (
    Callers,
    LoopbackServer,
    fd_count,
    healing_builds_bound,
)

httpx = pytest.importorskip("httpx")

from poolkeeper import _lifecycle, process_singleton  # noqa: E402

OUTAGE = 10.0
THREADS = 64
#: The incident's growth of open fds, per second (INCIDENT.md).
INCIDENT_FDS_PER_SECOND = 17
#: Slack on top of the backoff for a loaded 2-core machine (seconds).
SLACK = 5.0


def _deadline_wait(predicate, timeout: float) -> bool:
    """Poll *predicate* by the wall clock for at most *timeout* seconds."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(0.02)
    return bool(predicate())


def _sample_until(end: float, samples: list[int], times: list[float]) -> None:
    while time.monotonic() < end:
        samples.append(fd_count())
        times.append(time.monotonic())
        time.sleep(0.05)


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


@pytest.fixture(name="server")
def _server():
    server = LoopbackServer()
    server.start()
    yield server
    server.stop()


class _Singleton:
    """The singleton under test, with its builds' and closes' times."""

    def __init__(self, url: str) -> None:
        self.built_at: list[float] = []
        self.closed: list[object] = []
        self.closed_at: list[float] = []

        @process_singleton(retire_on=httpx.TransportError, close=self.close)
        def api() -> httpx.Client:
            self.built_at.append(time.monotonic())
            return httpx.Client(base_url=url, timeout=5.0)

        self.api = api

    def close(self, client: httpx.Client) -> None:
        self.closed_at.append(time.monotonic())
        self.closed.append(client)
        client.close()


@dataclasses.dataclass
class _Run:
    """What one outage measured (times on the monotonic clock)."""

    baseline: int = 0  # fds with the server up and no client.
    before: int = 0  # fds with every thread served, as the outage begins.
    began: float = 0.0
    back: float = 0.0  # The server listens again.
    samples: list[int] = dataclasses.field(default_factory=list)
    times: list[float] = dataclasses.field(default_factory=list)
    refused: int = 0  # Calls that failed during the outage.
    spacing: float = 0.0  # The backoff in force when the server returned.
    recovered: float | None = None  # Every caller ok again, after back.
    quiet: bool = False  # No retirement deferred any more.
    served: bool = False  # fds back to both ends of a connection a thread.
    after: int = 0
    released: bool = False  # fds back to the baseline after a reset.
    end: int = 0


def _outage(server: LoopbackServer, single: _Singleton) -> _Run:
    run = _Run(baseline=fd_count())
    port = server.port
    proxy = single.api.proxy()
    callers = Callers(lambda: proxy.get("/").status_code, THREADS)
    callers.start()
    try:
        # Warm: every thread had an answer, the pool holds connections.
        assert _deadline_wait(lambda: len(callers.warm) == THREADS, WAIT)
        assert [] == callers.failures
        run.before = fd_count()
        run.began = time.monotonic()
        with server.outage():
            _sample_until(run.began + OUTAGE, run.samples, run.times)
            run.refused = callers.refused
        assert port == server.port  # The same port, listening again.
        callers.back = run.back = time.monotonic()
        run.spacing = single.api.statistics().backoff
        if _deadline_wait(
            lambda: len(callers.ok_after) == THREADS, run.spacing + SLACK
        ):
            run.recovered = max(callers.ok_after.values()) - run.back
        # The retirement deferred at the end of the outage is carried out
        # by its timer once the spacing ends; then healing is quiet.
        run.quiet = _deadline_wait(
            lambda: single.api.statistics().deferred is None,
            run.spacing + SLACK,
        )
        # Both ends of a connection per thread, once the server's handler
        # threads have seen the retired client's connections end.
        run.served = _deadline_wait(
            lambda: fd_count() <= run.baseline + 2 * THREADS + 4, 10.0
        )
        run.after = fd_count()
    finally:
        callers.join()
    assert [] == callers.failures
    single.api.reset()
    run.released = _deadline_wait(lambda: fd_count() <= run.baseline, 10.0)
    run.end = fd_count()
    return run


@pytest.mark.timeout(120)
def test_an_outage_heals_within_the_bound_with_flat_fds(server):
    """10 s outage, 64 threads: <= 4 healing builds, fds flat, recovery."""
    first, cap = _lifecycle.BACKOFF_FIRST, _lifecycle.BACKOFF_CAP
    assert (1.0, 60.0) == (first, cap), "the shipped defaults"
    assert 4 == healing_builds_bound(OUTAGE, first, cap)
    single = _Singleton(server.url)

    run = _outage(server, single)

    built_at = single.built_at
    in_outage = [t for t in built_at if run.began <= t < run.back]
    builds_after = sum(t >= run.back for t in built_at)
    bound = healing_builds_bound(run.back - run.began, first, cap)
    growth = _slope(run.times, run.samples)
    print(
        f"\noutage {run.back - run.began:.2f}s, {THREADS} threads,"
        f" {run.refused} failed calls: healing builds {len(in_outage)}"
        f" (bound {bound}) at {[round(t - run.began, 2) for t in in_outage]}"
        f" s; spacing at the return {run.spacing:.0f}s, every caller ok"
        f" {run.recovered or -1:.2f} s after it, {builds_after} build(s)"
        f" after it;"
        f" fds baseline {run.baseline}, before {run.before}, during"
        f" {min(run.samples)}..{max(run.samples)} (slope {growth:.2f}"
        f" fds/s), after {run.after}, end {run.end}"
    )
    # Every call of the outage failed, yet builds stayed within the bound:
    # not one per failed call (the incident), nor one per thread.
    assert run.refused > 10 * bound
    assert 1 <= len(in_outage) <= bound
    assert built_at[0] < run.began  # The first, before the outage.
    # Each healing build waited out the doubling spacing (the timers'
    # rounding aside).
    gaps = [b - a for a, b in itertools.pairwise(in_outage)]
    for n, gap in enumerate(gaps):
        assert gap >= first * 2**n - 0.01, gaps
    # Back within the spacing in force (8 s at most), in practice at once.
    assert run.spacing <= 2 ** (bound - 1) * first
    assert run.recovered is not None
    # Then the one deferred retirement, and quiet.
    assert run.quiet
    assert builds_after <= 1
    # Every retired client closed, once; the live one at the reset.
    closed = single.closed
    assert len(closed) == len({id(c) for c in closed}) == len(built_at)
    # Flat. Once the first client is closed (its pool with it), at most
    # a socket per thread, in flight while its connect is refused; no
    # growth over the outage (least squares), where the incident grew
    # ~17 fds/s; nothing left at the end.
    first_closed = single.closed_at[0]
    assert first_closed < run.began + OUTAGE / 2
    later = [
        n
        for n, t in zip(run.samples, run.times, strict=True)
        if t > first_closed
    ]
    assert max(later) <= run.baseline + THREADS + 4
    assert growth < INCIDENT_FDS_PER_SECOND / 4
    assert run.served, (run.after, run.baseline)
    assert run.released, (run.end, run.baseline)
