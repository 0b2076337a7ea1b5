"""The documented recipe for a project that tests without the SDK."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

_PROJECT = Path(__file__).parent / "recipe_project"


class TestFakeSdkRecipe:
    """The recipe's tests pass in a run where daytona cannot be imported."""

    def test_recipe_project_passes_without_the_sdk(self, tmp_path):
        """Fake SDK, lazy import, reset per test, builds from statistics()."""
        for source in _PROJECT.glob("*.py"):
            shutil.copy(source, tmp_path / source.name)

        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "pytest",
                "-q",
                "-p",
                "no:cacheprovider",
                "-p",
                "no:randomly",
                "-W",
                "error",
                "--rootdir",
                str(tmp_path),
                str(tmp_path),
            ],
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=120,
            check=False,
        )

        assert 0 == done.returncode, done.stdout + done.stderr
        assert "3 passed" in done.stdout, done.stdout
