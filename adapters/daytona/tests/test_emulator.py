"""The emulator speaks the API the real SDK calls."""

from __future__ import annotations

import asyncio
import contextlib
import threading

import daytona
import pytest
from daytona import ListSandboxesQuery, SandboxState
from daytona_test_helpers import (
    ause_sandbox,
    fd_count,
    sandbox_calls,
    use_sandbox,
    wait_for,
)

from poolkeeper_daytona import aclose_daytona, close_daytona
from poolkeeper_daytona.testing import DaytonaEmulator, client_id


class TestSandboxLifecycle:
    """create, get, list and delete through the real SDK."""

    def test_create_returns_started_sandbox(self, make_client):
        """A default create polls until the sandbox is started."""
        sandbox = make_client().create()

        assert SandboxState.STARTED == sandbox.state
        assert sandbox.toolbox_proxy_url.endswith("/toolbox")

    def test_create_polls_state_with_get(self, make_client, daytona_emulator):
        """A sandbox still creating is read back with GET after the POST."""
        # Only while the sandbox is not started yet does the SDK poll: a
        # "started" event that arrives first makes it skip the GET.
        daytona_emulator.faults.start_delay = 1.0
        sandbox = make_client().create()

        path = f"/api/sandbox/{sandbox.id}"
        gets = daytona_emulator.requests(method="GET", path=path)
        assert gets, f"requests seen: {daytona_emulator.requests()}"

    def test_get_returns_same_sandbox(self, make_client):
        """get() by id finds the created sandbox."""
        client = make_client()
        created = client.create()

        fetched = client.get(created.id)

        assert created.id == fetched.id
        assert SandboxState.STARTED == fetched.state

    def test_get_missing_raises_not_found(self, make_client):
        """get() of an unknown id raises the SDK's not-found error."""
        with pytest.raises(daytona.DaytonaNotFoundError):
            make_client().get("no-such-sandbox")

    def test_list_filters_by_labels_and_pages(self, make_client):
        """list() follows nextCursor and applies the label filter."""
        client = make_client()
        params = daytona.CreateSandboxFromSnapshotParams(labels={"t": "x"})
        wanted = {client.create(params).id for _ in range(3)}
        client.create()

        found = {
            s.id
            for s in client.list(
                ListSandboxesQuery(labels={"t": "x"}, limit=2)
            )
        }

        assert wanted == found

    def test_delete_destroys(self, make_client, daytona_emulator):
        """delete(wait=True) ends with the sandbox destroyed."""
        client = make_client()
        sandbox = client.create()

        client.delete(sandbox, wait=True)

        # The wait ended on 'destroyed' (from the event or a poll). The
        # sandbox object may still say 'destroying': the SDK applies a poll's
        # answer and the event on two threads, and one read before the event
        # can be applied after it (seen on a loaded machine).
        assert sandbox.state in (
            SandboxState.DESTROYED,
            SandboxState.DESTROYING,
        )
        assert "destroyed" == daytona_emulator.sandbox_states()[sandbox.id]
        assert sandbox.id not in {s.id for s in client.list()}

    def test_toolbox_proxy_url_endpoint(self, make_client):
        """The toolbox proxy URL endpoint answers for a known sandbox."""
        client = make_client()
        sandbox = client.create()

        url = client._sandbox_api.get_toolbox_proxy_url(sandbox.id).url

        assert sandbox.toolbox_proxy_url == url


