"""is_transport_failure against what the real SDK raises from the emulator.

Every exception here comes from a real ``daytona.Daytona`` or
``daytona.AsyncDaytona`` talking TLS to the emulator, which breaks the
connection the way the incident's API edge did (or answers with an error).
Each case also pins the chain the SDK builds, so a new SDK release that
wraps differently shows up here first.
"""

from __future__ import annotations

import asyncio
import http.client
import ssl

import aiohttp
import daytona
import pytest
import urllib3
from daytona_test_helpers import DROPPED_TLS_WEBSOCKETS

from poolkeeper_daytona import close_daytona, is_transport_failure
from poolkeeper_daytona.testing import DaytonaEmulator

# It breaks TLS connections on purpose.
pytestmark = DROPPED_TLS_WEBSOCKETS


def _chain(exc: BaseException) -> list[BaseException]:
    """The exception, then what it was raised from (MaxRetryError.reason)."""
    links: list[BaseException] = []
    current: BaseException | None = exc
    while current is not None and len(links) < 16:
        links.append(current)
        reason = getattr(current, "reason", None)
        current = (
            reason
            if isinstance(reason, BaseException)
            else current.__cause__ or current.__context__
        )
    return links


def _types(exc: BaseException) -> list[type[BaseException]]:
    return [type(link) for link in _chain(exc)]


@pytest.fixture(name="tls_emu")
def _tls_emu(monkeypatch):
    """A TLS emulator the SDK trusts through SSL_CERT_FILE."""
    with DaytonaEmulator(tls=True) as emu:
        for name, value in emu.trust_env().items():
            monkeypatch.setenv(name, value)
        yield emu


@pytest.fixture(name="sync_client")
def _sync_client(tls_emu):
    """A sync client of the TLS emulator, closed after the test."""
    client = daytona.Daytona(
        daytona.DaytonaConfig(api_key="sync-key", api_url=tls_emu.api_url)
    )
    yield client
    close_daytona(client)


def _raised(call) -> BaseException:
    with pytest.raises(daytona.DaytonaError) as info:
        call()
    return info.value


def _araised(make_call) -> BaseException:
    """Run make_call(client) on a new AsyncDaytona in a fresh loop."""

    async def run() -> BaseException:
        client = daytona.AsyncDaytona(
            daytona.DaytonaConfig(api_key="async-key", api_url=API_URL[0])
        )
        try:
            with pytest.raises(daytona.DaytonaError) as info:
                await make_call(client)
            return info.value
        finally:
            await client.close()

    return asyncio.run(run())


API_URL: list[str] = [""]


@pytest.fixture(name="async_url", autouse=True)
def _async_url(request):
    """Tell _araised the URL of this test's emulator, if it has one."""
    if "tls_emu" in request.fixturenames:
        API_URL[0] = request.getfixturevalue("tls_emu").api_url
    yield
    API_URL[0] = ""


