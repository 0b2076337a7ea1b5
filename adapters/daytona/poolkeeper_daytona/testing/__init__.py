"""Test support: a Daytona API emulator and its pytest fixture.

``daytona_emulator`` is a pytest fixture; it is imported lazily so that the
emulator itself works without pytest installed. Use it from a conftest::

    from poolkeeper_daytona.testing import daytona_emulator

.. versionadded:: 0.1.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from poolkeeper_daytona.testing._emulator import DaytonaEmulator
from poolkeeper_daytona.testing._records import (
    ConnectionRecord,
    RequestRecord,
    SocketIOSession,
    client_id,
)

if TYPE_CHECKING:
    from poolkeeper_daytona.testing._fixture import daytona_emulator

__all__ = [
    "ConnectionRecord",
    "DaytonaEmulator",
    "RequestRecord",
    "SocketIOSession",
    "client_id",
    "daytona_emulator",
]


def __getattr__(name: str) -> Any:  # noqa: ANN401 - PEP 562 hook.
    if name == "daytona_emulator":
        from poolkeeper_daytona.testing import _fixture  # noqa: PLC0415

        return _fixture.daytona_emulator
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def __dir__() -> list[str]:
    return sorted(__all__)
