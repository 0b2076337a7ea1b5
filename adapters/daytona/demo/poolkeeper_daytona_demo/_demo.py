"""The demo: the incident's client-per-attempt loop against daytona_client.

Both phases run the same workload against one in-process emulator: a
warm-up round, then the rest of the attempts. Every number reported is
measured: fds from ``/proc/self/fd``, threads from
``threading.active_count()``, attempts and failures counted by the
workers, connections counted by the emulator.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time
from dataclasses import replace
from typing import TYPE_CHECKING, Final, TextIO

import daytona
from poolkeeper_daytona import close_daytona, daytona_client
from poolkeeper_daytona.testing import DaytonaEmulator

from poolkeeper_daytona_demo._results import (
    FD_TOLERANCE,
    Cleanup,
    DemoReport,
    PhaseResult,
)
from poolkeeper_daytona_demo._workload import (
    CREATE_TIMEOUT,
    Budget,
    Point,
    Sampler,
    measure,
    run_round,
)

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from poolkeeper_daytona_demo._report import Progress
    from poolkeeper_daytona_demo._results import DemoSettings

__all__ = ["run_demo"]

_NAIVE_KEY: Final = "naive-demo-key"
_POOLED_KEY: Final = "pooled-demo-key"
_WARM_KEY: Final = "warm-up-demo-key"
# API latency, so concurrent creates really overlap: the pooled phase's
# warm-up then opens every connection its thread count will ever need.
_LATENCY: Final = 0.05
_SETTLE_TIMEOUT: Final = 5.0
_SETTLE_STEP: Final = 0.05


def _settle_to(target: Point, stop: threading.Event) -> Point:
    """Measure until fds are back near *target* (bounded wait)."""
    deadline = time.monotonic() + _SETTLE_TIMEOUT
    point = measure()
    while (
        point.fds > target.fds + FD_TOLERANCE
        and time.monotonic() < deadline
        and not stop.wait(_SETTLE_STEP)
    ):
        point = measure()
    return point


@contextlib.contextmanager
def _environment(api_url: str) -> Iterator[None]:
    """Point ``daytona_client()`` at the emulator; restore env afterwards."""
    wanted = {"DAYTONA_API_KEY": _POOLED_KEY, "DAYTONA_API_URL": api_url}
    saved = {name: os.environ.get(name) for name in wanted}
    os.environ.update(wanted)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value


class _Run:
    """One run of the demo: its emulator, phases and leftovers."""

    def __init__(
        self,
        settings: DemoSettings,
        stop: threading.Event,
        progress: Progress,
        out: TextIO,
    ) -> None:
        self.settings = settings
        self.stop = stop
        self.progress = progress
        self.out = out
        self.report = DemoReport(settings)
        self.emu = DaytonaEmulator(
            failure_rate=settings.failure_rate,
            latency=_LATENCY,
            seed=settings.seed,
            max_lifetime=2 * settings.seconds + 300.0,
        )
        # The incident's closures, which kept every client alive.
        self.naive: list[daytona.Daytona] = []
        self._naive_lock = threading.Lock()
        self._naive_config: daytona.DaytonaConfig | None = None

    def say(self, text: str) -> None:
        print(text, file=self.out, flush=True)

    def run(self) -> DemoReport:
        # Start with no live client, so the pooled phase's build counts.
        daytona_client.reset()
        settings = self.settings
        self.say(
            f"poolkeeper-daytona demo: {settings.threads} threads, "
            f"{settings.attempts} create attempts per phase "
            f"({settings.warm_up} of them warm-up), "
            f"{settings.failure_rate:.0%} injected failures, "
            f"at most {settings.seconds:g} s per phase."
        )
        with self.emu, _environment(self.emu.api_url):
            self.report.api_url = self.emu.api_url
            self.say(
                f"Emulator serving {self.emu.api_url} in this process, so "
                "fds count both ends of each loopback connection."
            )
            baseline = measure()
            try:
                self._phases()
            finally:
                # Reached early only on an exception (a forced Ctrl-C).
                if self.naive:
                    self._cleanup(self._close_naive, baseline)
                if daytona_client.current() is not None:
                    self._cleanup(self._close_pooled, baseline)
        self.say("Emulator stopped.")
        self.report.interrupted = self.stop.is_set()
        return self.report

    def _warm_sdk(self) -> None:
        """Build, use and close one client, outside both phases.

        The SDK imports most of itself on first use (seconds, when no
        bytecode is cached): that must not count against the naive phase.
        """
        began = time.monotonic()
        faults = self.emu.faults
        rate, faults.failure_rate = faults.failure_rate, 0.0
        # One throwaway client, closed below: imports are not a leak.
        client = daytona.Daytona(  # noqa: PK001
            daytona.DaytonaConfig(api_key=_WARM_KEY, api_url=self.emu.api_url)
        )
        try:
            client.create(timeout=CREATE_TIMEOUT)
        finally:
            faults.failure_rate = rate
            close_daytona(client)
        self.say(
            "Loaded the SDK (one client built, used and closed) in "
            f"{time.monotonic() - began:.1f} s."
        )

    def _phases(self) -> None:
        self._warm_sdk()
        if self.stop.is_set():
            return
        self._naive_config = daytona.DaytonaConfig(
            api_key=_NAIVE_KEY, api_url=self.emu.api_url
        )
        self.say(
            "[naive] a new daytona.Daytona(DaytonaConfig(...)) per create "
            "attempt, retries included, never closed"
        )
        naive = self._phase("naive", self._make_naive)
        self.report.phases.append(
            replace(
                naive,
                clients=len(self.naive),
                connections=self.emu.total_connections(_NAIVE_KEY),
            )
        )
        self._summarize(naive)
        self._cleanup(self._close_naive, naive.start)
        if self.stop.is_set():
            return
        self.say(
            "[pooled] daytona_client(), configured from DAYTONA_API_KEY and "
            "DAYTONA_API_URL"
        )
        builds = daytona_client.statistics().builds
        pooled = self._phase("pooled", daytona_client)
        self.report.phases.append(
            replace(
                pooled,
                clients=daytona_client.statistics().builds - builds,
                connections=self.emu.total_connections(_POOLED_KEY),
            )
        )
        self._summarize(pooled)
        self._cleanup(self._close_pooled, pooled.start)

    def _summarize(self, phase: PhaseResult) -> None:
        kinds = ", ".join(
            f"{count} {kind}"
            for kind, count in sorted(phase.failure_kinds.items())
        )
        self.say(
            f"[{phase.name}] {phase.attempts} attempts "
            f"({phase.warm_attempts} warm-up), {phase.failures} failed"
            f"{': ' + kinds if kinds else ''}; fds {phase.start.fds} -> "
            f"{phase.warm.fds} after warm-up -> {phase.final.fds}, threads "
            f"{phase.start.threads} -> {phase.warm.threads} -> "
            f"{phase.final.threads}; {phase.wall:.1f} s."
        )

    def _make_naive(self) -> daytona.Daytona:
        # The incident's make_daytona(): a new client on every attempt.
        client = daytona.Daytona(self._naive_config)  # noqa: PK001
        with self._naive_lock:
            self.naive.append(client)
        return client

    def _phase(
        self, name: str, make: Callable[[], daytona.Daytona]
    ) -> PhaseResult:
        settings, stop = self.settings, self.stop
        began = time.monotonic()
        budget = Budget(began + settings.seconds, stop)
        sampler = Sampler(
            budget, lambda sample: self.progress.update(name, sample)
        )
        sampler.start()
        try:
            start = measure()
            budget.allow(settings.warm_up)
            run_round(settings.threads, make, budget, stop)
            warm_attempts = budget.attempts
            warm = measure()
            budget.allow(settings.attempts)
            run_round(settings.threads, make, budget, stop)
            final = measure()
        finally:
            samples = sampler.stop()
            self.progress.finish()
        fds = [s.fds for s in samples] + [start.fds, warm.fds, final.fds]
        threads = [s.threads for s in samples]
        threads += [start.threads, warm.threads, final.threads]
        return PhaseResult(
            name=name,
            attempts=budget.attempts,
            failures=budget.failures,
            failure_kinds=dict(budget.failure_kinds),
            warm_attempts=warm_attempts,
            clients=0,
            connections=0,
            start=start,
            warm=warm,
            final=final,
            peak_fds=max(fds),
            peak_threads=max(threads),
            wall=time.monotonic() - began,
            samples=samples,
        )

    def _cleanup(
        self, close: Callable[[], tuple[str, int]], target: Point
    ) -> None:
        before = measure()
        began = time.monotonic()
        what, count = close()
        seconds = time.monotonic() - began
        cleanup = Cleanup(
            what, count, seconds, before, _settle_to(target, self.stop)
        )
        self.report.cleanups.append(cleanup)
        self.say(
            f"Closed {cleanup.clients} {cleanup.what} in "
            f"{cleanup.seconds:.2f} s: fds {before.fds} -> "
            f"{cleanup.after.fds}, threads {before.threads} -> "
            f"{cleanup.after.threads}."
        )

    def _close_naive(self) -> tuple[str, int]:
        with self._naive_lock:
            clients, self.naive = self.naive, []
        for client in clients:
            close_daytona(client)
        return "naive clients with close_daytona", len(clients)

    @staticmethod
    def _close_pooled() -> tuple[str, int]:
        closed = daytona_client.reset()
        return "pooled client with daytona_client.reset()", int(closed)


def run_demo(
    settings: DemoSettings,
    stop: threading.Event,
    progress: Progress,
    out: TextIO,
) -> DemoReport:
    """Run both phases and close everything, even when interrupted.

    Args:
        settings: What to run.
        stop: Set it (from a signal handler) to stop early and clean up.
        progress: Shows the live progress line.
        out: Where the narration goes.

    Returns:
        The measurements; :attr:`DemoReport.interrupted` if *stop* was set.
    """
    return _Run(settings, stop, progress, out).run()
