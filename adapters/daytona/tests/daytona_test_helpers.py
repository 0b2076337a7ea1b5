"""Probes shared by the adapter's tests."""

from __future__ import annotations

import gc
import os

from poolkeeper_daytona.testing import DaytonaEmulator


def fd_count() -> int:
    """Return the number of open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))  # noqa: PTH208 -- a count.


def settle() -> None:
    """Collect garbage, so only resources something still holds remain."""
    gc.collect()
    gc.collect()


def wait_for(predicate, timeout: float = 5.0) -> bool:
    """Poll *predicate* for at most *timeout* seconds."""
    return DaytonaEmulator.wait_until(predicate, timeout)
