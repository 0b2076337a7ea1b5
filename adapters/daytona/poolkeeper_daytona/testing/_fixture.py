"""The ``daytona_emulator`` pytest fixture."""

from __future__ import annotations

from typing import TYPE_CHECKING

import pytest

from poolkeeper_daytona.testing._emulator import DaytonaEmulator

if TYPE_CHECKING:
    from collections.abc import Iterator

__all__ = ["daytona_emulator"]


@pytest.fixture(name="daytona_emulator")
def daytona_emulator() -> Iterator[DaytonaEmulator]:
    """Yield a running :class:`DaytonaEmulator` with no faults injected.

    The emulator stops (joining its thread, bounded) when the test ends.
    Tests that need faults build their own: ``with DaytonaEmulator(...)``.
    """
    with DaytonaEmulator(max_lifetime=300.0) as emulator:
        yield emulator
