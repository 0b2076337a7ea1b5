"""The project's fixtures: every singleton reset around each test."""

from __future__ import annotations

import pytest

from poolkeeper_daytona.testing import reset_singletons  # noqa: F401


@pytest.fixture(autouse=True)
def _fresh_singletons(request):
    """No client built in one test is seen by another."""
    request.getfixturevalue("reset_singletons")
