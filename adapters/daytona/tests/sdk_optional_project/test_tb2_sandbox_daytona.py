"""The CPU CI job's tests: they run whether or not daytona is installed."""

from __future__ import annotations

import pytest
from tb2_sandbox_daytona import (
    create_sandbox,
    daytona_client,
    eval_daytona,
    run_episode,
)


class FlakyDaytona:
    """A test double: fails its first creates, then answers."""

    def __init__(self, failures: int) -> None:
        self.failures = failures
        self.creates = 0
        self.deleted: list[object] = []

    def create(self):
        self.creates += 1
        if self.creates <= self.failures:
            raise ConnectionError("edge refused")
        return type("Sandbox", (), {"id": f"sb-{self.creates}"})()

    def delete(self, sandbox):
        self.deleted.append(sandbox)


def _sdk_installed() -> bool:
    try:
        import daytona  # noqa: F401
    except ImportError:
        return False
    return True


def test_retries_reuse_one_client():
    """Every retry goes through the same client, never a new one."""
    fake = FlakyDaytona(failures=2)
    with daytona_client.override(fake):
        sandbox = create_sandbox()

    assert "sb-3" == sandbox.id
    assert 3 == fake.creates


def test_gives_up_after_the_last_attempt():
    """The last error is the cause of the final one."""
    fake = FlakyDaytona(failures=10)
    with (
        daytona_client.override(fake),
        pytest.raises(RuntimeError, match="4 attempts") as info,
    ):
        create_sandbox()

    assert isinstance(info.value.__cause__, ConnectionError)


def test_an_episode_deletes_its_sandbox():
    """The sandbox is deleted through the shared client."""
    fake = FlakyDaytona(failures=0)
    with daytona_client.override(fake):
        assert "sb-1: ls" == run_episode("ls")

    assert 1 == len(fake.deleted)


def test_the_singletons_build_nothing_at_import():
    """Importing the module and making its singletons built no client."""
    assert daytona_client.current() is None
    assert eval_daytona.current() is None


def test_without_the_sdk_a_build_names_the_package(monkeypatch):
    """Where daytona is absent, the first build says what to install."""
    if _sdk_installed():
        pytest.skip("the SDK is installed: the SDK job builds real clients")
    monkeypatch.setenv("DAYTONA_API_KEY", "k")

    for singleton in (daytona_client, eval_daytona):
        with pytest.raises(ModuleNotFoundError, match=r"daytona.*pip install"):
            singleton()
