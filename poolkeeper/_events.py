"""Lifecycle events: one function per event, the one place each is said.

Each event is a record on the ``poolkeeper`` logger, with its fields in
``extra`` (``poolkeeper_singleton``, ``poolkeeper_event``,
``poolkeeper_key``: the key's fingerprint, never the key; and the event's
own fields), and, with the ``otel`` extra installed, a value on an
OpenTelemetry instrument of the meter ``poolkeeper``. Levels: builds,
closes and the retirements no failure caused (key, reset, close_all,
loop_end, fork) DEBUG; a deferral and a backoff reset INFO; failures,
the healing retirements (retire, retire_on, check, max_age) and the
healing backoff engaged WARNING.

The drivers, the registry and the closer call these, with no lock held,
on builds, retirements and closes only: nothing here runs per call or per
lease. The lifecycle never calls them (it does no I/O); its verdicts say
what was retired, and the driver that carries a retirement out says it
(:func:`say`) before it closes the client. OpenTelemetry is imported
on the first event, never by ``import poolkeeper``; without it installed,
an event costs one cached check. What only the lifecycle holds now
(clients live and retired; leases) is observed from the registry when a
reader collects, not recorded per event.
"""

from __future__ import annotations

import collections
import contextlib
import logging
import os
import sys
import threading
from typing import TYPE_CHECKING, Any, Final, ParamSpec, TypeVar

from poolkeeper._lifecycle import HEALING

if TYPE_CHECKING:
    from collections.abc import Callable, Generator, Iterable, Mapping
    from types import CodeType, FrameType

    from opentelemetry.metrics import (
        CallbackOptions,
        Counter,
        Histogram,
        Meter,
        Observation,
    )

    from poolkeeper._lifecycle import Lifecycle
    from poolkeeper._records import Census, Verdict

P = ParamSpec("P")
R = TypeVar("R")

log = logging.getLogger("poolkeeper")

#: The reasons a build carries besides a retirement's: the slot's first
#: build, or a rebuild after a failed one with nothing retired.
FIRST: Final = "first"


# -- failures ------------------------------------------------------------
#
# A failure (a close that raised, an adapter's or a hook's error) is said
# at WARNING with its error's type and where it was raised, never its
# message: an SDK's error can carry a URL with a token, a key, a header
# ("DELETE https://api/x?token=... failed"). Its message and traceback go
# to a DEBUG record of their own, for whoever enables DEBUG on the logger.


def raised_where(error: BaseException) -> str:
    """Where *error* was raised, as ``file.py:line in function``."""
    tb = error.__traceback__
    if tb is None:
        return "an unknown place"
    while tb.tb_next is not None:
        tb = tb.tb_next
    code = tb.tb_frame.f_code
    name = os.path.basename(code.co_filename)  # noqa: PTH119 -- no pathlib.
    return f"{name}:{tb.tb_lineno} in {code.co_name}"


def failure(
    logger: logging.Logger,
    text: str,
    error: BaseException | None,
    extra: dict[str, Any] | None = None,
) -> None:
    """Log *text* at WARNING with *error*'s type and place, not its message.

    *text* is final (no ``%`` arguments). With DEBUG enabled on *logger*,
    a DEBUG record follows with the error itself (``exc_info``): its
    message and traceback, which may hold secrets.
    """
    # stacklevel: the record names the caller's line, not this one.
    if error is None:
        logger.warning("%s", text, extra=extra, stacklevel=2)
        return
    kind = type(error).__name__
    where = raised_where(error)
    logger.warning(
        "%s (%s raised at %s)", text, kind, where, extra=extra, stacklevel=2
    )
    if logger.isEnabledFor(logging.DEBUG):
        logger.debug(
            "The %s of the warning above, with its message and traceback.",
            kind,
            exc_info=error,
            stacklevel=2,
        )


# -- the events ----------------------------------------------------------


def built(  # noqa: PLR0913 -- what a build says.
    name: str,
    key: str | None,
    generation: int,
    reason: str,
    duration: float,
    *,
    is_async: bool,
) -> None:
    """A build made a client live in *duration* seconds."""
    log.debug(
        "Built %s (generation %d, key %s, reason %s) in %.3f s.",
        name,
        generation,
        key,
        reason,
        duration,
        extra={
            **_fields(name, "built", key),
            "poolkeeper_generation": generation,
            "poolkeeper_reason": reason,
            "poolkeeper_duration": duration,
            "poolkeeper_outcome": "success",
            "poolkeeper_async": is_async,
        },
    )
    _build_metrics(name, reason, "success", duration)


