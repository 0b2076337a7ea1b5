"""Fixtures: the emulator, an isolated SDK environment, resource probes."""

from __future__ import annotations

import gc
import threading
import warnings

import daytona
import poolkeeper
import pytest
from daytona_test_helpers import UNCLOSED_TLS_SOCKET, fd_count, quiet, settle
from poolkeeper import _filekeys

from poolkeeper_daytona import close_daytona
from poolkeeper_daytona._client import _ENV_VARS, _file_keys
from poolkeeper_daytona.testing import DaytonaEmulator, daytona_emulator

__all__ = ["daytona_emulator"]

# A user's project, run by test_recipe.py in a subprocess of its own: its
# conftest hides the SDK, which must never happen in this process.
collect_ignore = ["recipe_project", "sdk_optional_project"]

# How often the checker looks at the key and dotenv files in the tests.
RECHECK = 0.05

# Exactly the variables the adapter keys on.
_SDK_VARS = _ENV_VARS


@pytest.fixture(scope="session", autouse=True)
def _warm_sdk():
    """Build, use and close one client so one-time imports are not leaks."""
    with DaytonaEmulator() as emu:
        client = daytona.Daytona(
            daytona.DaytonaConfig(api_key="warm", api_url=emu.api_url)
        )
        client.delete(client.create())
        close_daytona(client)
    gc.collect()


@pytest.fixture(name="dropped_tls_websockets", scope="module")
def _dropped_tls_websockets():
    """At a module's end, collect the TLS sockets the SDK dropped unclosed.

    See ``daytona_test_helpers.DROPPED_TLS_WEBSOCKETS``.
    """
    yield
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", UNCLOSED_TLS_SOCKET, ResourceWarning)
        settle()


@pytest.fixture(name="sdk_env")
def _sdk_env(monkeypatch, tmp_path, daytona_emulator):
    """Point every DAYTONA_* variable at the emulator, nothing else."""
    for name in _SDK_VARS:
        monkeypatch.delenv(name, raising=False)
    # No .env / .env.local from the real working directory.
    monkeypatch.chdir(tmp_path)
    monkeypatch.setenv("DAYTONA_API_KEY_FILE", str(tmp_path / "api_key"))
    monkeypatch.setenv("DAYTONA_API_URL", daytona_emulator.api_url)
    monkeypatch.setenv("DAYTONA_TARGET", "us")
    # The checker looks at the files often: a test waits for it.
    for key in _file_keys:
        monkeypatch.setattr(key, "recheck_seconds", RECHECK)
    yield monkeypatch
    # Close every singleton's client while the emulator still runs.
    poolkeeper.close_all()


@pytest.fixture(name="make_client")
def _make_client(daytona_emulator):
    """Build real clients against the emulator; close them all at the end."""
    built: list[daytona.Daytona] = []

    def make(api_key: str = "test-key", **config) -> daytona.Daytona:
        client = daytona.Daytona(
            daytona.DaytonaConfig(
                api_key=api_key,
                api_url=daytona_emulator.api_url,
                target="us",
                **config,
            )
        )
        built.append(client)
        return client

    yield make
    for client in built:
        close_daytona(client)


@pytest.fixture(name="baseline")
def _baseline(daytona_emulator):
    """Return (fds, threads) with the emulator running and nothing else.

    Nothing else but the file-key thread: the adapter's singletons watch
    their key files from the first build on, for the process's life.
    """
    del daytona_emulator
    _filekeys.ensure()
    quiet()
    return fd_count(), threading.active_count()
