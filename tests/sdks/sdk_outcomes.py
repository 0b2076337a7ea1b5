"""What the 128-thread tests measured: the source of the threads page's table.

Each such test calls :func:`record` with one row: what it shared (labels)
and what it counted. A run with ``RECORD_THREAD_OUTCOMES=1`` writes the
rows it measured into ``docs/threads/outcomes.json`` (at the session's
end, see conftest.py), and ``docs/threads/render.py`` renders the table
that the page includes from that file. Every other run checks each row
against the committed one, in its categories only: each count zero or
not, connections within the pool or not, the labels equal. So the page
cannot say "0" where this run measured more, nor the reverse, while the
numbers that vary from run to run stay those of the run that wrote it.
"""

from __future__ import annotations

import importlib.util
import json
import os
import platform
import sys
from importlib import metadata
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
OUTCOMES = ROOT / "docs" / "threads" / "outcomes.json"
RENDER = ROOT / "docs" / "threads" / "render.py"
RECORD = os.environ.get("RECORD_THREAD_OUTCOMES", "") not in ("", "0")
#: The SDKs whose versions the file records.
SDKS = ("requests", "urllib3", "httpx", "openai", "boto3", "redis", "grpcio")

#: The rows this run measured, by name.
measured: dict[str, dict[str, object]] = {}


def render_module():
    """Import docs/threads/render.py (it is no package)."""
    spec = importlib.util.spec_from_file_location("threads_render", RENDER)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def record(name, **row):
    """Keep *row*; unless recording, check the committed row agrees."""
    measured[name] = row
    if RECORD:
        return
    render = render_module()
    committed = json.loads(OUTCOMES.read_text(encoding="utf-8"))["rows"]
    assert name in committed, (
        f"{name} is not in {OUTCOMES.name}: run the SDK suite with "
        "RECORD_THREAD_OUTCOMES=1, then docs/threads/render.py"
    )
    assert render.categories(committed[name]) == render.categories(row), (
        f"{name}: the page's table says {committed[name]}, this run "
        f"measured {row}; record the outcomes again"
    )


def write():
    """Merge this run's rows into the committed file (recording runs)."""
    if not (RECORD and measured):
        return
    data = {"rows": {}}
    if OUTCOMES.exists():
        data = json.loads(OUTCOMES.read_text(encoding="utf-8"))
    data["rows"].update(measured)
    installed = {d.metadata["Name"].lower() for d in metadata.distributions()}
    versions = {
        name: metadata.version(name) for name in SDKS if name in installed
    }
    data["run"] = {
        "python": platform.python_version(),
        "platform": sys.platform,
        "sdks": versions,
    }
    data["rows"] = dict(sorted(data["rows"].items()))
    OUTCOMES.parent.mkdir(parents=True, exist_ok=True)
    OUTCOMES.write_text(
        json.dumps(data, indent=2, sort_keys=True) + "\n", encoding="utf-8"
    )