def build_failed(  # noqa: PLR0913 -- what a build says.
    name: str,
    key: str | None,
    reason: str,
    duration: float,
    error: BaseException,
    *,
    is_async: bool,
) -> None:
    """A build raised *error*: its type is logged, never its message."""
    log.warning(
        "Building %s (key %s, reason %s) failed after %.3f s: %s.",
        name,
        key,
        reason,
        duration,
        type(error).__name__,
        extra={
            **_fields(name, "build_failed", key),
            "poolkeeper_reason": reason,
            "poolkeeper_duration": duration,
            "poolkeeper_outcome": "failure",
            "poolkeeper_error_type": type(error).__name__,
            "poolkeeper_async": is_async,
        },
    )
    _build_metrics(name, reason, "failure", duration)


def retired(  # noqa: PLR0913 -- what a retirement says.
    name: str,
    key: str | None,
    reason: str,
    error: str | None,
    age: float,
    *,
    backoff: float,
) -> None:
    """A client was retired, for any reason; counted by reason.

    WARNING for a healing retirement (retire, retire_on, check,
    max_age), DEBUG otherwise. *backoff*: the
    healing backoff its successor has, in seconds.
    """
    extra = {
        **_fields(name, "retired", key),
        "poolkeeper_reason": reason,
        "poolkeeper_error_type": error,
        "poolkeeper_age": age,
        "poolkeeper_backoff": backoff,
    }
    if reason in HEALING:
        log.log(
            logging.WARNING,
            "Retired %s (reason %s, error %s, age %.3f s); the next call "
            "builds a new client.",
            name,
            reason,
            error,
            age,
            extra=extra,
        )
    else:
        log.debug(
            "Retired %s (reason %s, age %.3f s).",
            name,
            reason,
            age,
            extra=extra,
        )
    made = instruments()
    if made is not None:
        _record(
            made.retirements.add,
            1,
            {"poolkeeper.singleton": name, "poolkeeper.reason": reason},
        )


def deferred(name: str, key: str | None, reason: str, delay: float) -> None:
    """A retirement (healing, or a reset) waits *delay* s: the backoff."""
    log.info(
        "Deferred the retirement of %s (reason %s) by %.3f s: the "
        "backoff is in force.",
        name,
        reason,
        delay,
        extra={
            **_fields(name, "deferred", key),
            "poolkeeper_reason": reason,
            "poolkeeper_delay": delay,
        },
    )


def backoff_engaged(
    name: str, key: str | None, backoff: float, before: float
) -> None:
    """Healing retired a client within its backoff: the backoff doubles.

    Clients are found broken faster than the backoff: WARNING.
    """
    log.warning(
        "Healing of %s backs off: a healing retirement of its next client "
        "within %.3f s of its build waits until then (was %.3f s).",
        name,
        backoff,
        before,
        extra={
            **_fields(name, "backoff_engaged", key),
            "poolkeeper_backoff": backoff,
            "poolkeeper_backoff_before": before,
        },
    )


def backoff_reset(
    name: str, key: str | None, backoff: float, before: float
) -> None:
    """A client outlived the backoff: it starts again from *backoff* s."""
    log.info(
        "Healing of %s: the backoff is reset to %.3f s (was %.3f s); the "
        "retired client outlived it.",
        name,
        backoff,
        before,
        extra={
            **_fields(name, "backoff_reset", key),
            "poolkeeper_backoff": backoff,
            "poolkeeper_backoff_before": before,
        },
    )


# -- verdicts --------------------------------------------------------------
#
# A retirement decided by the lifecycle comes back to its driver as a
# Verdict (retired now, or deferred); the driver says it here, then closes
# what it retired.


def say(name: str, verdict: Verdict | None) -> None:
    """Send *verdict*'s events: retired now, or deferred by the backoff.

    Every retirement's ``retired`` event is sent here, once, by the driver
    that carries it out, before it closes the client. A healing
    retirement starts the backoff (said in its ``retired`` record); one
    deferred by it lengthens it: the backoff is engaged. One whose client
    outlived it shortens it again: the backoff is reset.
    """
    if verdict is None:
        return
    if verdict.retired:
        before, after = verdict.spacing_before, verdict.spacing_after
        retired(
            name,
            verdict.key,
            verdict.reason,
            verdict.error,
            verdict.age,
            backoff=after,
        )
        if after > before > 0:
            backoff_engaged(name, verdict.key, after, before)
        elif after < before:
            backoff_reset(name, verdict.key, after, before)
    elif verdict.delay is not None:
        deferred(name, verdict.key, verdict.reason, verdict.delay)


