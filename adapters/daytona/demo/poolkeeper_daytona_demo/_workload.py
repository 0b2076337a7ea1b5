"""The demo's workload: concurrent creates with retries, and its probes."""

from __future__ import annotations

import gc
import os
import random
import threading
import time
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Callable

    import daytona

__all__ = [
    "CREATE_TIMEOUT",
    "Budget",
    "Point",
    "Sample",
    "Sampler",
    "fd_count",
    "measure",
    "run_round",
]

# Per attempt; bounds how long a stopped or timed-out phase runs over.
CREATE_TIMEOUT: Final = 10.0
_MAX_RETRIES: Final = 5
_BACKOFF_BASE: Final = 0.02
_BACKOFF_CAP: Final = 0.32
_JOIN_STEP: Final = 0.1
# After a stop, how long to wait for in-flight creates before abandoning
# the (daemon) workers.
_JOIN_GRACE: Final = CREATE_TIMEOUT + 2.0


def fd_count() -> int:
    """Return how many file descriptors this process has open.

    Returns:
        The size of ``/proc/self/fd`` (``/dev/fd`` where there is no
        ``/proc``); the directory's own descriptor is included.
    """
    path = "/proc/self/fd" if os.path.isdir("/proc/self/fd") else "/dev/fd"  # noqa: PTH112
    return len(os.listdir(path))  # noqa: PTH208 - only a count.


@dataclass(frozen=True, slots=True)
class Point:
    """Open fds and live threads at a quiet moment (no creates running).

    Attributes:
        fds: Open file descriptors.
        threads: ``threading.active_count()``.
    """

    fds: int
    threads: int


def measure() -> Point:
    """Collect garbage twice, then count fds and threads.

    Returns:
        What is still held once unreachable objects are freed.
    """
    gc.collect()
    gc.collect()
    return Point(fd_count(), threading.active_count())


@dataclass(frozen=True, slots=True)
class Sample:
    """One reading of the background sampler.

    Attributes:
        elapsed: Seconds since the phase started.
        fds: Open file descriptors.
        threads: ``threading.active_count()``.
        attempts: Create attempts started so far in the phase.
        failures: Create attempts that failed so far.
    """

    elapsed: float
    fds: int
    threads: int
    attempts: int
    failures: int


class Budget:
    """Hands out create attempts to workers, up to a limit and a deadline.

    Args:
        deadline: ``time.monotonic()`` after which no attempt starts.
        stop: Set to stop handing out attempts (Ctrl-C).
    """

    def __init__(self, deadline: float, stop: threading.Event) -> None:
        """Start with no attempts allowed; :meth:`allow` raises the limit."""
        self._lock = threading.Lock()
        self._deadline = deadline
        self._stop = stop
        self._limit = 0
        self.attempts = 0
        self.failures = 0
        self.failure_kinds: Counter[str] = Counter()

    def allow(self, limit: int) -> None:
        """Let the attempt counter go up to *limit*."""
        with self._lock:
            self._limit = limit

    @property
    def is_over(self) -> bool:
        """Whether the deadline passed or a stop was requested."""
        return self._stop.is_set() or time.monotonic() >= self._deadline

    def take(self) -> bool:
        """Count one attempt; return whether the caller may make it."""
        if self.is_over:
            return False
        with self._lock:
            if self.attempts >= self._limit:
                return False
            self.attempts += 1
            return True

    def failed(self, exc: BaseException) -> None:
        """Count a failed attempt under its exception's type name."""
        with self._lock:
            self.failures += 1
            self.failure_kinds[type(exc).__name__] += 1


def _backoff(retry: int, rng: random.Random) -> float:
    delay = min(_BACKOFF_CAP, _BACKOFF_BASE * 2.0 ** (retry - 1))
    return delay * rng.uniform(0.5, 1.0)


def _worker(
    make: Callable[[], daytona.Daytona],
    budget: Budget,
    stop: threading.Event,
    seed: int,
) -> None:
    """Create sandboxes until the budget runs out, retrying with backoff.

    As in the incident, every attempt asks *make* for a client, retries
    included; after ``_MAX_RETRIES`` failures in a row the sandbox is given
    up and the next one started.
    """
    rng = random.Random(seed)  # noqa: S311 - jitter, not cryptography.
    retry = 0
    while budget.take():
        error = _attempt(make)
        if error is None:
            retry = 0
            continue
        budget.failed(error)
        retry = retry + 1 if retry < _MAX_RETRIES else 0
        if retry:
            stop.wait(_backoff(retry, rng))


def _attempt(make: Callable[[], daytona.Daytona]) -> Exception | None:
    """Make one create attempt; return its error, if any."""
    try:
        make().create(timeout=CREATE_TIMEOUT)
    # Any failed attempt is retried, as the incident's loop did; the kinds
    # are counted and reported, so nothing is hidden.
    except Exception as exc:  # noqa: BLE001
        return exc
    return None


def run_round(
    threads: int,
    make: Callable[[], daytona.Daytona],
    budget: Budget,
    stop: threading.Event,
) -> None:
    """Run *threads* workers until *budget* is spent, then join them.

    Joins in short steps, so a signal handler in the main thread runs
    promptly. Once *stop* is set, in-flight creates get a bounded grace
    period; workers still running after it are daemons and are abandoned.
    """
    workers = [
        threading.Thread(
            target=_worker,
            args=(make, budget, stop, index),
            name=f"demo-worker-{index}",
            daemon=True,
        )
        for index in range(threads)
    ]
    for worker in workers:
        worker.start()
    give_up: float | None = None
    for worker in workers:
        while worker.is_alive():
            worker.join(_JOIN_STEP)
            if give_up is None and budget.is_over:
                give_up = time.monotonic() + _JOIN_GRACE
            if give_up is not None and time.monotonic() > give_up:
                return


class Sampler:
    """Samples fds and threads from a background thread, in bounded memory.

    When *limit* samples are held, every other one is dropped and the
    interval doubles, so a long run keeps its whole timeline.

    Args:
        budget: Read for the attempt and failure counts.
        on_sample: Called with each sample, from the sampler thread.
        interval: Seconds between samples at first.
        limit: Most samples held.
    """

    def __init__(
        self,
        budget: Budget,
        on_sample: Callable[[Sample], None],
        interval: float = 0.1,
        limit: int = 1024,
    ) -> None:
        """Prepare; :meth:`start` begins sampling."""
        self._budget = budget
        self._on_sample = on_sample
        self._interval = interval
        self._limit = limit
        self._samples: list[Sample] = []
        self._done = threading.Event()
        self._thread = threading.Thread(
            target=self._run, name="demo-sampler", daemon=True
        )
        self._began = 0.0

    def start(self) -> None:
        """Take the first sample now and keep sampling."""
        self._began = time.monotonic()
        self._thread.start()

    def stop(self) -> tuple[Sample, ...]:
        """Stop sampling (joins the thread) and return the samples."""
        self._done.set()
        self._thread.join(5.0)
        return tuple(self._samples)

    def _run(self) -> None:
        while True:
            sample = Sample(
                time.monotonic() - self._began,
                fd_count(),
                threading.active_count(),
                self._budget.attempts,
                self._budget.failures,
            )
            self._samples.append(sample)
            if len(self._samples) >= self._limit:
                del self._samples[1::2]
                self._interval *= 2
            self._on_sample(sample)
            if self._done.wait(self._interval):
                return
