"""The end of an event loop: its async singletons' slots close with it.

When a loop ends the way ``asyncio.run()`` and ``asyncio.Runner`` end it,
its clients are closed on it before it closes: each slot registers an
async generator with its loop, and the loop's ``shutdown_asyncgens()``
closes that generator, whose ``finally`` closes the slot. A loop closed
without that shutdown cannot run anything any more: its slot is dropped
when the next slot opens (``prune``) and its clients are reported unclosed.

A close hook raising a ``BaseException`` at loop end (``KeyboardInterrupt``)
skips no client: it is raised, out of the loop's shutdown, by the last of
that loop's loop-end closes to finish.
"""

from __future__ import annotations

import asyncio
import contextlib
import functools
import sys
import weakref
from typing import TYPE_CHECKING, Any, cast, final

from poolkeeper._close import arun_each

if TYPE_CHECKING:
    from collections.abc import AsyncGenerator

    from poolkeeper._close import Closer
    from poolkeeper._lifecycle import Lifecycle, Record, Slot


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
                life.close_slot(slot, doomed)
                slot.hook = None
                # Every one of them, whatever one close raises.
                await arun_each(
                    functools.partial(closer.aclose, record)
                    for record in sorted(doomed, key=lambda r: -r.sequence)
                )
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
    life.close_slot(slot, doomed)
    lost.extend(doomed)
    agen, slot.hook = slot.hook, None
    if agen is not None:
        with contextlib.suppress(StopIteration, RuntimeError):
            cast("Any", agen).aclose().send(None)


def prune(life: Lifecycle[Any], lost: list[Record[Any]]) -> None:
    """Drop the slots of loops that were closed (or collected)."""
    for slot in list(life.slots.values()):
        loop = None if slot.loop is None else slot.loop()
        if slot.loop is not None and (loop is None or loop.is_closed()):
            drop(life, slot, lost)
