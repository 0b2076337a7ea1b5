"""The demo's chart: open fds and threads over time, per phase.

The SVG is written by hand, so the demo needs nothing beyond the SDK; a
PNG is added when matplotlib happens to be importable.
"""

from __future__ import annotations

import importlib
import math
from typing import TYPE_CHECKING, Final
from xml.sax.saxutils import escape, quoteattr

from poolkeeper_daytona_demo._report import capped

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence
    from pathlib import Path

    from poolkeeper_daytona_demo._results import DemoReport, PhaseResult
    from poolkeeper_daytona_demo._workload import Sample

__all__ = ["write_png", "write_svg"]

_WIDTH: Final = 960
_PANEL_HEIGHT: Final = 230
_LEFT: Final = 70
_RIGHT: Final = 170
_TOP: Final = 60
_GAP: Final = 60
_COLORS: Final = {"naive": "#d62728", "pooled": "#1f77b4"}
_FALLBACK_COLOR: Final = "#555555"
_METRICS: Final[tuple[tuple[str, str, Callable[[Sample], int]], ...]] = (
    ("fds", "open file descriptors", lambda s: s.fds),
    ("threads", "threads", lambda s: s.threads),
)


def _ticks(top: float, count: int = 5) -> list[float]:
    """Return round tick values from 0 to at least *top*."""
    top = max(top, 1.0)
    raw = top / count
    magnitude = 10.0 ** math.floor(math.log10(raw))
    step = next(
        m * magnitude for m in (1, 2, 2.5, 5, 10) if m * magnitude >= raw
    )
    return [i * step for i in range(math.ceil(top / step - 1e-9) + 1)]


def _label(value: float) -> str:
    return f"{value:g}"


class _Panel:
    """One plot area: maps data to pixels and draws axes."""

    def __init__(self, top: float, x_max: float, y_max: float) -> None:
        self.top = top
        self.x_ticks = _ticks(x_max)
        self.y_ticks = _ticks(y_max)
        self.x_max = self.x_ticks[-1]
        self.y_max = self.y_ticks[-1]
        self.width = _WIDTH - _LEFT - _RIGHT

    def x(self, value: float) -> float:
        return _LEFT + self.width * value / self.x_max

    def y(self, value: float) -> float:
        return self.top + _PANEL_HEIGHT * (1 - value / self.y_max)

    def axes(self, title: str) -> list[str]:
        bottom = self.top + _PANEL_HEIGHT
        parts = [
            (
                f'<text x="{_LEFT}" y="{self.top - 10}" '
                f'class="panel-title">{escape(title)}</text>'
            ),
            (
                f'<rect x="{_LEFT}" y="{self.top}" width="{self.width}" '
                f'height="{_PANEL_HEIGHT}" class="frame"/>'
            ),
        ]
        for tick in self.y_ticks:
            y = self.y(tick)
            parts.append(
                f'<line x1="{_LEFT}" y1="{y:.1f}" x2="{_LEFT + self.width}" '
                f'y2="{y:.1f}" class="grid"/>'
                f'<text x="{_LEFT - 6}" y="{y + 4:.1f}" class="y-tick">'
                f"{_label(tick)}</text>"
            )
        for tick in self.x_ticks:
            x = self.x(tick)
            parts.append(
                f'<line x1="{x:.1f}" y1="{bottom}" x2="{x:.1f}" '
                f'y2="{bottom + 4}" class="axis"/>'
                f'<text x="{x:.1f}" y="{bottom + 18}" class="x-tick">'
                f"{_label(tick)}</text>"
            )
        return parts

    def line(
        self,
        element_id: str,
        phase: PhaseResult,
        value: Callable[[Sample], int],
    ) -> list[str]:
        color = _COLORS.get(phase.name, _FALLBACK_COLOR)
        points = " ".join(
            f"{self.x(s.elapsed):.1f},{self.y(value(s)):.1f}"
            for s in phase.samples
        )
        parts = [
            (
                f"<polyline id={quoteattr(element_id)} "
                f"class={quoteattr('phase-' + phase.name)} "
                f'points="{points}" fill="none" stroke="{color}" '
                'stroke-width="1.8" stroke-linejoin="round"/>'
            )
        ]
        if phase.samples:
            last = phase.samples[-1]
            parts.append(
                f'<text x="{self.x(last.elapsed) + 6:.1f}" '
                f'y="{self.y(value(last)) + 4:.1f}" fill="{color}" '
                f'class="end-label">{escape(phase.name)} {value(last)}</text>'
            )
        return parts


