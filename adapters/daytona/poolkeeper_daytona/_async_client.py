"""A process- and loop-wide ``daytona.AsyncDaytona``, closed completely."""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Final

from poolkeeper import process_singleton

from poolkeeper_daytona._client import _KEY, _build
from poolkeeper_daytona._close import (
    connected_clients,
    log_failure,
    socketio_clients_of,
    unlink,
)
from poolkeeper_daytona._guard import unrecognised
from poolkeeper_daytona._sdk import require_sdk
from poolkeeper_daytona._transport import is_transport_failure

if TYPE_CHECKING:
    import daytona

__all__ = ["aclose_daytona", "async_daytona_client"]

_SHUTDOWN_SECONDS: Final = 5.0


async def aclose_daytona(client: daytona.AsyncDaytona) -> None:
    """Close a ``daytona.AsyncDaytona`` and stop its Socket.IO reconnects.

    Lets the Socket.IO connect begun at the client's build end (bounded),
    runs the SDK's own ``close()`` (its aiohttp session, subscriptions and
    event dispatcher), then shuts down the dispatcher's ``socketio``
    client, which ``close()`` misses while a reconnect loop is sleeping,
    and any other of its clients still in python-socketio's or
    python-engineio's global registries; it closes their websockets and
    ends an engine.io client whose disconnect was cut short (at a loop's
    end, by the cancellation of its read loop). Idempotent; failures are
    logged on ``poolkeeper.daytona``, never raised. Must run on the loop
    the client was built on.

    Args:
        client: The client to close; unusable afterwards.

    .. versionadded:: 0.1.0
    """
    dispatcher = getattr(client, "_event_dispatcher", None)
    await _connected_or_failed(dispatcher)
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
        # dispatcher's disconnect), after its HTTP sessions were closed
        # (older SDKs: of a task that step cancelled). This close was not
        # cancelled: the steps below run.
    if dispatcher is None:
        return
    if sio is None:
        sio = getattr(dispatcher, "_sio", None)
    # The dispatcher's Socket.IO client, and any of its clients still in
    # python-socketio's or python-engineio's global registries.
    clients = {id(c): c for c in [sio, *socketio_clients_of(dispatcher)]}
    clients.pop(id(None), None)
    for each in clients.values():
        if not await _stop_socketio(each):
            return


async def _stop_socketio(sio: object) -> bool:
    """Stop *sio* and everything under it; whether it was recognised."""
    shutdown = getattr(sio, "shutdown", None)
    if shutdown is None:
        unrecognised("socketio.AsyncClient.shutdown")
        return False
    try:
        await asyncio.wait_for(shutdown(), _SHUTDOWN_SECONDS)
    except (TimeoutError, asyncio.TimeoutError):
        pass  # What it left open is closed below.
    except Exception as exc:  # noqa: BLE001 -- logged; the steps below run.
        log_failure("Shutting down the Socket.IO client failed.", exc)
    await _close_websocket(sio)
    await _end_engineio(getattr(sio, "eio", None))
    return True


async def _end_engineio(eio: object) -> None:
    """End an engine.io client whose disconnect was cut short.

    At a loop's end ``asyncio.run()`` cancels every task, the engine.io
    read loop too, before the loop's shutdown runs a close still owed (a
    client retired while sandboxes made from it lived, or retired by the
    loop's end). python-engineio's disconnect then stops at its wait for
    that read loop: the client stays "disconnecting", listed in
    python-engineio's global ``connected_clients`` for the rest of the
    process, its aiohttp session never closed (measured: every such close,
    and now and then its websocket too, still connected). Ending it again
    resets it: its session is closed, and it is unlisted here.
    """
    state = getattr(eio, "state", None)
    disconnect = getattr(eio, "disconnect", None)
    if state in (None, "disconnected") or not callable(disconnect):
        unlink(connected_clients(), eio)
        return
    try:
        # abort: never wait for the read loop again (it is cancelled).
        await asyncio.wait_for(disconnect(abort=True), _SHUTDOWN_SECONDS)
    except Exception as exc:  # noqa: BLE001 -- logged (a timeout too).
        log_failure("Ending the engine.io client failed.", exc)
    unlink(connected_clients(), eio)


async def _connected_or_failed(dispatcher: object) -> None:
    """Let the Socket.IO connect that the client started at its build end.

    ``AsyncDaytona()`` starts connecting its event dispatcher in a task;
    ``close()`` cancels that task if it is still running. A cancellation
    that lands just after the server accepted the websocket upgrade leaves
    that connection open, unreleased, until the garbage collector finds it
    (aiohttp then warns "Unclosed connection"): measured against the
    emulator, 9 of 900 closes made 0 to 50 ms after the build. The
    SDK bounds its connect (5 s); this wait is bounded the same, and a
    connect still running after it is cancelled by ``close()`` as before.
    """
    task = getattr(dispatcher, "_connect_task", None)
    if (
        isinstance(task, asyncio.Task)
        and not task.done()
        and task.get_loop() is asyncio.get_running_loop()
    ):
        await asyncio.wait([task], timeout=_SHUTDOWN_SECONDS)


async def _close_websocket(sio: object) -> None:
    """Close the engine.io websocket of *sio* if its disconnect left it open.

    python-engineio's disconnect skips the websocket's close when its read
    loop ended first (seen with daytona 0.203.0 against the emulator, one
    close in a few dozen): the client reports "disconnected" while the
    websocket and its aiohttp connection stay open, and aiohttp warns
    "Unclosed connection" once they are collected. Newer SDKs wait for
    that close themselves; then there is nothing left to do here.
    """
    ws = getattr(getattr(sio, "eio", None), "ws", None)
    close = getattr(ws, "close", None)
    if getattr(ws, "closed", True) or not callable(close):
        return
    try:
        await asyncio.wait_for(close(), _SHUTDOWN_SECONDS)
    except Exception as exc:  # noqa: BLE001 -- logged (a timeout too).
        log_failure("Closing the Socket.IO websocket failed.", exc)


def _sdk_task_cancelled(sio: object) -> bool:
    """Whether a CancelledError came from one of the SDK's own tasks.

    Not from the task running the close: that one is cancelled by its
    caller. Python 3.11+ counts such a cancellation (``Task.cancelling()``),
    so a CancelledError with none counted is the SDK's: ``close()``
    re-raises the cancellation of its Socket.IO read loop (cancelled by
    ``asyncio.run()`` at a loop's end), or, in older SDKs (0.203.0), of a
    disconnect task it cancelled itself. On 3.10 only the read loop's is
    recognised.
    """
    task = asyncio.current_task()
    cancelling = getattr(task, "cancelling", None)
    if callable(cancelling):
        return not cancelling()
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
