"""The incident's hand-written fix: a global guarded by a lock."""

from __future__ import annotations

import os
import threading

_client = None
_client_lock = threading.Lock()


def make_daytona():
    """Return the process's Daytona client, built on first use."""
    global _client  # noqa: PLW0603
    with _client_lock:
        if _client is None:
            from daytona import Daytona, DaytonaConfig

            _client = Daytona(
                DaytonaConfig(api_key=os.environ["DAYTONA_API_KEY"])
            )
        return _client
