"""Fixtures shared by the core tests."""

from __future__ import annotations

import os

import pytest
from hypothesis import settings

import poolkeeper


@pytest.fixture(autouse=True)
def _close_all_after_test():
    """Close whatever a test left live, so tests never leak into each other."""
    yield
    poolkeeper.close_all()


# Profiles for the state machine: CI runs 2,000 examples by default,
# HYPOTHESIS_PROFILE=soak runs 20,000 and =dev a quick 200.
settings.register_profile("ci", max_examples=2000, deadline=None)
settings.register_profile("soak", max_examples=20000, deadline=None)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
