"""What the demo measured: settings, phases, cleanups and the verdict."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from poolkeeper_daytona_demo._workload import Point, Sample

__all__ = [
    "FD_TOLERANCE",
    "Cleanup",
    "DemoReport",
    "DemoSettings",
    "PhaseResult",
]

#: Fds the pooled phase may gain after its warm-up and still pass.
FD_TOLERANCE: Final = 4


@dataclass(frozen=True, slots=True)
class DemoSettings:
    """What the demo runs.

    Attributes:
        threads: Concurrent workers per phase.
        attempts: Create attempts per phase, retries included.
        failure_rate: Fraction of creates the emulator fails with 503.
        seconds: Time cap per phase.
        seed: Seed of the emulator's injected failures.
    """

    threads: int = 8
    attempts: int = 120
    failure_rate: float = 0.3
    seconds: float = 15.0
    seed: int = 4

    @property
    def warm_up(self) -> int:
        """Attempts in the warm-up round of each phase."""
        return min(
            self.attempts // 2, max(2 * self.threads, self.attempts // 10)
        )


@dataclass(frozen=True, slots=True)
class PhaseResult:
    """What one phase measured.

    Attributes:
        name: ``"naive"`` or ``"pooled"``.
        attempts: Create attempts made.
        failures: Attempts that failed.
        failure_kinds: Failures by exception type name.
        warm_attempts: Attempts made in the warm-up round.
        clients: ``daytona.Daytona`` objects built.
        connections: TCP connections the emulator accepted.
        start: Before the first attempt.
        warm: After the warm-up round.
        final: After the last attempt.
        peak_fds: Most open fds seen.
        peak_threads: Most threads seen.
        wall: Seconds the phase took.
        samples: The sampler's readings.
    """

    name: str
    attempts: int
    failures: int
    failure_kinds: dict[str, int]
    warm_attempts: int
    clients: int
    connections: int
    start: Point
    warm: Point
    final: Point
    peak_fds: int
    peak_threads: int
    wall: float
    samples: tuple[Sample, ...]

    @property
    def fd_growth(self) -> int:
        """Fds gained from the end of the warm-up to the end."""
        return self.final.fds - self.warm.fds

    @property
    def fd_growth_per_100(self) -> float:
        """:attr:`fd_growth` per 100 attempts after the warm-up."""
        after = self.attempts - self.warm_attempts
        return 100.0 * self.fd_growth / after if after > 0 else 0.0


@dataclass(frozen=True, slots=True)
class Cleanup:
    """Closing one phase's clients.

    Attributes:
        what: What was closed.
        clients: How many clients were closed.
        seconds: Time spent in ``close_daytona`` / ``reset()``.
        before: Just before closing.
        after: Once the fds stopped falling (bounded wait).
    """

    what: str
    clients: int
    seconds: float
    before: Point
    after: Point


@dataclass(slots=True)
class DemoReport:
    """Everything the demo measured.

    Attributes:
        settings: What was run.
        api_url: The emulator's URL.
        phases: Completed (or interrupted) phases, in order.
        cleanups: Closing after each phase.
        interrupted: Whether a stop was requested.
    """

    settings: DemoSettings
    api_url: str = ""
    phases: list[PhaseResult] = field(default_factory=list)
    cleanups: list[Cleanup] = field(default_factory=list)
    interrupted: bool = False

    @property
    def pooled(self) -> PhaseResult | None:
        """The pooled phase, if it ran."""
        return next((p for p in self.phases if p.name == "pooled"), None)

    @property
    def is_ok(self) -> bool:
        """Whether the pooled phase ran and its fds did not grow."""
        pooled = self.pooled
        return (
            not self.interrupted
            and pooled is not None
            and pooled.fd_growth <= FD_TOLERANCE
        )
