"""Which poolkeeper modules run for a call, a rebuild, a fork, a healing.

A reader's walk through the source follows the code that runs: this prints,
for seven scenarios, the poolkeeper modules with a Python frame executed
(``sys.setprofile`` in the calling thread, ``threading.setprofile`` in the
threads started meanwhile; a fork's child reports its own), the count
first. ``docs/core-concepts.md`` walks the same seven by hand.

    .venv/bin/python benchmarks/walks.py [--json]

The scenarios: a call of a built singleton (no key: the armed hit path); a
call after a watched environment write (the write, then the rebuild that
the call runs, closing the old client); a fork (what the child runs at the
fork; its first call then builds as any first call does); an async loop end
(``asyncio.run()`` returning, its loop's client closed on it); a healing
retirement (``retire()`` of the live client, closed at once: the first
healing retirement has no backoff); a ``max_age`` expiry (the client's age
timer ending, on the timer thread's worker, until the client is closed);
a ``check=`` probe (the call that finds the live client's probe due, runs
the probe and is served the client).
"""

from __future__ import annotations

import asyncio
import gc
import json
import logging
import os
import sys
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING

import poolkeeper
from poolkeeper import keys, process_singleton

if TYPE_CHECKING:
    from collections.abc import Callable
    from types import FrameType

ROOT = str(Path(poolkeeper.__file__).parent)


class Client:
    """A client with a close, as SDK clients have."""

    def close(self) -> None:
        """Nothing to release."""

    async def aclose(self) -> None:
        """Nothing to release."""


def _tracer(seen: set[str]) -> Callable[[FrameType, str, object], None]:
    """A profile function adding each poolkeeper module it sees to *seen*."""

    def tracer(frame: FrameType, _event: str, _arg: object) -> None:
        name = frame.f_code.co_filename
        if name.startswith(ROOT):
            seen.add(os.path.relpath(name, ROOT))

    return tracer


def _modules(run: Callable[[], object]) -> list[str]:
    seen: set[str] = set()
    sys.setprofile(_tracer(seen))
    try:
        run()
    finally:
        sys.setprofile(None)
    return sorted(seen)


def hit() -> list[str]:
    single = process_singleton(Client)
    single()
    single()
    return _modules(single)


def rebuild() -> list[str]:
    os.environ["PK_WALK_KEY"] = "one"
    single = process_singleton(key=keys.env("PK_WALK_KEY"))(Client)
    single()

    def write_and_call() -> None:
        os.environ["PK_WALK_KEY"] = "two"
        single()

    return _modules(write_and_call)


def fork() -> list[str]:
    single = process_singleton(Client)
    single()
    read, write = os.pipe()
    seen: set[str] = set()
    sys.setprofile(_tracer(seen))
    pid = os.fork()
    if pid == 0:  # The child: its fork hook ran.
        sys.setprofile(None)
        os.write(write, json.dumps(sorted(seen)).encode())
        os._exit(0)
    sys.setprofile(None)
    os.close(write)
    with os.fdopen(read, "rb") as pipe:
        data = pipe.read()
    os.waitpid(pid, 0)
    return list(json.loads(data))


def loop_end() -> list[str]:
    single = process_singleton(_make_async)
    seen: set[str] = set()

    async def main() -> None:
        await single()
        await single()
        # From here to asyncio.run()'s return: the loop's end.
        sys.setprofile(_tracer(seen))

    try:
        asyncio.run(main())
    finally:
        sys.setprofile(None)
    return sorted(seen)


async def _make_async() -> Client:
    return Client()


class Closing(Client):
    """A client that says when it was closed."""

    def __init__(self) -> None:
        self.closed = threading.Event()

    def close(self) -> None:
        """Say so."""
        self.closed.set()


def healing() -> list[str]:
    single = process_singleton(Closing)
    client = single()
    return _modules(lambda: single.retire(client))


def expiry() -> list[str]:
    single = process_singleton(max_age=0.2)(Closing)
    client = single()
    seen: set[str] = set()
    # The timer thread runs before this (the build started it); the age
    # timer's callback runs on a worker it starts at the deadline.
    threading.setprofile(_tracer(seen))
    try:
        if not client.closed.wait(10.0):
            msg = "the max_age timer never closed the client"
            raise RuntimeError(msg)
        # The rest of the retirement (leases loosened) runs after the
        # close, on the same worker: the walk ends with it.
        for thread in threading.enumerate():
            if thread.name == "poolkeeper-retire":
                thread.join(10.0)
    finally:
        threading.setprofile(None)
    return sorted(seen)


def probe() -> list[str]:
    single = process_singleton(check=bool, check_every=0.05)(Closing)
    single()
    slot = single._self_slot
    deadline = time.monotonic() + 10.0
    while slot.probe is None:  # Made due by the probe timer.
        if time.monotonic() > deadline:
            msg = "the probe never came due"
            raise RuntimeError(msg)
        time.sleep(0.01)
    return _modules(single)


#: Each walk: its name, and the function that measures it.
WALKS: tuple[tuple[str, Callable[[], list[str]]], ...] = (
    ("call of a built singleton", hit),
    ("rebuild after an environment write", rebuild),
    ("fork (the child's fork hook)", fork),
    ("async loop end", loop_end),
    ("healing retirement", healing),
    ("max_age expiry", expiry),
    ("check= probe", probe),
)


def _alone(walk: Callable[[], list[str]]) -> list[str]:
    """Run *walk* with no garbage of the walks before it to collect.

    A collection during a walk would run their finalizers and weakref
    callbacks (a dropped singleton's subscription forgotten, in
    ``_environ.py``) inside it: seen on CPython 3.10, not on 3.11.
    """
    gc.collect()
    gc.disable()
    try:
        return walk()
    finally:
        gc.enable()


def main(argv: list[str] | None = None) -> None:
    """Print each walk: its count, then its modules (--json: a mapping)."""
    # The healing walks' WARNING records, kept off stderr.
    logging.getLogger("poolkeeper").addHandler(logging.NullHandler())
    found = {name: _alone(walk) for name, walk in WALKS}
    if "--json" in (sys.argv[1:] if argv is None else argv):
        print(json.dumps(found))
        return
    for name, modules in found.items():
        print(f"{name}: {len(modules)}: {' '.join(modules)}")


if __name__ == "__main__":
    main()
