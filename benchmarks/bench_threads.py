"""Calls per second from 1 and 2 threads: singletons beside functools.cache.

Every variant returns one shared object, as a singleton does; each row is
timed in the same run as its ``functools.cache`` baseline:

- ``functools.cache`` hit: ``get()`` of a cached zero-argument function;
- singleton, no key: ``api()`` of a built ``@process_singleton`` (the
  armed hit path);
- singleton, ``keys.env``: the same with a watched environment variable;
- lease: ``with api.lease(): pass`` (on a free-threaded build it takes the
  singleton's lock to pin and to unpin).

Method: for each thread count, one round runs every variant, in a rotating
order; a variant's threads start together (a barrier) and each runs
``number`` calls in timeit's loop. Its rate is the calls of all its
threads over the time from the barrier to the last thread's end. The
report gives the median rate over rounds, its ratio to the cache's in the
same rounds, and the 2-thread rate over the 1-thread rate. Run it from the
repository root, on any interpreter::

    .venv-ft/bin/python benchmarks/bench_threads.py      # about 20 s
    .venv/bin/python benchmarks/bench_threads.py --quick

With the GIL, two threads share one interpreter lock and cannot go faster
than one; on a free-threaded build they can. It is a report, not a test:
it exits 0 whatever the numbers.
"""

from __future__ import annotations

import argparse
import functools
import os
import platform
import statistics
import sys
import sysconfig
import threading
import time
import timeit

from poolkeeper import close_all, keys, process_singleton

CLIENT = object()
NAME = "POOLKEEPER_BENCH_THREADS"


def variants() -> dict[str, tuple[str, dict[str, object]]]:
    """Each variant's statement and the names it uses."""

    @functools.cache
    def cached() -> object:
        return CLIENT

    @process_singleton
    def plain() -> object:
        return CLIENT

    @process_singleton(key=keys.env(NAME))
    def watched() -> object:
        return CLIENT

    for call in (cached, plain, watched):
        call()
        call()  # Built and armed.
    return {
        "functools.cache hit": ("get()", {"get": cached}),
        "singleton, no key": ("api()", {"api": plain}),
        "singleton, keys.env": ("api()", {"api": watched}),
        "lease": ("with lease(): pass", {"lease": plain.lease}),
    }


def rate(
    stmt: str, names: dict[str, object], threads: int, number: int
) -> float:
    """Calls per second of *stmt* run *number* times in each of *threads*."""
    timer = timeit.Timer(stmt, globals=names)
    barrier = threading.Barrier(threads + 1)
    ends: list[float] = []

    def run() -> None:
        barrier.wait()
        timer.timeit(number)
        ends.append(time.perf_counter())

    workers = [threading.Thread(target=run) for _ in range(threads)]
    for worker in workers:
        worker.start()
    barrier.wait()
    start = time.perf_counter()
    for worker in workers:
        worker.join()
    return threads * number / (max(ends) - start)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--rounds", type=int, default=9)
    parser.add_argument("--number", type=int, default=200_000)
    parser.add_argument("--quick", action="store_true", help="3 rounds")
    args = parser.parse_args()
    rounds = 3 if args.quick else args.rounds
    os.environ[NAME] = "a"
    table = variants()
    names = list(table)
    free = bool(sysconfig.get_config_var("Py_GIL_DISABLED"))
    gil = "on" if getattr(sys, "_is_gil_enabled", lambda: True)() else "off"
    print(
        f"CPython {platform.python_version()}"
        f"{' free-threaded' if free else ''} (GIL {gil}), "
        f"{os.cpu_count()} CPUs, {rounds} rounds of {args.number:,} calls"
        " per thread"
    )
    rates: dict[tuple[str, int], list[float]] = {}
    ratios: dict[tuple[str, int], list[float]] = {}
    for threads in (1, 2):
        for n in range(rounds):
            order = names[n % len(names) :] + names[: n % len(names)]
            got = {
                name: rate(*table[name], threads, args.number)
                for name in order
            }
            for name in names:
                rates.setdefault((name, threads), []).append(got[name])
                ratios.setdefault((name, threads), []).append(
                    got[name] / got[names[0]]
                )
    print(
        f"{'':24} {'1 thread':>12} {'2 threads':>12}"
        f" {'x cache 1t':>11} {'x cache 2t':>11} {'2t / 1t':>8}"
    )
    for name in names:
        one = statistics.median(rates[name, 1])
        two = statistics.median(rates[name, 2])
        print(
            f"{name:24} {one / 1e6:>10.2f} M {two / 1e6:>10.2f} M"
            f" {statistics.median(ratios[name, 1]):>11.2f}"
            f" {statistics.median(ratios[name, 2]):>11.2f}"
            f" {two / one:>8.2f}"
        )
    print("(calls per second, medians over rounds; x cache: the ratio to")
    print(" the functools.cache hit's rate in the same round)")
    close_all()


if __name__ == "__main__":
    main()
