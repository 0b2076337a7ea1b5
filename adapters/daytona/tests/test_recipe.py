"""The documented recipe for a project that tests without the SDK."""

from __future__ import annotations

import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from daytona_test_helpers import run_pytest

if TYPE_CHECKING:
    import subprocess

_PROJECT = Path(__file__).parent / "recipe_project"

# A test module of a user's, using the adapter's reset_singletons fixture.
_WITH_FIXTURE = """
import pytest
from poolkeeper import process_singleton
from poolkeeper_daytona.testing import reset_singletons


class Client:
    closed = []

    def close(self):
        Client.closed.append(self)


@process_singleton
def client():
    return Client()


@pytest.mark.usefixtures("reset_singletons")
def test_a_builds_one_client():
    before = client.statistics().builds
    assert client() is client()
    assert 1 == client.statistics().builds - before
    assert [] == Client.closed


def test_b_the_client_was_closed_after_the_test():
    assert client.current() is None
    assert 1 == len(Client.closed)
"""


def _pytest(directory: Path) -> subprocess.CompletedProcess[str]:
    """Run pytest on *directory* in a process of its own."""
    return run_pytest(directory)


class TestFakeSdkRecipe:
    """The recipe's tests pass in a run where daytona cannot be imported."""

    def test_recipe_project_passes_without_the_sdk(self, tmp_path):
        """Fake SDK, lazy import, reset per test, builds from statistics()."""
        for source in _PROJECT.glob("*.py"):
            shutil.copy(source, tmp_path / source.name)

        done = _pytest(tmp_path)

        assert 0 == done.returncode, done.stdout + done.stderr
        assert "3 passed" in done.stdout, done.stdout

    def test_reset_singletons_fixture_closes_after_the_test(self, tmp_path):
        """The adapter's fixture closes what a test built, once it ends."""
        (tmp_path / "test_user.py").write_text(_WITH_FIXTURE)

        done = _pytest(tmp_path)

        assert 0 == done.returncode, done.stdout + done.stderr
        assert "2 passed" in done.stdout, done.stdout
