"""Closing retired clients: one path for sync, async and cross-loop closes.

A close runs with no lock held, exactly once per doomed record (the
lifecycle hands each record out once). It uses ``close=`` when given, else
the client's ``aclose()`` (async singletons) or ``close()``, else nothing.
An ``Exception`` from any of that (even from looking ``close`` up) is
logged at WARNING with its traceback and counted, never raised; anything
else (``KeyboardInterrupt``, ``SystemExit``, cancellation) is counted once
and propagates to the caller, after every other client the caller closes
was closed: a close run on another thread's loop or on a helper thread
hands it back to the caller instead of raising it there. A client that
cannot be closed is reported where a user sees it: a WARNING log record
and an :class:`UnclosedClientWarning` pointing at the user's code.
"""

from __future__ import annotations

import asyncio
import concurrent.futures
import functools
import inspect
import logging
import sys
import threading
import warnings
from typing import TYPE_CHECKING, Any, cast

from poolkeeper.exceptions import UnclosedClientWarning

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from poolkeeper._lifecycle import Lifecycle, Record

log = logging.getLogger("poolkeeper")

#: How long a close may take on another thread's loop before it is given up.
CROSS_LOOP_CLOSE_SECONDS = 30.0

# Distinct classes before Python 3.11, aliases of TimeoutError since.
_TIMEOUTS = (
    TimeoutError,
    asyncio.TimeoutError,
    concurrent.futures.TimeoutError,
)

# Frames of these modules are skipped when a warning names the user's code.
_SKIPPED = ("poolkeeper", "contextlib", "asyncio", "threading", "concurrent")

# Closes scheduled on a loop that was running this very thread's code.
_scheduled: set[asyncio.Task[None]] = set()


