"""What a call to an already-built singleton costs: the hit path.

Every variant below returns a client object that was built before timing
starts, so only the per-call cost of getting it back is measured:

1. a bare module-global return (the floor: a plain Python call);
2. ``functools.cache`` on a zero-argument function;
3. ``cachetools.cached(cache=Cache(maxsize=1), lock=threading.Lock())``;
4. the incident's fix: a module global guarded by a ``threading.Lock()``
   taken on every call;
5. ``@process_singleton`` without a key;
6. ``@process_singleton(key=keys.env(A, B))`` with both variables set;
7. ``key=keys.file(path)``, the tuple ``(keys.env(A, B), keys.file(path))``
   and a plain callable key (polled on every call);
7b. the healing options (issue 21): ``max_age=``, ``check=`` with
   ``check_every=``, and ``keys.env`` with ``retire_on``, ``max_age`` and
   ``check`` together; none comes due while timed, so these measure what
   the options cost a call between deadlines (nothing, by design: their
   timers disarm the hit path instead of a clock read per call);
7c. ``scope="thread"`` (issue 34), without a key and with ``keys.env``:
   the calling thread's client, each thread's built once;
8. ``poolkeeper_daytona.daytona_client()`` when the adapter is installed
   (built against a refused loopback URL; no request is made);
9. for reference, an ``os.getpid()`` comparison on every call: what fork
   safety would cost if it were checked on the hit path.

Method (single thread): each variant gets ``timeit.Timer(fn)``; one round
times ``number`` calls of every variant, the variants taken round-robin
with a rotating starting point so that machine noise lands on all of them
alike. The report gives the median over the rounds of the per-call time,
and the interquartile range as a measure of noise. Ratios are paired: the
median over rounds of the ratio between two variants timed in the same
round, which cancels slow drifts of the machine's speed (shared VMs often
run at two speeds for seconds at a time). Nothing is subtracted:
every row includes the same ``timeit`` loop and call overhead, which is
why the floor is not zero. The floor runs one Python frame; poolkeeper's
armed hit path runs none (its ``__call__`` is a C callable), so it can come
out at or below the floor. ``timeit`` turns the garbage collector off while
timing.

Method (threads): 16 threads, released together by a barrier, each make a
fixed number of calls to one variant (in chunks, checking a stop flag and
the returned object between chunks); the report gives total calls per
second of wall time, the median over a few interleaved rounds, under a
wall-clock cap, and the paired (same-round) ratio to poolkeeper. On a GIL
build the threads take turns, so this measures contention cost (lock
convoys, switch overhead), not parallel speedup.

Every factory counts its builds; the script fails loudly if any variant
built again while being timed, since its numbers would then be meaningless.

Run it from the repository root with the project's virtualenv::

    .venv/bin/python benchmarks/bench_hit_path.py            # 20-40 s
    .venv/bin/python benchmarks/bench_hit_path.py --quick    # CI smoke
    .venv/bin/python benchmarks/bench_hit_path.py --check    # exit 1 on MISS
    .venv/bin/python benchmarks/bench_hit_path.py --markdown out.md

It needs ``cachetools`` (the ``bench`` extra). It is a report, not a test:
it exits 0 whatever the numbers, unless ``--check`` is given.
"""

from __future__ import annotations

import argparse
import functools
import itertools
import os
import platform
import statistics
import sys
import tempfile
import threading
import time
import timeit
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import cachetools
import wrapt

import poolkeeper
from poolkeeper import keys, process_singleton

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

ENV_NAMES = ("POOLKEEPER_BENCH_API_KEY", "POOLKEEPER_BENCH_API_URL")

FLOOR = "bare module global (floor)"
FUNCTOOLS = "functools.cache hit"
CACHETOOLS = "cachetools.cached + Lock hit"
LOCKED = "global + Lock every call (incident fix)"
POOLKEEPER = "poolkeeper, no key"
POOLKEEPER_ENV = "poolkeeper, keys.env (2 variables)"
POOLKEEPER_FILE = "poolkeeper, keys.file"
POOLKEEPER_MIXED = "poolkeeper, (keys.env, keys.file)"
POOLKEEPER_CALLABLE = "poolkeeper, callable key (polled)"
POOLKEEPER_MAX_AGE = "poolkeeper, no key, max_age=3600"
POOLKEEPER_CHECK = "poolkeeper, no key, check= every 3600 s"
POOLKEEPER_HEALING = "poolkeeper, keys.env + retire_on + max_age + check"
POOLKEEPER_THREAD = 'poolkeeper, scope="thread", no key'
POOLKEEPER_THREAD_ENV = 'poolkeeper, scope="thread", keys.env'
DAYTONA = "poolkeeper_daytona.daytona_client()"
GETPID = "getpid() check every call (reference)"

