"""A Sandbox obtained before a key rotation, and the client it depends on.

A ``Sandbox`` routes every call through the ``Daytona`` that returned it
(its API and toolbox pools). A lease keeps that client open across a
rotation; without one, the retired client is closed under the sandbox.
"""

from __future__ import annotations

from daytona_test_helpers import wait_for

from poolkeeper_daytona import daytona_client


class TestSandboxAcrossRotation:
    """What a rotation means for sandboxes of the old client."""

    def test_lease_keeps_the_old_client_open_for_its_sandboxes(
        self, sdk_env, daytona_emulator
    ):
        """Inside a lease the sandbox keeps working on the old client."""
        sdk_env.setenv("DAYTONA_API_KEY", "lease-old")
        with daytona_client.lease() as old:
            sandbox = old.create()
            sdk_env.setenv("DAYTONA_API_KEY", "lease-new")
            new = daytona_client()
            assert new is not old
            assert 1 == daytona_client.statistics().pending_close

            sandbox.refresh_data()
            sandbox.delete()

            assert daytona_emulator.open_connections("lease-old")
            deletes = daytona_emulator.requests("lease-old", method="DELETE")
            assert [f"/api/sandbox/{sandbox.id}"] == [r.path for r in deletes]
        assert 0 == daytona_client.statistics().pending_close
        assert wait_for(
            lambda: not daytona_emulator.open_connections("lease-old")
        )

    def test_without_a_lease_the_old_client_is_closed_at_rotation(
        self, sdk_env, daytona_emulator
    ):
        """Unleased, the rotation closes the client the sandbox depends on."""
        sdk_env.setenv("DAYTONA_API_KEY", "bare-old")
        old = daytona_client()
        sandbox = old.create()
        assert wait_for(lambda: daytona_emulator.socketio_sessions("bare-old"))

        sdk_env.setenv("DAYTONA_API_KEY", "bare-new")
        daytona_client()

        # Its websocket and pooled connections are gone: events for the
        # sandbox can no longer arrive. Use lease() to keep them.
        assert wait_for(
            lambda: not daytona_emulator.open_connections("bare-old")
        )
        # The server records a session's end in its disconnect handler,
        # which can run after the connection's close was recorded.
        assert wait_for(
            lambda: (
                not any(
                    s.is_connected
                    for s in daytona_emulator.socketio_sessions("bare-old")
                )
            )
        ), daytona_emulator.socketio_sessions("bare-old")
        assert sandbox.id
