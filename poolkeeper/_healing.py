"""Healing's driver half: timers, probes, ageing, the *retire_on* matcher.

The lifecycle decides every healing step under its lock (its "healing"
section: ``heal``, ``carry_out``, ``expire``, ``due``, ``probed``,
``unprobe``) and answers with a :class:`~poolkeeper._records.Verdict`.
This module does what both drivers (threads and event loops) then do
alike, with no lock held:

- **Retirements** (:func:`schedule`): a verdict is said
  (``events.say``: retired, or deferred), what it retired is closed, and a
  retirement deferred by the backoff or *min_rebuild_interval* gets a
  timer, whose end (:func:`deferral_due`) asks the lifecycle to carry it
  out.
- **Ageing** (:func:`start_timers`, :func:`age_due`): each build starts the
  client's *max_age* timer; its end retires the client (reason
  "max_age").
- **Probes** (:func:`start_timers`, :func:`run_probe`,
  :func:`arun_probe`, :func:`give_back`): each build starts the client's
  probe timer, whose end marks the probe due (``Lifecycle.due``); the call
  the lifecycle hands the probe to runs *check* here and reports its
  verdict, and a call that unwinds before it reported gives it back.
- **The matcher** (:func:`matcher`): *retire_on* as ``exc -> bool``.

Timers are entries of the process's one scheduler (``_timers``), holding
the lifecycle, its closer and the slot, never the singleton; a forked
child drops or resumes them (``_timers.resume``), and a ``fork="keep"``
child starts those a parent thread was about to start (:func:`rearm`).
A timer's or a probe's
retirement closes a sync client on the thread that decided it and an
async one on its own loop (``close_soon``): no caller waits for it.
"""

from __future__ import annotations

import functools
import inspect
import random
import time
from typing import TYPE_CHECKING, Any, Final, cast

from poolkeeper import _events as events
from poolkeeper import _timers as timers
from poolkeeper._close import close_soon, run_each
from poolkeeper._lease import loosen
from poolkeeper._timers import Timer

if TYPE_CHECKING:
    from collections.abc import Callable

    from poolkeeper._close import Closer
    from poolkeeper._lifecycle import Lifecycle, Record, Slot
    from poolkeeper._records import Verdict

__all__ = [
    "CHECK_EVERY",
    "MAX_AGE_JITTER",
    "age_due",
    "age_limit",
    "arun_probe",
    "closing",
    "deferral_due",
    "error_name",
    "give_back",
    "matcher",
    "monotonic",
    "rearm",
    "run_probe",
    "schedule",
    "start_timers",
]


# -- retirements ---------------------------------------------------------


def error_name(error: BaseException | None) -> str | None:
    """The type name of *error*, never its message (it may hold secrets)."""
    return None if error is None else type(error).__name__


def schedule(
    life: Lifecycle[Any], closer: Closer, slot: Slot, verdict: Verdict | None
) -> bool:
    """Start *verdict*'s timer, if it deferred; return whether it retired.

    The driver said *verdict* before it closed what it retired
    (``events.say``).
    """
    if verdict is None:
        return False
    if not verdict.retired and verdict.delay is not None:
        Timer(
            verdict.delay,
            deferral_due,
            life,
            closer,
            slot,
            verdict.sequence,
            owner=slot,
        )
    return verdict.retired


def deferral_due(
    life: Lifecycle[Any], closer: Closer, slot: Slot, sequence: int
) -> None:
    """A deferral's timer ends: carry out the retirement it deferred.

    On the timer's thread, which no caller waits for: a sync client is
    closed here, an async one on its own loop (``close_soon``).
    """
    doomed: list[Record[Any]] = []
    verdict: Verdict | None = None
    try:
        verdict = life.carry_out(slot, sequence, doomed)
    finally:
        closing(life, closer, verdict, doomed)


def closing(
    life: Lifecycle[Any],
    closer: Closer,
    verdict: Verdict | None,
    doomed: list[Record[Any]],
) -> None:
    """Say *verdict*, then close *doomed* (on its loop, for async ones).

    A timer's or a probe's: no caller waits for an async client's close.
    """
    try:
        events.say(life.name, verdict)
    finally:
        run_each(
            (
                *(functools.partial(close_soon, closer, r) for r in doomed),
                functools.partial(loosen, life),
            )
        )


# -- ageing and probing ------------------------------------------------
#
# max_age and check start timers of the same kind (holding the lifecycle,
# its closer and the slot), never a clock read on the hit path: at each
# build (start_timers), the record's max_age timer, whose end retires it
# (age_due), and its probe timer, whose end marks its probe due
# (Lifecycle.due), which disarms the hit path until a call runs the probe
# (run_probe).

