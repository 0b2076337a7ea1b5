"""Release what a sync ``daytona.Daytona`` holds; neuter it after fork.

The sync SDK client has no ``close()``. Everything here reaches private
SDK attributes, each looked up with ``getattr`` and reported through the
version guard when missing, in the order measured to leave no socket,
thread or timer behind (see the adapter's README).
"""

from __future__ import annotations

import contextlib
import functools
import logging
import sys
import threading
import time
import weakref
from typing import TYPE_CHECKING, Any, Final

from poolkeeper import release_sockets

from poolkeeper_daytona._guard import is_sdk_object, unrecognised
from poolkeeper_daytona._reuse import guard_reuse

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    # Reports a missing internal: the guard for a real client, else DEBUG.
    Report = Callable[[str], None]

__all__ = ["close_daytona"]

_log = logging.getLogger("poolkeeper.daytona")


def log_failure(text: str, error: BaseException) -> None:
    """Log *text* with *error*'s type and where it was raised, at WARNING.

    Never the error's message: the SDK's errors carry URLs and headers.
    With DEBUG enabled on ``poolkeeper.daytona``, a DEBUG record follows
    with the error itself (message and traceback), as poolkeeper's own
    failure records do.
    """
    tb = error.__traceback__
    while tb is not None and tb.tb_next is not None:
        tb = tb.tb_next
    where = "an unknown place"
    if tb is not None:
        code = tb.tb_frame.f_code
        name = code.co_filename.replace("\\", "/").rpartition("/")[2]
        where = f"{name}:{tb.tb_lineno} in {code.co_name}"
    kind = type(error).__name__
    _log.warning("%s (%s raised at %s)", text, kind, where, stacklevel=2)
    if _log.isEnabledFor(logging.DEBUG):
        _log.debug(
            "The %s of the warning above, with its message and traceback.",
            kind,
            exc_info=error,
            stacklevel=2,
        )


_MISSING: Final = object()
_MIN_WAIT: Final = 0.05
_LOCK_WAIT: Final = 1.0
_POOL_OWNERS: Final = ("_api_client", "_toolbox_api_client")

_closed_lock = threading.Lock()
_closed: weakref.WeakSet[Any] = weakref.WeakSet()


def _registry(module: str, name: str) -> list[Any]:
    """Return a global client registry of python-socketio or -engineio.

    Read from ``sys.modules``, never imported: importing socketio costs
    hundreds of modules, and if the SDK never imported it no client of
    it can exist. Importing inside the at-fork hook could also deadlock.
    """
    registry = getattr(sys.modules.get(module), name, None)
    return registry if isinstance(registry, list) else []


def _reconnecting_clients() -> list[Any]:
    return _registry("socketio.base_client", "reconnecting_clients")


def connected_clients() -> list[Any]:
    return _registry("engineio.base_client", "connected_clients")


def close_daytona(client: object, *, timeout: float = 5.0) -> None:
    """Release the sockets, threads and timers held by a ``daytona.Daytona``.

    Steps, in the order that released everything when measured: shut down
    the subscription manager; mark the event dispatcher closed and wait for
    its connect thread; disable Socket.IO reconnection and disconnect; stop
    any reconnect loop and orphaned Socket.IO client of that dispatcher
    (found in python-socketio's and python-engineio's global registries);
    cancel its leftover idle timers; clear both urllib3 pool managers and
    close their pools; close the ``httpx`` client; shut down the tracer
    provider if it owns one.

    Idempotent and never raises: a failing step is logged at WARNING on the
    ``poolkeeper.daytona`` logger and the next step still runs. A missing
    internal of a real SDK client is reported once per process as a
    :class:`DaytonaInternalsWarning`; on anything else (a test double) it
    is logged at DEBUG only, and the once-per-process warning is kept for
    a real client. The client must not be used afterwards: its first use
    issues a :class:`~poolkeeper_daytona.ClosedDaytonaUsedWarning`.

    Args:
        client: A ``daytona.Daytona`` (anything else is released on a
            best-effort basis).
        timeout: Seconds to wait, in total and roughly, for the SDK's
            background threads to finish.

    .. versionadded:: 0.1.0
    """
    try:
        if _mark_closed(client):
            report = unrecognised if is_sdk_object(client) else _not_sdk
            _release(client, time.monotonic() + timeout, report)
    except Exception as exc:  # noqa: BLE001 - close_daytona never raises.
        log_failure("Unexpected failure closing a Daytona client.", exc)


