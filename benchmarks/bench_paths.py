"""What the paths beside the plain hit cost: leases, async hits, env writes.

Each row is a ratio to its own baseline, timed in the same round:

1. ``with single.lease(): pass`` (enter and exit) against a
   ``functools.cache`` hit, both as statements in timeit's own loop (as a
   caller writes them; the hit rows of ``bench_hit_path.py`` likewise call
   the singleton itself, with no function of ours around it);
2. ``await single()`` of an async singleton (no key, and ``keys.env``)
   against awaiting a plain ``async def`` that returns a global;
3. a write to an environment variable that one ``keys.env`` singleton
   watches, against the same write through ``os.environ``'s own class
   (alternating two values, so every write changes the value), and a write
   of the value already there;
4. the same write once 1,000 singletons watch that very name, and once
   1,000 singletons watch 1,000 other names (the name written keeps its
   one watcher): a write notifies the watchers of its name only. Its
   tables give the cost of one write, and time fewer runs per round.

Method: one round times ``number`` runs of every variant, taken
round-robin with a rotating start; the report gives the median over rounds
of the per-run time with its interquartile range, and the median over
rounds of the paired ratio. Run it from the repository root::

    .venv/bin/python benchmarks/bench_paths.py            # about 30 s
    .venv/bin/python benchmarks/bench_paths.py --quick

It is a report, not a test: it exits 0 whatever the numbers.
"""

from __future__ import annotations

import argparse
import asyncio
import functools
import os
import statistics
import timeit
from typing import TYPE_CHECKING

from poolkeeper import keys, process_singleton

if TYPE_CHECKING:
    from collections.abc import Callable

CLIENT = object()
NAME = "POOLKEEPER_BENCH_PATHS"


def quartiles(values: list[float]) -> tuple[float, float, float]:
    """Median and interquartile range."""
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q2, q1, q3


def measure(
    variants: dict[str, Callable[[], object] | str],
    rounds: int,
    number: int,
    names: dict[str, object] | None = None,
) -> dict[str, list[float]]:
    """Per-run seconds of each variant, one value per round.

    A variant is a callable, or a statement run in timeit's own loop with
    *names* as its globals (no function frame of ours around it).
    """
    order = list(variants)
    times: dict[str, list[float]] = {name: [] for name in order}
    for r in range(rounds):
        for i in range(len(order)):
            name = order[(r + i) % len(order)]
            timer = timeit.Timer(variants[name], globals=names)
            total = timer.timeit(number)
            times[name].append(total / number)
    return times


def report(
    title: str,
    times: dict[str, list[float]],
    baseline: str,
    unit: float = 1e9,
) -> None:
    """Print one table: median, IQR and the paired ratio to *baseline*."""
    print(f"\n## {title}\n")
    print("| Variant | median ns | IQR ns | x baseline (paired) |")
    print("|---|---:|---:|---:|")
    base = times[baseline]
    for name, values in times.items():
        median, q1, q3 = quartiles(values)
        ratio = statistics.median(
            v / b for v, b in zip(values, base, strict=True)
        )
        print(
            f"| {name} | {median * unit:.1f} | {q1 * unit:.1f} - "
            f"{q3 * unit:.1f} | {ratio:.2f} |"
        )


def lease_rows(rounds: int, number: int) -> dict[str, list[float]]:
    """A lease's enter and exit, against a functools.cache hit.

    Both are statements, as written in the caller's code: ``cached()``
    and a ``with`` block that does nothing.
    """

    @functools.cache
    def cached() -> object:
        return CLIENT

    @process_singleton
    def single() -> object:
        return object()

    single()
    return measure(
        {
            "functools.cache hit": "cached()",
            "with single.lease()": "with single.lease():\n    pass",
        },
        rounds,
        number,
        {"cached": cached, "single": single},
    )