#: max_age's deadline is spread by up to this fraction, at random: a
#: client lives max_age * (1 + uniform(0, MAX_AGE_JITTER)) seconds.
MAX_AGE_JITTER: Final = 0.1

#: check_every's default, in seconds, when *check* is given without it.
CHECK_EVERY: Final = 30.0


def age_limit(max_age: float) -> float:
    """*max_age* with its jitter: the life of one client, in seconds."""
    return max_age * (1.0 + random.uniform(0.0, MAX_AGE_JITTER))  # noqa: S311


def start_timers(
    life: Lifecycle[Any], closer: Closer, record: Record[Any]
) -> None:
    """After a build made *record* live: start its max_age and probe timers.

    The record keeps them: its close cancels them (``Closer``), so that a
    retired client leaves no timer thread waiting for its deadline.
    """
    slot, sequence, timers = record.slot, record.sequence, record.timers
    if life.max_age is not None:
        timers["age"] = Timer(
            age_limit(life.max_age),
            age_due,
            life,
            closer,
            slot,
            sequence,
            owner=slot,
        )
    if life.check_every is not None:
        timers["probe"] = Timer(
            life.check_every,
            life.due,
            slot,
            sequence,
            0,
            inline=True,
            owner=slot,
        )
    if record.is_closed():
        record.cancel_timers()  # Closed meanwhile, maybe before they were.


def age_due(
    life: Lifecycle[Any], closer: Closer, slot: Slot, sequence: int
) -> None:
    """A max_age timer ends: retire record *sequence* if still live."""
    doomed: list[Record[Any]] = []
    verdict: Verdict | None = None
    try:
        verdict = life.expire(slot, sequence, monotonic(), doomed)
    finally:
        closing(life, closer, verdict, doomed)
    schedule(life, closer, slot, verdict)


def run_probe(
    life: Lifecycle[Any], closer: Closer, record: Record[Any]
) -> bool:
    """Probe *record*'s client (*check*), held for it; report; schedule.

    No lock is held while the probe runs. A probe that raises an
    ``Exception`` failed; any other exception (``KeyboardInterrupt``)
    propagates once the probe is reported as cut short (due again).
    Returns whether the client was retired now.
    """
    answer: list[object] = [None, None]
    count = record.probes + 1  # Once this probe is reported.
    try:
        try:
            result = life.check(record.client)
            awaitable = inspect.isawaitable(result)
            if not awaitable:
                answer[:] = bool(result), None
        except Exception as err:  # noqa: BLE001 -- a failed probe.
            answer[:] = False, err
        else:
            if awaitable:
                # A bad probe function, not a bad client: cut short, said
                # loudly.
                raise _cannot_await(life.name, result)
    finally:
        _next_probe(life, record, count)
        verdict = _report(life, closer, record, *answer)
    return schedule(life, closer, record.slot, verdict)


async def arun_probe(
    life: Lifecycle[Any], closer: Closer, record: Record[Any]
) -> bool:
    """:func:`run_probe` on an event loop: an awaitable answer is awaited.

    Other tasks of the loop are served meanwhile; a cancellation cuts the
    probe short, as a ``KeyboardInterrupt`` does in :func:`run_probe`.
    """
    answer: list[object] = [None, None]
    count = record.probes + 1  # Once this probe is reported.
    try:
        try:
            result = life.check(record.client)
            if inspect.isawaitable(result):
                result = await result
            answer[:] = bool(result), None
        except Exception as err:  # noqa: BLE001 -- a failed probe.
            answer[:] = False, err
    finally:
        _next_probe(life, record, count)
        verdict = _report(life, closer, record, *answer)
    return schedule(life, closer, record.slot, verdict)


def give_back(
    life: Lifecycle[Any], closer: Closer, slot: Slot | None, done: object
) -> None:
    """A call unwinds: give back a probe it was handed and did not report.

    Asks the lifecycle (under its lock), which finds the record that
    probe holds, unless *slot* can hold none: no probe, and no retired
    record (where a held record goes when the slot moves on from it,
    see ``Lifecycle.probed``). Lock-free, with no Python frame: this is
    every call's way out by an exception.
    """
    if (
        slot is None
        or done is None
        or (slot.probe is None and not slot.retired)
    ):
        return
    doomed: list[Record[Any]] = []
    try:
        life.unprobe(slot, done, doomed)
    finally:
        closing(life, closer, None, doomed)