def forked(life: Lifecycle[Any]) -> None:
    """In a forked child: say the fork's retirements, once.

    The at-fork hook logs nothing (I6): the lifecycle keeps them
    (``Lifecycle.forked``) until the child's first build, or its
    ``close_all()``, says them here. Off the hit path.
    """
    if life.forked:
        for verdict in life.take_forked():
            say(life.name, verdict)


def predicate_failed(
    name: str, error: BaseException, handled: BaseException
) -> None:
    """*retire_on*'s predicate raised *error* on *handled*: no match."""
    log.warning(
        "The retire_on predicate of %s raised %s on %s; the client is kept.",
        name,
        type(error).__name__,
        type(handled).__name__,
        extra={
            "poolkeeper_factory": name,
            "poolkeeper_error_type": type(error).__name__,
        },
    )


def retire_on_failed(
    name: str, handled: BaseException, error: BaseException
) -> None:
    """Retiring a client on *handled* (*retire_on*) raised *error*."""
    log.warning(
        "Retiring a client of %s on %s failed: %s.",
        name,
        type(handled).__name__,
        type(error).__name__,
        extra={"poolkeeper_factory": name},
    )


def closed(
    name: str, key: str | None, generation: int, duration: float
) -> None:
    """A retired client's close returned after *duration* seconds."""
    log.debug(
        "Closed the retired %s client (generation %d) in %.3f s.",
        name,
        generation,
        duration,
        extra={
            **_fields(name, "closed", key),
            "poolkeeper_generation": generation,
            "poolkeeper_duration": duration,
            "poolkeeper_outcome": "success",
        },
    )
    _close_metrics(name, "success")


def close_failed(  # noqa: PLR0913 -- what a failed close says.
    name: str,
    key: str | None,
    generation: int,
    message: str,
    error: BaseException | None,
    *,
    counted: bool,
) -> None:
    """A retired client's close failed (raised, or could not run)."""
    failure(
        log,
        message,
        error,
        {
            **_fields(name, "close_failed", key),
            "poolkeeper_generation": generation,
            "poolkeeper_outcome": "failure",
            "poolkeeper_error_type": (
                None if error is None else type(error).__name__
            ),
        },
    )
    if counted:
        _close_metrics(name, "failure")


def _fields(name: str, event: str, key: str | None) -> dict[str, Any]:
    # poolkeeper_factory: the name's field before events (kept).
    return {
        "poolkeeper_singleton": name,
        "poolkeeper_factory": name,
        "poolkeeper_event": event,
        "poolkeeper_key": key,
    }


# -- OpenTelemetry ---------------------------------------------------------


class Instruments:
    """The synchronous instruments; the observable ones report by callback."""

    __slots__ = ("build_duration", "builds", "closes", "retirements")

    def __init__(
        self,
        builds: Counter,
        build_duration: Histogram,
        closes: Counter,
        retirements: Counter,
    ) -> None:
        self.builds = builds
        self.build_duration = build_duration
        self.closes = closes
        self.retirements = retirements


_lock = threading.Lock()
#: None until the first event; then False (no OpenTelemetry) or the set.
_made: Instruments | bool | None = None

#: How long a fork waits for another thread making the instruments.
_FORK_WAIT: Final = 5.0


def before_fork() -> None:
    """Before a fork: wait for a thread making the instruments to finish.

    It holds ``_lock`` while it imports OpenTelemetry: forked then, the
    child would find both that lock and the module's import lock held by
    a thread it does not have, and its first event would wait for ever.
    Bounded: the forking thread may hold ``_lock`` itself (an instrument's
    code that forks), and then nothing waits for it.
    """
    if _made is None and _lock.acquire(timeout=_FORK_WAIT):
        _lock.release()


def after_fork_in_child() -> None:
    """A fresh lock: the parent's may have been held by another thread."""
    global _lock  # noqa: PLW0603 -- see above.
    _lock = threading.Lock()


