"""Lifecycle events without OpenTelemetry (issue 24): runs in every venv.

``make core-only`` has no OpenTelemetry installed; the dev venv has it,
and the subprocess blocks its import to see the same.
"""

from __future__ import annotations

import ast
import logging
import pathlib
import re
import subprocess
import sys
import textwrap

import pytest
from helpers import WAIT, Factory

from poolkeeper import process_singleton

IMPORT_CHECK = textwrap.dedent(
    """
    import sys

    class Block:
        def find_spec(self, name, path=None, target=None):
            if name == "opentelemetry" or name.startswith("opentelemetry."):
                raise ImportError("blocked: " + name)

    if sys.argv[1] == "absent":
        sys.meta_path.insert(0, Block())
    import poolkeeper

    assert not [m for m in sys.modules if m.startswith("opentelemetry")]
    single = poolkeeper.process_singleton(name="x")(object)
    single()
    single.reset()
    single()
    poolkeeper.close_all()
    print(sorted(m for m in sys.modules if m.startswith("opentelemetry")))
    """
)


def imported_after(mode: str) -> list[str]:
    """The opentelemetry modules a process holds after import and events."""
    done = subprocess.run(
        [sys.executable, "-c", IMPORT_CHECK, mode],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=True,
    )
    return list(ast.literal_eval(done.stdout.strip()))


def test_import_poolkeeper_imports_no_opentelemetry_when_absent():
    """Without the extra: nothing imported, builds and closes work."""
    assert imported_after("absent") == []


class TestNameOption:
    def test_name_is_the_singletons_name(self, caplog):
        caplog.set_level(logging.DEBUG, logger="poolkeeper")
        single = process_singleton(name="api-client")(Factory())
        assert "api-client" in repr(single)
        single()
        [built] = [
            r
            for r in caplog.records
            if getattr(r, "poolkeeper_event", None) == "built"
        ]
        assert built.poolkeeper_singleton == "api-client"
        assert built.poolkeeper_factory == "api-client"
        assert built.poolkeeper_reason == "first"
        assert built.poolkeeper_key is None  # No key.
        assert "Built api-client (generation 1" in built.getMessage()

    @pytest.mark.parametrize(
        ("name", "error"),
        [
            ("", ValueError),
            ("  ", ValueError),
            (3, TypeError),
            (b"x", TypeError),
        ],
    )
    def test_bad_name_is_refused_naming_the_factory(self, name, error):
        def make_client() -> object:
            return object()

        with pytest.raises(error, match=r"name=.*make_client"):
            process_singleton(name=name)(make_client)


DOCS = pathlib.Path(__file__).resolve().parent.parent / "docs"


def private_imports(text: str) -> list[str]:
    """Modules with a private part (``_x``) imported by *text*'s code."""
    found = []
    for block in re.findall(
        r"^```python\n(.*?)^```", text, re.MULTILINE | re.DOTALL
    ):
        for node in ast.walk(ast.parse(block)):
            if isinstance(node, ast.ImportFrom):
                names = [node.module or ""]
            elif isinstance(node, ast.Import):
                names = [alias.name for alias in node.names]
            else:
                continue
            found.extend(
                name
                for name in names
                if any(
                    part.startswith("_") and not part.startswith("__")
                    for part in name.split(".")
                )
            )
    return found


@pytest.mark.skipif(not DOCS.is_dir(), reason="needs the repository's docs")
def test_the_observability_page_uses_public_api_only():
    """Its timeline runs the demo by its public entry point (issue 24)."""
    text = (DOCS / "observability.md").read_text(encoding="utf-8")
    assert "poolkeeper_daytona_demo.main(" in text
    assert private_imports(text) == []
