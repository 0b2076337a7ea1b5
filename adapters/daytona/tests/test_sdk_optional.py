"""The adapter without the SDK: a project shaped like its first users'.

``sdk_optional_project/`` is a project whose CPU CI never installs
``daytona`` (as radixark/miles'): it imports ``poolkeeper_daytona`` and
makes its singletons at module level. Its tests run here twice, in a
pytest process of their own: with the SDK hidden (the CPU CI job; `make
no-sdk` runs it again in a venv that never had the SDK) and with it (the
SDK job, against the emulator).
"""

from __future__ import annotations

import os
import shutil
from pathlib import Path

from daytona_test_helpers import run_pytest

_PROJECT = Path(__file__).parent / "sdk_optional_project"

# A pytest plugin that makes the run look like a CI without the SDK and
# the packages only the SDK brings.
_HIDE_SDK = """
import importlib.abc
import sys

_HIDDEN = {"daytona", "aiohttp", "socketio", "engineio", "dotenv"}


class _NoSdk(importlib.abc.MetaPathFinder):
    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] in _HIDDEN:
            raise ModuleNotFoundError(f"No module named {name!r}", name=name)


sys.meta_path.insert(0, _NoSdk())
"""


def _run_project(tmp_path: Path, *, hide_sdk: bool) -> str:
    project = tmp_path / "project"
    shutil.copytree(_PROJECT, project)
    plugins: list[str] = []
    if hide_sdk:
        (tmp_path / "hide_sdk.py").write_text(_HIDE_SDK)
        plugins = ["-p", "hide_sdk"]
    done = run_pytest(
        project,
        "-rs",
        *plugins,
        env={**_clean_env(), "PYTHONPATH": str(tmp_path)},
    )
    assert 0 == done.returncode, done.stdout + done.stderr
    return done.stdout


def _clean_env() -> dict[str, str]:
    return {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DAYTONA_", "EVAL_DAYTONA_", "PYTEST_"))
    }


class TestSdkOptionalProject:
    """The project's two CI jobs pass with the adapter installed."""

    def test_cpu_job_without_the_sdk(self, tmp_path):
        """Collection works; the SDK tests skip; a build names daytona."""
        out = _run_project(tmp_path, hide_sdk=True)

        assert "10 passed, 1 skipped" in out, out
        assert "SKIPPED" in out, out
        assert "could not import 'daytona'" in out, out

    def test_sdk_job_with_the_sdk(self, tmp_path):
        """With the SDK, every test but the SDK-absent one runs for real."""
        out = _run_project(tmp_path, hide_sdk=False)

        assert "12 passed, 1 skipped" in out, out
