"""A plain @process_singleton returning daytona.Daytona() closes fully.

No ``close=`` and no ``after_fork=`` written: poolkeeper finds the
adapter's hooks through its ``poolkeeper.adapters`` entry point.
"""

from __future__ import annotations

import logging
import os
import threading

import daytona
import poolkeeper
import pytest
from daytona_test_helpers import fd_count, settle, wait_for
from poolkeeper import process_singleton
from test_fork import _run_in_child


def _plain(emu, api_key):
    @process_singleton
    def plain() -> daytona.Daytona:
        return daytona.Daytona(
            daytona.DaytonaConfig(
                api_key=api_key, api_url=emu.api_url, target="us"
            )
        )

    return plain


def _at_baseline(emu, key, baseline) -> bool:
    settle()
    return not emu.open_connections(key) and baseline == (
        fd_count(),
        threading.active_count(),
    )


class TestPlainFactory:
    """The recipe's singleton, no hooks written, leaves nothing behind."""

    def test_close_all_releases_everything(
        self, daytona_emulator, baseline, caplog
    ):
        """fds and threads are back to baseline after close_all()."""
        plain = _plain(daytona_emulator, "plain")
        client = plain()
        client.delete(client.create())
        assert wait_for(
            lambda: 2 <= len(daytona_emulator.open_connections("plain"))
        )

        with caplog.at_level(logging.DEBUG, logger="poolkeeper"):
            poolkeeper.close_all()

        assert wait_for(
            lambda: _at_baseline(daytona_emulator, "plain", baseline)
        )
        assert 1 == plain.statistics().closes
        assert not [r for r in caplog.records if "no close" in r.message]

    def test_rotation_closes_the_retired_client(
        self, daytona_emulator, baseline
    ):
        """reset() closes the old client as close_all() would."""
        plain = _plain(daytona_emulator, "reset")
        plain().create()
        plain.reset()

        assert wait_for(
            lambda: _at_baseline(daytona_emulator, "reset", baseline)
        )

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
    def test_forked_child_makes_the_inherited_client_inert(
        self, daytona_emulator
    ):
        """The adapter's fork hook runs in the child, sending nothing."""
        plain = _plain(daytona_emulator, "forked-plain")
        parent = plain()
        parent.create()
        assert wait_for(
            lambda: daytona_emulator.socketio_sessions("forked-plain")
        )

        def child() -> int:
            # Abandoned by the at-fork hook: the dispatcher is closed and
            # the child's copies of its sockets are released.
            if not parent._event_dispatcher._closed:
                return 1
            return 0 if plain() is not parent else 2

        assert 0 == _run_in_child(child)
        assert all(
            s.is_connected
            for s in daytona_emulator.socketio_sessions("forked-plain")
        )
        poolkeeper.close_all()
