"""The hit path with OpenTelemetry absent, present, and recording (issue 24).

Events are sent on builds, retirements and closes only, so a call of a
built singleton and a lease should cost the same whether OpenTelemetry is
installed or not, and whether a meter provider records or not. This
script measures that side by side, in one run, in three configurations,
each in a subprocess of its own (a fresh interpreter):

- ``absent``: OpenTelemetry cannot be imported (a ``sys.meta_path``
  finder refuses ``opentelemetry`` and its submodules, before
  ``import poolkeeper``), as without the ``otel`` extra;
- ``api``: ``opentelemetry-api`` importable, no provider set: the
  instruments are made on the API's proxy meter, which records nothing;
- ``sdk``: the SDK's ``MeterProvider`` set, with an in-memory reader: the
  instruments record (checked: the reader holds poolkeeper's builds).

In each, before timing, the singleton builds, resets and builds again, so
that the events ran and (``api``, ``sdk``) the instruments are made. Then
three variants are timed round-robin with a rotating start, ``timeit``
style: a ``functools.cache`` hit on a zero-argument function (the
reference), a no-key ``@process_singleton`` call, and an entered and
exited ``single.lease()``; each round keeps, per variant, the fastest of
a few chunks of calls (the least disturbed by other processes). The
table gives, per configuration, the median per-call time and the paired
ratio to ``functools.cache`` (the median over rounds of the ratio between
the two timed in the same round, which cancels the machine's drifts),
with its quartiles over the rounds. The configurations are run
interleaved (absent, api, sdk, absent, ...) ``--repeats`` times; their
rounds pool.

Run it from the repository root with the project's virtualenv (it needs
``opentelemetry-sdk``, in the dev group)::

    .venv/bin/python benchmarks/bench_otel.py            # about 30 s
    .venv/bin/python benchmarks/bench_otel.py --quick    # a smoke run

It is a report, not a test: it exits 0 whatever the numbers, 1 if a
configuration is not what it says (OpenTelemetry imported when absent,
nothing recorded with the SDK, a rebuild while timing).
"""

from __future__ import annotations

import argparse
import functools
import json
import platform
import statistics
import subprocess
import sys
import timeit
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

MODES = ("absent", "api", "sdk")
MODE_TITLES = {
    "absent": "OpenTelemetry absent (import blocked)",
    "api": "API importable, no provider set",
    "sdk": "SDK MeterProvider + in-memory reader",
}
CACHE, CALL, LEASE = "functools.cache", "poolkeeper call", "poolkeeper lease"
VARIANTS = (CACHE, CALL, LEASE)
#: Each round times each variant in this many chunks and keeps the fastest.
CHUNKS = 5


class _Block:
    """A meta path finder that makes ``opentelemetry`` unimportable."""

    def find_spec(self, name, path=None, target=None):
        del path, target
        if name == "opentelemetry" or name.startswith("opentelemetry."):
            msg = f"blocked by bench_otel: {name}"
            raise ImportError(msg)


def _configure(mode: str) -> Callable[[], bool]:
    """Set the configuration up; return a check that it is what it says."""
    if mode == "absent":
        sys.meta_path.insert(0, _Block())
        return lambda: (
            not any(
                m == "opentelemetry" or m.startswith("opentelemetry.")
                for m in sys.modules
            )
        )
    from opentelemetry import metrics

    if mode == "api":
        return lambda: "opentelemetry.sdk" not in sys.modules
    from opentelemetry.sdk.metrics import MeterProvider
    from opentelemetry.sdk.metrics.export import (
        InMemoryMetricReader,
    )

    reader = InMemoryMetricReader()
    metrics.set_meter_provider(MeterProvider(metric_readers=[reader]))

    def recorded() -> bool:
        data = reader.get_metrics_data()
        return any(
            metric.name == "poolkeeper.client.builds"
            and sum(p.value for p in metric.data.data_points) >= 2
            for rm in data.resource_metrics
            for sm in rm.scope_metrics
            for metric in sm.metrics
        )

    return recorded