class TestSandboxOperations:
    """What sandbox code calls on a created sandbox is served."""

    # What each sandbox must have been sent, and answered with success.
    # The three are deleted three ways: the sandbox's own delete(), the
    # client's (the SDK runs it as the sandbox's), and the client's,
    # waiting for the destroyed state.
    CALLED: tuple[tuple[str, str, int], ...] = (
        ("POST", "/process/execute", 200),
        ("POST", "/last-activity", 201),
        ("DELETE", "", 200),
    )

    def _check_calls(self, emulator, sandboxes):
        for sandbox in sandboxes:
            calls = sandbox_calls(emulator, sandbox.id)
            assert set(self.CALLED) <= set(calls), calls
            assert all(status < 400 for _, _, status in calls), calls
            assert emulator.sandbox_states()[sandbox.id] in {
                "destroying",
                "destroyed",
            }

    def test_exec_refresh_and_delete(self, make_client, daytona_emulator):
        """process.exec, refresh_activity and delete all succeed."""
        client = make_client(api_key="sandbox-ops")
        sandboxes = [client.create() for _ in range(3)]

        for n, sandbox in enumerate(sandboxes):
            use_sandbox(sandbox, f"sync-{n}")
        first, second, third = sandboxes
        first.delete()
        client.delete(second)
        client.delete(third, wait=True)

        assert SandboxState.DESTROYED == third.state
        self._check_calls(daytona_emulator, sandboxes)

    def test_async_exec_refresh_and_delete(self, daytona_emulator):
        """The same calls succeed on AsyncSandbox objects."""

        async def main():
            client = daytona.AsyncDaytona(
                daytona.DaytonaConfig(
                    api_key="async-ops",
                    api_url=daytona_emulator.api_url,
                    target="us",
                )
            )
            try:
                sandboxes = [await client.create() for _ in range(3)]
                for n, sandbox in enumerate(sandboxes):
                    await ause_sandbox(sandbox, f"async-{n}")
                first, second, third = sandboxes
                await first.delete()
                await client.delete(second)
                await client.delete(third, wait=True)
            finally:
                await aclose_daytona(client)
            return sandboxes

        sandboxes = asyncio.run(asyncio.wait_for(main(), 60))

        assert SandboxState.DESTROYED == sandboxes[2].state
        self._check_calls(daytona_emulator, sandboxes)

    def test_exec_answers_like_a_shell(self, make_client):
        """Exit codes come back; a command the emulator lacks exits 127."""
        sandbox = make_client().create()

        answers = [
            (r.exit_code, r.result)
            for r in map(
                sandbox.process.exec,
                ["echo 'a  b' c", "true", "false", "exit 3", "ls -l", "'"],
            )
        ]

        assert [
            (0, "a  b c\n"),
            (0, ""),
            (1, ""),
            (3, ""),
            (127, "sh: ls: not found\n"),
            (2, "sh: syntax error: '\n"),
        ] == answers

    def test_exec_on_a_deleted_sandbox_fails(self, make_client):
        """A destroyed sandbox runs nothing, as the real one."""
        client = make_client()
        sandbox = client.create()
        client.delete(sandbox, wait=True)

        with pytest.raises(daytona.DaytonaError, match="not started"):
            sandbox.process.exec("echo late")

    def test_unknown_sandbox_is_not_found(self, make_client):
        """A sandbox the emulator never made gets 404 on both routes."""
        sandbox = make_client().create()
        sandbox.id = "no-such-sandbox"
        sandbox._toolbox_api._sandbox_id = "no-such-sandbox"

        with pytest.raises(daytona.DaytonaNotFoundError):
            sandbox.process.exec("echo lost")
        with pytest.raises(daytona.DaytonaNotFoundError):
            sandbox.refresh_activity()


class TestAuthentication:
    """Tokens are required on REST and on the Socket.IO channel."""

    def test_unknown_key_is_rejected(self, make_client, daytona_emulator):
        """With api_keys set, another key gets 401 and no session."""
        with DaytonaEmulator(api_keys=["good"]) as emu:
            bad = daytona.Daytona(
                daytona.DaytonaConfig(api_key="bad", api_url=emu.api_url)
            )
            try:
                with pytest.raises(daytona.DaytonaAuthenticationError):
                    bad.create()
                assert [] == emu.socketio_sessions("bad")
            finally:
                close_daytona(bad)
        del make_client, daytona_emulator

    def test_session_is_attributed_to_token(
        self, make_client, daytona_emulator
    ):
        """The Socket.IO session carries the client's token fingerprint."""
        make_client(api_key="alice").create()
        assert wait_for(lambda: daytona_emulator.socketio_sessions("alice"))

        sessions = daytona_emulator.socketio_sessions("alice")

        assert 1 == len(sessions)
        assert client_id("alice") == sessions[0].client
        assert sessions[0].is_connected


class TestConnectionRecords:
    """Connections, requests and sessions are recorded per client."""

    def test_one_client_reuses_one_http_connection(
        self, make_client, daytona_emulator
    ):
        """Sequential creates from one client share one HTTP connection."""
        client = make_client(api_key="reuse")
        for _ in range(5):
            client.create()

        http = [
            c
            for c in daytona_emulator.connections("reuse")
            if c.kind == "http"
        ]
        posts = daytona_emulator.requests("reuse", method="POST")

        # Each create is one POST; the status GET that may follow is
        # skipped when the "started" event arrives first, so only the
        # POSTs are certain.
        assert 5 == len(posts), f"POSTs seen: {posts}"
        assert 1 == len(http), f"HTTP connections seen: {http}"
        assert 5 <= http[0].requests, f"requests on it: {http[0].requests}"

    def test_websocket_is_recorded(self, make_client, daytona_emulator):
        """The Socket.IO websocket is one open connection of kind websocket."""
        make_client(api_key="ws").create()
        assert wait_for(lambda: daytona_emulator.socketio_sessions("ws"))

        kinds = [c.kind for c in daytona_emulator.open_connections("ws")]

        assert ["websocket"] == [k for k in kinds if k == "websocket"]


