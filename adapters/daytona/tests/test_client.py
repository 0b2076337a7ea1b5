"""daytona_client: one client per process, rebuilt when the key rotates."""

from __future__ import annotations

import threading

import daytona
import pytest
from daytona import SandboxState
from daytona_test_helpers import fd_count, settle, wait_for

from poolkeeper_daytona import (
    DaytonaCredentialsError,
    daytona_client,
    make_daytona_singleton,
)


@pytest.fixture(name="constructions")
def _constructions(monkeypatch):
    """Count calls of the real daytona.Daytona.__init__."""
    calls: list[int] = []
    original = daytona.Daytona.__init__

    def counting(self, *args, **kwargs):
        calls.append(threading.get_ident())
        original(self, *args, **kwargs)

    monkeypatch.setattr(daytona.Daytona, "__init__", counting)
    return calls


class TestConfiguration:
    """Credentials are read as the SDK reads them."""

    def test_api_key_from_env(self, sdk_env, daytona_emulator):
        """DAYTONA_API_KEY authenticates against DAYTONA_API_URL."""
        sdk_env.setenv("DAYTONA_API_KEY", "env-key")

        daytona_client().create()

        assert daytona_emulator.requests("env-key", method="POST")

    def test_api_key_from_key_file(self, sdk_env, daytona_emulator, tmp_path):
        """Without env credentials the key file's content is the key."""
        (tmp_path / "api_key").write_text("file-key\n")

        daytona_client().create()

        assert daytona_emulator.requests("file-key", method="POST")

    def test_api_key_from_dotenv(self, sdk_env, daytona_emulator, tmp_path):
        """DAYTONA_API_KEY in the working directory's .env is used."""
        (tmp_path / ".env").write_text("DAYTONA_API_KEY=dotenv-key\n")

        daytona_client().create()

        assert daytona_emulator.requests("dotenv-key", method="POST")

    def test_no_credentials_raises_clear_error(self, sdk_env, tmp_path):
        """The error names the variables and the key file, no secret."""
        with pytest.raises(DaytonaCredentialsError) as info:
            daytona_client()

        message = str(info.value)
        assert "DAYTONA_API_KEY" in message
        assert "DAYTONA_JWT_TOKEN" in message
        assert str(tmp_path / "api_key") in message
        assert isinstance(info.value, ValueError)
        assert daytona_client.current() is None

    def test_make_daytona_singleton(self, daytona_emulator, constructions):
        """A user config factory gets the same build-once lifecycle."""
        config = daytona.DaytonaConfig(
            api_key="own", api_url=daytona_emulator.api_url, target="us"
        )
        singleton = make_daytona_singleton(lambda: config)
        try:
            first = singleton()

            assert first is singleton()
            assert SandboxState.STARTED == first.create().state
            assert 1 == len(constructions)
        finally:
            singleton.reset()
        assert wait_for(lambda: not daytona_emulator.open_connections("own"))


class TestConcurrency:
    """Many threads share one real client and its connections."""

    @pytest.mark.timeout(120)
    def test_thousand_calls_from_32_threads(
        self, sdk_env, daytona_emulator, constructions
    ):
        """1,000 calls from 32 threads construct exactly one Daytona."""
        sdk_env.setenv("DAYTONA_API_KEY", "shared")
        barrier = threading.Barrier(32)
        seen: list[object] = []
        errors: list[BaseException] = []

        def worker(index: int) -> None:
            try:
                barrier.wait(10)
                for call in range(1000 // 32 + (index < 1000 % 32)):
                    client = daytona_client()
                    seen.append(client)
                    if call == 0 and index % 4 == 0:
                        client.create()
            except BaseException as exc:
                errors.append(exc)

        threads = [
            threading.Thread(target=worker, args=(i,)) for i in range(32)
        ]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)

        assert not any(t.is_alive() for t in threads)
        assert [] == errors
        assert 1000 == len(seen)
        assert 1 == len({id(c) for c in seen})
        assert 1 == len(constructions)
        assert wait_for(lambda: daytona_emulator.socketio_sessions("shared"))
        assert 1 == len(daytona_emulator.socketio_sessions("shared"))
        posts = daytona_emulator.requests("shared", method="POST")
        assert 8 == len(posts), f"POSTs seen: {posts}"
        # Eight concurrent creates need at most eight pooled connections.
        # Each sent one POST; a status GET follows only when the SDK's
        # "started" event did not arrive first, so only POSTs are counted.
        http = [
            c
            for c in daytona_emulator.connections("shared")
            if c.kind == "http"
        ]
        assert 1 <= len(http) <= 8, f"HTTP connections seen: {http}"
        served = sum(c.requests for c in http)
        assert 8 <= served, f"{served} requests on {len(http)} connections"


