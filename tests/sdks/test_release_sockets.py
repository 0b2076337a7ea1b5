"""release_sockets(): a forked child lets go of its copies, sends nothing."""

from __future__ import annotations

import asyncio
import collections
import datetime as dt
import ipaddress
import logging
import logging.handlers
import os
import socket
import ssl
import stat
import threading
import warnings
from pathlib import Path

import aiohttp
import httpx
import pytest
import requests
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sdk_fork import Forked
from sdk_net import process_ports, server_sees_open, socket_inodes, wait_until

from poolkeeper import process_singleton, release_sockets

QUIET = 0.3  # seconds of silence that show nothing was sent
NOTHING = (
    "release_sockets() found no connected socket of its own in a "
    f"{__name__}.Holder: it had no open connection, or it keeps its "
    "sockets below Python (uvloop, a C extension), where only an "
    "after_fork hook of your own can close them."
)


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
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                count = release_sockets(holder)
            return {
                "count": count,
                "said": [str(w.message) for w in caught],
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
        assert {
            "count": 0,
            "said": [NOTHING],
            "sockets": [True, True, True],
        } == reply

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
        assert ([], False) == _sockets._connected_sockets(cycle, set())
        monkeypatch.setattr(_sockets, "MAX_OBJECTS", 200_000)
        assert ([pair[1].fileno()], True) == _sockets._connected_sockets(
            cycle, set()
        )

    def test_every_entry_of_a_container_counts(self, pair, monkeypatch):
        """A big list's entries count: the walk stops inside it, and says so.

        The socket is reached after the list: counting only the objects it
        follows, the walk went through every entry (6 million took 3.7 s).
        """
        from poolkeeper import _sockets

        holder = Holder()
        holder.sock = pair[1]
        holder.big = list(range(100_000))
        monkeypatch.setattr(_sockets, "MAX_OBJECTS", 1000)
        assert ([], False) == _sockets._connected_sockets(holder, set())

        def in_child():
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                count = release_sockets(holder)
            return count, [str(w.message) for w in caught]

        child = Forked(in_child)
        count, said = child.result()
        assert 0 == child.finish()
        assert 0 == count
        assert (
            "release_sockets() stopped after 1,000 objects reachable from a "
            f"{__name__}.Holder; sockets past them stay open in this child."
        ) == said[0]

    def test_nothing_reachable_opens_nothing_and_says_so(self):
        """With no socket to release, not even /dev/null is opened."""
        fds = Path("/proc/self/fd")

        def in_child():
            before = {p.name for p in fds.iterdir()}
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                count = release_sockets(Holder())
            after = {p.name for p in fds.iterdir()}
            said = [(w.category.__name__, str(w.message)) for w in caught]
            return count, before == after, said

        child = Forked(in_child)
        count, same_fds, said = child.result()
        assert 0 == child.finish()
        assert (0, True) == (count, same_fds)
        assert [["PoolkeeperWarning", NOTHING]] == said

    def test_refused_in_the_process_that_made_the_client(self, pair):
        """Outside a forked child the sockets are in use: RuntimeError."""
        _, client, server = pair
        with pytest.raises(RuntimeError, match="this process is no forked"):
            release_sockets(client)
        assert _is_socket(client.fileno())
        client.sendall(b"x")
        assert b"x" == server.recv(1)


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

    @pytest.mark.parametrize("kind", ["plain", "tls"])
    def test_a_child_that_uses_a_released_socket_gets_no_parent_bytes(
        self, request, kind
    ):
        """A child writing to a released socket fails; the peer gets nothing.

        Also over TLS, whose OpenSSL writes with write(2): a /dev/null open
        for writing took the bytes silently.
        """
        if kind == "tls":
            client, server = request.getfixturevalue("tls_pair")
        else:
            _, client, server = request.getfixturevalue("pair")

        def in_child():
            release_sockets([client])
            try:
                client.sendall(b"from the child")
            except OSError as exc:
                return exc.__class__.__name__
            return "sent"

        child = Forked(in_child)
        # TLS: ssl.SSLEOFError, or OSError (EBADF) on Python 3.13.
        expected = {"OSError", "SSLEOFError"} if kind == "tls" else {"OSError"}
        assert child.result() in expected
        assert 0 == child.finish()
        server.settimeout(QUIET)
        with pytest.raises(TimeoutError):
            server.recv(1)
        client.sendall(b"x")
        server.settimeout(5)
        assert b"x" == server.recv(1)


def _port(url):
    return int(url.rsplit(":", 1)[1])


class TestOnlyTheClientsOwn:
    def test_a_kept_singletons_socket_is_never_released(self, http_server):
        """A client reached through another, kept singleton stays usable.

        The abandoned client holds the fork="keep" singleton's session (it
        was built from it): the child releases only the abandoned client's
        own connection, and goes on using the kept session's.
        """
        kept = process_singleton(fork="keep")(requests.Session)
        holder = Holder()
        holder.session = kept()
        # Closed by the singleton's close hook.
        holder.http = httpx.Client(base_url=http_server.url)  # noqa: PK001
        abandoned = process_singleton(
            after_fork=release_sockets, close=lambda h: h.http.close()
        )(lambda: holder)
        server_port = _port(http_server.url)
        kept().get(http_server.url).raise_for_status()
        [kept_port] = process_ports(server_port)
        assert abandoned() is holder
        holder.http.get("/").raise_for_status()
        [own_port] = process_ports(server_port) - {kept_port}

        def in_child():
            open_ports = process_ports(server_port)
            kept().get(http_server.url).raise_for_status()
            return sorted(open_ports), sorted(process_ports(server_port))

        try:
            child = Forked(in_child)
            before_use, after_use = child.result()
            assert 0 == child.finish()
            assert [kept_port] == before_use  # The kept one, reused.
            assert [kept_port] == after_use
            assert server_sees_open(server_port, kept_port)
            assert abandoned.reset()
            assert wait_until(
                lambda: not server_sees_open(server_port, own_port)
            )
        finally:
            abandoned.reset()
            holder.http.close()
            kept().close()
            kept.reset()

    @pytest.mark.parametrize("flavour", ["asyncio", "uvloop"])
    def test_an_aiohttp_session_in_a_forked_child(self, http_server, flavour):
        """The session's connection goes; the loop's own sockets stay.

        On uvloop the connection is a C object, out of reach: nothing is
        released, and it says so.
        """
        if flavour == "uvloop":
            import uvloop

            loop = uvloop.new_event_loop()
        else:
            loop = asyncio.new_event_loop()
        server_port = _port(http_server.url)

        async def connect():
            session = aiohttp.ClientSession()
            async with session.get(http_server.url) as response:
                await response.read()
            return session

        session = loop.run_until_complete(connect())
        [port] = process_ports(server_port)

        def in_child():
            sockets = socket_inodes()
            with warnings.catch_warnings(record=True) as caught:
                warnings.simplefilter("always")
                count = release_sockets(session)
            gone = len(sockets - socket_inodes())
            return (
                count,
                gone,
                sorted(process_ports(server_port)),
                [str(w.message) for w in caught],
            )

        try:
            child = Forked(in_child)
            count, gone, open_ports, said = child.result()
            assert 0 == child.finish()
        finally:
            loop.run_until_complete(session.close())
            loop.close()
        if flavour == "uvloop":
            assert (0, 0, [port]) == (count, gone, open_ports)
            assert 1 == len(said)
            assert said[0].startswith(
                "release_sockets() found no connected socket of its own in "
                "a aiohttp.client.ClientSession"
            )
        else:
            assert (1, 1, [], []) == (count, gone, open_ports, said)

    def test_nothing_released_is_logged_on_first_use(self, caplog):
        """As after_fork, the warning waits for the child's first call."""
        holder = Holder()
        single = process_singleton(after_fork=release_sockets)(lambda: holder)
        single()

        def in_child():
            records = []
            handler = logging.Handler()
            handler.emit = records.append
            log = logging.getLogger("poolkeeper")
            log.addHandler(handler)
            try:
                pending = len(single._self_life.fork_errors)
                single()
            finally:
                log.removeHandler(handler)
            return pending, [r.getMessage() for r in records]

        child = Forked(in_child)
        pending, logged = child.result()
        assert 0 == child.finish()
        assert 1 == pending
        name = single.__qualname__
        assert [f"{NOTHING} (the after_fork hook of {name}, in process"] == [
            m.rsplit(" ", 1)[0] for m in logged
        ]
        single.reset()


def _self_signed(directory):
    """Write a certificate for 127.0.0.1 and its key; return both paths."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "127.0.0.1")])
    now = dt.datetime.now(dt.timezone.utc)
    cert = (
        x509.CertificateBuilder()
        .subject_name(name)
        .issuer_name(name)
        .public_key(key.public_key())
        .serial_number(x509.random_serial_number())
        .not_valid_before(now - dt.timedelta(hours=1))
        .not_valid_after(now + dt.timedelta(hours=1))
        .add_extension(
            x509.SubjectAlternativeName(
                [x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
            ),
            critical=False,
        )
        .sign(key, hashes.SHA256())
    )
    cert_path, key_path = directory / "cert.pem", directory / "key.pem"
    cert_path.write_bytes(cert.public_bytes(serialization.Encoding.PEM))
    key_path.write_bytes(
        key.private_bytes(
            serialization.Encoding.PEM,
            serialization.PrivateFormat.PKCS8,
            serialization.NoEncryption(),
        )
    )
    return cert_path, key_path


@pytest.fixture(name="tls_pair")
def _tls_pair(tmp_path):
    """Return (client, server end) of a TLS connection on 127.0.0.1."""
    cert, key = _self_signed(tmp_path)
    server_context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_context.load_cert_chain(cert, key)
    client_context = ssl.create_default_context(cafile=str(cert))
    listener = socket.create_server(("127.0.0.1", 0))
    accepted = []

    def accept():
        sock, _ = listener.accept()
        sock.settimeout(5)
        accepted.append(server_context.wrap_socket(sock, server_side=True))

    acceptor = threading.Thread(target=accept, daemon=True)
    acceptor.start()
    raw = socket.create_connection(listener.getsockname(), timeout=5)
    client = client_context.wrap_socket(raw, server_hostname="127.0.0.1")
    acceptor.join(5)
    [server] = accepted
    yield client, server
    for sock in (client, server, listener):
        sock.close()
