"""The emulator over TLS, and its connection-breaking faults.

The SDK is the real one; the client side of the raw-socket checks is the
standard library's ``socket``/``ssl``.
"""

from __future__ import annotations

import os
import socket
import ssl
import subprocess
import sys

import daytona
import pytest
from daytona_test_helpers import DROPPED_TLS_WEBSOCKETS

from poolkeeper_daytona import close_daytona, is_transport_failure
from poolkeeper_daytona.testing import DaytonaEmulator

# It breaks TLS connections on purpose.
pytestmark = DROPPED_TLS_WEBSOCKETS

_GET = (
    b"GET /api/sandbox HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer k\r\n"
    b"Connection: close\r\n\r\n"
)


def _connect(emu: DaytonaEmulator) -> ssl.SSLSocket:
    """Open a verified TLS connection to *emu* (ragged EOFs reported)."""
    context = ssl.create_default_context(cafile=str(emu.ca_file))
    sock = socket.create_connection(("127.0.0.1", emu.port), timeout=10)
    return context.wrap_socket(
        sock, server_hostname="127.0.0.1", suppress_ragged_eofs=False
    )


def _exchange(
    sock: socket.socket, request: bytes
) -> tuple[bytes, OSError | None]:
    """Send *request*, read to the end; return what came and the error."""
    data = b""
    try:
        sock.sendall(request)
        for _ in range(1000):
            chunk = sock.recv(65536)
            if not chunk:
                break
            data += chunk
    except OSError as exc:  # ssl.SSLError is one.
        return data, exc
    return data, None


def _read_all(sock: ssl.SSLSocket) -> bytes:
    """Read until EOF (bounded by the socket's timeout)."""
    data = b""
    for _ in range(1000):
        chunk = sock.recv(65536)
        if not chunk:
            break
        data += chunk
    return data


@pytest.fixture(name="tls_emu")
def _tls_emu(monkeypatch):
    """A TLS emulator the SDK trusts through SSL_CERT_FILE."""
    with DaytonaEmulator(tls=True) as emu:
        for name, value in emu.trust_env().items():
            monkeypatch.setenv(name, value)
        yield emu


class TestTLS:
    """HTTPS and WSS with a certificate authority made at start."""

    def test_the_sdk_creates_over_https_and_listens_over_wss(self, tls_emu):
        """REST and the Socket.IO channel both run over TLS."""
        client = daytona.Daytona(
            daytona.DaytonaConfig(api_key="tls", api_url=tls_emu.api_url)
        )
        try:
            sandbox = client.create()
        finally:
            close_daytona(client)

        kinds = {c.kind for c in tls_emu.connections("tls")}
        assert tls_emu.api_url.startswith("https://127.0.0.1:")
        assert daytona.SandboxState.STARTED == sandbox.state
        assert {"http", "websocket"} == kinds
        assert 1 == len(tls_emu.socketio_sessions("tls"))

    def test_a_client_that_does_not_trust_the_ca_is_refused(self, monkeypatch):
        """Without SSL_CERT_FILE the certificate does not verify."""
        monkeypatch.delenv("SSL_CERT_FILE", raising=False)
        with DaytonaEmulator(tls=True) as emu:
            client = daytona.Daytona(
                daytona.DaytonaConfig(api_key="untrust", api_url=emu.api_url)
            )
            try:
                with pytest.raises(daytona.DaytonaError) as info:
                    client.get("any")
            finally:
                close_daytona(client)

        assert "CERTIFICATE_VERIFY_FAILED" in str(info.value)
        assert is_transport_failure(info.value)

    # A fresh interpreter imports the whole SDK (about 4 s of CPU): on a
    # loaded machine that took 40 s and more, hence the wide bounds.
    @pytest.mark.timeout(300)
    def test_async_socketio_trusts_the_ca_set_before_aiohttp_loads(
        self, tls_emu
    ):
        """AsyncDaytona's websocket verifies with the CA set at import."""
        code = (
            "import asyncio, sys, daytona\n"
            "async def main():\n"
            "    c = daytona.AsyncDaytona(daytona.DaytonaConfig(\n"
            "        api_key='async-tls', api_url=sys.argv[1]))\n"
            "    await c.create()\n"
            "    await c.close()\n"
            "asyncio.run(main())\n"
        )
        env = dict(os.environ, **tls_emu.trust_env())

        done = subprocess.run(
            [sys.executable, "-c", code, tls_emu.api_url],
            env=env,
            capture_output=True,
            text=True,
            timeout=240,
            check=False,
        )

        assert 0 == done.returncode, done.stderr
        assert 1 == len(tls_emu.socketio_sessions("async-tls"))

    def test_the_certificates_are_removed_at_stop(self):
        """The CA's folder lives as long as the emulator."""
        with DaytonaEmulator(tls=True) as emu:
            ca_file = emu.ca_file
            assert ca_file is not None
            assert ca_file.is_file()
            assert {"SSL_CERT_FILE": str(ca_file)} == emu.trust_env()

        assert not ca_file.parent.exists()

    def test_plain_http_has_no_ca(self):
        """Without tls, nothing to trust."""
        emu = DaytonaEmulator()

        assert emu.ca_file is None
        assert {} == emu.trust_env()
        assert emu.api_url.startswith("http://")


