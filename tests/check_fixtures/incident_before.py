"""The incident's module before the fix: a client per create attempt."""

from __future__ import annotations

import os
import time

MAX_ATTEMPTS = 6


def make_daytona():
    """Return a new Daytona client configured from the environment."""
    from daytona import Daytona, DaytonaConfig

    return Daytona(
        DaytonaConfig(
            api_key=os.environ["DAYTONA_API_KEY"],
            api_url=os.getenv("DAYTONA_API_URL", "https://app.daytona.io/api"),
        )
    )


def create_task_sandbox(params, delay=1.0):
    """Create a sandbox, retrying with backoff on any API failure."""
    for attempt in range(MAX_ATTEMPTS):
        try:
            daytona = make_daytona()
            return daytona.create(params)
        except Exception:  # noqa: PERF203
            if attempt == MAX_ATTEMPTS - 1:
                raise
            time.sleep(delay * 2**attempt)
    return None
