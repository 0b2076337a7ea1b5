"""Test support: a Daytona API emulator and pytest fixtures.

``daytona_emulator`` and ``reset_singletons`` are pytest fixtures; they are
imported lazily so that the emulator itself works without pytest
installed, and the emulator is imported lazily so that ``reset_singletons``
works without aiohttp and python-socketio (the ``sdk`` extra). Use them
from a conftest::

    from poolkeeper_daytona.testing import daytona_emulator, reset_singletons

.. versionadded:: 0.1.0
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from poolkeeper_daytona.testing._records import (
    ConnectionRecord,
    RequestRecord,
    SocketIOSession,
    client_id,
)

if TYPE_CHECKING:
    from poolkeeper_daytona.testing._emulator import DaytonaEmulator
    from poolkeeper_daytona.testing._fixture import (
        daytona_emulator,
        reset_singletons,
    )

__all__ = [
    "ConnectionRecord",
    "DaytonaEmulator",
    "RequestRecord",
    "SocketIOSession",
    "client_id",
    "daytona_emulator",
    "reset_singletons",
]


def __getattr__(name: str) -> Any:  # noqa: ANN401 - PEP 562 hook.
    if name == "DaytonaEmulator":
        return _emulator()
    if name in {"daytona_emulator", "reset_singletons"}:
        from poolkeeper_daytona.testing import _fixture  # noqa: PLC0415

        return getattr(_fixture, name)
    msg = f"module {__name__!r} has no attribute {name!r}"
    raise AttributeError(msg)


def _emulator() -> type[DaytonaEmulator]:
    # The emulator runs on aiohttp and python-socketio, both of the ``sdk``
    # extra: a project without the SDK still gets reset_singletons.
    try:
        from poolkeeper_daytona.testing._emulator import (  # noqa: PLC0415
            DaytonaEmulator,
        )
    except ModuleNotFoundError as exc:
        msg = (
            f"DaytonaEmulator needs {exc.name}, which is not installed: "
            "pip install 'poolkeeper-daytona[sdk]'."
        )
        raise ModuleNotFoundError(msg, name=exc.name) from exc
    globals()["DaytonaEmulator"] = DaytonaEmulator
    return DaytonaEmulator


def __dir__() -> list[str]:
    return sorted(__all__)