def async_rows(rounds: int, number: int) -> dict[str, list[float]]:
    """``await single()`` in a running loop, against a plain coroutine."""
    os.environ[NAME] = "a"

    async def plain() -> object:
        return CLIENT

    @process_singleton
    async def bare() -> object:
        return object()

    @process_singleton(key=keys.env(NAME))
    async def keyed() -> object:
        return object()

    async def loop_of(fn: Callable[[], object]) -> None:
        for _ in range(number):
            await fn()  # type: ignore[misc]

    async def main() -> dict[str, list[float]]:
        await bare()
        await keyed()
        names = {
            "await plain async def": plain,
            "await single(), no key": bare,
            "await single(), keys.env": keyed,
        }
        times: dict[str, list[float]] = {name: [] for name in names}
        order = list(names)
        loop = asyncio.get_running_loop()
        for r in range(rounds):
            for i in range(len(order)):
                name = order[(r + i) % len(order)]
                start = loop.time()
                await loop_of(names[name])
                times[name].append((loop.time() - start) / number)
        return times

    try:
        return asyncio.run(main())
    finally:
        del os.environ[NAME]


def env_rows(rounds: int, number: int) -> dict[str, list[float]]:
    """A watched environment write, against the plain one."""

    @process_singleton(key=keys.env(NAME))
    def single() -> object:
        return object()

    os.environ[NAME] = "a"
    single()
    watched = type(os.environ)
    base = watched.__mro__[1]
    environ = os.environ

    def plain() -> None:
        base.__setitem__(environ, NAME, "a")
        base.__setitem__(environ, NAME, "b")

    def write() -> None:
        environ[NAME] = "a"
        environ[NAME] = "b"

    def same() -> None:
        environ[NAME] = "b"
        environ[NAME] = "b"

    try:
        return measure(
            {
                "os.environ's own class (no watcher)": plain,
                "watched, one singleton, new value": write,
                "watched, one singleton, same value": same,
            },
            rounds,
            number,
        )
    finally:
        del os.environ[NAME]


def many_rows(rounds: int, number: int) -> dict[str, list[float]]:
    """One write, with 1,000 watchers of its name or of other names."""
    crowd, alone = f"{NAME}_CROWD", f"{NAME}_ALONE"
    others = [f"{NAME}_OTHER_{i}" for i in range(1_000)]
    singles = [
        process_singleton(key=keys.env(name))(object)
        for name in [alone, *[crowd] * 1_000, *others]
    ]
    environ = os.environ
    for name in (alone, crowd, *others):
        environ[name] = "a"
    for single in singles:
        single()
        single()  # Armed: a write disarms each watcher of its name.
    base = type(environ).__mro__[1]

    def plain() -> None:
        base.__setitem__(environ, alone, "a")
        base.__setitem__(environ, alone, "b")

    def one() -> None:
        environ[alone] = "a"
        environ[alone] = "b"

    def many() -> None:
        environ[crowd] = "a"
        environ[crowd] = "b"

    try:
        times = measure(
            {
                "os.environ's own class (no watcher)": plain,
                "1 watcher; 1,000 singletons watch other names": one,
                "1,000 watchers of this name": many,
            },
            rounds,
            number,
        )
    finally:
        for name in (alone, crowd, *others):
            del environ[name]
    # Two writes per run: report one.
    return {name: [t / 2 for t in values] for name, values in times.items()}


def main() -> None:
    """Run every table and print it as Markdown."""
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    rounds, number = (5, 2_000) if args.quick else (15, 20_000)
    report(
        "Lease: enter and exit",
        lease_rows(rounds, number),
        "functools.cache hit",
    )
    report(
        "Async: one await",
        async_rows(rounds, number),
        "await plain async def",
    )
    report(
        "Environment: two writes",
        env_rows(rounds, number),
        "os.environ's own class (no watcher)",
    )
    report(
        "Environment: one write, 1,000 watchers",
        many_rows(rounds, max(10, number // 200)),
        "os.environ's own class (no watcher)",
    )


if __name__ == "__main__":
    main()
