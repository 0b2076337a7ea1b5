"""A client that records which process built it and which closed it."""

from __future__ import annotations

import os
from pathlib import Path


class RecordingClient:
    """A fake SDK client whose close() is visible from every process.

    A forked child holds a *copy* of its parent's client, so a close in
    the child would never show in the parent's memory. Each close()
    therefore also appends ``"<closer pid> <builder pid>"`` to a shared
    log file, where the parent can find a child closing its client.
    """

    def __init__(self, log: str | None = None) -> None:
        self.pid = os.getpid()
        self.closes: list[int] = []
        self._log = log

    def close(self) -> None:
        """Record the closing process in memory and in the log file."""
        self.closes.append(os.getpid())
        if self._log is not None:
            # One short O_APPEND write: lines from processes never mix.
            with Path(self._log).open("a", encoding="utf-8") as log:
                log.write(f"{os.getpid()} {self.pid}\n")


def read_close_log(path: Path) -> list[tuple[int, int]]:
    """Return the sorted ``(closer pid, builder pid)`` pairs in *path*."""
    lines = path.read_text(encoding="utf-8").split()
    pids = [int(pid) for pid in lines]
    return sorted(zip(pids[::2], pids[1::2], strict=True))
