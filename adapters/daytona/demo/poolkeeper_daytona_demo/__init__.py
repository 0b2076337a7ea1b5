"""The incident and its fix, live: ``make demo``, not part of the library.

``python -m poolkeeper_daytona_demo demo`` runs the incident's create loop
against the Daytona emulator, a client per attempt and then
``daytona_client()``, and exits 1 if the pooled phase's fds grow. It is a
small package of its own beside the adapter (``adapters/daytona/demo/``),
installed only in the demo's venv: the ``poolkeeper-daytona`` wheel ships
neither the demo nor a console script.

``main(argv)`` runs the same command line in-process (``main(["demo",
"--threads", "4"])``), for a program that watches the process while the
demo runs: its metrics, its descriptors.
"""

from __future__ import annotations

from poolkeeper_daytona_demo._cli import main

__all__ = ["main"]
