"""What poolkeeper.watch costs: construction, and method calls (nothing).

A trivial class stands in for an SDK client, in a module of its own (as an
SDK's class would be). Each variant builds and drops instances in a tight
loop; the table gives the best of several rounds, per construction, and
the ratio to the unwatched class. Method calls on a watched instance are
timed too: watch() wraps only ``__init__``, so they should cost the same.

Run it from the repository root::

    .venv/bin/python benchmarks/bench_watch.py [--quick]
"""

from __future__ import annotations

import argparse
import sys
import timeit
import types

import poolkeeper

SOURCE = """
class Client:
    def __init__(self, number=0):
        self.number = number

    def get(self):
        return self.number
"""


def _module(name: str) -> types.ModuleType:
    module = types.ModuleType(name)
    exec(SOURCE, module.__dict__)  # noqa: S102 -- our own constant source.
    sys.modules[name] = module
    return module


def _best(stmt, number: int, repeat: int) -> float:
    return min(timeit.repeat(stmt, number=number, repeat=repeat)) / number


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    number, repeat = (20_000, 3) if args.quick else (200_000, 7)

    plain = _module("bench_watch_plain").Client
    watched = _module("bench_watch_sdk").Client
    poolkeeper.watch("bench_watch_sdk:Client", limit=3)

    base = _best(lambda: plain(1), number, repeat)
    cost = _best(lambda: watched(1), number, repeat)
    client_plain, client_watched = plain(1), watched(1)
    call_plain = _best(client_plain.get, number, repeat)
    call_watched = _best(client_watched.get, number, repeat)
    poolkeeper.unwatch()

    print(f"{'':28} {'ns/op':>9} {'ratio':>7}")
    print(f"{'construct, unwatched':28} {base * 1e9:9.0f} {1:7.2f}")
    print(f"{'construct, watched':28} {cost * 1e9:9.0f} {cost / base:7.2f}")
    print(f"{'  overhead per build':28} {(cost - base) * 1e9:9.0f}")
    print(f"{'method call, unwatched':28} {call_plain * 1e9:9.0f} {1:7.2f}")
    print(
        f"{'method call, watched':28} {call_watched * 1e9:9.0f} "
        f"{call_watched / call_plain:7.2f}"
    )


if __name__ == "__main__":
    main()