THREADED = (FUNCTOOLS, LOCKED, POOLKEEPER, POOLKEEPER_ENV)


@dataclass(frozen=True)
class Settings:
    rounds: int
    number: int
    threads: int
    thread_calls: int
    thread_rounds: int
    thread_cap: float


DEFAULT = Settings(
    rounds=31,
    number=200_000,
    threads=16,
    thread_calls=200_000,
    thread_rounds=5,
    thread_cap=20.0,
)
QUICK = Settings(
    rounds=9,
    number=50_000,
    threads=16,
    thread_calls=50_000,
    thread_rounds=1,
    thread_cap=3.0,
)


class Client:
    """Stands in for an SDK client; only its identity matters here."""

    __slots__ = ("variant",)

    def __init__(self, variant: str) -> None:
        self.variant = variant


builds: dict[str, int] = {}


def _build(variant: str) -> Client:
    builds[variant] = builds.get(variant, 0) + 1
    return Client(variant)


def _factory(variant: str) -> Callable[[], Client]:
    def factory() -> Client:
        return _build(variant)

    factory.__qualname__ = factory.__name__ = f"factory[{variant}]"
    return factory


# -- the hand-written patterns, as they appear in application code ----------

_CLIENT = _build(FLOOR)


def floor() -> Client:
    return _CLIENT


_lock = threading.Lock()
_locked_client: Client | None = None


def locked() -> Client:
    global _locked_client
    with _lock:
        if _locked_client is None:
            _locked_client = _build(LOCKED)
        return _locked_client


_pid = os.getpid()
_pid_client = _build(GETPID)


def getpid_checked() -> Client:
    global _pid, _pid_client
    if os.getpid() != _pid:
        _pid_client = _build(GETPID)
        _pid = os.getpid()
    return _pid_client


_SETTING = ("bench-setting",)


def _healthy(client: Client) -> bool:
    """A health probe; with ``check_every=3600`` it never runs while timed."""
    return client.variant != ""


def _daytona() -> Callable[[], object] | None:
    """Return the adapter's singleton, configured for a loopback URL."""
    try:
        from poolkeeper_daytona import daytona_client
    except ImportError:
        return None
    os.environ["DAYTONA_API_KEY"] = "bench-key"
    os.environ["DAYTONA_API_URL"] = "http://127.0.0.1:9/api"
    return daytona_client


def make_variants(directory: Path) -> dict[str, Callable[[], Client]]:
    """Return every variant, each called once so that its client is built."""
    for name in ENV_NAMES:
        os.environ[name] = f"bench-value-of-{name.lower()}"
    key_file = directory / "api_key"
    key_file.write_text("bench-key-file\n", encoding="utf-8")
    variants: dict[str, Callable[[], Client]] = {
        FLOOR: floor,
        FUNCTOOLS: functools.cache(_factory(FUNCTOOLS)),
        CACHETOOLS: cachetools.cached(
            cache=cachetools.Cache(maxsize=1), lock=threading.Lock()
        )(_factory(CACHETOOLS)),
        LOCKED: locked,
        POOLKEEPER: process_singleton(_factory(POOLKEEPER)),
        POOLKEEPER_ENV: process_singleton(key=keys.env(*ENV_NAMES))(
            _factory(POOLKEEPER_ENV)
        ),
        POOLKEEPER_FILE: process_singleton(key=keys.file(key_file))(
            _factory(POOLKEEPER_FILE)
        ),
        POOLKEEPER_MIXED: process_singleton(
            key=(keys.env(*ENV_NAMES), keys.file(key_file))
        )(_factory(POOLKEEPER_MIXED)),
        POOLKEEPER_CALLABLE: process_singleton(key=lambda: _SETTING)(
            _factory(POOLKEEPER_CALLABLE)
        ),
        POOLKEEPER_MAX_AGE: process_singleton(max_age=3600)(
            _factory(POOLKEEPER_MAX_AGE)
        ),
        POOLKEEPER_CHECK: process_singleton(check=_healthy, check_every=3600)(
            _factory(POOLKEEPER_CHECK)
        ),
        POOLKEEPER_HEALING: process_singleton(
            key=keys.env(*ENV_NAMES),
            retire_on=OSError,
            max_age=3600,
            check=_healthy,
            check_every=3600,
        )(_factory(POOLKEEPER_HEALING)),
        POOLKEEPER_THREAD: process_singleton(scope="thread")(
            _factory(POOLKEEPER_THREAD)
        ),
        POOLKEEPER_THREAD_ENV: process_singleton(
            scope="thread", key=keys.env(*ENV_NAMES)
        )(_factory(POOLKEEPER_THREAD_ENV)),
        GETPID: getpid_checked,
    }
    daytona = _daytona()
    for name, fn in variants.items():
        first = fn()
        if not (isinstance(first, Client) and first.variant == name):
            msg = f"{name} returned {first!r}, not its own client"
            raise RuntimeError(msg)
        if fn() is not first:
            msg = f"{name} returned a different client on its second call"
            raise RuntimeError(msg)
    if daytona is not None:
        first = daytona()
        if daytona() is not first:
            msg = "daytona_client() returned a different client"
            raise RuntimeError(msg)
        variants[DAYTONA] = daytona  # type: ignore[assignment]
    return variants


