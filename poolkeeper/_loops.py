"""Event loops: the async hit path armed for one loop, and a loop's end.

**The hit path**: one event loop's live client, without the driver. Each
async singleton has a class of its own (see ``_decorator``). While a pushed
key (none, ``keys.env``, ``keys.file``) cannot have changed and a loop's
client is live, the lifecycle arms that class's ``__call__`` for that loop:
a plain function that validates its arguments and returns a coroutine
which, once awaited, returns the client if it runs on the armed loop and
the arming still stands. Two Python frames, no lock, no key read. Anything
else (another loop, a disarmed class, a loop no longer running) takes the
driver's slow path from inside that coroutine.

The validation runs when the coroutine runs, not when ``single()`` is called:
a coroutine made on one loop and awaited on another gets the other loop's
client. One loop per class is armed at a time; while it runs, other loops
take the slow path rather than take the arming from it (which would make
every call on two busy loops a class-attribute store).

The lifecycle calls ``arm``, its change hook, under its lock, from its "live
client changed" transitions only, so the two never interleave.

**The end of a loop.** When a loop ends the way ``asyncio.run()`` and
``asyncio.Runner`` end it, its clients are closed on it before it closes:
each slot registers an async generator with its loop, and the loop's
``shutdown_asyncgens()`` closes that generator, whose ``finally`` closes
the slot. A loop closed without that shutdown cannot run anything any
more: its slot is dropped when the next slot opens (``prune``) and its
clients are reported unclosed.

The loop-end generator also waits, bounded, for the closes poolkeeper runs
in tasks of their own on the loop (``_close.track``): ``asyncio.run()``
waits only for the tasks that existed when it cancelled them all.

A close hook raising a ``BaseException`` at loop end (``KeyboardInterrupt``)
skips no client: it is raised, out of the loop's shutdown, by the last of
that loop's loop-end closes to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import threading
import weakref
from asyncio import _get_running_loop
from typing import TYPE_CHECKING, Any, cast, final

from poolkeeper._close import arun_each, await_own
from poolkeeper._events import say
from poolkeeper._identity import no_arguments

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator, Callable, Coroutine

    from poolkeeper._close import Closer
    from poolkeeper._lifecycle import Lifecycle, Record, Slot
    from poolkeeper._records import Verdict

# Before 3.12, asyncio's _get_running_loop() calls getpid() (a system call)
# each time. There an asyncio loop's record of the thread it runs on (None
# while stopped) answers the same question: one thread runs one loop at a
# time.
_BY_THREAD = sys.version_info < (3, 12)
_get_ident = threading.get_ident

# Where an armed class keeps what _disarm() needs: the flag its coroutines
# read last, and the loop it serves.
_ON = "_poolkeeper_on"
_LOOP = "_poolkeeper_loop"

# The flag of each armed class, by the id of the class's weak reference
# (the lifecycle holds that reference as long as it can arm or disarm).
# The cycle collector clears that reference before the orphan close of a
# singleton collected with its class runs, and a call made while armed
# must still miss then: disarm finds the flag here, not on the class.
_flags: dict[int, list[bool]] = {}


def arm(  # noqa: PLR0913, PLR0917 -- bound to the first three.
    cls_ref: weakref.ReferenceType[type],
    single_ref: weakref.ReferenceType[Any],
    name: str,
    client: object,
    record: Record[Any] | None,
    pushed: bool,  # noqa: FBT001 -- the lifecycle's change hook.
) -> bool:
    """The change hook of an async singleton: arm one loop, or disarm.

    With a live *record* of a pushed key, arms *cls*'s hit path with its
    client, for *record*'s loop; another loop that is armed and still
    running keeps the arming. Anything else disarms: *client* None, or an
    override's stand-in (the slow path serves overrides), and a polled key
    is never armed. The loop is held strongly while armed: its end
    (``hook``), like any other disarm, lets go of it. The singleton is held
    weakly.

    Returns:
        Whether the hit path serves *client* now (an override: whether it
        is disarmed, as the slow path serves it).
    """
    if record is None:
        _disarm(cls_ref)
        return client is not None
    if not pushed:
        return False
    cls = cls_ref()
    loop_ref = record.slot.loop
    loop = None if loop_ref is None else loop_ref()
    if cls is None or loop is None or kept(cls, loop):
        return False
    _disarm(cls_ref)
    on = [True]
    hit = _hit(loop, record.client, on, single_ref, name)

    # A staticmethod: binding the singleton would cost a tuple per call.
    def armed_call(
        *args: object, **kwargs: object
    ) -> Coroutine[Any, Any, object]:
        if args or kwargs:
            raise TypeError(no_arguments(name, args, kwargs))
        return hit()

    _flags[id(cls_ref)] = on
    type.__setattr__(cls, _ON, on)
    type.__setattr__(cls, _LOOP, loop)
    type.__setattr__(cls, "__call__", staticmethod(armed_call))
    return True


def kept(cls: type, loop: object) -> bool:
    """Whether another loop, armed and running, keeps *cls*'s arming."""
    other: Any = cls.__dict__.get(_LOOP)
    return other is not None and other is not loop and other.is_running()


