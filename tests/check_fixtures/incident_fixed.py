"""The incident's module after the fix, with poolkeeper."""

from __future__ import annotations

import os
import time

from poolkeeper import process_singleton

MAX_ATTEMPTS = 6


@process_singleton
def make_daytona():
    """Return the process's Daytona client."""
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