def _after_fork(client: object) -> None:
    """Make a client inherited from the parent inert in a forked child.

    Sends nothing on the parent's connections: no Socket.IO disconnect, no
    websocket close frame, no TLS alert, and takes none of the SDK's locks
    (a parent thread may have held one at fork time). It marks the
    dispatcher and the subscription manager closed, disables reconnection,
    unlinks the Socket.IO clients from the global registries (so a SIGINT
    handler in the child cannot disconnect the parent's session), and
    releases the child's copies of the pooled and websocket sockets with
    :func:`poolkeeper.release_sockets`: the parent's ``close()`` then ends
    the connections even while the child lives. poolkeeper keeps the
    client referenced in the child (its list of abandoned clients), so no
    finalizer runs on it there.

    It runs in the at-fork hook, so it logs and warns nothing; an error
    propagates to poolkeeper, which reports it on the singleton's next use.

    Args:
        client: The inherited ``daytona.Daytona``.
    """
    dispatcher = getattr(client, "_event_dispatcher", None)
    if dispatcher is not None:
        dispatcher._closed = True
        for sio in socketio_clients_of(dispatcher):
            sio.reconnection = False
            unlink(_reconnecting_clients(), sio)
            unlink(connected_clients(), getattr(sio, "eio", None))
            # An orphaned client (found in the registries) is not reachable
            # from the Daytona client: its websocket is released here.
            release_sockets(sio)
    manager = getattr(client, "_subscription_manager", None)
    if manager is not None:
        manager._closed = True
    release_sockets(client)


def _mark_closed(client: object) -> bool:
    """Return True the first time *client* is seen."""
    with _closed_lock:
        try:
            if client in _closed:
                return False
            _closed.add(client)
        except TypeError:  # Not weak-referenceable: every step is idempotent.
            pass
    return True


@contextlib.contextmanager
def _step(what: str) -> Iterator[None]:
    try:
        yield
    except Exception as exc:  # noqa: BLE001 - a failed step is logged.
        log_failure(f"Closing a Daytona client: {what} failed.", exc)


def _not_sdk(what: str) -> None:
    # A test double lacks internals by design: no DaytonaInternalsWarning,
    # and the once-per-process warning stays for a real client.
    _log.debug("Closing a non-SDK object: it has no %s.", what)


def _attr(obj: object, name: str, label: str, report: Report) -> Any:  # noqa: ANN401
    value = getattr(obj, name, _MISSING)
    if value is _MISSING:
        report(label)
        return None
    return value


def _join(thread: object, deadline: float) -> None:
    if not isinstance(thread, threading.Thread):
        return
    if thread is threading.current_thread() or not thread.is_alive():
        return
    thread.join(max(_MIN_WAIT, deadline - time.monotonic()))


def _release(client: object, deadline: float, report: Report) -> None:
    manager = _attr(
        client,
        "_subscription_manager",
        "Daytona._subscription_manager",
        report,
    )
    if manager is not None:
        _shutdown_subscriptions(manager, deadline, report)
    dispatcher = _attr(
        client, "_event_dispatcher", "Daytona._event_dispatcher", report
    )
    if dispatcher is not None:
        _close_dispatcher(dispatcher, deadline, report)
    _release_pools(client, report)
    http = _attr(client, "_http_client", "Daytona._http_client", report)
    close = getattr(http, "close", None)
    if callable(close):
        with _step("httpx client close"):
            close()
    # Only a provider set on the instance is this client's own; the class
    # attribute is a None default.
    provider = getattr(client, "__dict__", {}).get("_tracer_provider")
    shutdown = getattr(provider, "shutdown", None)
    if callable(shutdown):
        with _step("tracer provider shutdown"):
            shutdown()


def _release_pools(client: object, report: Report) -> None:
    """Guard the client's urllib3 pool managers, then close their pools."""
    managers: list[object] = []
    clears: list[Callable[[], None]] = []
    for owner in _POOL_OWNERS:
        api = _attr(client, owner, f"Daytona.{owner}", report)
        pools = getattr(
            getattr(api, "rest_client", None), "pool_manager", None
        )
        if pools is not None:
            managers.append(pools)
        clear = getattr(pools, "clear", None)
        if api is not None and not callable(clear):
            report(f"Daytona.{owner}.rest_client.pool_manager")
        elif callable(clear):
            clears.append(functools.partial(_clear, owner, pools, clear))
    if report is unrecognised:
        # A real client: its reuse warns. Guarded before its connections
        # close, so that whoever sees them closed sees the guard too.
        guard_reuse(managers)
    for clear_pools in clears:
        clear_pools()


def _clear(owner: str, manager: object, clear: Callable[[], None]) -> None:
    """Clear a urllib3 ``PoolManager`` and close the pools it held."""
    held = _pools_of(manager)
    with _step(f"{owner} pool clear"):
        clear()
    for pool in held:
        with _step(f"{owner} pool close"):
            pool.close()


