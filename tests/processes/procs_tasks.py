"""Tasks for the multiprocessing tests, importable by name in every worker.

Each task waits at a barrier with as many parties as the pool has workers.
A worker blocked there cannot take another task, so every round of tasks
runs exactly one task in each worker, whatever the scheduler does.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from procs_client import RecordingClient
from procs_env import STEP

import poolkeeper
from poolkeeper import process_singleton

if TYPE_CHECKING:
    from threading import Barrier

    from poolkeeper import ProcessSingleton


class _State:
    """This process's part in the test; set by start_worker() or the test."""

    barrier: Barrier | None = None
    log: str | None = None
    started_empty = False


state = _State()


@process_singleton
def CLIENT() -> RecordingClient:  # noqa: N802 -- a module-level singleton.
    """Build a client that logs its closes to this process's log file."""
    return RecordingClient(state.log)


class Report(NamedTuple):
    """What one task saw of the singleton in its worker."""

    pid: int
    client_id: int
    builder_pid: int
    builds: int
    # The unpickled singleton argument is this process's CLIENT.
    is_own_singleton: bool
    # No client was live when the worker started (nothing inherited).
    started_empty: bool


def start_worker(barrier: Barrier, log: str) -> None:
    """Pool initializer: keep the barrier and log, note any live client."""
    state.barrier = barrier
    state.log = log
    state.started_empty = CLIENT.current() is None


def _next_round() -> None:
    assert state.barrier is not None, "start_worker() did not run"
    state.barrier.wait(STEP)


def report(single: ProcessSingleton[RecordingClient], task: int) -> Report:
    """Call the singleton passed in (by reference) and describe its client."""
    _next_round()
    client = single()
    return Report(
        pid=os.getpid(),
        client_id=id(client),
        builder_pid=client.pid,
        builds=single.statistics().builds,
        is_own_singleton=single is CLIENT,
        started_empty=state.started_empty,
    )


def shut_down(task: int) -> int:
    """Close this worker's clients as at its end of life; return its pid."""
    _next_round()
    poolkeeper.close_all()
    return os.getpid()
