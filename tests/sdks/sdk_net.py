"""What the kernel says about loopback TCP connections.

A connection is named by the client's port. The server has seen it close
once its own end leaves ESTABLISHED (CLOSE_WAIT or gone): that happens
only when the last descriptor of the client's socket, in any process, is
closed. ``process_ports`` reads this process's ``/proc/self/fd``.
"""

from __future__ import annotations

import threading
import time
from pathlib import Path

ESTABLISHED = 0x01
LISTEN = 0x0A


def _entries():
    for name in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            lines = Path(name).read_text(encoding="ascii").splitlines()[1:]
        except FileNotFoundError:
            continue
        for line in lines:
            fields = line.split()
            local = int(fields[1].rsplit(":", 1)[1], 16)
            remote = int(fields[2].rsplit(":", 1)[1], 16)
            yield local, remote, int(fields[3], 16), int(fields[9])


def server_sees_open(server_port, client_port):
    """Return whether the server's end of the connection is ESTABLISHED."""
    return any(
        local == server_port and remote == client_port and state == ESTABLISHED
        for local, remote, state, _ in _entries()
    )


def socket_inodes(pid="self"):
    """Return the inodes of the sockets in a process's descriptor table."""
    inodes = set()
    for fd in Path(f"/proc/{pid}/fd").iterdir():
        try:
            target = str(fd.readlink())
        except FileNotFoundError:
            continue
        if target.startswith("socket:["):
            inodes.add(int(target[8:-1]))
    return inodes


def process_ports(server_port, pid="self"):
    """Return the client ports of a process's open sockets to *server_port*."""
    inodes = socket_inodes(pid)
    return {
        local
        for local, remote, _, inode in _entries()
        if remote == server_port and inode in inodes
    }


def wait_until(predicate, timeout=5.0):
    """Poll *predicate* until true or *timeout* seconds pass; return it."""
    pause = threading.Event()
    deadline = time.monotonic() + timeout
    while not predicate():
        if time.monotonic() > deadline:
            return bool(predicate())
        pause.wait(0.02)
    return True


def together(count, work, timeout):
    """Run *work* on *count* threads released at once; return their errors.

    Every thread is joined within *timeout* seconds (asserted).
    """
    barrier = threading.Barrier(count, timeout=timeout)
    errors = []

    def run(_):
        try:
            barrier.wait()
            work()
        except BaseException as exc:
            errors.append(exc)

    each(count, run, timeout)
    return errors


def each(count, work, timeout):
    """Run ``work(i)`` on threads i = 0 .. *count* - 1; join them all.

    Every thread is joined within *timeout* seconds (asserted).
    """
    threads = [threading.Thread(target=work, args=(i,)) for i in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout)
        assert not thread.is_alive()
