"""The demo's console output: the live progress line and the tables."""

from __future__ import annotations

import threading
import time
from typing import TYPE_CHECKING, Final, TextIO

if TYPE_CHECKING:
    from collections.abc import Sequence

    from poolkeeper_daytona_demo._results import DemoReport, PhaseResult
    from poolkeeper_daytona_demo._workload import Sample

__all__ = [
    "Progress",
    "capped",
    "format_notes",
    "format_table",
    "format_verdict",
]

_TTY_INTERVAL: Final = 0.2
_PLAIN_INTERVAL: Final = 2.0
_COLUMNS: Final = (
    ("phase", 7),
    ("attempts", 9),
    ("failures", 9),
    ("clients", 8),
    ("conns", 6),
    ("peak fds", 9),
    ("final fds", 10),
    ("fds/100 att", 12),
    ("peak threads", 13),
    ("wall s", 7),
)


class Progress:
    """Shows fds, threads, attempts and failures while a phase runs.

    On a terminal one line is rewritten in place (carriage return); on
    anything else a plain line is written every two seconds.

    Args:
        stream: Where to write; ``None`` shows nothing.
        attempts: The attempt budget per phase, shown as the total.
    """

    def __init__(self, stream: TextIO | None, attempts: int) -> None:
        """Decide between in-place and periodic lines from *stream*."""
        self._stream = stream
        self._attempts = attempts
        self._is_tty = stream is not None and stream.isatty()
        self._interval = _TTY_INTERVAL if self._is_tty else _PLAIN_INTERVAL
        self._lock = threading.Lock()
        self._last_shown = float("-inf")
        self._last: tuple[str, Sample] | None = None
        self._width = 0

    def _line(self, phase: str, sample: Sample) -> str:
        return (
            f"[{phase}] {sample.elapsed:5.1f} s  fds {sample.fds:5d}  "
            f"threads {sample.threads:4d}  attempts "
            f"{sample.attempts:4d}/{self._attempts}  "
            f"failures {sample.failures:4d}"
        )

    def _write(self, line: str, *, final: bool) -> None:
        stream = self._stream
        if stream is None:
            return
        if self._is_tty:
            # Pad, so a shorter line fully covers the previous one.
            padded = line.ljust(self._width)
            self._width = len(line)
            stream.write("\r" + padded + ("\n" if final else ""))
        else:
            stream.write(line + "\n")
        stream.flush()

    def update(self, phase: str, sample: Sample) -> None:
        """Record *sample*; show it if the last line is old enough.

        Called from the sampler thread.
        """
        now = time.monotonic()
        with self._lock:
            self._last = (phase, sample)
            if now - self._last_shown >= self._interval:
                self._last_shown = now
                self._write(self._line(phase, sample), final=False)

    def finish(self) -> None:
        """Show the phase's last sample and end the line."""
        with self._lock:
            if self._last is not None:
                self._write(self._line(*self._last), final=True)
            self._last = None
            self._last_shown = float("-inf")
            self._width = 0


def _row(cells: Sequence[str]) -> str:
    first, *rest = cells
    parts = [first.ljust(_COLUMNS[0][1])]
    parts += [
        cell.rjust(width)
        for cell, (_, width) in zip(rest, _COLUMNS[1:], strict=True)
    ]
    return " ".join(parts).rstrip()


def capped(report: DemoReport) -> list[PhaseResult]:
    """Return the phases the time cap stopped before their last attempt."""
    planned = report.settings.attempts
    return [phase for phase in report.phases if phase.attempts < planned]


def format_notes(report: DemoReport) -> str:
    """Explain the table's ``conns`` column and any phase the cap stopped.

    Args:
        report: The measurements.

    Returns:
        One line per note, without a trailing newline.
    """
    settings = report.settings
    conns = (
        "conns: TCP connections the emulator accepted from the phase's "
        "clients. Each new client opens its own; one reused client keeps "
        "reusing a few."
    )
    lines = [conns]
    lines += [
        f"* {phase.name}: stopped by the {settings.seconds:g} s time cap "
        f"after {phase.attempts} of {settings.attempts} attempts "
        "(--seconds raises the cap)."
        for phase in capped(report)
    ]
    return "\n".join(lines)


def format_table(
    phases: Sequence[PhaseResult], planned: int | None = None
) -> str:
    """Return one row per phase, under a header.

    Args:
        phases: The measured phases.
        planned: Attempts each phase was to make; a phase that made fewer
            (the time cap stopped it) is marked ``*``.

    Returns:
        The table, without a trailing newline.
    """
    lines = [_row([name for name, _ in _COLUMNS])]
    lines += [
        _row(
            [
                phase.name,
                f"{phase.attempts}"
                + ("*" if planned and phase.attempts < planned else ""),
                str(phase.failures),
                str(phase.clients),
                str(phase.connections),
                str(phase.peak_fds),
                str(phase.final.fds),
                f"{phase.fd_growth_per_100:+.1f}",
                str(phase.peak_threads),
                f"{phase.wall:.1f}",
            ]
        )
        for phase in phases
    ]
    return "\n".join(lines)


def format_verdict(report: DemoReport, tolerance: int) -> str:
    """Say whether the pooled phase's fds grew after its warm-up.

    Args:
        report: The measurements.
        tolerance: Fds the pooled phase may gain.

    Returns:
        One line starting with ``OK`` or ``FAIL``.
    """
    pooled = report.pooled
    if pooled is None:
        return "FAIL: the pooled phase did not run."
    verdict = "OK" if pooled.fd_growth <= tolerance else "FAIL"
    naive = next((p for p in report.phases if p.name == "naive"), None)
    leaked = (
        ""
        if naive is None
        else f"a client per attempt leaked {naive.final.fds - naive.start.fds}"
        f" fds in {naive.attempts} attempts; "
    )
    return (
        f"{verdict}: {leaked}daytona_client() "
        f"{'held fds flat' if verdict == 'OK' else 'let fds grow'}: "
        f"pooled fds after warm-up {pooled.warm.fds}, at the end "
        f"{pooled.final.fds}: growth {pooled.fd_growth:+d} "
        f"(tolerance {tolerance})."
    )
