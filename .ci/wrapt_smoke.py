"""Smoke check of what the core needs from wrapt, run per wrapt version.

The core test suite runs next to it; this covers what that suite leaves
to wrapt itself: a singleton's per-class ``__call__`` and the proxy's
first use being an operator rather than an attribute access.
"""

from __future__ import annotations

import importlib.metadata
import pickle
import sys

import wrapt

import poolkeeper


class Client:
    """A client speaking a few protocols."""

    def __init__(self) -> None:
        self.closed = False
        self.items = [1, 2]

    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self):
        return iter(self.items)

    def __call__(self) -> str:
        return "called"

    def close(self) -> None:
        self.closed = True


KEY = ["a"]


@poolkeeper.process_singleton(key=lambda: KEY[0])
def client() -> Client:
    """Build a client."""
    return Client()


SINGLE = client


def main() -> int:
    """Exit 0 when every check holds; print what failed otherwise."""
    failures: list[str] = []

    def check(ok: object, what: str) -> None:
        if not ok:
            failures.append(what)

    handle = SINGLE.proxy()
    check(SINGLE.current() is None, "proxy() built a client")
    check(len(handle) == 2, "len() as the proxy's first use")
    first = SINGLE.current()
    check(first is not None, "len() did not build the client")
    check(SINGLE() is first, "the singleton's __call__ returned another")
    check(isinstance(handle, Client), "isinstance() through the proxy")
    check(handle() == "called", "calling the proxy")
    check(list(handle) == [1, 2], "iterating the proxy")
    KEY[0] = "b"
    check(SINGLE() is not first, "a key change did not rebuild")
    check(first is not None and first.closed, "the retired client is open")
    check(handle.closed is False, "the proxy still reaches the old client")
    again = pickle.loads(pickle.dumps(handle))
    check(again.__wrapped__ is SINGLE(), "unpickled proxy lost its single")
    check(SINGLE.statistics().builds == 2, "builds is not 2")
    poolkeeper.close_all()
    version = importlib.metadata.version("wrapt")
    print(f"wrapt {version} ({wrapt.__file__}):", failures or "ok")
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())
