"""The command line: ``python -m poolkeeper_daytona_demo demo``."""

from __future__ import annotations

import argparse
import contextlib
import signal
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING, Final, TextIO

from poolkeeper_daytona_demo._chart import write_png, write_svg
from poolkeeper_daytona_demo._report import (
    Progress,
    format_notes,
    format_table,
    format_verdict,
)
from poolkeeper_daytona_demo._results import FD_TOLERANCE, DemoSettings

if TYPE_CHECKING:
    from collections.abc import Iterator, Sequence
    from types import FrameType

__all__ = ["main"]

#: Exit status when the pooled phase's fds grew.
EXIT_GREW: Final = 1
#: Exit status after Ctrl-C (128 + SIGINT, as shells report it).
EXIT_INTERRUPTED: Final = 130
_CHART_NAME: Final = "poolkeeper-daytona-demo"
_DEFAULTS: Final = DemoSettings()


def _echo(text: str = "", *, stream: TextIO | None = None) -> None:
    """Write one line to *stream* (default: the current stdout)."""
    stream = sys.stdout if stream is None else stream
    stream.write(text + "\n")
    stream.flush()


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        msg = f"must be at least 1, not {value}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _positive_float(text: str) -> float:
    value = float(text)
    if not value > 0:
        msg = f"must be positive, not {text}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _rate(text: str) -> float:
    value = float(text)
    if not 0.0 <= value <= 1.0:
        msg = f"must be within [0, 1], not {text}"
        raise argparse.ArgumentTypeError(msg)
    return value


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m poolkeeper_daytona_demo",
        description="Tools for poolkeeper's Daytona adapter.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    demo = commands.add_parser(
        "demo",
        help="Reproduce the fd leak of a client per create attempt, "
        "then run the same workload with daytona_client().",
        description="Run the same create workload twice against a local "
        "Daytona emulator: first with a new daytona.Daytona per attempt "
        "(the incident), then with daytona_client(). Exits with status 1 "
        "if the pooled phase's open fds grow after its warm-up.",
    )
    demo.add_argument(
        "--threads",
        type=_positive_int,
        default=_DEFAULTS.threads,
        help="concurrent workers per phase (default: %(default)s)",
    )
    demo.add_argument(
        "--attempts",
        type=_positive_int,
        default=_DEFAULTS.attempts,
        help="create attempts per phase, retries included "
        "(default: %(default)s)",
    )
    demo.add_argument(
        "--failure-rate",
        type=_rate,
        default=_DEFAULTS.failure_rate,
        help="fraction of creates the emulator fails (default: %(default)s)",
    )
    demo.add_argument(
        "--seconds",
        type=_positive_float,
        default=_DEFAULTS.seconds,
        help="time cap per phase (default: %(default)s)",
    )
    demo.add_argument(
        "--out",
        type=Path,
        default=Path("artifacts"),
        help="directory for the chart (default: ./artifacts)",
    )
    demo.add_argument(
        "-q",
        "--quiet",
        "--no-progress",
        dest="progress",
        action="store_false",
        help="do not show the live progress line",
    )
    return parser


@contextlib.contextmanager
def _sigint_stops(stop: threading.Event) -> Iterator[None]:
    """Make the first Ctrl-C set *stop*; a second one raises as usual."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def on_sigint(signum: int, frame: FrameType | None) -> None:
        del signum, frame
        if stop.is_set():
            raise KeyboardInterrupt
        stop.set()
        # The main thread writes only to stdout: no reentrant write here.
        _echo(
            "\nStopping: finishing in-flight creates, closing clients, "
            "stopping the emulator (Ctrl-C again to force).",
            stream=sys.stderr,
        )

    previous = signal.signal(signal.SIGINT, on_sigint)
    try:
        yield
    finally:
        signal.signal(signal.SIGINT, previous)


def _demo(args: argparse.Namespace) -> int:
    settings = DemoSettings(
        threads=args.threads,
        attempts=args.attempts,
        failure_rate=args.failure_rate,
        seconds=args.seconds,
    )
    out_dir: Path = args.out
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = Progress(sys.stderr if args.progress else None, args.attempts)
    stop = threading.Event()
    with _sigint_stops(stop):
        try:
            # Imported under the handler: loading the SDK takes seconds,
            # and a Ctrl-C meanwhile must stop cleanly too.
            _echo("Loading the Daytona SDK (5 to 12 s on a first run)...")
            from poolkeeper_daytona_demo._demo import run_demo  # noqa: PLC0415

            report = run_demo(settings, stop, progress, sys.stdout)
        except KeyboardInterrupt:
            _echo("Interrupted (forced).", stream=sys.stderr)
            return EXIT_INTERRUPTED
    if report.interrupted:
        _echo(
            "Interrupted: workers stopped, clients closed, emulator "
            "stopped. No table or chart.",
            stream=sys.stderr,
        )
        return EXIT_INTERRUPTED
    _echo()
    _echo(format_table(report.phases, settings.attempts))
    _echo(format_notes(report))
    _echo()
    svg = write_svg(report, out_dir / f"{_CHART_NAME}.svg")
    _echo(f"Chart (SVG): {svg}")
    png = write_png(report, out_dir / f"{_CHART_NAME}.png")
    if png is None:
        _echo("Chart (PNG): skipped, matplotlib is not installed.")
    else:
        _echo(f"Chart (PNG): {png}")
    _echo(format_verdict(report, FD_TOLERANCE))
    return 0 if report.is_ok else EXIT_GREW


def main(argv: Sequence[str] | None = None) -> int:
    """Run the demo's command line.

    Args:
        argv: The arguments, without the program name; default
            ``sys.argv[1:]``.

    Returns:
        The exit status: 0 when the pooled phase's fds stayed flat, 1 when
        they grew, 2 on a usage error, 130 after Ctrl-C.
    """
    args = _parser().parse_args(argv)
    # The only command so far.
    return _demo(args)
