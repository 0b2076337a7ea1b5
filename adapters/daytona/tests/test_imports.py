"""Importing the library costs little; the SDK and test kit stay out."""

from __future__ import annotations

import json
import subprocess
import sys

# What `from poolkeeper_daytona import daytona_client` may import beyond
# what `import poolkeeper` imports by itself: the SDK is not imported.
_BUDGET = 10
_HEAVY = ("daytona", "socketio", "engineio", "aiohttp", "requests", "dotenv")


def _run(code: str) -> str:
    """Run *code* in a fresh interpreter; it must succeed. Its stdout."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert 0 == done.returncode, done.stderr
    return done.stdout


def _modules_after(code: str) -> set[str]:
    """Return sys.modules after running *code* in a fresh interpreter."""
    script = (
        f"{code}\nimport json, sys\nprint(json.dumps(sorted(sys.modules)))"
    )
    return set(json.loads(_run(script).splitlines()[-1]))


class TestImportCost:
    """The client's import path stays small."""

    def test_daytona_client_imports_at_most_10_more_modules(self):
        """The library adds at most 10 modules to poolkeeper, no SDK."""
        base = _modules_after("import poolkeeper")
        after = _modules_after("from poolkeeper_daytona import daytona_client")

        extra = sorted(after - base)

        assert len(extra) <= _BUDGET, (
            f"{len(extra)} modules beyond poolkeeper: {extra}"
        )
        assert "daytona" not in after

    def test_demo_and_testing_kit_are_not_imported(self):
        """Neither the SDK, the demo, the emulator nor Socket.IO loads."""
        base = _modules_after("import poolkeeper")
        after = _modules_after(
            "import poolkeeper_daytona\n"
            "from poolkeeper_daytona import daytona_client, close_daytona"
        )

        extra = after - base
        heavy = sorted(m for m in extra if m.split(".")[0] in _HEAVY)
        assert [] == heavy
        assert "poolkeeper_daytona_demo" not in after
        assert "poolkeeper_daytona.testing" not in after

    def test_building_a_client_still_works_after_the_lazy_import(self):
        """A client built after the cheap import is a real daytona.Daytona."""
        code = (
            "import os\n"
            "os.environ['DAYTONA_API_KEY'] = 'k'\n"
            "os.environ['DAYTONA_API_URL'] = 'http://127.0.0.1:9/api'\n"
            "os.environ['DAYTONA_USE_DEPRECATED_POLLING'] = 'true'\n"
            "import warnings\n"
            "warnings.simplefilter('ignore', DeprecationWarning)\n"
            "from poolkeeper_daytona import daytona_client\n"
            "import daytona\n"
            "assert isinstance(daytona_client(), daytona.Daytona)\n"
            "daytona_client.reset()\n"
        )
        after = _modules_after(code)

        assert "daytona._sync.daytona" in after


class TestNoThreadAtImport:
    """A process that never builds a client runs none of ours."""

    def test_importing_and_decorating_start_no_thread(self):
        """The key files are watched from the first build, not the import.

        A CPU-only job, a test run's collection or a worker about to fork
        imports the adapter and decorates its own factory: no thread.
        """
        code = (
            "import threading\n"
            "import poolkeeper_daytona\n"
            "from poolkeeper_daytona import make_daytona_singleton\n"
            "single = make_daytona_singleton(lambda: {'api_key': 'k'})\n"
            "names = [t.name for t in threading.enumerate()]\n"
            "assert names == ['MainThread'], names\n"
        )
        _run(code)