class TestBreaks:
    """Requests and handshakes broken on purpose, seen from a raw socket."""

    def test_eof_sends_half_the_answer_without_close_notify(self, tls_emu):
        """The peer reads a head and half a body, then a ragged EOF."""
        tls_emu.break_requests("eof")

        with _connect(tls_emu) as sock:
            data, error = _exchange(sock, _GET)

        # None would be a clean EOF: a close_notify was sent.
        assert isinstance(error, ssl.SSLEOFError), error

        head, _, body = data.partition(b"\r\n\r\n")
        length = next(
            int(line.split(b":")[1])
            for line in head.split(b"\r\n")
            if line.lower().startswith(b"content-length:")
        )
        assert head.startswith(b"HTTP/1.1 200 ")
        assert length // 2 == len(body)
        assert ["eof"] == [r.broken for r in tls_emu.requests()]

    def test_reset_is_a_tcp_rst(self):
        """Over plain TCP the reset shows as ECONNRESET."""
        with DaytonaEmulator() as emu:
            emu.break_requests("reset")
            with socket.create_connection(("127.0.0.1", emu.port), 10) as s:
                s.sendall(_GET)
                with pytest.raises(ConnectionResetError):
                    _read_all(s)  # type: ignore[arg-type]
            records = emu.requests()

        assert [(0, "reset")] == [(r.status, r.broken) for r in records]

    def test_planned_breaks_match_their_method_and_run_out(self, tls_emu):
        """Two planned POST breaks leave GETs alone and end after two."""
        tls_emu.break_requests("reset", 2, method="POST")
        post = (
            b"POST /api/nothing HTTP/1.1\r\nHost: x\r\nContent-Length: 0\r\n"
            b"Connection: close\r\n\r\n"
        )

        outcomes = []
        for request in (_GET, post, post, post):
            with _connect(tls_emu) as sock:
                sock.sendall(request)
                try:
                    outcomes.append(_read_all(sock).split(b" ")[1])
                except (ssl.SSLError, ConnectionError):
                    outcomes.append(b"broken")

        assert [b"200", b"broken", b"broken", b"401"] == outcomes

    def test_dropped_handshake_is_an_ssl_eof(self, tls_emu):
        """The handshake ends with an EOF in violation of protocol."""
        tls_emu.break_handshakes()

        with pytest.raises(ssl.SSLEOFError):
            _connect(tls_emu)
        with _connect(tls_emu) as sock:  # The next one is served.
            sock.sendall(_GET)
            assert _read_all(sock).startswith(b"HTTP/1.1 200 ")

        assert 1 == tls_emu.dropped_handshakes

    def test_clear_breaks_forgets_what_was_planned(self, tls_emu):
        """Nothing planned is used after clear_breaks()."""
        tls_emu.break_handshakes(3)
        tls_emu.break_requests("eof", 3)

        tls_emu.clear_breaks()
        with _connect(tls_emu) as sock:
            sock.sendall(_GET)
            answer = _read_all(sock)

        assert answer.startswith(b"HTTP/1.1 200 ")
        assert 0 == tls_emu.dropped_handshakes

    def test_outage_refuses_then_serves_on_the_same_port(self, tls_emu):
        """Connections are refused inside outage() and served after it."""
        port = tls_emu.port
        idle = _connect(tls_emu)

        with tls_emu.outage():
            assert tls_emu.in_outage
            with pytest.raises(ConnectionRefusedError):
                socket.create_connection(("127.0.0.1", port), timeout=10)
            # Open connections were reset as the outage began.
            _, error = _exchange(idle, _GET)
        idle.close()

        assert isinstance(error, (ssl.SSLError, ConnectionError)), error
        assert not tls_emu.in_outage
        assert port == tls_emu.port
        with _connect(tls_emu) as sock:
            sock.sendall(_GET)
            assert _read_all(sock).startswith(b"HTTP/1.1 200 ")


class TestValidation:
    """Bad fault options fail with a message saying what is allowed."""

    @pytest.mark.parametrize(
        "option", ["eof_rate", "reset_rate", "handshake_eof_rate"]
    )
    def test_rates_outside_zero_to_one_are_rejected(self, option):
        """Every new rate is validated."""
        with pytest.raises(ValueError, match=option):
            DaytonaEmulator(**{option: -0.1})

    def test_unknown_break_kind(self, tls_emu):
        """Only eof and reset exist."""
        with pytest.raises(ValueError, match="'eof' or 'reset'"):
            tls_emu.break_requests("close")

    def test_handshakes_need_tls(self, daytona_emulator):
        """Plain HTTP has no handshake to break."""
        with pytest.raises(RuntimeError, match="tls=True"):
            daytona_emulator.break_handshakes()

    def test_outage_needs_a_running_emulator(self):
        """An emulator that never started cannot have an outage."""
        with pytest.raises(RuntimeError, match="not running"):
            DaytonaEmulator().begin_outage()
