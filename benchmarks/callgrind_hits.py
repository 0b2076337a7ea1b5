"""Instructions per hit, counted by ``valgrind --tool=callgrind``.

Wall-clock ratios move with the machine; instruction counts do not. Each
row runs a child Python under callgrind twice, with ``--calls`` and with
twice as many calls, collecting only inside the C function that drives the
calls (``--toggle-collect``): ``deque_extend`` consuming an
``itertools.starmap`` of the call for sync rows, the task step
(``task_step_impl``) that runs a coroutine's whole loop of awaits for async
rows. The difference, divided by ``--calls``, is one call's cost, start-up
and set-up excluded; every row of a kind pays the same driving overhead,
so a row's ratio is to its baseline measured the same way.

Rows: a ``functools.cache`` hit; a built singleton's hit with no key
(also with ``max_age=`` and ``check=`` set, and with an OpenTelemetry
SDK meter provider set: each against the no-key row), ``keys.env``,
``keys.file``, ``(keys.env, keys.file)``, a polled callable key, and
``poolkeeper_daytona.daytona_client()`` (when the adapter is installed);
``with single.lease():`` (inside a function, whose own call, about 400
instructions, the row includes); ``await single()`` of an async
singleton, and awaiting a plain ``async def`` (the async rows'
baseline); a write of a new value to an environment variable one armed
``keys.env`` singleton watches, against the same write through
``os.environ``'s own class. The C function names are CPython 3.11's
(they may differ elsewhere).

Needs ``valgrind`` (Debian's package). Run it from the repository root::

    .venv/bin/python benchmarks/callgrind_hits.py            # a few minutes
    .venv/bin/python benchmarks/callgrind_hits.py --markdown
    .venv/bin/python benchmarks/callgrind_hits.py --row "no key" --row keys.env

(The ``daytona_client()`` row imports the SDK under callgrind: most of the
run.) It is a report, not a test: it exits 0 whatever the numbers (1 if
valgrind is missing).
"""

from __future__ import annotations

import argparse
import asyncio
import collections
import functools
import itertools
import json
import os
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from collections.abc import Callable

CLIENT = object()
ENV = "POOLKEEPER_CALLGRIND_KEY"

#: (row, baseline row) in the order reported.
ROWS = (
    ("functools.cache hit", None),
    ("no key", "functools.cache hit"),
    ("no key, max_age + check", "no key"),
    ("no key, OpenTelemetry provider set", "no key"),
    ("keys.env", "functools.cache hit"),
    ("keys.file", "functools.cache hit"),
    ("(keys.env, keys.file)", "functools.cache hit"),
    ("polled callable", "functools.cache hit"),
    ("daytona_client()", "functools.cache hit"),
    ("with single.lease()", "functools.cache hit"),
    ("await async def (baseline)", None),
    ("await single(), no key", "await async def (baseline)"),
    ("await single(), keys.env", "await async def (baseline)"),
    ("os.environ write (no watcher)", None),
    ("watched os.environ write", "os.environ write (no watcher)"),
)


def _sync_call(  # noqa: PLR0911 -- a row each.
    row: str, scratch: Path
) -> Callable[[], object] | None:
    """Return a zero-argument callable for *row*, its client built."""
    from poolkeeper import keys, process_singleton

    os.environ[ENV] = "value"
    key_file = scratch / "key"
    key_file.write_text("secret")

    def factory() -> object:
        return CLIENT

    if row == "functools.cache hit":
        return functools.cache(factory)
    if row == "daytona_client()":
        try:
            from poolkeeper_daytona import daytona_client
        except ImportError:
            return None
        os.environ["DAYTONA_API_KEY"] = "callgrind-key"
        os.environ["DAYTONA_API_URL"] = "http://127.0.0.1:9/api"
        return daytona_client
    kinds: dict[str, object] = {
        "no key": None,
        "keys.env": keys.env(ENV),
        "keys.file": keys.file(key_file),
        "(keys.env, keys.file)": (keys.env(ENV), keys.file(key_file)),
        "polled callable": lambda: os.environ[ENV],
    }
    if row in {"os.environ write (no watcher)", "watched os.environ write"}:
        return _env_write(row, watched=row.startswith("watched"))
    if row == "no key, max_age + check":
        # Neither comes due while counted: what the options cost a call.
        return process_singleton(max_age=3600, check=bool, check_every=3600)(
            factory
        )
    if row == "no key, OpenTelemetry provider set":
        from opentelemetry import metrics
        from opentelemetry.sdk.metrics import MeterProvider
        from opentelemetry.sdk.metrics.export import InMemoryMetricReader

        metrics.set_meter_provider(
            MeterProvider(metric_readers=[InMemoryMetricReader()])
        )
        return process_singleton(factory)
    if row == "with single.lease()":
        leased = process_singleton(factory)

        def lease() -> object:
            with leased.lease() as client:
                return client

        return lease
    return process_singleton(key=kinds[row])(factory)  # type: ignore[arg-type]


