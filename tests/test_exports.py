"""The public surface: small, listed, and free of SDK imports."""

from __future__ import annotations

import subprocess
import sys

import poolkeeper


class TestExports:
    def test_all_is_the_public_dir(self):
        """__all__ lists exactly the public names."""
        public = {
            name
            for name in dir(poolkeeper)
            if not name.startswith("_")
            and not isinstance(getattr(poolkeeper, name), type(sys))
        } | {"keys"}
        assert sorted(public) == sorted(poolkeeper.__all__)

    def test_all_is_sorted(self):
        """__all__ is kept sorted."""
        assert sorted(poolkeeper.__all__) == poolkeeper.__all__

    def test_names_live_in_poolkeeper(self):
        """Each exported object presents itself as poolkeeper's."""
        for name in poolkeeper.__all__:
            obj = getattr(poolkeeper, name)
            expected = "poolkeeper.keys" if name == "keys" else "poolkeeper"
            actual = getattr(obj, "__module__", None) or obj.__name__
            assert expected == actual, name

    def test_import_is_light(self):
        """import poolkeeper imports only itself, wrapt and the stdlib."""
        code = (
            "import sys; before = set(sys.modules); import poolkeeper; "
            "print(' '.join(sorted(set(sys.modules) - before)))"
        )
        out = subprocess.run(
            [sys.executable, "-c", code],
            capture_output=True,
            text=True,
            check=True,
            timeout=30,
        ).stdout.split()
        heavy = {
            "daytona",
            "httpx",
            "urllib3",
            "requests",
            "aiohttp",
            "socketio",
            "pydantic",
        }
        assert set() == heavy & {name.split(".")[0] for name in out}
        assert {n.split(".")[0] for n in out} <= {
            "poolkeeper",
            "wrapt",
        } | set(sys.stdlib_module_names)
