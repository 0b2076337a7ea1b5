"""Fixtures shared by the core tests."""

from __future__ import annotations

import pytest

import poolkeeper


@pytest.fixture(autouse=True)
def _close_all_after_test():
    """Close whatever a test left live, so tests never leak into each other."""
    yield
    poolkeeper.close_all()
