"""The demo's command line: phases, table, chart, Ctrl-C."""

from __future__ import annotations

import contextlib
import dataclasses
import importlib.util
import io
import os
import queue
import re
import signal
import subprocess
import sys
import threading
import time
from xml.etree import ElementTree as ET

import pytest
from daytona_test_helpers import wait_for
from poolkeeper import _filekeys
from poolkeeper_daytona import daytona_client
from poolkeeper_daytona._client import _ENV_VARS

from poolkeeper_daytona_demo._chart import _title
from poolkeeper_daytona_demo._cli import main
from poolkeeper_daytona_demo._report import (
    format_notes,
    format_table,
    format_verdict,
)
from poolkeeper_daytona_demo._results import (
    FD_TOLERANCE,
    DemoReport,
    DemoSettings,
    PhaseResult,
)
from poolkeeper_daytona_demo._workload import Budget, Point, Sample, Sampler

_SMALL = ["--threads", "4", "--attempts", "60", "--seconds", "30"]
_SVG = "{http://www.w3.org/2000/svg}"
_PHASES = ("naive", "pooled")


def _rows(stdout: str) -> dict[str, list[str]]:
    """Return the table's data rows, by phase name."""
    rows = {}
    for line in stdout.splitlines():
        cells = line.split()
        if cells and cells[0] in _PHASES:
            rows[cells[0]] = cells
    return rows


@pytest.fixture(scope="module", name="demo")
def _demo(tmp_path_factory):
    """Run the demo in-process once, with small settings."""
    out_dir = tmp_path_factory.mktemp("demo")
    stdout, stderr = io.StringIO(), io.StringIO()
    with pytest.MonkeyPatch.context() as mp:
        for name in _ENV_VARS:
            mp.delenv(name, raising=False)
        mp.chdir(out_dir)
        # The file-key thread watches daytona_client's key files from its
        # first build on, for the process's life: counted as before.
        _filekeys.ensure()
        threads_before = threading.active_count()
        with (
            contextlib.redirect_stdout(stdout),
            contextlib.redirect_stderr(stderr),
        ):
            code = main(["demo", *_SMALL, "--out", str(out_dir)])
        env_after = {name: os.environ.get(name) for name in _ENV_VARS}
    return {
        "code": code,
        "stdout": stdout.getvalue(),
        "stderr": stderr.getvalue(),
        "out": out_dir,
        "threads_before": threads_before,
        "env_after": env_after,
    }