def _style() -> str:
    return (
        "<style>"
        "text{font-family:sans-serif;font-size:12px;fill:#222}"
        ".title{font-size:16px;font-weight:bold}"
        ".panel-title{font-size:13px;font-weight:bold}"
        ".frame{fill:none;stroke:#888}"
        ".grid{stroke:#e4e4e4}"
        ".axis{stroke:#888}"
        ".y-tick{text-anchor:end}"
        ".x-tick{text-anchor:middle}"
        "</style>"
    )


def _legend(phases: Sequence[PhaseResult]) -> list[str]:
    x = _WIDTH - _RIGHT + 20
    parts = []
    for index, phase in enumerate(phases):
        y = _TOP + 10 + 20 * index
        color = _COLORS.get(phase.name, _FALLBACK_COLOR)
        parts.append(
            f'<line x1="{x}" y1="{y}" x2="{x + 24}" y2="{y}" '
            f'stroke="{color}" stroke-width="3"/>'
            f'<text x="{x + 30}" y="{y + 4}">{escape(phase.name)}</text>'
        )
    return parts


def _title(report: DemoReport) -> str:
    settings = report.settings
    # Claim only the attempts that ran: the time cap may stop a phase early.
    stopped = "".join(
        f"; {phase.name} stopped by the {settings.seconds:g} s cap after "
        f"{phase.attempts}"
        for phase in capped(report)
    )
    return (
        f"poolkeeper-daytona demo: {settings.threads} threads, "
        f"{settings.attempts} create attempts per phase{stopped}, "
        f"{settings.failure_rate:.0%} injected failures"
    )


def render_svg(report: DemoReport) -> str:
    """Return the chart of *report* as an SVG document.

    One panel per metric (fds, threads), x = seconds since the phase
    started, one polyline per phase with ids like ``fds-naive``.
    """
    phases = report.phases
    samples = [s for p in phases for s in p.samples]
    x_max = max((s.elapsed for s in samples), default=1.0)
    height = _TOP + len(_METRICS) * (_PANEL_HEIGHT + _GAP) + 10
    title = _title(report)
    parts = [
        (
            '<svg xmlns="http://www.w3.org/2000/svg" '
            f'width="{_WIDTH}" height="{height}" '
            f'viewBox="0 0 {_WIDTH} {height}">'
        ),
        _style(),
        f'<rect width="{_WIDTH}" height="{height}" fill="white"/>',
        f'<text x="{_LEFT}" y="26" class="title">{escape(title)}</text>',
    ]
    for index, (name, title_text, value) in enumerate(_METRICS):
        top = _TOP + 20 + index * (_PANEL_HEIGHT + _GAP)
        y_max = max((value(s) for s in samples), default=1)
        panel = _Panel(top, x_max, y_max)
        parts += panel.axes(f"{title_text} (sampled every ~100 ms)")
        for phase in phases:
            parts += panel.line(f"{name}-{phase.name}", phase, value)
    bottom = _TOP + 20 + len(_METRICS) * (_PANEL_HEIGHT + _GAP) - _GAP + 36
    parts.append(
        f'<text x="{_LEFT + (_WIDTH - _LEFT - _RIGHT) / 2}" y="{bottom}" '
        'class="x-tick">seconds since the phase started</text>'
    )
    parts += _legend(phases)
    parts.append("</svg>")
    return "\n".join(parts) + "\n"


def write_svg(report: DemoReport, path: Path) -> Path:
    """Write the chart of *report* to *path* as SVG.

    Returns:
        *path*.
    """
    path.write_text(render_svg(report), encoding="utf-8")
    return path


def write_png(report: DemoReport, path: Path) -> Path | None:
    """Write the chart as PNG with matplotlib, if it is importable.

    Returns:
        *path*, or ``None`` when matplotlib is not installed.
    """
    try:
        matplotlib = importlib.import_module("matplotlib")
    except ImportError:
        return None
    matplotlib.use("Agg")
    pyplot = importlib.import_module("matplotlib.pyplot")
    figure, axes = pyplot.subplots(
        len(_METRICS), 1, sharex=True, figsize=(9.6, 6.4)
    )
    try:
        for ax, (_, title, value) in zip(axes, _METRICS, strict=True):
            for phase in report.phases:
                ax.plot(
                    [s.elapsed for s in phase.samples],
                    [value(s) for s in phase.samples],
                    label=phase.name,
                    color=_COLORS.get(phase.name, _FALLBACK_COLOR),
                )
            ax.set_ylabel(title)
            ax.set_ylim(bottom=0)
            ax.grid(visible=True, alpha=0.3)
            ax.legend()
        axes[-1].set_xlabel("seconds since the phase started")
        figure.suptitle(_title(report))
        figure.tight_layout()
        figure.savefig(path, dpi=100)
    finally:
        pyplot.close(figure)
    return path