def _env_write(row: str, *, watched: bool) -> Callable[[], object]:
    """A write of a new value: watched by one armed singleton, or not."""
    from poolkeeper import keys, process_singleton

    single = process_singleton(key=keys.env(ENV))(object)
    single()
    single()
    environ = os.environ
    values = itertools.cycle(("a", "b"))
    if watched:

        def write() -> object:
            environ[ENV] = next(values)
            return single

        return write
    # The base class's own __setitem__: the write without the watching.
    store = type(environ).__mro__[1].__setitem__

    def plain() -> object:
        store(environ, ENV, next(values))
        return row

    return plain


def _async_run(row: str, calls: int) -> None:
    """Await *row*'s callable *calls* times on one loop."""
    from poolkeeper import keys, process_singleton

    os.environ[ENV] = "value"

    async def factory() -> object:
        return CLIENT

    if row == "await async def (baseline)":
        call = factory
    else:
        key = keys.env(ENV) if row.endswith("keys.env") else None
        call = process_singleton(key=key)(factory)

    async def main() -> None:
        await call()
        await call()
        for _ in range(calls):
            await call()

    asyncio.run(main())


def _child(row: str, calls: int, scratch: Path) -> None:
    if row.startswith("await"):
        _async_run(row, calls)
        return
    call = _sync_call(row, scratch)
    if call is None:
        sys.exit(3)  # Not installed: no row.
    call()
    call()
    # Collected inside deque_extend only: the calls, and their driving.
    collections.deque(
        itertools.starmap(call, itertools.repeat((), calls)), maxlen=0
    )


def _count(row: str, calls: int, scratch: Path) -> int | None:
    """Run the child for *row* under callgrind; return its instructions."""
    out = scratch / f"callgrind.{abs(hash((row, calls)))}"
    done = subprocess.run(  # noqa: S603 -- our own arguments.
        [  # noqa: S607 -- valgrind from PATH, checked in main().
            "valgrind",
            "--tool=callgrind",
            "--toggle-collect="
            + (
                "task_step_impl" if row.startswith("await") else "deque_extend"
            ),
            f"--callgrind-out-file={out}",
            sys.executable,
            __file__,
            "--child",
            row,
            "--calls",
            str(calls),
            "--scratch",
            str(scratch),
        ],
        capture_output=True,
        text=True,
        check=False,
        timeout=900,
        # A fixed hash seed: the start-up's instructions do not vary. No
        # coverage in the child (a suite run under coverage starts it in
        # subprocesses): its tracer would be counted in every frame.
        env={
            **{k: v for k, v in os.environ.items() if "COVERAGE" not in k},
            "PYTHONHASHSEED": "0",
        },
    )
    if done.returncode == 3:
        return None
    found = re.search(r"Collected : (\d+)", done.stderr)
    if done.returncode or found is None:
        msg = f"callgrind run of {row!r} failed:\n{done.stderr[-2000:]}"
        raise RuntimeError(msg)
    return int(found.group(1))


def _per_call(row: str, calls: int, scratch: Path) -> float | None:
    high = _count(row, 2 * calls, scratch)
    low = _count(row, calls, scratch)
    if high is None or low is None:
        return None
    return (high - low) / calls


def _measure(rows: set[str], calls: int) -> dict[str, float]:
    """Instructions per call of each row in *rows* (absent: not installed)."""
    with tempfile.TemporaryDirectory() as tmp:
        scratch = Path(tmp)
        costs: dict[str, float] = {}
        for row, _ in ROWS:
            if row in rows:
                cost = _per_call(row, calls, scratch)
                if cost is not None:
                    costs[row] = cost
    return costs


def _report(costs: dict[str, float], calls: int, *, markdown: bool) -> None:
    python = ".".join(map(str, sys.version_info[:3]))
    if markdown:
        print(f"Instructions per call (callgrind, CPython {python}):\n")
        print("| hit | instructions | ratio |")
        print("|---|---:|---:|")
    else:
        print(f"CPython {python}, {calls} calls per row")
    for row, base in ROWS:
        if row not in costs:
            continue
        cost = costs[row]
        ratio = "" if base not in costs else f"{cost / costs[base]:.2f}x"
        if markdown:
            print(f"| {row} | {cost:,.0f} | {ratio or '1 (baseline)'} |")
        else:
            print(f"{row:32} {cost:10,.0f} {ratio:>8}")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--calls", type=int, default=2_000)
    parser.add_argument(
        "--row",
        action="append",
        choices=[name for name, _ in ROWS],
        help="measure this row only (repeat for more)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print {row: instructions}"
    )
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    parser.add_argument("--scratch", type=Path, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.child:
        _child(args.child, args.calls, args.scratch)
        return 0
    if shutil.which("valgrind") is None:
        print("valgrind is not installed (apt-get install valgrind)")
        return 1
    costs = _measure(set(args.row or [n for n, _ in ROWS]), args.calls)
    if args.json:
        print(json.dumps(costs))
    else:
        _report(costs, args.calls, markdown=args.markdown)
    return 0


if __name__ == "__main__":
    sys.exit(main())