def _hit(
    loop: Any,  # noqa: ANN401 -- any event loop.
    client: object,
    on: list[bool],
    single_ref: weakref.ReferenceType[Any],
    name: str,
) -> Callable[[], Coroutine[Any, Any, object]]:
    """Return the coroutine function of an armed hit on *loop*."""

    async def miss() -> object:
        single = single_ref()
        if single is None:  # Dropped after the call, before the await.
            # Its clients were closed when it was collected: nothing here
            # is safe to serve. The call holds it weakly (a strong hold
            # would cost every armed call, or delay every orphan close).
            msg = (
                f"The singleton {name} was garbage collected before this "
                "call to it was awaited, and its clients were closed; keep "
                "a reference to the singleton (a module-level name, say) "
                "until every call to it is awaited."
            )
            raise ReferenceError(msg)
        return await single._get()

    # on[0] is read last and the client returned on the next line: under
    # the GIL no other thread runs between the two, so a disarm (which
    # comes before any retirement) is never missed.
    if _BY_THREAD and isinstance(loop, asyncio.BaseEventLoop):
        base: Any = loop  # Typeshed leaves out the private _thread_id.

        async def hit() -> object:
            if base._thread_id == _get_ident() and on[0]:
                return client
            return await miss()

    else:

        async def hit() -> object:
            if _get_running_loop() is loop and on[0]:
                return client
            return await miss()

    return hit


def _disarm(cls_ref: weakref.ReferenceType[type]) -> None:
    """Put *cls*'s slow path back; coroutines made while armed miss too."""
    flag = _flags.pop(id(cls_ref), None)
    if flag is not None:
        flag[0] = False
    cls = cls_ref()
    if cls is None:  # Gone: only calls made before it can still come.
        return
    on = cls.__dict__.get(_ON)
    if on is not None:
        on[0] = False
    # Each step is safe to repeat: one cut short is finished next time.
    for attribute in ("__call__", _ON, _LOOP):
        if attribute in cls.__dict__:
            type.__delattr__(cls, attribute)


# -- the end of a loop ---------------------------------------------------


def hook(life: Lifecycle[Any], closer: Closer, slot: Slot) -> None:
    """Register *slot*'s loop-end generator with the running loop.

    The loop's firstiter hook adds it to the generators its
    ``shutdown_asyncgens()`` closes. No finalizer is installed for it: a
    finalizer would hold the loop, and a dropped slot finishes its
    generator itself.
    """
    loop = asyncio.get_running_loop()
    ending = _endings.get(loop)
    if ending is None:
        ending = _endings[loop] = _Ending()
    agen = _until_loop_ends(life, closer, slot, ending)
    hooks = sys.get_asyncgen_hooks()
    sys.set_asyncgen_hooks(firstiter=hooks.firstiter, finalizer=None)
    try:
        agen.asend(None).send(None)
    except StopIteration:
        slot.hook = agen
    finally:
        sys.set_asyncgen_hooks(*hooks)


@final
class _Ending:
    """One loop's loop-end closes: how many are to run, what one raised."""

    __slots__ = ("error", "pending")

    def __init__(self) -> None:
        self.pending = 0
        self.error: BaseException | None = None


# Held weakly: a finished loop is not kept.
_endings: weakref.WeakKeyDictionary[asyncio.AbstractEventLoop, _Ending] = (
    weakref.WeakKeyDictionary()
)


async def _until_loop_ends(
    life: Lifecycle[Any], closer: Closer, slot: Slot, ending: _Ending
) -> AsyncGenerator[None, None]:
    ending.pending += 1
    closing = False
    try:
        yield
    finally:
        # The loop is shutting down its async generators: close the slot's
        # clients on it while it still runs. A slot dropped meanwhile has
        # nothing left to close here.
        try:
            closing = not slot.dropped
            if closing:
                doomed: list[Record[Any]] = []
                said: list[Verdict] = []
                life.close_slot(slot, doomed, said)
                slot.hook = None
                try:  # Said, then closed.
                    for verdict in said:
                        say(life.name, verdict)
                finally:
                    # Every one of them, whatever one close raises.
                    await arun_each(
                        functools.partial(closer.aclose, record)
                        for record in sorted(doomed, key=lambda r: -r.sequence)
                    )
            # And the closes running in tasks of their own on this loop,
            # which the loop would close unfinished (see _close.track).
            await await_own(asyncio.get_running_loop())
        except BaseException as exc:  # noqa: BLE001 -- raised below.
            # Raised by the last loop-end close of this loop: raised now, a
            # KeyboardInterrupt would stop the loop before the others ran.
            ending.error = ending.error or exc
        finally:
            ending.pending -= 1
        error = ending.error
        if closing and error is not None and not ending.pending:
            ending.error = None
            raise error


def drop(life: Lifecycle[Any], slot: Slot, lost: list[Record[Any]]) -> None:
    """Forget the slot of a loop that ended without closing it."""
    doomed: list[Record[Any]] = []
    said: list[Verdict] = []
    life.close_slot(slot, doomed, said)
    lost.extend(doomed)
    agen, slot.hook = slot.hook, None
    if agen is not None:
        with contextlib.suppress(StopIteration, RuntimeError):
            cast("Any", agen).aclose().send(None)
    # Its clients are never closed (the caller reports them unclosed).
    for verdict in said:
        say(life.name, verdict)


def prune(life: Lifecycle[Any], lost: list[Record[Any]]) -> None:
    """Drop the slots of loops that were closed (or collected)."""
    for slot in life.ended_slots():
        drop(life, slot, lost)