def worker(mode: str, rounds: int, number: int) -> dict[str, Any]:
    """Time the variants in *mode*; return every round's per-call times."""
    check = _configure(mode)
    import poolkeeper  # After the configuration.

    class Client:
        def close(self) -> None:
            pass

    builds: list[Client] = []

    def make() -> Client:
        builds.append(Client())
        return builds[-1]

    single = poolkeeper.process_singleton(name="bench-otel")(make)
    single()
    single.reset()  # A retirement and a close: the events ran.
    client = single()
    built = len(builds)
    cached = functools.cache(lambda: client)
    cached()

    def lease() -> None:
        with single.lease():
            pass

    fns = {CACHE: cached, CALL: single, LEASE: lease}
    timers = {name: timeit.Timer(fn) for name, fn in fns.items()}
    samples: dict[str, list[float]] = {name: [] for name in VARIANTS}
    for i in range(rounds):
        start = i % len(VARIANTS)
        for name in VARIANTS[start:] + VARIANTS[:start]:
            # The least disturbed of a few chunks: on a shared machine a
            # chunk the scheduler preempted says nothing about the code.
            chunk = max(number // CHUNKS, 1)
            seconds = min(timers[name].repeat(repeat=CHUNKS, number=chunk))
            samples[name].append(seconds / chunk * 1e9)
    # The armed hit path is a seeded lru_cache, a staticmethod of the
    # singleton's class (see poolkeeper._sync.armed).
    armed = isinstance(type(single).__dict__.get("__call__"), staticmethod)
    return {
        "mode": mode,
        "samples": samples,
        "armed": armed,
        "ok": check() and len(builds) == built and single() is client,
    }


def paired(samples: dict[str, list[float]], name: str) -> str:
    """The median paired ratio of *name* to the cache, and its quartiles."""
    ratios = [
        a / b for a, b in zip(samples[name], samples[CACHE], strict=True)
    ]
    low, _, high = statistics.quantiles(ratios, n=4)
    return f"{statistics.median(ratios):.2f} ({low:.2f}-{high:.2f})"


def table(runs: list[dict[str, Any]]) -> str:
    pooled: dict[str, dict[str, list[float]]] = {
        mode: {name: [] for name in VARIANTS} for mode in MODES
    }
    for run in runs:
        for name in VARIANTS:
            pooled[run["mode"]][name].extend(run["samples"][name])
    lines = [
        (
            "| configuration | functools.cache | call | call / cache "
            "| lease | lease / cache |"
        ),
        "| --- | ---: | ---: | ---: | ---: | ---: |",
    ]
    for mode in MODES:
        samples = pooled[mode]
        ns = {n: statistics.median(samples[n]) for n in VARIANTS}
        lines.append(
            f"| {MODE_TITLES[mode]} | {ns[CACHE]:.1f} ns | {ns[CALL]:.1f} ns "
            f"| {paired(samples, CALL)} | {ns[LEASE]:.1f} ns "
            f"| {paired(samples, LEASE)} |"
        )
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--worker", choices=MODES, help=argparse.SUPPRESS)
    parser.add_argument("--rounds", type=int, default=None)
    parser.add_argument("--number", type=int, default=None)
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    rounds = args.rounds or (5 if args.quick else 15)
    number = args.number or (20_000 if args.quick else 100_000)
    if args.worker:
        print(json.dumps(worker(args.worker, rounds, number)))
        return 0
    repeats = args.repeats or (1 if args.quick else 3)
    runs = []
    for _ in range(repeats):
        for mode in MODES:
            done = subprocess.run(  # noqa: S603 -- our own arguments.
                [
                    sys.executable,
                    __file__,
                    "--worker",
                    mode,
                    f"--rounds={rounds}",
                    f"--number={number}",
                ],
                capture_output=True,
                text=True,
                check=True,
                timeout=600,
            )
            runs.append(json.loads(done.stdout.strip().splitlines()[-1]))
    print(
        f"Hit path by OpenTelemetry configuration: CPython "
        f"{platform.python_version()} ({platform.machine()}), "
        f"{repeats} x {rounds} rounds of {number} calls per configuration, "
        "median ns per call; ratios paired with functools.cache "
        "(median, and quartiles over rounds)."
    )
    print()
    print(table(runs))
    bad = sorted(
        {run["mode"] for run in runs if not (run["ok"] and run["armed"])}
    )
    if bad:
        print(f"\nNOT AS CONFIGURED: {', '.join(bad)}")
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