#: The registry's view, installed by _registry (no import cycle): the
#: counts of the singletons of each name.
census: Callable[[], Mapping[str, Census]]
census = dict
#: Whether watch() asked for the process's descriptors and threads.
_process_gauges = False


def instruments() -> Instruments | None:
    """The instruments, made on first use; None without OpenTelemetry."""
    made = _made
    if made is None:
        if _interrupted():
            # A finalizer (or a recording) interrupted this thread, which
            # may hold _lock, making them: this event goes unmeasured.
            return None
        with _lock:
            made = _make_once() if _made is None else _made
    return made if isinstance(made, Instruments) else None


def _make_once() -> Instruments | bool:
    global _made  # noqa: PLW0603 -- set once, under _lock.
    try:
        return _make()
    except Exception as exc:  # noqa: BLE001 -- an event never raises.
        _made = False
        failure(
            log,
            "Making poolkeeper's OpenTelemetry instruments failed; no "
            "metrics will be recorded.",
            exc,
        )
        return False


def _make() -> Instruments | bool:
    global _made  # noqa: PLW0603 -- set once, under _lock.
    try:
        from opentelemetry import metrics  # noqa: PLC0415 -- the extra.
    except ImportError:
        _made = False
        return False
    from poolkeeper import __version__  # noqa: PLC0415 -- import cycle.

    meter = metrics.get_meter("poolkeeper", __version__)
    made = Instruments(
        meter.create_counter(
            "poolkeeper.client.builds",
            unit="{build}",
            description="Factory calls, by outcome and reason.",
        ),
        _histogram(meter),
        meter.create_counter(
            "poolkeeper.client.closes",
            unit="{client}",
            description="Retired clients closed, by outcome.",
        ),
        meter.create_counter(
            "poolkeeper.client.retirements",
            unit="{client}",
            description="Clients retired, by reason.",
        ),
    )
    meter.create_observable_gauge(
        "poolkeeper.client.open",
        callbacks=[_observe_open],
        unit="{client}",
        description="Clients not yet closed: live, or retired and "
        "waiting for their leases or their close.",
    )
    meter.create_observable_gauge(
        "poolkeeper.client.held_open",
        callbacks=[_observe_held],
        unit="{client}",
        description="Retired clients that objects made from them "
        "(made_from) hold open.",
    )
    meter.create_observable_gauge(
        "poolkeeper.lease.active",
        callbacks=[_observe_leases],
        unit="{lease}",
        description="Leases held, on live and retired clients.",
    )
    meter.create_observable_gauge(
        "process.open_file_descriptor.count",
        callbacks=[_observe_fds],
        unit="{file_descriptor}",
        description="The process's open file descriptors (watch()).",
    )
    meter.create_observable_gauge(
        "process.thread.count",
        callbacks=[_observe_threads],
        unit="{thread}",
        description="The process's threads (watch()).",
    )
    _made = made
    return made


#: Seconds: a client's build takes milliseconds to tens of seconds.
_SUBSECOND: Final = (0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5)
BUCKETS: Final = (*_SUBSECOND, 1.0, 2.5, 5.0, 10.0, 30.0, 60.0)


def _histogram(meter: Meter) -> Histogram:
    name, unit = "poolkeeper.client.build.duration", "s"
    description = "How long a factory call took."
    try:
        # Bucket boundaries in seconds, as advice (API 1.23 and later);
        # the SDK's default ones are for milliseconds.
        return meter.create_histogram(
            name,
            unit=unit,
            description=description,
            explicit_bucket_boundaries_advisory=list(BUCKETS),
        )
    except TypeError:  # pragma: no cover -- an API before 1.23.
        return meter.create_histogram(name, unit=unit, description=description)


def _build_metrics(
    name: str, reason: str, outcome: str, duration: float
) -> None:
    made = instruments()
    if made is None:
        return
    attributes = {
        "poolkeeper.singleton": name,
        "poolkeeper.reason": reason,
        "poolkeeper.outcome": outcome,
    }
    _record(made.builds.add, 1, attributes)
    _record(made.build_duration.record, duration, attributes)


def _close_metrics(name: str, outcome: str) -> None:
    made = instruments()
    if made is not None:
        _record(
            made.closes.add,
            1,
            {"poolkeeper.singleton": name, "poolkeeper.outcome": outcome},
        )


