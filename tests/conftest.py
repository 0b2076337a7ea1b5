"""Fixtures shared by the core tests."""

from __future__ import annotations

import os
import sys
import threading

import pytest
from hypothesis import settings

import poolkeeper


@pytest.fixture(autouse=True)
def _close_all_after_test():
    """Close whatever a test left live, so tests never leak into each other."""
    yield
    poolkeeper.close_all()


@pytest.fixture(autouse=True)
def _tracer_left_as_found():
    """A test that sets a tracer puts the one it found back.

    Under coverage that one is coverage's: a test that ends with
    ``sys.settrace(None)`` stops the measurement of every later test on
    the main thread (CI's coverage fell from 97.5 % to 93.6 % that way),
    and one that ends with ``threading.settrace(None)`` stops it in every
    thread started later.
    """
    before = sys.gettrace(), threading.gettrace()
    yield
    assert (sys.gettrace(), threading.gettrace()) == before, (
        "the test left another tracer set"
    )


# Profiles for the state machines: 2,000 examples by default (ci; `make
# machines` in CI), HYPOTHESIS_PROFILE=soak runs 20,000, =dev a quick 200
# (the matrix), =cov 100 (the coverage run: each path once is enough there,
# and the tracer makes each example several times slower).
settings.register_profile("ci", max_examples=2000, deadline=None)
settings.register_profile("soak", max_examples=20000, deadline=None)
settings.register_profile("dev", max_examples=200, deadline=None)
settings.register_profile("cov", max_examples=100, deadline=None)
settings.load_profile(os.environ.get("HYPOTHESIS_PROFILE", "ci"))