class TestKeyRotation:
    """A rotated key builds a new client and closes the old one."""

    def test_rotation_via_env(self, sdk_env, daytona_emulator, baseline):
        """Changing DAYTONA_API_KEY retires and closes the old client."""
        sdk_env.setenv("DAYTONA_API_KEY", "old")
        old = daytona_client()
        old.create()
        assert wait_for(lambda: daytona_emulator.socketio_sessions("old"))

        sdk_env.setenv("DAYTONA_API_KEY", "new")
        new = daytona_client()

        assert new is not old
        assert SandboxState.STARTED == new.create().state
        assert wait_for(lambda: not daytona_emulator.open_connections("old"))
        assert daytona_client.statistics().closes >= 1
        daytona_client.reset()
        del old, new
        assert wait_for(
            lambda: (
                (settle(), (fd_count(), threading.active_count()))[1]
                == baseline
            )
        ), (fd_count(), threading.enumerate(), baseline)

    def test_rotation_via_key_file(
        self, sdk_env, daytona_emulator, tmp_path, baseline
    ):
        """Rewriting the key file retires and closes the old client."""
        key_file = tmp_path / "api_key"
        key_file.write_text("first")
        old = daytona_client()
        old.create()

        key_file.write_text("second-key")
        # The checker notices within its recheck interval (conftest); old
        # stays referenced, so its id is not reused meanwhile.
        old_id = id(old)
        assert wait_for(lambda: id(daytona_client()) != old_id)
        new = daytona_client()

        assert new is not old
        new.create()
        assert daytona_emulator.requests("second-key", method="POST")
        assert wait_for(lambda: not daytona_emulator.open_connections("first"))
        daytona_client.reset()
        del old, new
        assert wait_for(
            lambda: (
                (settle(), (fd_count(), threading.active_count()))[1]
                == baseline
            )
        )


class TestWhatIsWatched:
    """Files are watched by the checker thread; variables are pushed."""

    def test_dotenv_rewrite_is_noticed(self, sdk_env, tmp_path):
        """A rewritten .env.local rebuilds once the checker looked."""
        (tmp_path / ".env.local").write_text("DAYTONA_API_KEY=one\n")
        old = daytona_client()
        assert "one" == old._api_key

        (tmp_path / ".env.local").write_text("DAYTONA_API_KEY=two, longer\n")

        assert wait_for(lambda: "two, longer" == daytona_client()._api_key)

    def test_working_directory_change_is_noticed(self, sdk_env, tmp_path):
        """Moving to a directory with another .env rebuilds."""
        (tmp_path / ".env").write_text("DAYTONA_API_KEY=here\n")
        elsewhere = tmp_path / "elsewhere"
        elsewhere.mkdir()
        (elsewhere / ".env").write_text("DAYTONA_API_KEY=there\n")
        assert "here" == daytona_client()._api_key

        sdk_env.chdir(elsewhere)

        assert wait_for(lambda: "there" == daytona_client()._api_key)

    def test_new_key_file_variable_is_read_at_once(self, sdk_env, tmp_path):
        """A changed DAYTONA_API_KEY_FILE is pushed; its file read now."""
        (tmp_path / "api_key").write_text("first")
        (tmp_path / "other_key").write_text("other")
        assert "first" == daytona_client()._api_key

        sdk_env.setenv("DAYTONA_API_KEY_FILE", str(tmp_path / "other_key"))

        assert "other" == daytona_client()._api_key