# Measurements that could not be recorded where they happened, recorded
# by the next one that can. The OpenTelemetry SDK records under locks of
# its own, which are not reentrant: a garbage collection that runs while
# this thread holds one (inside a recording of ours, or inside the SDK's
# collection) can collect a dropped singleton, whose finalizer closes its
# clients (_registry._orphan) and so records; inline, that recording would
# wait for the lock its own thread holds, for ever. A deque's append and
# popleft are atomic, and safe in a finalizer.
_pending: collections.deque[tuple[Any, tuple[Any, ...]]] = collections.deque()
#: The code of the functions inside which nothing is recorded inline.
_DEFERRING: set[CodeType] = set()


def records_later(fn: Callable[P, R]) -> Callable[P, R]:
    """Mark *fn*: nothing is recorded inline while it runs, only queued.

    For the finalizer of a collected singleton (``_registry._orphan``),
    which runs wherever the collector interrupted its thread. The stack
    says it, not a flag: a flag set and cleared around the call could be
    left set by an exception landing between two lines.
    """
    _DEFERRING.add(fn.__code__)
    return fn


def _interrupted() -> bool:
    # Whether the caller's caller runs inside a recording of ours, the
    # making of the instruments or a finalizer (see records_later).
    frame: FrameType | None = sys._getframe(2)
    while frame is not None:
        if frame.f_code in _DEFERRING:
            return True
        frame = frame.f_back
    return False


def _record(method: Any, *args: Any) -> None:  # noqa: ANN401 -- an SDK's.
    # Recorded inline unless this thread is already recording (or in a
    # finalizer): then queued, for the next recording here or elsewhere.
    if _interrupted():
        _pending.append((method, args))
        return
    for _ in range(len(_pending)):
        try:
            queued, queued_args = _pending.popleft()
        except IndexError:
            break
        with _quiet():
            queued(*queued_args)
    with _quiet():
        method(*args)


@contextlib.contextmanager
def _quiet() -> Generator[None, None, None]:
    # A recording that fails is logged at DEBUG: an event never raises
    # into the build or close it reports.
    try:
        yield
    except Exception:  # Logged, not raised.
        log.debug("Recording a poolkeeper metric failed.", exc_info=True)


def watched() -> None:
    """``watch()`` runs: report the process's descriptors and threads.

    The instruments are made now if OpenTelemetry is already imported,
    else at the first event: ``watch()`` at interpreter startup
    (``POOLKEEPER_WATCH=1``) imports nothing.
    """
    global _process_gauges  # noqa: PLW0603 -- a flag, set once.
    _process_gauges = True
    if "opentelemetry.metrics" in sys.modules:
        instruments()


def _observations(
    rows: Iterable[tuple[float, dict[str, str]]],
) -> list[Observation]:
    from opentelemetry.metrics import Observation  # noqa: PLC0415

    return [Observation(value, attributes) for value, attributes in rows]


def _observe_open(options: CallbackOptions) -> list[Observation]:
    del options
    rows: list[tuple[float, dict[str, str]]] = []
    for name, counts in census().items():
        rows.append(
            (
                counts.live,
                {"poolkeeper.singleton": name, "poolkeeper.state": "live"},
            )
        )
        rows.append(
            (
                counts.retired,
                {"poolkeeper.singleton": name, "poolkeeper.state": "retired"},
            )
        )
    return _observations(rows)


def _observe_leases(options: CallbackOptions) -> list[Observation]:
    del options
    return _observations(
        (counts.leases, {"poolkeeper.singleton": name})
        for name, counts in census().items()
    )


def _observe_held(options: CallbackOptions) -> list[Observation]:
    del options
    return _observations(
        (counts.held, {"poolkeeper.singleton": name})
        for name, counts in census().items()
    )


def _observe_fds(options: CallbackOptions) -> list[Observation]:
    del options
    if not _process_gauges:
        return []
    for where in ("/proc/self/fd", "/dev/fd"):
        try:
            count = _entries(where)
        except OSError:
            continue
        # The descriptor reading the directory is not the program's.
        return _observations([(count - 1, {})])
    return []


def _observe_threads(options: CallbackOptions) -> list[Observation]:
    del options
    if not _process_gauges:
        return []
    try:
        count = _entries("/proc/self/task")
    except OSError:
        count = threading.active_count()
    return _observations([(count, {})])


def _entries(directory: str) -> int:
    with os.scandir(directory) as entries:
        return sum(1 for _ in entries)


records_later(_record)
records_later(_make_once)
