"""Closing retired clients: one path for sync and async closes.

A close runs with no lock held, exactly once per doomed record (the
lifecycle hands each record out once). It uses ``close=`` when given, else
the close an adapter gives for the client's type (``_adapters``), else the
client's ``aclose()`` (async singletons) or ``close()``, else nothing
(said once per type). An ``Exception`` from any of that (even from looking
``close`` up) is logged at WARNING with its traceback and counted, never
raised; anything else (``KeyboardInterrupt``, ``SystemExit``,
cancellation) is counted once and propagates to the caller, after every
other client the caller closes was closed: a close run on another thread's
loop or on a helper thread hands it back to the caller instead of raising
it there. A client that cannot be closed is reported where a user sees it:
a WARNING log record and an :class:`UnclosedClientWarning` pointing at the
user's code.

Closing a client from code that may run on another thread or loop than the
client's (``close_all()``, ``aclose_all()``) is in ``_close_anywhere``.
"""

from __future__ import annotations

import functools
import inspect
import logging
import operator
import sys
import warnings
from typing import TYPE_CHECKING, Any, cast

from poolkeeper import _adapters
from poolkeeper.exceptions import UnclosedClientWarning

if TYPE_CHECKING:
    from collections.abc import Awaitable, Callable, Iterable

    from poolkeeper._lifecycle import Lifecycle, Record

log = logging.getLogger("poolkeeper")

# Frames of these modules are skipped when a warning names the user's code.
_SKIPPED = ("poolkeeper", "contextlib", "asyncio", "threading", "concurrent")


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
        # The record while this close holds its claim and has not begun.
        taken: list[Record[Any]] = []
        try:
            run = self._resolve(record.client)
            if run is not None:
                # Claimed from the lifecycle's owed closes, noted in *taken*
                # in the same step: a close cut short before it began is
                # owed again (below; close_all() does it), and one another
                # close took is not run twice.
                if not self.life.claim(record, taken):
                    return False, None
                return True, _begin(taken, run)
            claimed = self.life.claim(record)
        except Exception as exc:  # noqa: BLE001 -- logged, counted, not raised.
            self.life.claim(record)  # Failed: no longer owed.
            self.failed(record, exc)
            return False, None
        except BaseException:
            if taken:
                # Claimed, but cut short before the hook began (a signal
                # after the claim returned): owed again.
                self.life.owe(record)
            # Counted if it was this close's to run: one cut short before
            # it began is still owed, and counted when it runs.
            if not self.life.owes(record):
                self.life.closed(ok=False)
            raise
        if claimed:
            _adapters.say_unclosed(name, record.client)
            log.debug(
                "The retired %s client (generation %d) has no close(); "
                "dropping it.",
                name,
                record.generation,
                extra=_extra(name, record),
            )
        return False, None

    def _resolve(self, client: object) -> Callable[[], object] | None:
        if self.hook is not None:
            return functools.partial(self.hook, client)
        close = _adapters.learn(client).close
        if close is not None:
            return functools.partial(close, client)
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

    def unclosed(
        self,
        record: Record[Any],
        reason: str,
        hint: str,
        *,
        count: bool = True,
    ) -> None:
        """Count (unless told not to) and report a client left unclosed."""
        self.life.claim(record)  # No longer owed: it cannot be closed.
        if count:
            self.life.closed(ok=False)
        message = (
            f"Could not close a retired {self.life.name} client (generation "
            f"{record.generation}): {reason}" + (f"; {hint}." if hint else ".")
        )
        log.warning(message, extra=_extra(self.life.name, record))
        warnings.warn(message, UnclosedClientWarning, stacklevel=_user_level())


def _begin(taken: list[Record[Any]], run: Callable[[], object]) -> object:
    """Run a claimed close, emptying *taken* in the same C call (see _start).

    No line event and no signal falls between saying it began and its
    start: the two calls are made by ``map``, in C.
    """
    return list(map(_call, (taken.clear, run)))[1]


_call = operator.methodcaller("__call__")


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
