"""release_sockets(): a forked child lets go of its copies, sends nothing."""

from __future__ import annotations

import collections
import logging
import logging.handlers
import os
import socket
import stat
from pathlib import Path

import pytest
from sdk_fork import Forked

from poolkeeper import process_singleton, release_sockets

QUIET = 0.3  # seconds of silence that show nothing was sent


@pytest.fixture(name="pair")
def _pair():
    """Return (listener, client, server end) of a loopback connection."""
    listener = socket.create_server(("127.0.0.1", 0))
    client = socket.create_connection(listener.getsockname(), timeout=5)
    server, _ = listener.accept()
    server.settimeout(5)
    yield listener, client, server
    for sock in (listener, client, server):
        sock.close()


def _is_socket(fd):
    return stat.S_ISSOCK(os.fstat(fd).st_mode)


def _is_devnull(fd):
    return os.path.samestat(os.fstat(fd), Path(os.devnull).stat())


class Holder:
    """Stands in for an SDK client; attributes are set by each test."""


class Slotted:
    __slots__ = ("inner", "unset")


class Hostile(dict):
    """A dict whose own methods must never run in the at-fork hook."""

    def values(self):
        raise AssertionError("values() called")

    def __iter__(self):
        raise AssertionError("__iter__ called")


class Trap:
    """Attribute access runs code: the walk must not trigger it."""

    def __init__(self, inner):
        self.inner = inner

    def __getattr__(self, name):
        raise AssertionError("__getattr__ called", name)

    @property
    def dangerous(self):
        raise AssertionError("property called")


class TestReachability:
    def test_finds_sockets_in_attributes_slots_and_containers(self, pair):
        """Sockets behind __dict__, __slots__ and containers are found."""
        _, client, _ = pair
        other = socket.create_connection(pair[0].getsockname(), timeout=5)
        accepted, _ = pair[0].accept()
        slotted = Slotted()
        slotted.inner = collections.deque([(Hostile(k=client),)])
        holder = Holder()
        holder.pools = {"a": [Trap(slotted)], "b": {frozenset([1]): other}}
        holder.again = client  # The same socket twice: released once.

        def in_child():
            count = release_sockets(holder)
            return {
                "count": count,
                "fds_are_devnull": [
                    _is_devnull(client.fileno()),
                    _is_devnull(other.fileno()),
                ],
            }

        try:
            child = Forked(in_child)
            reply = child.result()
            assert 0 == child.finish()
        finally:
            other.close()
            accepted.close()
        assert {"count": 2, "fds_are_devnull": [True, True]} == reply
        assert _is_socket(client.fileno())

    def test_never_touches_unreachable_or_listening_sockets(self, pair):
        """Listening, unrelated, logger-held and closed sockets stay put."""
        listener, client, _ = pair
        log = logging.getLogger("poolkeeper.tests.release")
        handler = logging.handlers.DatagramHandler("127.0.0.1", 9)
        handler.sock = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
        handler.sock.connect(("127.0.0.1", 9))
        log.addHandler(handler)
        closed = socket.socket()
        closed.close()
        holder = Holder()
        holder.listener = listener  # Not connected: never released.
        holder.log = log  # Loggers lead to every handler: never followed.
        holder.factory = lambda: client  # Functions: never followed.
        holder.kind = type("WithSocket", (), {"sock": client})
        holder.closed = closed

        def in_child():
            return {
                "count": release_sockets(holder),
                "sockets": [
                    _is_socket(listener.fileno()),
                    _is_socket(client.fileno()),
                    _is_socket(handler.sock.fileno()),
                ],
            }

        try:
            child = Forked(in_child)
            reply = child.result()
            assert 0 == child.finish()
        finally:
            log.removeHandler(handler)
            handler.close()
        assert {"count": 0, "sockets": [True, True, True]} == reply

    def test_the_walk_is_bounded(self, pair, monkeypatch):
        """Past MAX_OBJECTS the walk stops: no recursion, no endless loop."""
        from poolkeeper import _sockets

        chain = {"next": None, "sock": pair[1]}
        for _ in range(5000):
            chain = {"next": chain}
        cycle = Holder()
        cycle.self = cycle
        cycle.chain = chain
        monkeypatch.setattr(_sockets, "MAX_OBJECTS", 1000)
        assert [] == _sockets._connected_sockets(cycle)
        monkeypatch.setattr(_sockets, "MAX_OBJECTS", 200_000)
        assert [pair[1].fileno()] == _sockets._connected_sockets(cycle)

    def test_nothing_reachable_opens_nothing(self):
        """With no socket to release, not even /dev/null is opened."""
        fds = Path("/proc/self/fd")
        before = set(fds.iterdir())
        assert 0 == release_sockets(Holder())
        assert before == set(fds.iterdir())


class TestAsAfterFork:
    @pytest.mark.parametrize("release", [True, False], ids=["release", "keep"])
    def test_the_parents_close_reaches_the_peer_while_the_child_lives(
        self, pair, release
    ):
        """With release_sockets the peer sees EOF at once; without, never."""
        _, client, server = pair
        holder = Holder()
        holder.sock = client
        single = process_singleton(
            after_fork=release_sockets if release else None,
            close=lambda h: h.sock.close(),
        )(lambda: holder)
        assert single() is holder
        child = Forked(lambda: _is_devnull(client.fileno()))
        try:
            assert release == child.result()
            # Nothing was sent by the child: the peer reads no byte, no EOF.
            server.settimeout(QUIET)
            with pytest.raises(TimeoutError):
                server.recv(1)
            assert single.reset()
            assert 1 == single.statistics().closes
            if release:
                server.settimeout(5)
                assert b"" == server.recv(1)
            else:
                with pytest.raises(TimeoutError):
                    server.recv(1)
        finally:
            assert 0 == child.finish()
        server.settimeout(5)
        assert b"" == server.recv(1)

    def test_a_child_that_uses_a_released_socket_gets_no_parent_bytes(
        self, pair
    ):
        """A child using a released socket fails; the peer gets nothing."""
        _, client, server = pair

        def in_child():
            release_sockets([client])
            try:
                client.sendall(b"from the child")
            except OSError as exc:
                return exc.__class__.__name__
            return "sent"

        child = Forked(in_child)
        assert "OSError" == child.result()
        assert 0 == child.finish()
        server.settimeout(QUIET)
        with pytest.raises(TimeoutError):
            server.recv(1)
        client.sendall(b"x")
        server.settimeout(5)
        assert b"x" == server.recv(1)