def hit_path_kind(fn: object) -> str:
    """Say how a poolkeeper singleton's hit path is armed, if it is."""
    call = type(fn).__dict__.get("__call__")
    if isinstance(call, staticmethod):
        if isinstance(call.__func__, functools.partial):
            # scope="thread": the calling thread's client, from a local.
            return "armed (attrgetter on a threading.local)"
        return "armed (a seeded lru_cache)"
    if getattr(call, "__name__", "") == "polled":
        return "armed (polled: one Python frame plus the key)"
    return "NOT armed (Python slow path)"


def check_no_rebuild(before: dict[str, int]) -> None:
    rebuilt = {
        name: n - before.get(name, 0)
        for name, n in builds.items()
        if n != before.get(name, 0)
    }
    if rebuilt:
        msg = f"variants rebuilt their client while timed: {rebuilt}"
        raise RuntimeError(msg)


# -- single-thread timing -----------------------------------------------------


def time_single(
    variants: dict[str, Callable[[], Client]], settings: Settings
) -> dict[str, list[float]]:
    """Return per-call nanoseconds of every round, for every variant."""
    names = list(variants)
    timers = {name: timeit.Timer(variants[name]) for name in names}
    for timer in timers.values():  # Warm-up, not recorded.
        timer.timeit(number=max(settings.number // 10, 1))
    samples: dict[str, list[float]] = {name: [] for name in names}
    for round_ in range(settings.rounds):
        start = round_ % len(names)
        for name in names[start:] + names[:start]:
            seconds = timers[name].timeit(number=settings.number)
            samples[name].append(seconds / settings.number * 1e9)
    return samples


def quartiles(values: Sequence[float]) -> tuple[float, float]:
    if len(values) < 2:
        return values[0], values[0]
    q1, _, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q3


def paired_ratio(
    samples: dict[str, list[float]], name: str, base: str
) -> float:
    """Median over rounds of the same-round ratio of *name* to *base*."""
    return statistics.median(
        a / b for a, b in zip(samples[name], samples[base], strict=True)
    )


def single_table(samples: dict[str, list[float]]) -> str:
    head = (
        "| Variant | median ns/call | IQR ns | x functools.cache"
        " | x lock every call |"
    )
    rows = [head, "|---|---:|---:|---:|---:|"]
    for name, values in samples.items():
        q1, q3 = quartiles(values)
        fc = paired_ratio(samples, name, FUNCTOOLS)
        lock = paired_ratio(samples, name, LOCKED)
        median = statistics.median(values)
        rows.append(
            f"| {name} | {median:.1f} | {q1:.1f} - {q3:.1f}"
            f" | {fc:.2f} | {lock:.2f} |"
        )
    return "\n".join(rows)


# -- threaded throughput ------------------------------------------------------


@dataclass(frozen=True)
class Burst:
    calls: int
    wall: float
    capped: bool

    @property
    def rate(self) -> float:
        return self.calls / self.wall if self.wall > 0 else 0.0


class Crew:
    """Threads released together, each calling one function many times."""

    CHUNK = 1_000

    def __init__(self, fn: Callable[[], Client], settings: Settings) -> None:
        self.fn = fn
        self.expected = fn()
        self.chunks = max(settings.thread_calls // self.CHUNK, 1)
        self.cap = settings.thread_cap
        self.stop = threading.Event()
        self.barrier = threading.Barrier(settings.threads + 1)
        self.done = [0] * settings.threads
        self.ends = [0.0] * settings.threads
        self.wrong: list[object] = []
        self.threads = [
            threading.Thread(target=self.work, args=(i,), daemon=True)
            for i in range(settings.threads)
        ]

    def work(self, index: int) -> None:
        try:
            self.barrier.wait(timeout=30)
        except threading.BrokenBarrierError:
            return
        fn = self.fn
        calls = 0
        result: object = None
        for _ in range(self.chunks):
            for _ in itertools.repeat(None, self.CHUNK):
                result = fn()
            calls += self.CHUNK
            if result is not self.expected:
                self.wrong.append(result)
                break
            if self.stop.is_set():
                break
        self.done[index] = calls
        self.ends[index] = time.perf_counter()

    def run(self) -> Burst:
        for thread in self.threads:
            thread.start()
        self.barrier.wait(timeout=30)
        start = time.perf_counter()
        deadline = start + self.cap
        for thread in self.threads:
            thread.join(timeout=max(deadline - time.perf_counter(), 0.0))
        capped = self.alive()
        if capped:
            self.stop.set()
            for thread in self.threads:
                thread.join(timeout=10)
        if self.alive():
            msg = "benchmark threads did not stop within 10 s of the cap"
            raise RuntimeError(msg)
        if self.wrong:
            msg = f"a thread got {self.wrong[0]!r}, not {self.expected!r}"
            raise RuntimeError(msg)
        return Burst(sum(self.done), max(self.ends) - start, capped)

    def alive(self) -> bool:
        return any(thread.is_alive() for thread in self.threads)


def time_threaded(
    variants: dict[str, Callable[[], Client]], settings: Settings
) -> dict[str, list[Burst]]:
    bursts: dict[str, list[Burst]] = {name: [] for name in THREADED}
    for round_ in range(settings.thread_rounds):
        start = round_ % len(THREADED)
        for name in THREADED[start:] + THREADED[:start]:
            bursts[name].append(Crew(variants[name], settings).run())
    return bursts


def threaded_table(bursts: dict[str, list[Burst]], settings: Settings) -> str:
    head = (
        f"| Variant ({settings.threads} threads) | calls per round"
        " | median wall s | median calls/s | x poolkeeper, no key |"
    )
    rows = [head, "|---|---:|---:|---:|---:|"]
    for name, runs in bursts.items():
        capped = sum(b.capped for b in runs)
        note = f" (capped in {capped}/{len(runs)} rounds)" if capped else ""
        calls = statistics.median(b.calls for b in runs)
        wall = statistics.median(b.wall for b in runs)
        rate = statistics.median(b.rate for b in runs)
        ratio = statistics.median(
            b.rate / p.rate
            for b, p in zip(runs, bursts[POOLKEEPER], strict=True)
        )
        rows.append(
            f"| {name}{note} | {calls:,.0f} | {wall:.3f}"
            f" | {rate:,.0f} | {ratio:.2f} |"
        )
    return "\n".join(rows)


# -- report -------------------------------------------------------------------

TARGETS = (
    (POOLKEEPER, FUNCTOOLS, 1.3),
    (POOLKEEPER, LOCKED, 0.25),
    (POOLKEEPER_ENV, FUNCTOOLS, 2.0),
    # Issue 21: the healing options cost a call nothing between deadlines.
    (POOLKEEPER_MAX_AGE, POOLKEEPER, 1.1),
    (POOLKEEPER_CHECK, POOLKEEPER, 1.1),
    (POOLKEEPER_HEALING, POOLKEEPER_ENV, 1.1),
    # Issue 34: a thread's own client, one C call away.
    (POOLKEEPER_THREAD, FUNCTOOLS, 2.5),
    (POOLKEEPER_THREAD_ENV, FUNCTOOLS, 2.5),
)


def time_handles(settings: Settings) -> str:
    """Time one attribute access: on the client, a proxy, a call + access."""
    single = process_singleton(_factory("handle"))
    client = single()
    handle = single.proxy()
    if handle.variant != "handle" or handle.__wrapped__ is not client:
        msg = "the proxy did not resolve to the live client"
        raise RuntimeError(msg)
    accesses: dict[str, Callable[[], object]] = {
        "client.attr (a stored client)": lambda: client.variant,
        "single().attr (call, then access)": lambda: single().variant,
        "single.proxy().attr (a stored proxy)": lambda: handle.variant,
    }
    samples = time_single(accesses, settings)  # type: ignore[arg-type]
    base = next(iter(accesses))
    lines = [
        "| Access | median ns | x stored client |",
        "|---|---:|---:|",
    ]
    for name, values in samples.items():
        ratio = paired_ratio(samples, name, base)
        lines.append(
            f"| {name} | {statistics.median(values):.1f} | {ratio:.2f} |"
        )
    return "\n".join(lines)


def targets(samples: dict[str, list[float]]) -> list[tuple[bool, str]]:
    verdicts = []
    for name, base, limit in TARGETS:
        ratio = paired_ratio(samples, name, base)
        ok = ratio <= limit
        mine = statistics.median(samples[name])
        theirs = statistics.median(samples[base])
        verdict = "PASS" if ok else "MISS"
        line = (
            f"{verdict}: {name} <= {limit:.2f}x {base}:"
            f" measured {ratio:.2f}x (medians {mine:.1f} ns"
            f" vs {theirs:.1f} ns)"
        )
        verdicts.append((ok, line))
    return verdicts


def header(
    settings: Settings, variants: dict[str, Callable[[], Client]]
) -> str:
    gil = "on" if getattr(sys, "_is_gil_enabled", lambda: True)() else "off"
    python = (
        f"- Python {platform.python_version()}"
        f" ({platform.python_implementation()}, GIL {gil}),"
        f" {platform.machine()}, {os.cpu_count()} CPUs,"
        f" switch interval {sys.getswitchinterval() * 1e3:g} ms"
    )
    versions = (
        f"- poolkeeper {poolkeeper.__version__}, wrapt {wrapt.__version__},"
        f" cachetools {cachetools.__version__}"
    )
    kinds = [
        f"{name.removeprefix('poolkeeper, ')} {hit_path_kind(fn)}"
        for name, fn in variants.items()
        if name.startswith(("poolkeeper", "poolkeeper_daytona"))
    ]
    armed = "- poolkeeper hit path: " + "; ".join(kinds)
    single = (
        f"- single thread: {settings.rounds} rounds x {settings.number:,}"
        " calls per variant, round-robin. Every row includes the same"
        " timeit loop and call overhead (nothing subtracted). Ratios are"
        " the median of same-round ratios (robust to the machine changing"
        " speed between rounds), so they can differ a little from a ratio"
        " of the medians."
    )
    threads = (
        f"- threads: {settings.threads} threads x"
        f" {settings.thread_calls:,} calls each, median of"
        f" {settings.thread_rounds} round(s), cap {settings.thread_cap:g} s"
        " per burst"
    )
    lines = ["# poolkeeper hit-path benchmark", ""]
    lines += [python, versions, armed, single, threads]
    return "\n".join(lines)


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        description="Time the poolkeeper hit path against common patterns."
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds, for CI smoke"
    )
    parser.add_argument(
        "--check",
        action="store_true",
        help="exit 1 if a target is missed",
    )
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        type=Path,
        help="also write the report to this file",
    )
    return parser.parse_args(argv)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    settings = QUICK if args.quick else DEFAULT
    began = time.perf_counter()
    scratch = tempfile.TemporaryDirectory()
    variants = make_variants(Path(scratch.name))
    built = dict(builds)

    samples = time_single(variants, settings)
    single = single_table(samples)
    bursts = time_threaded(variants, settings)
    threaded = threaded_table(bursts, settings)
    check_no_rebuild(built)
    handles = time_handles(settings)
    verdicts = targets(samples)

    report = "\n\n".join(
        [
            header(settings, variants),
            "## Single thread: median ns per call",
            single,
            "## Threads: throughput",
            threaded,
            "## Handles: one attribute access",
            handles,
            "## Targets",
            "\n".join(f"- {line}" for _, line in verdicts),
        ]
    )
    print(report)
    print(f"\nTotal runtime: {time.perf_counter() - began:.1f} s")
    if args.markdown is not None:
        args.markdown.write_text(report + "\n", encoding="utf-8")
    if args.check and not all(ok for ok, _ in verdicts):
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