class TestDemoRun:
    """Both phases with small settings, run in-process."""

    def test_exit_status_is_zero(self, demo):
        """The pooled phase's fds stayed flat, so the exit status is 0."""
        assert 0 == demo["code"], demo["stdout"] + demo["stderr"]

    def test_table_has_a_row_per_phase(self, demo):
        """The table has a header and one complete row per phase."""
        assert "peak threads" in demo["stdout"]
        rows = _rows(demo["stdout"])
        assert set(_PHASES) == set(rows)
        for cells in rows.values():
            assert 10 == len(cells)
            assert 60 == int(cells[1])

    def test_naive_grows_and_pooled_does_not(self, demo):
        """Naive fds grow per attempt; pooled ones stay within tolerance."""
        rows = _rows(demo["stdout"])
        naive_growth = float(rows["naive"][7])
        pooled_growth = float(rows["pooled"][7])
        assert naive_growth > 0
        # 4 fds of tolerance over the 52 attempts after the warm-up.
        assert abs(pooled_growth) <= 100 * 4 / 52
        match = re.search(
            r"^OK: .* growth ([+-]\d+) ", demo["stdout"], re.MULTILINE
        )
        assert match is not None, demo["stdout"]
        assert int(match.group(1)) <= 4

    def test_clients_built(self, demo):
        """Naive builds a client per attempt; pooled builds exactly one."""
        rows = _rows(demo["stdout"])
        assert rows["naive"][1] == rows["naive"][3]
        assert "1" == rows["pooled"][3]

    def test_naive_clients_closed_before_pooled_phase(self, demo):
        """The leaked clients are closed, and timed, before pooled starts."""
        stdout = demo["stdout"]
        closed = re.search(
            r"^Closed (\d+) naive clients with close_daytona in [\d.]+ s",
            stdout,
            re.MULTILINE,
        )
        assert closed is not None, stdout
        assert int(closed.group(1)) == int(_rows(stdout)["naive"][3])
        assert closed.start() < stdout.index("[pooled] daytona_client()")
        assert "Emulator stopped." in stdout

    def test_failures_are_the_injected_ones(self, demo):
        """Every failed attempt is a Daytona error from the emulator."""
        summaries = re.findall(
            r"^\[(?:naive|pooled)\] \d+ attempts .*?failed(.*?);",
            demo["stdout"],
            re.MULTILINE,
        )
        assert 2 == len(summaries)
        for kinds in summaries:
            assert re.fullmatch(r"(: \d+ Daytona\w*Error(, )?)*", kinds)

    def test_progress_lines(self, demo):
        """Without a terminal, progress comes as plain lines per phase."""
        for phase in _PHASES:
            assert re.search(
                rf"^\[{phase}\] +[\d.]+ s +fds +\d+ +threads +\d+ +"
                r"attempts +\d+/60 +failures +\d+$",
                demo["stderr"],
                re.MULTILINE,
            ), demo["stderr"]
        assert "\r" not in demo["stderr"]

    def test_svg_has_a_polyline_per_phase_and_metric(self, demo):
        """The SVG parses and has fds and threads lines for both phases."""
        path = demo["out"] / "poolkeeper-daytona-demo.svg"
        assert f"Chart (SVG): {path}" in demo["stdout"]
        root = ET.parse(path).getroot()  # noqa: S314 - our own file.
        lines = {
            p.get("id"): p.get("points", "").split()
            for p in root.iter(f"{_SVG}polyline")
        }
        expected = {
            f"{metric}-{phase}"
            for metric in ("fds", "threads")
            for phase in _PHASES
        }
        assert expected == set(lines)
        for points in lines.values():
            assert len(points) >= 2
            for point in points:
                x, y = map(float, point.split(","))
                assert x >= 0
                assert y >= 0

    def test_png_only_with_matplotlib(self, demo):
        """A PNG is written exactly when matplotlib is importable."""
        png = demo["out"] / "poolkeeper-daytona-demo.png"
        if importlib.util.find_spec("matplotlib") is None:
            assert "Chart (PNG): skipped" in demo["stdout"]
            assert not png.exists()
        else:
            assert f"Chart (PNG): {png}" in demo["stdout"]
            assert png.read_bytes().startswith(b"\x89PNG")

    def test_leaves_nothing_behind(self, demo):
        """Env restored, no live singleton, no leftover threads."""
        assert all(v is None for v in demo["env_after"].values())
        assert daytona_client.current() is None
        assert wait_for(
            lambda: threading.active_count() <= demo["threads_before"]
        )


class TestArguments:
    """Bad options are usage errors; the console script is installed."""

    @pytest.mark.parametrize(
        "option",
        [
            ["--threads", "0"],
            ["--attempts", "-1"],
            ["--failure-rate", "1.5"],
            ["--seconds", "0"],
        ],
    )
    def test_rejected(self, option, capsys):
        """Out-of-range values exit with status 2 before running."""
        with pytest.raises(SystemExit) as info:
            main(["demo", *option])
        assert 2 == info.value.code
        assert "must be" in capsys.readouterr().err

    def test_command_line(self):
        """``python -m poolkeeper_daytona_demo demo --help``: every option."""
        result = subprocess.run(
            [
                sys.executable,
                "-m",
                "poolkeeper_daytona_demo",
                "demo",
                "--help",
            ],
            capture_output=True,
            text=True,
            timeout=60,
            check=False,
        )
        assert 0 == result.returncode, result.stderr
        for option in (
            "--threads",
            "--attempts",
            "--failure-rate",
            "--seconds",
            "--out",
            "--no-progress",
        ):
            assert option in result.stdout


def _reader(stream, lines: queue.Queue[str | None]) -> None:
    for line in stream:
        lines.put(line)
    lines.put(None)


class TestInterrupt:
    """Ctrl-C stops the demo cleanly, emulator included."""

    @pytest.mark.timeout(120)
    def test_sigint(self, tmp_path):
        """SIGINT mid-phase: exit 130, clean message, no traceback."""
        env = {k: v for k, v in os.environ.items() if k not in _ENV_VARS}
        process = subprocess.Popen(
            [
                sys.executable,
                "-m",
                "poolkeeper_daytona_demo",
                "demo",
                "--threads",
                "4",
                "--attempts",
                "100000",
                "--seconds",
                "60",
                "--out",
                str(tmp_path),
            ],
            stdout=subprocess.PIPE,
            stderr=subprocess.STDOUT,
            text=True,
            cwd=tmp_path,
            env=env,
        )
        lines: queue.Queue[str | None] = queue.Queue()
        reader = threading.Thread(
            target=_reader, args=(process.stdout, lines), daemon=True
        )
        reader.start()
        seen: list[str] = []
        try:
            # Wait (bounded) for a progress line showing creates running.
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:
                try:
                    line = lines.get(timeout=1)
                except queue.Empty:
                    continue
                if line is None:
                    break
                seen.append(line)
                if re.match(r"\[naive\] .*attempts +[1-9]", line):
                    break
            else:
                pytest.fail("no progress within 60 s:\n" + "".join(seen))
            assert process.poll() is None, "".join(seen)
            process.send_signal(signal.SIGINT)
            code = process.wait(timeout=45)
        finally:
            if process.poll() is None:
                process.kill()
                process.wait()
        reader.join(10)
        process.stdout.close()
        while not lines.empty():
            seen.append(lines.get_nowait() or "")
        output = "".join(seen)
        assert 130 == code, output
        assert "Stopping:" in output
        assert "Interrupted: workers stopped" in output
        assert re.search(r"^Closed \d+ naive clients", output, re.MULTILINE)
        assert "Emulator stopped." in output
        assert "Traceback" not in output
        assert "Chart (SVG)" not in output