class Closer:
    """Closes the retired clients of one singleton and counts the outcome."""

    __slots__ = ("hook", "is_async", "life")

    def __init__(
        self,
        life: Lifecycle[Any],
        hook: Callable[[Any], object] | None,
        *,
        is_async: bool,
    ) -> None:
        self.life = life
        self.hook = hook
        self.is_async = is_async

    # -- the hook -----------------------------------------------------------

    def _start(self, record: Record[Any]) -> tuple[bool, object]:
        """Call the close hook; return (whether it ran, what it returned)."""
        name = self.life.name
        try:
            run = self._resolve(record.client)
            if run is None:
                log.debug(
                    "The retired %s client (generation %d) has no close(); "
                    "dropping it.",
                    name,
                    record.generation,
                    extra=_extra(name, record),
                )
                return False, None
            return True, run()
        except Exception as exc:  # noqa: BLE001 -- logged, counted, not raised.
            self.failed(record, exc)
            return False, None
        except BaseException:
            self.life.closed(ok=False)
            raise

    def _resolve(self, client: object) -> Callable[[], object] | None:
        if self.hook is not None:
            return functools.partial(self.hook, client)
        for name in ("aclose", "close") if self.is_async else ("close",):
            method = getattr(client, name, None)
            if callable(method):
                return cast("Callable[[], object]", method)
        return None

    def failed(self, record: Record[Any], exc: BaseException) -> None:
        """Count and log a close that raised *exc*."""
        self.life.closed(ok=False)
        log.warning(
            "Closing the retired %s client (generation %d) failed; "
            "it was dropped.",
            self.life.name,
            record.generation,
            exc_info=exc,
            extra=_extra(self.life.name, record),
        )

    def _done(self, record: Record[Any]) -> None:
        self.life.closed(ok=True)
        log.debug(
            "Closed the retired %s client (generation %d).",
            self.life.name,
            record.generation,
            extra=_extra(self.life.name, record),
        )

    # -- where it runs ------------------------------------------------------

    def close(self, record: Record[Any]) -> None:
        """Close *record* here and now, synchronously."""
        ran, result = self._start(record)
        if not ran:
            return
        if inspect.isawaitable(result):
            if inspect.iscoroutine(result):
                result.close()  # Silences "never awaited": we say it here.
            self.unclosed(
                record,
                "its close returned an awaitable that a synchronous close "
                "cannot await",
                "pass close= a function that closes it synchronously",
            )
            return
        self._done(record)

    async def aclose(self, record: Record[Any]) -> None:
        """Close *record* on the running loop, awaiting its close."""
        ran, result = self._start(record)
        if not ran:
            return
        if inspect.isawaitable(result):
            try:
                await result
            except Exception as exc:  # noqa: BLE001 -- logged, counted.
                self.failed(record, exc)
                return
            except BaseException:
                self.life.closed(ok=False)
                raise
        self._done(record)

    def close_anywhere(self, record: Record[Any]) -> None:
        """Close *record* from synchronous code, on its own loop if async.

        Never raises an ``Exception``: what goes wrong is logged, counted.
        """
        try:
            self._close_anywhere(record)
        except Exception as exc:  # noqa: BLE001 -- logged and counted.
            self.failed(record, exc)

    def _owner(self, record: Record[Any]) -> asyncio.AbstractEventLoop | None:
        """Return the open loop *record* closes on; else close or report it.

        A sync client is closed here and now; a client whose loop is gone
        is reported. Either way None is returned: nothing is left to do.
        """
        ref = record.slot.loop
        if ref is None:
            self.close(record)
            return None
        loop: asyncio.AbstractEventLoop | None = ref()
        if loop is None or loop.is_closed():
            self.unclosed(record, "its event loop is closed", _LOOP_HINT)
            return None
        return loop

    def _close_anywhere(self, record: Record[Any]) -> None:
        loop = self._owner(record)
        if loop is None:
            return
        running = _running_loop()
        if loop is running:
            # Called synchronously from the client's own loop: it cannot be
            # awaited here, so it runs as soon as control returns to it.
            task = loop.create_task(self.aclose(record))
            _scheduled.add(task)
            task.add_done_callback(_scheduled.discard)
            return
        if loop.is_running():
            future = asyncio.run_coroutine_threadsafe(
                self._carry(record), loop
            )
            try:
                error = future.result(CROSS_LOOP_CLOSE_SECONDS)
            except _TIMEOUTS:
                future.cancel()
                self._late(record)
                return
        elif running is None:
            error = self._run_idle(record, loop)
        else:
            # An idle loop cannot run inside this thread's running loop.
            error = self._on_helper_thread(record, loop)
        self._raise(record, error)

    async def aclose_anywhere(self, record: Record[Any]) -> None:
        """Close *record* from a coroutine, on its own loop if async.

        Never raises an ``Exception``: what goes wrong is logged, counted.
        """
        try:
            await self._aclose_anywhere(record)
        except Exception as exc:  # noqa: BLE001 -- logged and counted.
            self.failed(record, exc)

    async def _aclose_anywhere(self, record: Record[Any]) -> None:
        loop = self._owner(record)
        if loop is None:
            return
        if loop is asyncio.get_running_loop():
            await self.aclose(record)
            return
        if loop.is_running():
            future = asyncio.run_coroutine_threadsafe(
                self._carry(record), loop
            )
            waited: Any = asyncio.wrap_future(future)
        else:
            waited = asyncio.to_thread(self._run_idle, record, loop)
        try:
            error = await asyncio.wait_for(waited, CROSS_LOOP_CLOSE_SECONDS)
        except _TIMEOUTS:
            self._late(record)
            return
        self._raise(record, error)

    def _raise(self, record: Record[Any], error: BaseException | None) -> None:
        """Raise what :meth:`_carry` brought back, in the caller."""
        if isinstance(error, asyncio.CancelledError):
            # Cancelled on its own loop (which is ending): counted there,
            # and no cancellation of the caller's.
            self.unclosed(
                record, "its close was cancelled on its event loop", "",
                count=False,
            )  # fmt: skip
        elif error is not None:
            raise error

    async def _carry(self, record: Record[Any]) -> BaseException | None:
        """Close *record* on its loop; return, not raise, what escapes.

        Run for a caller on another thread: raised there, a
        ``KeyboardInterrupt`` or ``SystemExit`` from the close hook would
        stop that loop (asyncio lets them out of a task) and never reach
        the caller. The caller raises it instead; it was counted already.
        """
        try:
            await self.aclose(record)
        except BaseException as exc:  # noqa: BLE001 -- the caller raises it.
            return exc
        return None

    def _run_idle(
        self, record: Record[Any], loop: asyncio.AbstractEventLoop
    ) -> BaseException | None:
        return loop.run_until_complete(self._carry(record))

    def _on_helper_thread(
        self, record: Record[Any], loop: asyncio.AbstractEventLoop
    ) -> BaseException | None:
        # What the close raised, or what running the loop raised: either
        # way the caller raises it, once (see close_anywhere).
        box: list[BaseException | None] = [None]

        def run() -> None:
            try:
                box[0] = self._run_idle(record, loop)
            except BaseException as exc:  # noqa: BLE001 -- raised by caller.
                box[0] = exc

        thread = threading.Thread(target=run, name="poolkeeper-close")
        thread.start()
        thread.join(CROSS_LOOP_CLOSE_SECONDS)
        if thread.is_alive():
            self._late(record)
            return None
        return box[0]

    def _late(self, record: Record[Any]) -> None:
        # Not counted here: the close given up on still counts its own
        # outcome, when it ends or is cancelled, so counting it here too
        # would count one client twice.
        self.unclosed(
            record, "its close did not finish in time", "", count=False
        )

    def unclosed(
        self,
        record: Record[Any],
        reason: str,
        hint: str,
        *,
        count: bool = True,
    ) -> None:
        """Count (unless told not to) and report a client left unclosed."""
        if count:
            self.life.closed(ok=False)
        message = (
            f"Could not close a retired {self.life.name} client (generation "
            f"{record.generation}): {reason}" + (f"; {hint}." if hint else ".")
        )
        log.warning(message, extra=_extra(self.life.name, record))
        warnings.warn(message, UnclosedClientWarning, stacklevel=_user_level())


