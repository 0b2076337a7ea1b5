"""close_daytona releases every socket, thread and timer of a client."""

from __future__ import annotations

import logging
import threading
import time
import types
import warnings

import daytona
import pytest
from daytona_test_helpers import fd_count, settle, wait_for

from poolkeeper_daytona import DaytonaInternalsWarning, close_daytona
from poolkeeper_daytona._guard import _reset_for_tests


def _hollow_client() -> daytona.Daytona:
    """A real ``daytona.Daytona`` with none of its internals (never built)."""
    return object.__new__(daytona.Daytona)


def _released(emu, key, baseline) -> bool:
    settle()
    return not emu.open_connections(key) and baseline == (
        fd_count(),
        threading.active_count(),
    )


class TestCloseDaytona:
    """Everything a client opened is gone after close_daytona."""

    def test_fresh_client(self, make_client, daytona_emulator, baseline):
        """A never-used client drops its websocket and threads."""
        client = make_client(api_key="fresh")
        assert wait_for(lambda: daytona_emulator.socketio_sessions("fresh"))

        close_daytona(client)

        assert wait_for(lambda: _released(daytona_emulator, "fresh", baseline))
        # The session's end is recorded by the server's disconnect handler,
        # which may run after the connection's close was recorded.
        assert wait_for(
            lambda: (
                not daytona_emulator.socketio_sessions("fresh")[0].is_connected
            )
        ), daytona_emulator.socketio_sessions("fresh")

    def test_used_client(self, make_client, daytona_emulator, baseline):
        """A client holding a sandbox subscription is fully released."""
        client = make_client(api_key="used")
        sandbox = client.create()
        client.get(sandbox.id)
        # The websocket connects in the background: wait for both.
        assert wait_for(
            lambda: 2 <= len(daytona_emulator.open_connections("used"))
        )

        close_daytona(client)

        assert wait_for(lambda: _released(daytona_emulator, "used", baseline))

    def test_an_error_the_caller_keeps(
        self, make_client, daytona_emulator, baseline
    ):
        """A kept SDK error holds its urllib3 pool, not the pool's sockets.

        urllib3 2's ``PoolManager.clear()`` only forgets its pools; their
        idle connections close when a pool is garbage-collected, and an
        error or a response a caller keeps (a 404 here, a retry loop's
        last error, a logged traceback) holds its pool. close_daytona
        closes the pools themselves.
        """
        client = make_client(api_key="kept")
        client.create()
        with pytest.raises(daytona.DaytonaNotFoundError) as info:
            client.get("no-such-sandbox")
        kept = info.value

        close_daytona(client)

        assert wait_for(lambda: _released(daytona_emulator, "kept", baseline))
        assert isinstance(kept, daytona.DaytonaNotFoundError)

    def test_twice_is_a_no_op(self, make_client, daytona_emulator, baseline):
        """A second close returns at once and changes nothing."""
        client = make_client(api_key="twice")
        client.create()
        close_daytona(client)

        close_daytona(client)

        assert wait_for(lambda: _released(daytona_emulator, "twice", baseline))

    def test_during_reconnect_loop(
        self, make_client, daytona_emulator, baseline
    ):
        """A client whose websocket the server dropped stops reconnecting."""
        client = make_client(api_key="flap")
        client.create()
        assert wait_for(lambda: daytona_emulator.socketio_sessions("flap"))
        daytona_emulator.faults.drop_mode = True
        daytona_emulator.drop_connections("flap")

        close_daytona(client)
        daytona_emulator.faults.drop_mode = False

        assert wait_for(lambda: _released(daytona_emulator, "flap", baseline))
        sessions = len(daytona_emulator.socketio_sessions("flap"))
        time.sleep(1.5)  # Longer than the SDK's first reconnect delay.
        assert sessions == len(daytona_emulator.socketio_sessions("flap"))

    def test_polling_mode_client(
        self, make_client, daytona_emulator, baseline
    ):
        """A client without an event dispatcher is released too."""
        with pytest.warns(DeprecationWarning, match="(?i)deprecat"):
            client = make_client(api_key="poll", use_deprecated_polling=True)
        client.create()

        close_daytona(client)

        assert wait_for(lambda: _released(daytona_emulator, "poll", baseline))
        assert [] == daytona_emulator.socketio_sessions("poll")


class TestUnrecognisedInternals:
    """Missing internals warn once and the rest is still released."""

    @pytest.fixture(autouse=True)
    def _fresh_warning_state(self):
        _reset_for_tests()
        yield
        _reset_for_tests()

    def test_missing_attributes_warn_once(
        self, make_client, daytona_emulator, baseline
    ):
        """Without _http_client a warning is issued and sockets still close."""
        client = make_client(api_key="odd")
        client.create()
        http = client._http_client
        del client._http_client

        with pytest.warns(DaytonaInternalsWarning, match="_http_client"):
            close_daytona(client)
        http.close()

        assert wait_for(lambda: _released(daytona_emulator, "odd", baseline))

    def test_warning_is_issued_once_per_process(self, recwarn):
        """Two real clients without their internals produce one warning."""
        close_daytona(_hollow_client())
        close_daytona(_hollow_client())

        assert 1 == len(recwarn.list)
        assert issubclass(recwarn.list[0].category, DaytonaInternalsWarning)

    def test_arbitrary_object_never_raises(self, recwarn):
        """Closing something that is not a client neither raises nor warns."""
        close_daytona(object())

        assert [] == recwarn.list

    def test_test_double_does_not_warn(self, recwarn, caplog):
        """A fake client is released quietly, logged at DEBUG only."""
        with caplog.at_level(logging.DEBUG, logger="poolkeeper.daytona"):
            close_daytona(types.SimpleNamespace())

        assert [] == recwarn.list
        assert any("non-SDK" in r.getMessage() for r in caplog.records)

    def test_test_double_keeps_the_real_warning(self):
        """After fakes were closed, a real unrecognised client still warns."""
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            close_daytona(types.SimpleNamespace())
            close_daytona(types.SimpleNamespace(_http_client=None))

        with pytest.warns(DaytonaInternalsWarning, match="Daytona"):
            close_daytona(_hollow_client())


class TestFailingSteps:
    """A failing step is logged and the remaining steps still run."""

    def test_failing_pool_clear_is_logged(
        self, make_client, daytona_emulator, caplog
    ):
        """An exception from one step is logged at WARNING, not raised."""
        client = make_client(api_key="boom")
        client.create()
        pools = client._api_client.rest_client.pool_manager
        original = pools.clear

        def fail() -> None:
            raise RuntimeError

        pools.clear = fail
        with caplog.at_level(logging.WARNING, logger="poolkeeper.daytona"):
            close_daytona(client)
        original()

        (said,) = [r.getMessage() for r in caplog.records]
        assert "RuntimeError raised at test_close.py:" in said
        assert not any(r.exc_info for r in caplog.records)
        assert wait_for(lambda: not daytona_emulator.open_connections("boom"))