class TestSyncTransportFailures:
    """Broken connections under the sync client are transport failures."""

    def test_dropped_handshake_is_the_incidents_ssl_eof(
        self, tls_emu, sync_client
    ):
        """A handshake cut short: MaxRetryError caused by SSLEOFError."""
        sandbox = sync_client.create()
        tls_emu.drop_connections("sync-key")
        tls_emu.faults.handshake_eof_rate = 1.0

        exc = _raised(lambda: sync_client.get(sandbox.id))

        types = _types(exc)
        assert daytona.DaytonaError is types[0]
        assert urllib3.exceptions.MaxRetryError in types
        assert urllib3.exceptions.SSLError in types
        assert ssl.SSLEOFError in types, types
        assert "EOF occurred in violation of protocol" in str(exc)
        assert is_transport_failure(exc)

    def test_dropped_handshake_on_create(self, tls_emu, sync_client):
        """A create whose handshakes all fail is retried, then fails."""
        tls_emu.faults.handshake_eof_rate = 1.0

        exc = _raised(sync_client.create)

        assert ssl.SSLEOFError in _types(exc), _types(exc)
        assert 0 == len(tls_emu.requests(method="POST"))
        assert is_transport_failure(exc)

    def test_response_cut_mid_body(self, tls_emu, sync_client):
        """EOF without close_notify mid-response: a short read."""
        tls_emu.break_requests("eof", method="POST")

        exc = _raised(sync_client.create)

        types = _types(exc)
        assert daytona.DaytonaConnectionError is types[0]
        assert urllib3.exceptions.ProtocolError in types
        assert http.client.IncompleteRead in types
        # The API did the work before the response was cut.
        assert ["eof"] == [r.broken for r in tls_emu.requests(method="POST")]
        assert 1 == len(tls_emu.sandbox_states())
        assert is_transport_failure(exc)

    def test_connection_reset(self, tls_emu, sync_client):
        """A reset before the answer: the connection was aborted."""
        tls_emu.break_requests("reset", method="POST")

        exc = _raised(sync_client.create)

        types = _types(exc)
        assert daytona.DaytonaConnectionError is types[0]
        assert urllib3.exceptions.ProtocolError in types
        assert "Connection aborted" in str(exc)
        assert {} == tls_emu.sandbox_states()
        assert is_transport_failure(exc)

    def test_resets_on_every_retry_of_a_get(self, tls_emu, sync_client):
        """urllib3 retries a GET, then gives up with MaxRetryError."""
        sandbox = sync_client.create()
        tls_emu.faults.reset_rate = 1.0

        exc = _raised(lambda: sync_client.get(sandbox.id))

        assert urllib3.exceptions.MaxRetryError in _types(exc)
        broken = [r.broken for r in tls_emu.requests(method="GET")]
        # The first try and urllib3's three retries.
        assert ["reset"] * 4 == [b for b in broken if b is not None]
        assert is_transport_failure(exc)

    def test_refused_during_an_outage(self, tls_emu, sync_client):
        """Connections refused while the API is away."""
        sandbox = sync_client.create()

        with tls_emu.outage():
            exc = _raised(lambda: sync_client.get(sandbox.id))

        types = _types(exc)
        assert urllib3.exceptions.NewConnectionError in types
        assert ConnectionRefusedError in types
        assert is_transport_failure(exc)
        after = sync_client.get(sandbox.id)
        assert daytona.SandboxState.STARTED == after.state


# CPython 3.10's asyncio (the sslproto that 3.11 rewrote) leaves a TLS
# transport unmarked as closed when the peer cuts the stream under a
# response, and warns at its collection, after aiohttp and the SDK closed
# everything they own. A warning about that interpreter, not the adapter.
_LEGACY_SSLPROTO_WARNING = pytest.mark.filterwarnings(
    "ignore:Exception ignored in. <function _SSLProtocolTransport.__del__"
    ":pytest.PytestUnraisableExceptionWarning"
)


class TestAsyncTransportFailures:
    """Broken connections under AsyncDaytona are transport failures."""

    def test_dropped_handshake(self, tls_emu):
        """asyncio reports a cut handshake as a reset, via aiohttp."""

        async def call(client):
            tls_emu.faults.handshake_eof_rate = 1.0
            await client.get("any")

        exc = _araised(call)

        types = _types(exc)
        assert daytona.DaytonaConnectionError is types[0]
        assert aiohttp.ClientConnectorError in types
        assert ConnectionResetError in types
        assert is_transport_failure(exc)

    @_LEGACY_SSLPROTO_WARNING
    def test_response_cut_mid_body(self, tls_emu):
        """EOF without close_notify mid-response: a short payload."""
        tls_emu.break_requests("eof", method="POST")

        exc = _araised(lambda client: client.create())

        types = _types(exc)
        assert daytona.DaytonaConnectionError is types[0]
        assert aiohttp.ClientPayloadError in types
        assert is_transport_failure(exc)

    @_LEGACY_SSLPROTO_WARNING
    def test_connection_reset(self, tls_emu):
        """A reset before the answer of a create (not retried: a POST)."""
        tls_emu.break_requests("reset", method="POST")

        exc = _araised(lambda client: client.create())

        types = _types(exc)
        assert aiohttp.ClientOSError in types
        assert ConnectionResetError in types
        assert is_transport_failure(exc)

    def test_refused_during_an_outage(self, tls_emu):
        """Connections refused while the API is away."""

        async def call(client):
            with tls_emu.outage():
                await client.get("any")

        exc = _araised(call)

        types = _types(exc)
        assert aiohttp.ClientConnectorError in types
        assert ConnectionRefusedError in types
        assert is_transport_failure(exc)


