"""The SDK job's tests: real clients against the Daytona emulator."""

from __future__ import annotations

import pytest

pytest.importorskip("daytona")

from tb2_sandbox_daytona import (
    daytona_client,
    eval_daytona,
    run_episode,
)

from poolkeeper_daytona.testing import DaytonaEmulator


@pytest.fixture(name="emulator")
def _emulator(monkeypatch, tmp_path):
    monkeypatch.chdir(tmp_path)  # no .env or .env.local from the real cwd
    monkeypatch.setenv("DAYTONA_API_KEY_FILE", str(tmp_path / "api_key"))
    with DaytonaEmulator() as emu:
        monkeypatch.setenv("DAYTONA_API_KEY", "train-key")
        monkeypatch.setenv("DAYTONA_API_URL", emu.api_url)
        monkeypatch.setenv("EVAL_DAYTONA_API_KEY", "eval-key")
        monkeypatch.setenv("EVAL_DAYTONA_API_URL", emu.api_url)
        yield emu
        import poolkeeper

        poolkeeper.close_all()  # while the emulator still runs


def test_episodes_share_one_client(emulator):
    """Five episodes build one client and open one event websocket."""
    before = daytona_client.statistics().builds
    for _ in range(5):
        run_episode("ls")

    assert 1 == daytona_client.statistics().builds - before
    assert 1 == len(emulator.socketio_sessions("train-key"))


def test_the_eval_account_is_its_own_client(emulator):
    """The module-level make_daytona_singleton builds from its mapping."""
    eval_daytona().delete(eval_daytona().create())

    assert eval_daytona() is not daytona_client()
    assert emulator.requests("eval-key")


def test_close_all_leaves_no_connection(emulator):
    """After close_all() the emulator sees no connection of either key."""
    run_episode("ls")
    eval_daytona().create()
    import poolkeeper

    poolkeeper.close_all()

    assert emulator.wait_until(
        lambda: (
            not emulator.open_connections("train-key")
            and not emulator.open_connections("eval-key")
        )
    )