_LOOP_HINT = (
    "run the loop with asyncio.run() or asyncio.Runner, which let "
    "poolkeeper close it, or await poolkeeper.aclose_all() before the loop "
    "ends"
)


def _extra(name: str, record: Record[Any]) -> dict[str, object]:
    return {
        "poolkeeper_factory": name,
        "poolkeeper_generation": record.generation,
    }


def _running_loop() -> asyncio.AbstractEventLoop | None:
    try:
        return asyncio.get_running_loop()
    except RuntimeError:
        return None


def _user_level() -> int:
    """Return the stacklevel of the nearest frame outside poolkeeper."""
    frame = sys._getframe(1)  # The caller of warn().
    level = 1
    while frame.f_back is not None:
        module = str(frame.f_globals.get("__name__", ""))
        if module.split(".", 1)[0] not in _SKIPPED:
            break
        frame = frame.f_back
        level += 1
    return level


def run_each(calls: Iterable[Callable[[], object]]) -> None:
    """Run every call; never skip one.

    A ``BaseException`` from one call (Ctrl-C) stops none of the others;
    the first one is raised once they all ran.
    """
    first: BaseException | None = None
    for call in calls:
        try:
            call()
        except BaseException as exc:  # noqa: BLE001, PERF203 -- raised below.
            first = first or exc
    if first is not None:
        raise first


async def arun_each(
    calls: Iterable[Callable[[], Awaitable[object]]],
) -> None:
    """Await every call in turn, like :func:`run_each`."""
    first: BaseException | None = None
    for call in calls:
        try:
            await call()
        except BaseException as exc:  # noqa: BLE001, PERF203 -- raised below.
            first = first or exc
    if first is not None:
        raise first
