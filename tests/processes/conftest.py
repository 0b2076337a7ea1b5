"""Make this folder importable by name, here and in every child process."""

from __future__ import annotations

import sys
from pathlib import Path

# Worker processes unpickle tasks and singletons by module name, so the
# modules they name must be importable there too: spawn and forkserver
# children copy this sys.path; gunicorn and Ray get PYTHONPATH instead
# (procs_env.child_pythonpath()).
_HERE = str(Path(__file__).resolve().parent)
if _HERE not in sys.path:
    sys.path.insert(0, _HERE)