class TestFaults:
    """Injected failures, latency and dropped connections."""

    def test_failure_rate_one_fails_every_create(self):
        """failure_rate=1.0 answers every create with a 5xx error."""
        with DaytonaEmulator(failure_rate=1.0, seed=3) as emu:
            client = daytona.Daytona(
                daytona.DaytonaConfig(api_key="f", api_url=emu.api_url)
            )
            try:
                with pytest.raises(daytona.DaytonaError) as info:
                    client.create()
            finally:
                close_daytona(client)
            statuses = {r.status for r in emu.requests(method="POST")}

        assert {503} == statuses
        assert 503 == info.value.status_code

    def test_failure_rate_is_seeded(self):
        """The same seed injects the same failures."""

        def outcomes(seed: int) -> list[int]:
            with DaytonaEmulator(failure_rate=0.5, seed=seed) as emu:
                client = daytona.Daytona(
                    daytona.DaytonaConfig(api_key="s", api_url=emu.api_url)
                )
                try:
                    for _ in range(8):
                        with contextlib.suppress(daytona.DaytonaError):
                            client.create()
                finally:
                    close_daytona(client)
                return [r.status for r in emu.requests(method="POST")]

        first = outcomes(7)

        assert first == outcomes(7)
        assert {200, 503} == set(first)

    def test_latency_delays_requests(self, make_client, daytona_emulator):
        """latency adds that many seconds to each request."""
        import time

        client = make_client()
        daytona_emulator.faults.latency = 0.2
        start = time.monotonic()
        with pytest.raises(daytona.DaytonaNotFoundError):
            client.get("missing")

        assert 0.2 <= time.monotonic() - start

    def test_drop_mode_drops_new_connections(self):
        """In drop mode connections are accepted, then dropped."""
        with DaytonaEmulator(drop_mode=True) as emu:
            client = daytona.Daytona(
                daytona.DaytonaConfig(api_key="d", api_url=emu.api_url)
            )
            try:
                with pytest.raises(daytona.DaytonaError):
                    client.get("anything")
            finally:
                close_daytona(client)
            records = emu.connections()

        assert records
        assert {"dropped"} == {c.kind for c in records}
        assert [] == emu.requests()

    def test_drop_connections_makes_sdk_reconnect(
        self, make_client, daytona_emulator
    ):
        """Dropping a live websocket starts a new Socket.IO session."""
        client = make_client(api_key="flap")
        client.create()
        # Drop only once python-socketio's connect() has returned: a
        # websocket dropped during its handshake (seen 14 ms after the
        # server's connect, under CPU load) fails that connect, and nothing
        # reconnects until the SDK's next subscription. The SDK's own flag
        # (_connected) is set by the connect event, before connect()
        # returns: a drop 2 ms after it was seen never reconnected (CI).
        dispatcher = client._event_dispatcher
        assert wait_for(
            lambda: (
                dispatcher._connected
                and dispatcher._sio is not None
                and dispatcher._sio.connected
            ),
            timeout=20.0,
        )

        daytona_emulator.drop_connections("flap")

        # python-socketio retries with a 1 s delay doubling up to 30 s.
        assert wait_for(
            lambda: 2 <= len(daytona_emulator.socketio_sessions("flap")),
            timeout=45.0,
        ), daytona_emulator.socketio_sessions("flap")


class TestEmulatorLifecycle:
    """Start and stop are clean and bounded."""

    def test_stop_joins_thread_and_closes_socket(self):
        """After the with block no emulator thread or socket remains."""
        threads, fds = threading.active_count(), fd_count()

        with DaytonaEmulator() as emu:
            assert emu.is_running

        assert not emu.is_running
        assert threads == threading.active_count()
        assert fds == fd_count()

    def test_max_lifetime_stops_itself(self):
        """The emulator stops on its own after max_lifetime seconds."""
        emu = DaytonaEmulator(max_lifetime=0.2).start()

        assert wait_for(lambda: not emu.is_running, timeout=5.0)
        emu.stop()

    def test_start_twice_raises(self):
        """An emulator runs at most once."""
        with DaytonaEmulator() as emu, pytest.raises(RuntimeError):
            emu.start()

    def test_invalid_failure_rate_raises(self):
        """failure_rate outside [0, 1] is rejected."""
        with pytest.raises(ValueError, match="failure_rate"):
            DaytonaEmulator(failure_rate=1.5)
