"""Faults a retry loop meets, injected by the emulator, seen by the SDK.

Each test drives the real ``daytona.Daytona`` against the emulator, so a
user's own retry policy can be exercised the same way.
"""

from __future__ import annotations

import contextlib
import time

import daytona
import pytest

from poolkeeper_daytona import close_daytona
from poolkeeper_daytona.testing import DaytonaEmulator


def _client(emu: DaytonaEmulator, api_key: str) -> daytona.Daytona:
    return daytona.Daytona(
        daytona.DaytonaConfig(api_key=api_key, api_url=emu.api_url)
    )


class TestRateLimit:
    """429 with Retry-After."""

    def test_429_raises_rate_limit_error_with_retry_after(self):
        """A rate-limited create raises DaytonaRateLimitError, header kept."""
        with DaytonaEmulator(rate_limit_rate=1.0, retry_after=2.5) as emu:
            client = _client(emu, "limited")
            try:
                with pytest.raises(daytona.DaytonaRateLimitError) as info:
                    client.create()
            finally:
                close_daytona(client)
            statuses = [r.status for r in emu.requests(method="POST")]

        assert [429] == statuses
        assert 429 == info.value.status_code
        headers = {k.lower(): v for k, v in info.value.headers.items()}
        assert "3" == headers.get("retry-after"), f"headers: {headers}"

    def test_a_retry_after_the_limit_lifts_succeeds(self):
        """Waiting Retry-After and retrying reaches a started sandbox."""
        with DaytonaEmulator(rate_limit_rate=1.0, retry_after=0.0) as emu:
            client = _client(emu, "retry")
            try:
                with pytest.raises(daytona.DaytonaRateLimitError):
                    client.create()
                emu.faults.rate_limit_rate = 0.0

                sandbox = client.create()
            finally:
                close_daytona(client)
            statuses = [r.status for r in emu.requests(method="POST")]

        assert daytona.SandboxState.STARTED == sandbox.state
        assert [429, 200] == statuses

    def test_rate_is_seeded_and_independent_of_failures(self):
        """With a seed, 429s and 503s both appear, the same every time."""

        def statuses(seed: int) -> list[int]:
            with DaytonaEmulator(
                failure_rate=0.3, rate_limit_rate=0.4, seed=seed
            ) as emu:
                client = _client(emu, "mixed")
                try:
                    for _ in range(12):
                        with contextlib.suppress(daytona.DaytonaError):
                            client.create()
                finally:
                    close_daytona(client)
                return [r.status for r in emu.requests(method="POST")]

        first = statuses(11)

        assert first == statuses(11)
        assert {200, 429, 503} == set(first), f"statuses: {first}"


class TestSlowResponses:
    """A create answered after the client's timeout."""

    def test_create_times_out_and_leaves_the_sandbox_behind(self):
        """The SDK gives up at its timeout; the API created it anyway."""
        with DaytonaEmulator(slow_rate=1.0, slow_seconds=3.0) as emu:
            client = _client(emu, "slow")
            labels = {"attempt": "1"}
            params = daytona.CreateSandboxFromSnapshotParams(labels=labels)
            try:
                start = time.monotonic()
                with pytest.raises(daytona.DaytonaTimeoutError):
                    client.create(params, timeout=0.5)
                elapsed = time.monotonic() - start
                states = emu.sandbox_states()
                # What a careful retry does first: look for the orphan.
                emu.faults.slow_rate = 0.0
                found = client.list(daytona.ListSandboxesQuery(labels=labels))
                found_ids = [s.id for s in found]
            finally:
                close_daytona(client)

        assert elapsed < 3.0, f"create returned after {elapsed:.2f} s"
        assert 1 == len(states), f"sandboxes on the server: {states}"
        assert list(states) == found_ids

    def test_the_client_works_after_a_timed_out_create(self):
        """The timed-out request's connection does not break the client."""
        with DaytonaEmulator(slow_rate=1.0, slow_seconds=2.0) as emu:
            client = _client(emu, "after-slow")
            try:
                with pytest.raises(daytona.DaytonaTimeoutError):
                    client.create(timeout=0.3)
                emu.faults.slow_rate = 0.0

                sandbox = client.create()
            finally:
                close_daytona(client)

        assert daytona.SandboxState.STARTED == sandbox.state


class TestDroppedConnections:
    """Connections the edge drops under a live client."""

    def test_pooled_connection_dropped_between_calls(
        self, make_client, daytona_emulator
    ):
        """After its pooled connection drops, the next create still works."""
        client = make_client(api_key="dropped")
        client.create()

        daytona_emulator.drop_connections("dropped")
        sandbox = client.create()

        http = [
            c
            for c in daytona_emulator.connections("dropped")
            if c.kind == "http"
        ]
        assert daytona.SandboxState.STARTED == sandbox.state
        assert 2 <= len(http), f"HTTP connections seen: {http}"
        # The websocket comes back on python-socketio's own schedule (a
        # 1 to 30 s backoff): test_emulator.py checks that separately.


class TestValidation:
    """Fault knobs are checked when the emulator is made."""

    @pytest.mark.parametrize(
        "option", ["rate_limit_rate", "slow_rate", "failure_rate"]
    )
    def test_rates_outside_zero_to_one_are_rejected(self, option):
        """Every rate is validated."""
        with pytest.raises(ValueError, match=option):
            DaytonaEmulator(**{option: 1.5})
