"""What a stampede of first calls costs: how many clients get built.

32 threads wait on a ``threading.Barrier`` and then all call the same
fresh singleton at once; its factory sleeps 10 ms (standing in for a TLS
handshake or a token fetch) and counts how many clients it built. Variants:

- ``@process_singleton``: one build; the other callers wait for it.
- the incident's fix, a global guarded by a ``threading.Lock()`` taken on
  every call (a closure here so that each round starts fresh): one build,
  made while holding the lock.
- ``cachetools.cached(cache=Cache(1), lock=threading.Lock())``: the lock
  guards the cache only; the function is called outside it, so every
  caller that misses builds its own client. The cache keeps the first one
  stored and the others are dropped, never closed: leaked connections.
- for comparison, ``cachetools.cached(cache, condition=Condition())``
  (cachetools 6 and later), which makes concurrent missers wait. (Passing
  both ``lock=Lock()`` and ``condition=Condition()`` fails: the condition
  must be built on that same lock.)

Each variant runs several rounds, interleaved, with a fresh singleton each
round. The table gives builds per round (min - max), how many distinct
clients the 32 callers received, and the median wall time from the
barrier's release to the last caller's return. Every wait is bounded.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_build.py [--quick] [--markdown PATH]
"""

from __future__ import annotations

import argparse
import statistics
import sys
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING

import cachetools

from poolkeeper import process_singleton

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

THREADS = 32
BUILD_SECONDS = 0.010
WAIT_SECONDS = 30.0


class Client:
    """Stands in for an SDK client; only its identity matters here."""

    __slots__ = ("number",)

    def __init__(self, number: int) -> None:
        self.number = number


class Factory:
    """A slow factory that counts the clients it built."""

    def __init__(self) -> None:
        self.builds = 0
        self._lock = threading.Lock()

    def __call__(self) -> Client:
        time.sleep(BUILD_SECONDS)
        with self._lock:
            self.builds += 1
            return Client(self.builds)


def use_poolkeeper(factory: Factory) -> Callable[[], Client]:
    def build() -> Client:
        return factory()

    return process_singleton(build)


def use_incident_lock(factory: Factory) -> Callable[[], Client]:
    lock = threading.Lock()
    client: Client | None = None

    def get() -> Client:
        nonlocal client
        with lock:
            if client is None:
                client = factory()
            return client

    return get


def use_cachetools(factory: Factory) -> Callable[[], Client]:
    return cachetools.cached(
        cache=cachetools.Cache(maxsize=1), lock=threading.Lock()
    )(factory)


def use_cachetools_condition(factory: Factory) -> Callable[[], Client]:
    # The condition doubles as the lock: cachetools waits on it while
    # holding ``lock``, so a separate lock must be the condition's own.
    return cachetools.cached(
        cache=cachetools.Cache(maxsize=1), condition=threading.Condition()
    )(factory)


VARIANTS: dict[str, Callable[[Factory], Callable[[], Client]]] = {
    "poolkeeper": use_poolkeeper,
    "global + Lock every call (incident fix)": use_incident_lock,
    "cachetools.cached + Lock": use_cachetools,
    "cachetools.cached + Lock + Condition": use_cachetools_condition,
}


@dataclass(frozen=True)
class Stampede:
    builds: int
    distinct: int
    wall: float


def stampede(make: Callable[[Factory], Callable[[], Client]]) -> Stampede:
    """Release THREADS threads on a fresh singleton; report what happened."""
    factory = Factory()
    fn = make(factory)
    barrier = threading.Barrier(THREADS + 1)
    got: list[Client | None] = [None] * THREADS
    ends = [0.0] * THREADS
    errors: list[Exception] = []

    def caller(index: int) -> None:
        try:
            barrier.wait(timeout=WAIT_SECONDS)
            got[index] = fn()
        except Exception as exc:  # noqa: BLE001 -- the main thread raises it.
            errors.append(exc)
        ends[index] = time.perf_counter()

    threads = [
        threading.Thread(target=caller, args=(i,), daemon=True)
        for i in range(THREADS)
    ]
    for thread in threads:
        thread.start()
    barrier.wait(timeout=WAIT_SECONDS)
    start = time.perf_counter()
    deadline = start + WAIT_SECONDS
    for thread in threads:
        thread.join(timeout=max(deadline - time.perf_counter(), 0.0))
    if errors:
        msg = f"{len(errors)} of {THREADS} callers failed"
        raise RuntimeError(msg) from errors[0]
    if any(thread.is_alive() for thread in threads) or None in got:
        msg = f"callers did not all return within {WAIT_SECONDS:g} s"
        raise RuntimeError(msg)
    distinct = len({id(client) for client in got})
    return Stampede(factory.builds, distinct, max(ends) - start)


def run(rounds: int) -> dict[str, list[Stampede]]:
    results: dict[str, list[Stampede]] = {name: [] for name in VARIANTS}
    names = list(VARIANTS)
    for round_ in range(rounds):
        start = round_ % len(names)
        for name in names[start:] + names[:start]:
            results[name].append(stampede(VARIANTS[name]))
    return results


def table(results: dict[str, list[Stampede]]) -> str:
    head = (
        "| Variant | builds per round | clients returned per round"
        " | built and dropped (total) | median wall ms |"
    )
    rows = [head, "|---|---:|---:|---:|---:|"]
    for name, runs in results.items():
        builds = [r.builds for r in runs]
        distinct = [r.distinct for r in runs]
        dropped = sum(r.builds - r.distinct for r in runs)
        wall = statistics.median(r.wall for r in runs) * 1e3
        rows.append(
            f"| {name} | {span(builds)} | {span(distinct)}"
            f" | {dropped} | {wall:.1f} |"
        )
    return "\n".join(rows)


def span(values: Sequence[int]) -> str:
    low, high = min(values), max(values)
    return str(low) if low == high else f"{low} - {high}"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        description="Count builds when many threads make the first call."
    )
    parser.add_argument(
        "--quick", action="store_true", help="fewer rounds, for CI smoke"
    )
    parser.add_argument(
        "--markdown",
        metavar="PATH",
        type=Path,
        help="also write the report to this file",
    )
    args = parser.parse_args(argv)
    rounds = 2 if args.quick else 7
    began = time.perf_counter()
    results = run(rounds)
    intro = (
        f"{THREADS} threads released by a barrier onto a fresh singleton"
        f" whose factory sleeps {BUILD_SECONDS * 1e3:g} ms;"
        f" {rounds} rounds per variant, interleaved."
    )
    report = "\n\n".join(
        ["# poolkeeper first-call stampede", intro, table(results)]
    )
    print(report)
    print(f"\nTotal runtime: {time.perf_counter() - began:.1f} s")
    if args.markdown is not None:
        args.markdown.write_text(report + "\n", encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main())
