"""Bounds and paths shared by the tests that run real processes."""

from __future__ import annotations

import os
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)

# Upper bound, in seconds, on one blocking step inside a worker.
STEP = 10.0
# Upper bound, in seconds, on a whole exchange with a group of workers,
# which includes starting them (an interpreter each, for spawn).
WAIT = 60.0


def child_pythonpath() -> str:
    """Return a PYTHONPATH that puts this folder first."""
    rest = os.environ.get("PYTHONPATH")
    return os.pathsep.join([HERE, rest]) if rest else HERE
