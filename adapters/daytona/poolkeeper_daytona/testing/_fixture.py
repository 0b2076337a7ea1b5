"""The ``daytona_emulator`` and ``reset_singletons`` pytest fixtures."""

from __future__ import annotations

from typing import TYPE_CHECKING

import poolkeeper
import pytest

if TYPE_CHECKING:
    from collections.abc import Iterator

    from poolkeeper_daytona.testing._emulator import DaytonaEmulator

__all__ = ["daytona_emulator", "reset_singletons"]


@pytest.fixture(name="daytona_emulator")
def daytona_emulator() -> Iterator[DaytonaEmulator]:
    """Yield a running :class:`DaytonaEmulator` with no faults injected.

    The emulator stops (joining its thread, bounded) when the test ends.
    Tests that need faults build their own: ``with DaytonaEmulator(...)``.
    """
    # Imported here: reset_singletons works without aiohttp and socketio.
    from poolkeeper_daytona.testing import DaytonaEmulator  # noqa: PLC0415

    with DaytonaEmulator(max_lifetime=300.0) as emulator:
        yield emulator


@pytest.fixture(name="reset_singletons")
def reset_singletons() -> Iterator[None]:
    """Close every singleton's client before and after the test.

    Calls :func:`poolkeeper.close_all` on both sides, so no client built in
    one test (from a fake SDK module, an emulator, an override's factory) is
    seen by another. Build counters are per process and keep counting:
    compare ``statistics().builds`` with its value at the start of a test.
    Use it as ``@pytest.mark.usefixtures("reset_singletons")`` or make an
    autouse fixture of your own that requests it.

    .. versionadded:: 0.1.0
    """
    poolkeeper.close_all()
    yield
    poolkeeper.close_all()
