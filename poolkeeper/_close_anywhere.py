"""Closing a client from wherever the caller runs: ``close_all()``'s path.

A sync client is closed where the caller is. An async client is closed on
its own loop: awaited there if the caller runs on it, handed to it if it
runs on another thread, run to completion on it if it is idle (on a helper
thread when the caller is inside another running loop). A close that does
not finish within ``CROSS_LOOP_CLOSE_SECONDS`` is given up and reported;
a ``BaseException`` the close raised on another thread is brought back and
raised in the caller (see ``_carry``).
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import logging
import threading
from typing import TYPE_CHECKING, Any

from poolkeeper._close import _LOOP_HINT

log = logging.getLogger("poolkeeper")

if TYPE_CHECKING:
    from poolkeeper._close import Closer
    from poolkeeper._lifecycle import Record

#: How long a close may take on another thread's loop before it is given up.
CROSS_LOOP_CLOSE_SECONDS = 30.0

# Distinct classes before Python 3.11, aliases of TimeoutError since.
_TIMEOUTS = (
    TimeoutError,
    asyncio.TimeoutError,
    concurrent.futures.TimeoutError,
)

# Closes scheduled on a loop that was running this very thread's code.
_scheduled: set[asyncio.Task[None]] = set()


def close_anywhere(closer: Closer, record: Record[Any]) -> None:
    """Close *record* from synchronous code, on its own loop if async.

    Never raises an ``Exception``: what goes wrong is logged, counted.
    """
    try:
        _close_anywhere(closer, record)
    except Exception as exc:  # noqa: BLE001 -- logged and counted.
        closer.failed(record, exc)


def _owner(
    closer: Closer, record: Record[Any]
) -> asyncio.AbstractEventLoop | None:
    """Return the open loop *record* closes on; else close or report it.

    A sync client is closed here and now; a client whose loop is gone
    is reported. Either way None is returned: nothing is left to do.
    """
    ref = record.slot.loop
    if ref is None:
        closer.close(record)
        return None
    loop: asyncio.AbstractEventLoop | None = ref()
    if loop is None or loop.is_closed():
        closer.unclosed(record, "its event loop is closed", _LOOP_HINT)
        return None
    return loop


def _close_anywhere(closer: Closer, record: Record[Any]) -> None:
    loop = _owner(closer, record)
    if loop is None:
        return
    running = _running_loop()
    if loop is running:
        # Called synchronously from the client's own loop: it cannot be
        # awaited here, so it runs as soon as control returns to it.
        task = loop.create_task(closer.aclose(record))
        _scheduled.add(task)
        task.add_done_callback(_scheduled.discard)
        return
    if loop.is_running():
        future = asyncio.run_coroutine_threadsafe(_carry(closer, record), loop)
        try:
            error = future.result(CROSS_LOOP_CLOSE_SECONDS)
        except _TIMEOUTS:
            future.cancel()
            _late(closer, record)
            return
    elif running is None:
        error = _run_idle(closer, record, loop)
    else:
        # An idle loop cannot run inside this thread's running loop.
        error = _on_helper_thread(closer, record, loop)
    _raise(closer, record, error)


def close_soon(closer: Closer, record: Record[Any]) -> None:
    """Close *record* without waiting for another thread or loop.

    For the garbage collector's clean-up, which runs on whatever thread
    allocated and must never block there: a sync client is closed here, an
    async one is handed to its loop (a running loop) or to a helper thread
    (an idle loop), and nothing waits for them. An ``Exception`` is logged
    and counted; what a close on another thread raised otherwise is logged
    there (it has no caller to reach).
    """
    try:
        loop = _owner(closer, record)
        if loop is None:
            return
        if loop is _running_loop():
            _close_anywhere(closer, record)  # A task of this loop's.
        elif loop.is_running():
            future = asyncio.run_coroutine_threadsafe(
                _carry(closer, record), loop
            )
            future.add_done_callback(
                functools.partial(_report, closer, record)
            )
        else:
            threading.Thread(
                target=_report_idle,
                args=(closer, record, loop),
                name="poolkeeper-close",
            ).start()
    except Exception as exc:  # noqa: BLE001 -- logged and counted.
        closer.failed(record, exc)


def _report(
    closer: Closer,
    record: Record[Any],
    future: concurrent.futures.Future[BaseException | None],
) -> None:
    # A close close_soon() handed to another loop ended: what it brought
    # back was counted there; it is logged, as no caller awaits it.
    try:
        error = (
            asyncio.CancelledError() if future.cancelled() else future.result()
        )
    except BaseException as exc:  # noqa: BLE001 -- logged below.
        error = exc
    if isinstance(error, asyncio.CancelledError):
        error = None
        closer.unclosed(
            record,
            "its close was cancelled on its event loop",
            "",
            count=False,
        )
    if error is not None:
        log.warning(
            "Closing a collected %s singleton's client raised %r; it was "
            "dropped.",
            closer.life.name,
            error,
            exc_info=error,
        )


def _report_idle(
    closer: Closer, record: Record[Any], loop: asyncio.AbstractEventLoop
) -> None:
    future: concurrent.futures.Future[BaseException | None] = (
        concurrent.futures.Future()
    )
    try:
        future.set_result(_run_idle(closer, record, loop))
    except BaseException as exc:  # noqa: BLE001 -- logged by _report.
        future.set_result(exc)
    _report(closer, record, future)


async def aclose_anywhere(closer: Closer, record: Record[Any]) -> None:
    """Close *record* from a coroutine, on its own loop if async.

    Never raises an ``Exception``: what goes wrong is logged, counted.
    """
    try:
        await _aclose_anywhere(closer, record)
    except Exception as exc:  # noqa: BLE001 -- logged and counted.
        closer.failed(record, exc)


async def _aclose_anywhere(closer: Closer, record: Record[Any]) -> None:
    loop = _owner(closer, record)
    if loop is None:
        return
    if loop is asyncio.get_running_loop():
        await closer.aclose(record)
        return
    if loop.is_running():
        future = asyncio.run_coroutine_threadsafe(_carry(closer, record), loop)
        waited: Any = asyncio.wrap_future(future)
    else:
        waited = asyncio.to_thread(_run_idle, closer, record, loop)
    try:
        error = await asyncio.wait_for(waited, CROSS_LOOP_CLOSE_SECONDS)
    except _TIMEOUTS:
        _late(closer, record)
        return
    _raise(closer, record, error)


def _raise(
    closer: Closer, record: Record[Any], error: BaseException | None
) -> None:
    """Raise what :meth:`_carry` brought back, in the caller."""
    if isinstance(error, asyncio.CancelledError):
        # Cancelled on its own loop (which is ending): counted there,
        # and no cancellation of the caller's.
        closer.unclosed(
            record,
            "its close was cancelled on its event loop",
            "",
            count=False,
        )
    elif error is not None:
        raise error


async def aclose_here(closer: Closer, record: Record[Any]) -> None:
    """Close *record* on the running loop, whatever happens to the caller.

    Shielded (in a task of its own), so a caller cancelled mid-close does
    not leak the client; carried (see ``_carry``), so a ``KeyboardInterrupt``
    or ``SystemExit`` from the close hook is raised here, in the awaiting
    code, instead of stopping the loop as asyncio does with a task's.
    """
    error = await asyncio.shield(_carry(closer, record))
    if error is not None:
        raise error


async def _carry(closer: Closer, record: Record[Any]) -> BaseException | None:
    """Close *record* on its loop; return, not raise, what escapes.

    Run for a caller on another thread: raised there, a
    ``KeyboardInterrupt`` or ``SystemExit`` from the close hook would
    stop that loop (asyncio lets them out of a task) and never reach
    the caller. The caller raises it instead; it was counted already.
    """
    try:
        await closer.aclose(record)
    except BaseException as exc:  # noqa: BLE001 -- the caller raises it.
        return exc
    return None


def _run_idle(
    closer: Closer, record: Record[Any], loop: asyncio.AbstractEventLoop
) -> BaseException | None:
    return loop.run_until_complete(_carry(closer, record))


def _on_helper_thread(
    closer: Closer, record: Record[Any], loop: asyncio.AbstractEventLoop
) -> BaseException | None:
    # What the close raised, or what running the loop raised: either
    # way the caller raises it, once (see close_anywhere).
    box: list[BaseException | None] = [None]

    def run() -> None:
        try:
            box[0] = _run_idle(closer, record, loop)
        except BaseException as exc:  # noqa: BLE001 -- raised by caller.
            box[0] = exc

    thread = threading.Thread(target=run, name="poolkeeper-close")
    thread.start()
    thread.join(CROSS_LOOP_CLOSE_SECONDS)
    if thread.is_alive():
        _late(closer, record)
        return None
    return box[0]


def _late(closer: Closer, record: Record[Any]) -> None:
    # Not counted here: the close given up on still counts its own
    # outcome, when it ends or is cancelled, so counting it here too
    # would count one client twice.
    closer.unclosed(
        record, "its close did not finish in time", "", count=False
    )


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None
