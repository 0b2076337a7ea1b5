"""A task and an actor for the Ray tests; importable by name in workers.

Nothing here imports Ray: the test wraps these with ``ray.remote``, and
Ray's pickler then names them, and the singleton, by module and name.
"""

from __future__ import annotations

import os
from typing import TYPE_CHECKING, NamedTuple

from procs_client import RecordingClient

from poolkeeper import process_singleton

if TYPE_CHECKING:
    from poolkeeper import ProcessSingleton


@process_singleton
def CLIENT() -> RecordingClient:  # noqa: N802 -- a module-level singleton.
    """Build a client in whichever Ray worker first needs one."""
    return RecordingClient()


class Report(NamedTuple):
    """What one call saw of the singleton in its worker process."""

    pid: int
    client_id: int
    builder_pid: int
    builds: int
    # The singleton Ray unpickled is this process's CLIENT.
    is_own_singleton: bool


def report(single: ProcessSingleton[RecordingClient]) -> Report:
    """Call the singleton passed in (by reference) and describe its client."""
    client = single()
    return Report(
        pid=os.getpid(),
        client_id=id(client),
        builder_pid=client.pid,
        builds=single.statistics().builds,
        is_own_singleton=single is CLIENT,
    )


class Holder:
    """An actor that keeps the singleton it was constructed with."""

    def __init__(self, single: ProcessSingleton[RecordingClient]) -> None:
        self.single = single

    def report(self) -> Report:
        """Describe the client of the singleton given at construction."""
        return report(self.single)

    def report_arg(self, single: ProcessSingleton[RecordingClient]) -> Report:
        """Describe the client of the singleton passed to this call."""
        return report(single)
