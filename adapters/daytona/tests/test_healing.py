"""The adapter's default retire_on, against the real SDK over TLS.

The emulator serves HTTPS on 127.0.0.1 with a certificate authority the
SDK trusts, and breaks connections the way the incident's API edge did
(TLS handshakes cut short: the incident's ``SSLEOFError``; responses cut
mid-body; resets). A broken connection retires the singleton's client;
an answer of the API never does. Under a storm of broken connections the
healing builds stay within poolkeeper's backoff and the process's file
descriptors stay flat, where a client per attempt grows them.
"""

from __future__ import annotations

import asyncio
import ssl
import time

import daytona
import poolkeeper
import pytest
from daytona_test_helpers import DROPPED_TLS_WEBSOCKETS
from poolkeeper import _lifecycle

from poolkeeper_daytona import (
    async_daytona_client,
    daytona_client,
    is_transport_failure,
    make_daytona_singleton,
)
from poolkeeper_daytona.testing import DaytonaEmulator

# It breaks TLS connections on purpose.
pytestmark = DROPPED_TLS_WEBSOCKETS


def _chain(exc: BaseException) -> list[type[BaseException]]:
    types: list[type[BaseException]] = []
    current: BaseException | None = exc
    while current is not None and len(types) < 16:
        types.append(type(current))
        reason = getattr(current, "reason", None)
        current = (
            reason
            if isinstance(reason, BaseException)
            else current.__cause__ or current.__context__
        )
    return types


def _retired(single, reason: str) -> int:
    return single.statistics().retirements.get(reason, 0)


def _healed(single) -> int:
    """Healing retirements so far (counters live as long as the process)."""
    stats = single.statistics().retirements
    return stats["retire_on"] + stats["retire"]


@pytest.fixture(name="tls_emu")
def _tls_emu(sdk_env):
    """A TLS emulator that the env points daytona_client at.

    The healing backoff is made short: a module-level singleton keeps its
    spacing from one test to the next (a close_all() does not reset it).
    """
    sdk_env.setattr(_lifecycle, "BACKOFF_FIRST", 0.05)
    sdk_env.setattr(_lifecycle, "BACKOFF_CAP", 0.2)
    time.sleep(0.2)  # Any spacing left by an earlier test has passed.
    with DaytonaEmulator(tls=True, seed=7) as emu:
        for name, value in emu.trust_env().items():
            sdk_env.setenv(name, value)
        sdk_env.setenv("DAYTONA_API_URL", emu.api_url)
        sdk_env.setenv("DAYTONA_API_KEY", "healing")
        yield emu
        # Close the clients while the emulator still answers.
        poolkeeper.close_all()


class TestDefaultRetireOn:
    """daytona_client retires on a broken connection, never on an answer."""

    def test_the_incidents_ssl_eof_retires_the_client(self, tls_emu):
        """A cut handshake under a lease: retired, then a new client."""
        first = daytona_client()
        healed = _healed(daytona_client)
        sandbox = first.create()
        time.sleep(0.3)  # Older than the (short) spacing: retired at once.
        tls_emu.drop_connections("healing")
        tls_emu.faults.handshake_eof_rate = 1.0

        with pytest.raises(daytona.DaytonaError) as info:  # noqa: SIM117
            with daytona_client.lease() as client:
                client.get(sandbox.id)
        tls_emu.faults.handshake_eof_rate = 0.0

        assert ssl.SSLEOFError in _chain(info.value)
        assert "EOF occurred in violation of protocol" in str(info.value)
        second = daytona_client()
        assert second is not first
        assert sandbox.id == second.get(sandbox.id).id
        assert healed + 1 == _healed(daytona_client)

    def test_a_response_cut_through_the_proxy_retires_the_client(
        self, tls_emu
    ):
        """A create whose answer is cut mid-body, called via proxy()."""
        client = daytona_client.proxy()
        first = daytona_client()
        healed = _healed(daytona_client)
        time.sleep(0.3)  # Older than the (short) spacing: retired at once.
        tls_emu.break_requests("eof", method="POST")

        with pytest.raises(daytona.DaytonaConnectionError):
            client.create()

        assert daytona_client() is not first
        assert healed + 1 == _healed(daytona_client)
        assert daytona.SandboxState.STARTED == client.create().state

    @pytest.mark.parametrize(
        ("fault", "error"),
        [
            ("rate_limit_rate", daytona.DaytonaRateLimitError),
            ("failure_rate", daytona.DaytonaError),
        ],
    )
    def test_answers_of_the_api_retire_nothing(self, tls_emu, fault, error):
        """429, 503 and 404 keep the client: the connection is fine."""
        first = daytona_client()
        healed = _healed(daytona_client)
        setattr(tls_emu.faults, fault, 1.0)

        with pytest.raises(error) as info:  # noqa: SIM117
            with daytona_client.lease() as client:
                client.create()
        with pytest.raises(daytona.DaytonaNotFoundError):  # noqa: SIM117
            with daytona_client.lease() as client:
                client.get("no-such-sandbox")

        assert not is_transport_failure(info.value)
        assert daytona_client() is first
        assert healed == _healed(daytona_client)

    def test_an_async_lease_retires_on_a_refused_connection(self, tls_emu):
        """async_daytona_client: an outage under `async with` retires."""

        async def main() -> tuple[object, object, BaseException]:
            first = await async_daytona_client()
            await asyncio.sleep(0.3)  # Older than the short spacing.
            with tls_emu.outage(), pytest.raises(daytona.DaytonaError) as info:
                async with async_daytona_client.lease() as client:
                    await client.get("any")
            second = await async_daytona_client()
            await second.create()
            return first, second, info.value

        first, second, error = asyncio.run(main())

        assert is_transport_failure(error)
        assert first is not second
        assert _retired(async_daytona_client, "retire_on") >= 1


class TestMakeDaytonaSingleton:
    """The same default for your own config; replaceable, or off."""

    def _config(self, emu: DaytonaEmulator):
        return {"api_key": "made", "api_url": emu.api_url, "target": "us"}

    def test_the_default_retires_on_a_reset(self, tls_emu):
        """make_daytona_singleton retires on a broken connection too."""
        single = make_daytona_singleton(lambda: self._config(tls_emu))
        first = single()
        tls_emu.break_requests("reset", method="POST")

        with pytest.raises(daytona.DaytonaConnectionError):  # noqa: SIM117
            with single.lease() as client:
                client.create()

        assert single() is not first
        assert 1 == _retired(single, "retire_on")

    def test_retire_on_none_turns_it_off(self, tls_emu):
        """retire_on=None: the broken client stays (reset() is yours)."""
        single = make_daytona_singleton(
            lambda: self._config(tls_emu), retire_on=None
        )
        first = single()
        tls_emu.break_requests("reset", method="POST")

        with pytest.raises(daytona.DaytonaConnectionError):  # noqa: SIM117
            with single.lease() as client:
                client.create()

        assert single() is first
        assert 0 == sum(single.statistics().retirements.values())

    def test_your_own_retire_on_replaces_the_default(self, tls_emu):
        """A predicate of yours: here, rate limits retire too."""
        seen: list[BaseException] = []

        def rate_limited(exc: BaseException) -> bool:
            seen.append(exc)
            return isinstance(exc, daytona.DaytonaRateLimitError)

        single = make_daytona_singleton(
            lambda: self._config(tls_emu), retire_on=rate_limited
        )
        first = single()
        tls_emu.faults.rate_limit_rate = 1.0

        with pytest.raises(daytona.DaytonaRateLimitError):  # noqa: SIM117
            with single.lease() as client:
                client.create()

        assert 1 == len(seen)
        assert single() is not first
