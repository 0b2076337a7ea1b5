"""The async hit path: one event loop's live client, without the driver.

Each async singleton has a class of its own (see ``_make``).
While a pushed key (none, ``keys.env``, ``keys.file``) cannot have changed
and a loop's client is live, the lifecycle arms that class's ``__call__``
for that loop: a plain function that validates its arguments and returns a
coroutine which, once awaited, returns the client if it runs on the armed
loop and the arming still stands. Two Python frames, no lock, no key read.
Anything else (another loop, a disarmed class, a loop no longer running)
takes the driver's slow path from inside that coroutine.

The validation runs when the coroutine runs, not when ``single()`` is called:
a coroutine made on one loop and awaited on another gets the other loop's
client. One loop per class is armed at a time; while it runs, other loops
take the slow path rather than take the arming from it (which would make
every call on two busy loops a class-attribute store).

The lifecycle calls ``arm`` and ``disarm`` under its lock, from its "live
client changed" transitions only, so the two never interleave.
"""

from __future__ import annotations

import asyncio
import sys
import threading
from asyncio import _get_running_loop
from typing import TYPE_CHECKING, Any

from poolkeeper._identity import no_arguments

if TYPE_CHECKING:
    import weakref
    from collections.abc import Callable, Coroutine

    from poolkeeper._lifecycle import Record

# Before 3.12, asyncio's _get_running_loop() calls getpid() (a system call)
# each time. There an asyncio loop's record of the thread it runs on (None
# while stopped) answers the same question: one thread runs one loop at a
# time.
_BY_THREAD = sys.version_info < (3, 12)
_get_ident = threading.get_ident

# Where an armed class keeps what disarm() needs: the flag its coroutines
# read last, and the loop it serves.
_ON = "_poolkeeper_on"
_LOOP = "_poolkeeper_loop"

# The flag of each armed class, by the id of the class's weak reference
# (the lifecycle holds that reference as long as it can arm or disarm).
# The cycle collector clears that reference before the orphan close of a
# singleton collected with its class runs, and a call made while armed
# must still miss then: disarm finds the flag here, not on the class.
_flags: dict[int, list[bool]] = {}


def arm(
    cls_ref: weakref.ReferenceType[type],
    single_ref: weakref.ReferenceType[Any],
    name: str,
    record: Record[Any],
) -> bool:
    """Arm *cls*'s hit path with *record*'s client, for *record*'s loop.

    Another loop that is armed and still running keeps the arming. The
    loop is held strongly while armed: its end (``_loop_end``), like any
    other disarm, lets go of it. The singleton is held weakly.

    Returns:
        Whether it armed.
    """
    cls = cls_ref()
    loop_ref = record.slot.loop
    loop = None if loop_ref is None else loop_ref()
    if cls is None or loop is None or kept(cls, loop):
        return False
    disarm(cls_ref, None)
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


def disarm(cls_ref: weakref.ReferenceType[type], _client: object) -> None:
    """Put *cls*'s slow path back; coroutines made while armed miss too.

    The lifecycle's switch: any client (an override) disarms as None does,
    because the slow path serves overrides.
    """
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