def _phase(name: str, warm_fds: int, final_fds: int) -> PhaseResult:
    return PhaseResult(
        name=name,
        attempts=60,
        failures=0,
        failure_kinds={},
        warm_attempts=8,
        clients=1,
        connections=1,
        start=Point(10, 3),
        warm=Point(warm_fds, 6),
        final=Point(final_fds, 6),
        peak_fds=final_fds,
        peak_threads=6,
        wall=1.0,
        samples=(),
    )


class TestVerdict:
    """The exit status follows the pooled phase's fds after warm-up."""

    @pytest.mark.parametrize(
        ("final_fds", "is_ok"), [(20, True), (24, True), (25, False)]
    )
    def test_tolerance(self, final_fds, is_ok):
        """Up to FD_TOLERANCE fds of growth pass; one more fails."""
        report = DemoReport(DemoSettings())
        report.phases.append(_phase("pooled", 20, final_fds))
        assert 4 == FD_TOLERANCE
        assert is_ok == report.is_ok
        verdict = format_verdict(report, FD_TOLERANCE)
        assert verdict.startswith("OK" if is_ok else "FAIL")

    def test_no_pooled_phase_fails(self):
        """A run that never reached the pooled phase is not OK."""
        report = DemoReport(DemoSettings())
        report.phases.append(_phase("naive", 20, 400))
        assert not report.is_ok
        assert format_verdict(report, FD_TOLERANCE).startswith("FAIL")


class TestTimeCap:
    """A phase stopped by the time cap says so in the table and the chart."""

    def _report(self):
        report = DemoReport(DemoSettings(attempts=120, seconds=15.0))
        naive = dataclasses.replace(_phase("naive", 40, 300), attempts=74)
        report.phases += [naive, _phase("pooled", 20, 20)]
        return report

    def test_table_marks_the_capped_phase(self):
        """The capped phase's attempts carry a star, explained below."""
        report = self._report()
        rows = format_table(report.phases, 120).splitlines()[1:]
        assert ["74*", "60*"] == [row.split()[1] for row in rows]
        notes = format_notes(report).splitlines()
        assert notes[0].startswith("conns: TCP connections")
        assert (
            "* naive: stopped by the 15 s time cap after 74 of 120 attempts "
            "(--seconds raises the cap)."
        ) == notes[1]

    def test_full_phases_are_not_marked(self):
        """A phase that made every attempt has no star and no note."""
        report = DemoReport(DemoSettings(attempts=60))
        report.phases.append(_phase("pooled", 20, 20))
        assert (
            "60" == format_table(report.phases, 60).splitlines()[1].split()[1]
        )
        assert 1 == len(format_notes(report).splitlines())

    def test_chart_title(self):
        """The chart's title claims only the attempts that ran."""
        title = _title(self._report())
        assert "naive stopped by the 15 s cap after 74" in title

    def test_verdict_contrasts_the_phases(self):
        """The verdict names the naive leak and the pooled growth."""
        verdict = format_verdict(self._report(), FD_TOLERANCE)
        assert verdict.startswith(
            "OK: a client per attempt leaked 290 fds in 74 attempts; "
            "daytona_client() held fds flat"
        )


class TestSampler:
    """The background sampler keeps a bounded number of samples."""

    def test_bounded(self):
        """Past the limit, samples are thinned and the interval doubles."""
        budget = Budget(time.monotonic() + 60, threading.Event())
        seen: list[Sample] = []
        sampler = Sampler(budget, seen.append, interval=0.001, limit=8)
        sampler.start()
        assert wait_for(lambda: len(seen) >= 24)
        samples = sampler.stop()
        assert 2 <= len(samples) <= 8
        assert samples[0] is seen[0]
        elapsed = [s.elapsed for s in samples]
        assert elapsed == sorted(elapsed)
