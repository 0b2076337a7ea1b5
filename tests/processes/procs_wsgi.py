"""A WSGI app whose client is built at import, in the gunicorn master.

Run with ``gunicorn --preload``: the master imports this module, builds
``IMPORT_CLIENT`` and then forks its workers, which each inherit a copy.
``PK_CLOSE_LOG`` names the file every client's close() is logged to and
``PK_BARRIER_DIR`` the folder of the cross-worker barrier (see ``app``).
"""

from __future__ import annotations

import json
import os
import threading
import time
from pathlib import Path
from typing import TYPE_CHECKING
from urllib.parse import parse_qs

from procs_client import RecordingClient
from procs_env import STEP

from poolkeeper import process_singleton

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

WORKERS = int(os.environ["PK_WORKERS"])


@process_singleton
def CLIENT() -> RecordingClient:  # noqa: N802 -- a module-level singleton.
    """Build a client that logs its closes to the shared log file."""
    return RecordingClient(os.environ["PK_CLOSE_LOG"])


# The module-level call: under --preload it runs once, in the master.
IMPORTED_BY = os.getpid()
IMPORT_CLIENT = CLIENT()


def _barrier(name: str) -> bool:
    """Wait until WORKERS processes have reached the barrier *name*.

    A sync worker serves one request at a time, so WORKERS concurrent
    requests that all wait here must have landed in WORKERS different
    workers: the test sees every worker without hoping the kernel
    spreads connections.
    """
    folder = Path(os.environ["PK_BARRIER_DIR"])
    (folder / f"{name}-{os.getpid()}").touch()
    pause = threading.Event()
    deadline = time.monotonic() + STEP
    while len(list(folder.glob(f"{name}-*"))) < WORKERS:
        if time.monotonic() > deadline:
            return False
        pause.wait(0.01)
    return True


def app(
    environ: dict[str, object],
    start_response: Callable[[str, list[tuple[str, str]]], object],
) -> Iterable[bytes]:
    """Describe this worker's client; ``?round=N`` first waits for peers."""
    query = parse_qs(str(environ.get("QUERY_STRING", "")))
    if "round" in query and not _barrier(query["round"][0]):
        start_response("503 Service Unavailable", [])
        return [b"barrier timed out"]
    client = CLIENT()
    body = json.dumps(
        {
            "pid": os.getpid(),
            "client_id": id(client),
            "builder_pid": client.pid,
            "builds": CLIENT.statistics().builds,
            "imported_by": IMPORTED_BY,
            "is_import_client": client is IMPORT_CLIENT,
            "import_client_closes": IMPORT_CLIENT.closes,
        }
    ).encode()
    start_response("200 OK", [("Content-Type", "application/json")])
    return [body]