class TestAnswersAreNotTransportFailures:
    """Errors the API answered with never count, sync or async."""

    @pytest.mark.parametrize(
        ("faults", "status"),
        [({"rate_limit_rate": 1.0}, 429), ({"failure_rate": 1.0}, 503)],
    )
    def test_create_answered_with_an_error(
        self, tls_emu, sync_client, faults, status
    ):
        """429 and 503 carry a status: not transport failures."""
        for name, value in faults.items():
            setattr(tls_emu.faults, name, value)

        sync_exc = _raised(sync_client.create)
        async_exc = _araised(lambda client: client.create())

        assert status == sync_exc.status_code
        assert status == async_exc.status_code
        assert not is_transport_failure(sync_exc)
        assert not is_transport_failure(async_exc)

    def test_not_found(self, tls_emu, sync_client):
        """A 404 is an answer."""
        sync_exc = _raised(lambda: sync_client.get("missing"))
        async_exc = _araised(lambda client: client.get("missing"))

        assert isinstance(sync_exc, daytona.DaytonaNotFoundError)
        assert isinstance(async_exc, daytona.DaytonaNotFoundError)
        assert not is_transport_failure(sync_exc)
        assert not is_transport_failure(async_exc)

    def test_unauthorized(self, monkeypatch):
        """A 401 is an answer."""
        with DaytonaEmulator(tls=True, api_keys={"good"}) as emu:
            for name, value in emu.trust_env().items():
                monkeypatch.setenv(name, value)
            client = daytona.Daytona(
                daytona.DaytonaConfig(api_key="bad", api_url=emu.api_url)
            )
            try:
                exc = _raised(client.create)
            finally:
                close_daytona(client)

        assert 401 == exc.status_code
        assert not is_transport_failure(exc)

    def test_timeout_is_not_a_transport_failure(self, tls_emu, sync_client):
        """A create answered past the client's timeout: slow, not broken."""
        tls_emu.faults.slow_rate = 1.0
        tls_emu.faults.slow_seconds = 2.0

        with pytest.raises(daytona.DaytonaTimeoutError) as info:
            sync_client.create(timeout=0.3)

        assert not is_transport_failure(info.value)


class TestChains:
    """The walk itself, on chains built by hand."""

    def test_plain_errors_are_not_transport_failures(self):
        """Nothing in the chain names a connection."""
        assert not is_transport_failure(ValueError("x"))
        assert not is_transport_failure(KeyboardInterrupt())

    def test_an_ssl_error_under_a_cycle_is_found_once(self):
        """A cyclic chain ends; the SSL error inside it counts."""
        outer = RuntimeError("outer")
        inner = ssl.SSLEOFError(8, "EOF occurred in violation of protocol")
        outer.__context__ = inner
        inner.__context__ = outer

        assert is_transport_failure(outer)

    def test_connection_timeout_is_not_a_transport_failure(self):
        """The SDK's connection timeout is a timeout first."""
        exc = daytona.DaytonaConnectionTimeoutError("timed out")

        assert not is_transport_failure(exc)
