"""The decision loop both drivers run: request, then serve, wait or build.

A call asks the lifecycle what to do next (:meth:`Lifecycle.request`) and
acts on the answer until it is served. Which key it asks for, how often it
asks, and what each answer leads to is one rule for the sync driver
(``_singleton``: threads and events) and the async one (``_async``: tasks
and futures), so it is written once, here, as a generator: it yields each
step for the driver to carry out (a ``Build`` to run, a ``Wait`` to wait
out, an error to raise) and ends with the ``Serve`` that answers the call.
It does no I/O of its own: it never calls the factory, never waits and
never closes. It reads the key again after a wait, and a key's error
passes through it unchanged, except the one a generator cannot raise
(``StopIteration``, PEP 479), which it yields for the driver to raise, as
it yields a failed build's error.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from poolkeeper._drive import NOTHING
from poolkeeper._identity import evaluate_key, hash_key, too_many_rounds
from poolkeeper._lifecycle import MAX_ROUNDS, Build, Wait, constant

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

    from poolkeeper._lifecycle import Lifecycle, Serve, Slot

T = TypeVar("T")


def read_key(
    life: Lifecycle[Any],
    key: Callable[[], object] | None,
    name: str,
    value: object = NOTHING,
) -> tuple[int, int, object]:
    """Return ``(epoch, hash, value)`` of the key, read after the epoch.

    The epoch is read before the key: a change between the two keeps the
    hit path disarmed (see :meth:`Lifecycle.request`). A *value* the polled
    hit path already read is used instead of calling *key* again.
    """
    epoch = life.epoch
    if value is NOTHING:
        return (epoch, *evaluate_key(key, name))
    return (epoch, *hash_key(value, name))


class Driven(Protocol[T]):
    """What the decision loop reads of a singleton."""

    @property
    def _self_life(self) -> Lifecycle[T]: ...
    @property
    def _self_name(self) -> str: ...
    @property
    def _self_key(self) -> Callable[[], object] | None: ...


def rounds(  # noqa: PLR0913, PLR0917 -- what a call knows.
    single: Driven[T],
    slot: Slot,
    reslot: Callable[[], Slot],
    owner: object,
    wakeup: Callable[[], object],
    asked: list[Any],
    first: tuple[int, int, object],
) -> Iterator[Serve | Wait | Build | BaseException]:
    """Yield what a call for *slot*'s client does next; a ``Serve`` ends it.

    *first* is the key as :func:`read_key` read it; *owner* is the thread
    or task that calls, and *wakeup* makes the event or future a build's
    waiters wait on. After a ``Build`` the builder asks again for the key
    it built (it is served what it built, if still live); after a
    ``Wait`` for a build of the same key that failed, the build's error is
    yielded, for the driver to raise. A slot dropped meanwhile (its loop
    ended) is replaced by *reslot*. *asked* holds the slot, the wake-up and
    the epoch of the latest request: a driver unwinding by an exception
    gives them to :meth:`Lifecycle.settle_unbegun`.

    Raises:
        PoolkeeperError: If the key changed during each of ``MAX_ROUNDS``
            builds.
    """
    life, name, key = single._self_life, single._self_name, single._self_key
    epoch, key_hash, value = first
    for _ in range(MAX_ROUNDS):
        if slot.dropped:
            slot = reslot()
        else:
            done = wakeup()
            asked[:] = slot, done, epoch
            # The key is compared here, with no lock held: its __eq__ is
            # user code. request() says if the live record changed since.
            live = slot.live
            matched = live is not None and live.matches(key_hash, value)
            step = life.request(
                slot,
                live,
                matched,
                key_hash,
                value,
                epoch,
                owner,
                constant(done),
            )
            if step is None:
                continue
            yield step
            if isinstance(step, Build):
                ticket = step.ticket
                if ticket.record:
                    # The builder is served what it built, if still live.
                    key_hash, value = ticket.key_hash, ticket.key.value
                    continue
            elif isinstance(step, Wait):
                ended = step.ticket
                if ended.error is not None and ended.matches(key_hash, value):
                    yield ended.error
        try:
            epoch, key_hash, value = read_key(life, key, name)
        except StopIteration as stop:
            # A generator may not raise it (PEP 479 turns it into a
            # RuntimeError): the driver raises the key's error unchanged.
            yield stop
            return
    raise too_many_rounds(name, "build")
