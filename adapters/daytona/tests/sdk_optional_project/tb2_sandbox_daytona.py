"""Terminal-Bench sandboxes on Daytona, in a project that keeps SDKs optional.

Shaped like radixark/miles' ``tb2_sandbox_daytona.py``: its CPU CI never
installs ``daytona``, yet this module is imported by the tests of the code
around it. It uses the Daytona page's first examples as written, at module
level: ``daytona_client`` and a module-level ``make_daytona_singleton``.
"""

from __future__ import annotations

import os
import time
from typing import Any

from poolkeeper_daytona import daytona_client, make_daytona_singleton

MAX_ATTEMPTS = 4

# A second account (the evaluation one), configured by the project. Its
# config is a mapping of DaytonaConfig's fields: no SDK import here.
eval_daytona = make_daytona_singleton(
    lambda: {
        "api_key": os.environ.get("EVAL_DAYTONA_API_KEY", ""),
        "api_url": os.environ.get("EVAL_DAYTONA_API_URL", ""),
    }
)


def create_sandbox(
    *, attempts: int = MAX_ATTEMPTS, backoff: float = 0.0
) -> Any:
    """Create a sandbox, retrying on errors, always on the shared client."""
    error: Exception | None = None
    for attempt in range(attempts):
        try:
            return daytona_client().create()
        except Exception as exc:  # noqa: PERF203 -- the SDK's errors vary.
            error = exc
            time.sleep(backoff * 2**attempt)
    msg = f"no sandbox after {attempts} attempts"
    raise RuntimeError(msg) from error


def run_episode(command: str) -> str:
    """Create a sandbox, run *command* in it, delete it."""
    sandbox = create_sandbox()
    try:
        return f"{sandbox.id}: {command}"
    finally:
        daytona_client().delete(sandbox)
