"""A module-level singleton for the multiprocessing tests."""

from __future__ import annotations

from helpers import FakeClient

from poolkeeper import process_singleton


@process_singleton
def SINGLE() -> FakeClient:  # noqa: N802 -- a constant-like module singleton.
    """Build a fake client."""
    return FakeClient()
