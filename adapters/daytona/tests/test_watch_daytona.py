"""poolkeeper.watch on the incident's loop, against the Daytona emulator."""

from __future__ import annotations

import warnings

import daytona
import poolkeeper
import pytest
from daytona_test_helpers import settle

from poolkeeper_daytona import close_daytona, daytona_client
from poolkeeper_daytona.testing import DaytonaEmulator

_CREATES = 6
_MAX_ATTEMPTS = 6


def _create_loop(make, kept: list[object]) -> None:
    """Create sandboxes, retrying each failed attempt with make()."""
    for _ in range(_CREATES):
        for _attempt in range(_MAX_ATTEMPTS):
            client = make()
            # As in the incident, something keeps each client alive.
            kept.append(client)
            try:
                client.create()
                break
            except daytona.DaytonaError:
                continue


@pytest.fixture(autouse=True)
def _unwatch():
    """Leave daytona.Daytona unpatched for the next test."""
    yield
    poolkeeper.unwatch()


class TestWatchIncident:
    """The watchdog flags a client per attempt and not the singleton."""

    @pytest.mark.timeout(120)
    def test_client_per_attempt_warns(self):
        """A new client per attempt warns at the line that builds it."""
        kept: list[object] = []
        with DaytonaEmulator(failure_rate=0.3, seed=11) as emu:
            config = daytona.DaytonaConfig(
                api_key="naive", api_url=emu.api_url, target="us"
            )

            def make() -> daytona.Daytona:
                return daytona.Daytona(config)

            site = f"{__file__}:{make.__code__.co_firstlineno + 1}"
            poolkeeper.watch("daytona:Daytona", limit=3)
            try:
                with pytest.warns(poolkeeper.PoolLeakWarning) as record:
                    _create_loop(make, kept)
            finally:
                poolkeeper.unwatch()
                for client in kept:
                    close_daytona(client)
        warning = record[0].message
        assert isinstance(warning, poolkeeper.PoolLeakWarning)
        assert 4 == warning.count
        assert ((site, 4),) == warning.sites
        assert site == f"{record[0].filename}:{record[0].lineno}"
        assert [4, 8, 16][: len(record)] == [w.message.count for w in record]
        settle()

    @pytest.mark.timeout(120)
    def test_singleton_is_quiet(self, sdk_env):
        """The same loop through daytona_client() stays at one client."""
        kept: list[object] = []
        builds_before = daytona_client.statistics().builds
        with DaytonaEmulator(failure_rate=0.3, seed=11) as emu:
            sdk_env.setenv("DAYTONA_API_URL", emu.api_url)
            sdk_env.setenv("DAYTONA_API_KEY", "pooled")
            poolkeeper.watch("daytona:Daytona", limit=3)
            try:
                with warnings.catch_warnings():
                    warnings.simplefilter("error", poolkeeper.PoolLeakWarning)
                    _create_loop(daytona_client, kept)
            finally:
                poolkeeper.unwatch()
                kept.clear()
                daytona_client.reset()
            attempts = len(emu.requests("pooled", method="POST"))
        assert attempts > _CREATES
        # Counters are per process: earlier tests built clients too.
        assert builds_before + 1 == daytona_client.statistics().builds