def _pools_of(manager: object) -> list[Any]:
    """The connection pools a urllib3 ``PoolManager`` holds now.

    urllib3 2's ``PoolManager.clear()`` only forgets them: a pool's idle
    connections close when the pool is garbage-collected, and an SDK
    error or a response that a caller keeps holds its pool (their
    ``pool`` and ``_pool``). So they are closed here, after the clear
    (urllib3 1's clear closed them already: a second close is a no-op).
    A connection in use is closed when it is handed back.
    """
    container = getattr(manager, "pools", None)
    keys = getattr(container, "keys", None)
    get = getattr(container, "get", None)
    if not callable(keys) or not callable(get):
        return []
    found = [get(key) for key in list(keys())]
    return [pool for pool in found if callable(getattr(pool, "close", None))]


def _shutdown_subscriptions(
    manager: object, deadline: float, report: Report
) -> None:
    # Before the dispatcher: unsubscribing on a closed dispatcher would start
    # a fresh 30 s idle timer that nothing cancels.
    shutdown = getattr(manager, "shutdown", None)
    if not callable(shutdown):
        report("Daytona._subscription_manager.shutdown")
        return
    with _step("subscription manager shutdown"):
        shutdown()
    _join(getattr(manager, "_worker", None), deadline)


def _close_dispatcher(
    dispatcher: object, deadline: float, report: Report
) -> None:
    if not hasattr(dispatcher, "_closed"):
        report("SyncEventDispatcher._closed")
    lock = getattr(dispatcher, "_lock", None)
    acquire = getattr(lock, "acquire", None)
    held = bool(acquire(timeout=_LOCK_WAIT)) if callable(acquire) else False
    try:
        # Stops ensure_connected() and subscribe() from starting anything
        # new, and makes a connect in flight disconnect itself.
        dispatcher._closed = True  # type: ignore[attr-defined]
    finally:
        if held:
            lock.release()  # type: ignore[union-attr]
    # Disconnecting while engine.io is still finishing the background
    # connect can fail inside engine.io: let that thread end first.
    _join(getattr(dispatcher, "_bg_thread", None), deadline)
    clients = socketio_clients_of(dispatcher)
    for sio in clients:
        sio.reconnection = False
    disconnect = getattr(dispatcher, "disconnect", None)
    if callable(disconnect):
        with _step("event dispatcher disconnect"):
            disconnect()
    else:
        report("SyncEventDispatcher.disconnect")
    # Rescan: the dispatcher's disconnect may have dropped a client from
    # its own attributes while a reconnect loop still holds it.
    for sio in {
        id(c): c for c in [*clients, *socketio_clients_of(dispatcher)]
    }.values():
        with _step("socket.io client stop"):
            _stop_socketio(sio, deadline)
    for timer in threading.enumerate():
        function = getattr(timer, "function", None)
        if (
            isinstance(timer, threading.Timer)
            and getattr(function, "__self__", None) is dispatcher
        ):
            timer.cancel()
            _join(timer, deadline)


def socketio_clients_of(dispatcher: object) -> list[Any]:
    """The dispatcher's current and orphaned Socket.IO clients (any kind)."""
    found: dict[int, Any] = {}
    current = getattr(dispatcher, "_sio", None)
    if current is not None:
        found[id(current)] = current
    candidates = list(_reconnecting_clients())
    for eio in list(connected_clients()):
        handler = getattr(eio, "handlers", {}).get("connect")
        candidates.append(getattr(handler, "__self__", None))
    for sio in candidates:
        if sio is not None and _belongs(sio, dispatcher):
            found[id(sio)] = sio
    return list(found.values())


def _belongs(sio: object, dispatcher: object) -> bool:
    # The dispatcher registers closures over itself as the client's
    # connect/disconnect handlers: that is the only link back to it.
    handlers = getattr(sio, "handlers", {}).get("/", {})
    for handler in list(handlers.values()):
        for cell in getattr(handler, "__closure__", None) or ():
            with contextlib.suppress(ValueError):  # Empty cell.
                if cell.cell_contents is dispatcher:
                    return True
    return False


def _stop_socketio(sio: Any, deadline: float) -> None:  # noqa: ANN401
    sio.reconnection = False
    abort = getattr(sio, "_reconnect_abort", None)
    if abort is not None:
        abort.set()
    task = getattr(sio, "_reconnect_task", None)
    _join(task, deadline)
    eio = getattr(sio, "eio", None)
    # A reconnect attempt already in flight when the abort was set can
    # still succeed: disconnect whatever is connected now.
    if (
        getattr(sio, "connected", False)
        or getattr(eio, "state", None) == "connected"
    ):
        sio.disconnect()
    if isinstance(task, threading.Thread) and task.is_alive():
        return  # Its own exit path unregisters it; never race that.
    unlink(_reconnecting_clients(), sio)
    if getattr(eio, "state", None) == "disconnected":
        unlink(connected_clients(), eio)


def unlink(registry: list[Any], item: object) -> None:
    with contextlib.suppress(ValueError):
        registry.remove(item)
