"""poolkeeper in one minute: one build across threads, rotation, fork.

Run with ``make quickstart`` (or ``python examples/quickstart.py``). The
client is a stand-in that owns a real socket pair, so the open file
descriptors it prints are real.
"""

from __future__ import annotations

import os
import socket
import sys
import threading
from pathlib import Path

from poolkeeper import keys, process_singleton

BUILDS: list[int] = []


def open_fds() -> int:
    """Count this process's open file descriptors."""
    return sum(1 for _ in Path("/proc/self/fd").iterdir())


class PooledClient:
    """Stands in for an SDK client: owns sockets until closed."""

    def __init__(self, api_key: str) -> None:
        self.key_tail = api_key[-4:]
        self.pid = os.getpid()
        self._sockets = socket.socketpair()
        self.closed = False

    def close(self) -> None:
        """Release the sockets."""
        for s in self._sockets:
            s.close()
        self.closed = True


@process_singleton(key=keys.env("DEMO_API_KEY"))
def make_client() -> PooledClient:
    """Build the process's client from the environment."""
    BUILDS.append(os.getpid())
    return PooledClient(os.environ["DEMO_API_KEY"])


def main() -> int:
    """Walk through the three guarantees and check each one."""
    os.environ["DEMO_API_KEY"] = "sk-demo-1111"
    ok = True

    barrier = threading.Barrier(32)
    seen: list[PooledClient] = []

    def worker() -> None:
        barrier.wait(10)
        seen.append(make_client())

    threads = [threading.Thread(target=worker) for _ in range(32)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(10)
    first = make_client()
    one = len(BUILDS) == 1 and all(c is first for c in seen)
    ok &= one
    print(f"1. 32 threads called make_client() at once: {len(BUILDS)} build,")
    print(f"   {len({id(c) for c in seen})} distinct client, fds {open_fds()}")

    fds_before = open_fds()
    os.environ["DEMO_API_KEY"] = "sk-demo-2222"  # Key rotation.
    second = make_client()
    rotated = second is not first and first.closed and not second.closed
    ok &= rotated and open_fds() == fds_before
    print(
        f"2. rotated DEMO_API_KEY: new client (key ...{second.key_tail}), "
        f"old one closed: {first.closed}, fds {fds_before} -> {open_fds()}"
    )

    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        child = make_client()
        good = child is not second and child.pid == os.getpid()
        good &= not second.closed
        os.write(write, b"1" if good else b"0")
        os._exit(0)
    os.close(write)
    _, status = os.waitpid(pid, 0)
    child_ok = (
        os.read(read, 1) == b"1" and os.waitstatus_to_exitcode(status) == 0
    )
    os.close(read)
    ok &= child_ok and not second.closed and make_client() is second
    print(
        f"3. forked child {pid} built its own client: {child_ok}; "
        f"parent's still open and in use: {not second.closed}"
    )
    print(f"\n{make_client!r}\n{make_client.statistics()}")
    print("all checks passed" if ok else "A CHECK FAILED")
    return 0 if ok else 1


if __name__ == "__main__":
    sys.exit(main())
