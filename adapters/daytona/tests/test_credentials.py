"""daytona_client() resolves settings exactly as daytona.Daytona() does.

Each case writes the process environment, ``.env.local`` and ``.env``,
builds one client with the SDK's own constructor and one through
``daytona_client()``, and compares what each resolved. The SDK's rules
differ between releases (before 0.226 the API URL was read from dotenv
files too), and the comparison holds on every release the CI runs.
"""

from __future__ import annotations

import warnings

import daytona
import pytest
from daytona_test_helpers import wait_for

from poolkeeper_daytona import (
    DaytonaCredentialsError,
    close_daytona,
    daytona_client,
)

_FILES = (".env", ".env.local")

# Each case: {"env": {...}, ".env": {...}, ".env.local": {...}}; a value
# of None deletes the variable from the process environment.
CASES = {
    "env key": {"env": {"DAYTONA_API_KEY": "env"}},
    "dotenv key": {".env": {"DAYTONA_API_KEY": "dot"}},
    "env.local wins over env": {
        ".env": {"DAYTONA_API_KEY": "dot"},
        ".env.local": {"DAYTONA_API_KEY": "local"},
    },
    "process env wins over files": {
        "env": {"DAYTONA_API_KEY": "env"},
        ".env.local": {"DAYTONA_API_KEY": "local"},
    },
    "jwt and organization from files": {
        ".env": {"DAYTONA_JWT_TOKEN": "jwt"},
        ".env.local": {"DAYTONA_ORGANIZATION_ID": "org"},
    },
    "key beats jwt": {
        "env": {"DAYTONA_API_KEY": "env"},
        ".env": {"DAYTONA_JWT_TOKEN": "jwt", "DAYTONA_ORGANIZATION_ID": "o"},
    },
    "target from env.local": {
        "env": {"DAYTONA_API_KEY": "k", "DAYTONA_TARGET": None},
        ".env.local": {"DAYTONA_TARGET": "eu"},
        ".env": {"DAYTONA_TARGET": "us"},
    },
    "empty env.local value still wins": {
        "env": {"DAYTONA_TARGET": None},
        ".env.local": {"DAYTONA_API_KEY": "k", "DAYTONA_TARGET": ""},
        ".env": {"DAYTONA_TARGET": "us"},
    },
    # A refused loopback port: the URL must never be one off this host.
    "api url in a dotenv file": {
        "env": {"DAYTONA_API_KEY": "k"},
        ".env": {"DAYTONA_API_URL": "http://127.0.0.1:9/api"},
    },
}

# Each case, and the error daytona_client() raises for it.
FAILING = {
    "empty env key hides the file's": (
        {
            "env": {"DAYTONA_API_KEY": ""},
            ".env": {"DAYTONA_API_KEY": "dot"},
        },
        DaytonaCredentialsError,
    ),
    "jwt without organization": (
        {"env": {"DAYTONA_JWT_TOKEN": "jwt"}},
        daytona.DaytonaAuthenticationError,
    ),
}


def _apply(case, sdk_env, tmp_path, api_url):
    for name, value in case.get("env", {}).items():
        if value is None:
            sdk_env.delenv(name, raising=False)
        else:
            sdk_env.setenv(name, value)
    for file_name in _FILES:
        lines = [
            f"{name}={value.replace('EMULATOR', api_url)}"
            for name, value in case.get(file_name, {}).items()
        ]
        if lines:
            (tmp_path / file_name).write_text("\n".join(lines) + "\n")


def _resolved(client):
    return {
        "api_key": client._api_key,
        "jwt_token": client._jwt_token,
        "organization_id": client._organization_id,
        "api_url": client._api_url,
        "target": client._target,
    }


def _build(make):
    """Build with *make*, returning the client and its warnings."""
    with warnings.catch_warnings(record=True) as seen:
        warnings.simplefilter("always")
        client = make()
    return client, sorted({str(w.message) for w in seen})


class TestSameAsTheSdk:
    """Every setting comes from where the SDK's constructor takes it."""

    @pytest.mark.parametrize("case", CASES.values(), ids=CASES)
    def test_resolves_like_the_constructor(
        self, case, sdk_env, tmp_path, daytona_emulator
    ):
        """daytona_client() and daytona.Daytona() resolve the same values."""
        _apply(case, sdk_env, tmp_path, daytona_emulator.api_url)

        sdk, sdk_warnings = _build(daytona.Daytona)
        try:
            ours, our_warnings = _build(daytona_client)
        finally:
            close_daytona(sdk)

        assert _resolved(sdk) == _resolved(ours)
        assert sdk_warnings == our_warnings

    @pytest.mark.parametrize(("case", "error"), FAILING.values(), ids=FAILING)
    def test_fails_where_the_constructor_fails(
        self, case, error, sdk_env, tmp_path
    ):
        """Without usable credentials (and no key file) neither builds."""
        _apply(case, sdk_env, tmp_path, "")

        with pytest.raises(daytona.DaytonaAuthenticationError):
            daytona.Daytona()
        with pytest.raises(error):
            daytona_client()

        assert daytona_client.current() is None


class TestWherePoolkeeperAdds:
    """The key file is read only when the SDK finds no credentials."""

    def test_key_file_used_when_the_sdk_finds_none(
        self, sdk_env, tmp_path, daytona_emulator
    ):
        """With no key nor JWT anywhere, the file's key is used."""
        (tmp_path / "api_key").write_text("from-file\n")

        client = daytona_client()

        assert "from-file" == client._api_key
        assert daytona_emulator.api_url == client._api_url
        assert "us" == client._target

    def test_key_file_ignored_when_the_sdk_finds_a_key(
        self, sdk_env, tmp_path
    ):
        """A key in .env wins over the key file, as the SDK sees only .env."""
        (tmp_path / "api_key").write_text("from-file\n")
        (tmp_path / ".env").write_text("DAYTONA_API_KEY=from-dotenv\n")

        assert "from-dotenv" == daytona_client()._api_key

    def test_an_empty_env_key_falls_back_to_the_key_file(
        self, sdk_env, tmp_path
    ):
        """An empty DAYTONA_API_KEY counts as none, so the file is read."""
        sdk_env.setenv("DAYTONA_API_KEY", "")
        (tmp_path / ".env").write_text("DAYTONA_API_KEY=hidden\n")
        (tmp_path / "api_key").write_text("from-file\n")

        assert "from-file" == daytona_client()._api_key

    def test_no_key_file_raises_credentials_error(self, sdk_env, tmp_path):
        """Nothing anywhere: a DaytonaCredentialsError naming the file."""
        with pytest.raises(DaytonaCredentialsError) as info:
            daytona_client()

        assert str(tmp_path / "api_key") in str(info.value)
        assert wait_for(lambda: daytona_client.current() is None)