def _cannot_await(name: str, result: object) -> TypeError:
    """The error for a thread singleton's probe that returned an awaitable."""
    if inspect.iscoroutine(result):
        result.close()  # Never awaited: no "never awaited" warning.
    msg = (
        f"process_singleton(check=...) for {name} returned an awaitable, "
        f"but {name} is a thread singleton: its probe must answer at once. "
        "Pass a plain function client -> bool."
    )
    return TypeError(msg)


def _report(
    life: Lifecycle[Any],
    closer: Closer,
    record: Record[Any],
    ok: object,
    error: object,
) -> Verdict | None:
    """Report a probe's answer (None: cut short); say, then close."""
    doomed: list[Record[Any]] = []
    verdict: Verdict | None = None
    try:
        verdict = life.probed(
            record.slot,
            record,
            cast("bool | None", ok),
            error_name(cast("BaseException | None", error)),
            monotonic(),
            doomed,
        )
    finally:
        closing(life, closer, verdict, doomed)
    return verdict


def _next_probe(life: Lifecycle[Any], record: Record[Any], count: int) -> None:
    """Start the next probe's timer of *record*, before this one is reported.

    Started first, so that nothing cut between the report and the start
    can stop the probes of a live client; a probe cut short before it is
    started is due again for the next call instead. The timer acts only if
    the record then has *count* probes reported, so that a probe repeated
    after a cut starts no second cycle of probes. A timer that finds the
    client retired does nothing.
    """
    if life.check_every is not None:
        record.timers["probe"] = Timer(
            life.check_every,
            life.due,
            record.slot,
            record.sequence,
            count,
            inline=True,
            owner=record.slot,
        )
        if record.is_closed():
            record.cancel_timers()  # Closed meanwhile, as start_timers.


def rearm(life: Lifecycle[Any], closer: Closer) -> None:
    """In a ``fork="keep"`` child: start the kept clients' missing timers.

    A timer that another thread of the parent was about to start at the
    fork is not among the child's (``_timers.resume``): a build's
    *max_age* and first probe, a deferral's, the next probe's. Without it
    the kept client would never age out, be probed or see its deferred
    retirement there (a deferral pending stands: no later one starts a
    timer). Each missing one starts here, due when the parent's would
    have been (the next probe a full *check_every* from now). Called by
    the runtime's fork hook after ``_timers.resume``; takes no lock of the
    lifecycle (the child has one thread).
    """
    alive = timers.alive()
    now = time.monotonic()
    for slot in list(life.slots.values()):
        record = slot.live
        if record is None:
            continue
        sequence = record.sequence
        here = [t for t in alive if t.owner is slot]
        if life.max_age is not None and not _has(here, age_due, -1, sequence):
            left = record.built_at + age_limit(life.max_age) - now
            record.timers["age"] = Timer(
                left, age_due, life, closer, slot, sequence, owner=slot
            )
        if (
            life.check_every is not None
            and slot.probe is None
            and not _has(here, life.due, 1, sequence)
        ):
            record.timers["probe"] = Timer(
                life.check_every,
                life.due,
                slot,
                sequence,
                record.probes,
                inline=True,
                owner=slot,
            )
        deferred = slot.deferred
        if (
            deferred is not None
            and deferred.sequence == sequence
            and not _has(here, deferral_due, -1, sequence)
        ):
            Timer(
                deferred.due - now,
                deferral_due,
                life,
                closer,
                slot,
                sequence,
                owner=slot,
            )


def _has(found: list[Timer], function: object, at: int, sequence: int) -> bool:
    """Whether one of *found* calls *function* for record *sequence*.

    *at*: where the sequence is among the timer's arguments.
    """
    return any(
        t.function == function and t.args[at] == sequence for t in found
    )


def matcher(
    name: str, retire_on: object
) -> Callable[[BaseException], bool] | None:
    """Return *retire_on* (validated) as ``exc -> bool``, or None.

    A predicate that raises an ``Exception`` is logged and means "no
    match": the exception being handled propagates unchanged.
    """
    if retire_on is None:
        return None
    if isinstance(retire_on, (type, tuple)):
        types = cast("type | tuple[type, ...]", retire_on)

        def matches_types(exc: BaseException) -> bool:
            return isinstance(exc, types)

        return matches_types
    predicate = cast("Callable[[BaseException], object]", retire_on)

    def matches(exc: BaseException) -> bool:
        try:
            return bool(predicate(exc))
        except Exception as err:  # noqa: BLE001 -- logged, no match.
            events.predicate_failed(name, err, exc)
            return False

    return matches


def monotonic() -> float:
    """The clock of healing decisions (ages, the backoff)."""
    return time.monotonic()
