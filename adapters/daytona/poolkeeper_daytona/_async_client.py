"""A process- and loop-wide ``daytona.AsyncDaytona``, closed completely."""

from __future__ import annotations

import asyncio
import contextlib
from typing import TYPE_CHECKING, Final

from poolkeeper import process_singleton

from poolkeeper_daytona._client import _KEY, _build
from poolkeeper_daytona._close import log_failure
from poolkeeper_daytona._guard import unrecognised
from poolkeeper_daytona._sdk import require_sdk
from poolkeeper_daytona._transport import is_transport_failure

if TYPE_CHECKING:
    import daytona

__all__ = ["aclose_daytona", "async_daytona_client"]

_SHUTDOWN_SECONDS: Final = 5.0


async def aclose_daytona(client: daytona.AsyncDaytona) -> None:
    """Close a ``daytona.AsyncDaytona`` and stop its Socket.IO reconnects.

    Runs the SDK's own ``close()`` (its aiohttp session, subscriptions and
    event dispatcher), then shuts down the dispatcher's ``socketio``
    client, which ``close()`` misses while a reconnect loop is sleeping.
    Idempotent; failures are logged on ``poolkeeper.daytona``, never
    raised. Must run on the loop the client was built on.

    Args:
        client: The client to close; unusable afterwards.

    .. versionadded:: 0.1.0
    """
    dispatcher = getattr(client, "_event_dispatcher", None)
    sio = getattr(dispatcher, "_sio", None)
    try:
        await client.close()  # type: ignore[no-untyped-call]
    except Exception as exc:  # noqa: BLE001 -- logged; the steps below run.
        log_failure("AsyncDaytona.close() failed.", exc)
    except asyncio.CancelledError:
        if not _sdk_task_cancelled(sio):
            raise
        # At a loop's end asyncio.run() cancels every task before the
        # loop's shutdown closes this client: close() re-raises the
        # cancellation of the Socket.IO read loop from its last step (the
        # dispatcher's disconnect), after its HTTP sessions were closed.
        # This close was not cancelled: the steps below run.
    if dispatcher is None:
        return
    if sio is None:
        sio = getattr(dispatcher, "_sio", None)
    shutdown = getattr(sio, "shutdown", None)
    if sio is not None and shutdown is None:
        unrecognised("socketio.AsyncClient.shutdown")
        return
    if shutdown is not None:
        with contextlib.suppress(TimeoutError, asyncio.TimeoutError):
            await asyncio.wait_for(shutdown(), _SHUTDOWN_SECONDS)


def _sdk_task_cancelled(sio: object) -> bool:
    """Whether a CancelledError came from the SDK's cancelled read loop.

    Not from the task running the close: that one is cancelled by its
    caller (Python 3.11+ counts it: ``Task.cancelling()``).
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if callable(cancelling) and cancelling():
        return False
    reader = getattr(getattr(sio, "eio", None), "read_loop_task", None)
    cancelled = getattr(reader, "cancelled", None)
    return callable(cancelled) and bool(cancelled())


@process_singleton(
    key=_KEY, close=aclose_daytona, retire_on=is_transport_failure
)
async def async_daytona_client() -> daytona.AsyncDaytona:
    """Return the running loop's ``daytona.AsyncDaytona``, from the env.

    Configured exactly like :data:`~poolkeeper_daytona.daytona_client`
    (``DAYTONA_API_KEY``, the key file, ``DAYTONA_API_URL``, …) and rebuilt
    when any of it changes. One client per process and event loop; a
    retired client is closed with :func:`aclose_daytona` on its own loop.
    A broken connection under ``async with async_daytona_client.lease()``
    retires the client, as for ``daytona_client``
    (:func:`~poolkeeper_daytona.is_transport_failure`).

    Raises:
        DaytonaCredentialsError: If no credentials are found.
        ModuleNotFoundError: If the ``daytona`` package is not installed.
        ImportError: If the ``daytona`` module lacks ``AsyncDaytona`` (a
            test's stand-in).

    .. versionadded:: 0.1.0
    """
    require_sdk("async_daytona_client", "AsyncDaytona")
    from daytona import AsyncDaytona  # noqa: PLC0415 -- optional SDK.

    return _build(AsyncDaytona, "async_daytona_client")
