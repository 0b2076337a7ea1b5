"""The CPU CI job's tests: they run whether or not daytona is installed."""

from __future__ import annotations

import sys
import types

import pytest
from tb2_sandbox_daytona import (
    create_sandbox,
    daytona_client,
    eval_daytona,
    run_episode,
)

from poolkeeper_daytona import DaytonaCredentialsError


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


def _dotenv_installed() -> bool:
    try:
        import dotenv  # noqa: F401
    except ImportError:
        return False
    return True


class StandInDaytona:
    """The stand-in SDK's client: remembers the config it was given."""

    def __init__(self, config=None):
        self.config = config


class StandInConfig:
    """The stand-in SDK's DaytonaConfig: remembers its fields."""

    def __init__(self, **fields):
        self.fields = fields


@pytest.fixture(name="stand_in")
def _stand_in(monkeypatch, tmp_path):
    """A stand-in daytona module in sys.modules, and no credentials."""
    module = types.ModuleType("daytona")
    module.Daytona = StandInDaytona
    module.DaytonaConfig = StandInConfig
    monkeypatch.setitem(sys.modules, "daytona", module)
    monkeypatch.chdir(tmp_path)
    monkeypatch.delenv("DAYTONA_API_KEY", raising=False)
    monkeypatch.delenv("DAYTONA_JWT_TOKEN", raising=False)
    monkeypatch.setenv("DAYTONA_API_KEY_FILE", str(tmp_path / "api_key"))
    return module


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
        with pytest.raises(
            ModuleNotFoundError, match=r"daytona.*pip install.*override\(\)"
        ):
            singleton()


class TestAStandInSdk:
    """A daytona module a test put in sys.modules is built from."""

    def test_both_singletons_build_from_it(self, stand_in, monkeypatch):
        """daytona_client() calls its Daytona(); the eval one its config."""
        monkeypatch.setenv("DAYTONA_API_KEY", "train-key")
        monkeypatch.setenv("EVAL_DAYTONA_API_KEY", "eval-key")

        client = daytona_client()
        other = eval_daytona()

        assert StandInDaytona is type(client)
        assert client.config is None
        assert {"api_key": "eval-key", "api_url": ""} == other.config.fields

    def test_the_key_file_goes_through_its_config(self, stand_in, tmp_path):
        """Without a variable, the key file's key is in its DaytonaConfig."""
        (tmp_path / "api_key").write_text("file-key\n")

        assert {"api_key": "file-key"} == daytona_client().config.fields

    def test_no_credentials_says_to_override(self, stand_in):
        """Nothing set: the adapter's error names override() for tests."""
        with pytest.raises(DaytonaCredentialsError, match=r"override\(\)"):
            daytona_client()

    def test_a_module_without_daytona_says_to_override(
        self, stand_in, monkeypatch
    ):
        """A stand-in lacking what the build takes: an error, not a guess."""
        monkeypatch.setenv("DAYTONA_API_KEY", "train-key")
        monkeypatch.delattr(stand_in, "Daytona")

        with pytest.raises(
            ImportError,
            match=r"daytona\.Daytona.*not the Daytona SDK.*"
            r"override\(\)",
        ):
            daytona_client()

    def test_dotenv_files_count_where_the_sdk_could_read_them(
        self, stand_in, tmp_path
    ):
        """The SDK reads .env with python-dotenv; without it, nobody does."""
        (tmp_path / ".env").write_text("DAYTONA_API_KEY=dotenv-key\n")

        if _dotenv_installed():
            assert daytona_client().config is None  # As daytona.Daytona().
        else:
            with pytest.raises(DaytonaCredentialsError):
                daytona_client()
