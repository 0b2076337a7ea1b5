"""What both drivers do the same way around a build.

The sync driver (``_singleton``) and the async one (``_async``) differ in
how they wait and close; how a build that an exception cut short is
settled is one rule, kept here.
"""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any, Final

from poolkeeper._identity import key_fingerprint

if TYPE_CHECKING:
    from poolkeeper._lifecycle import Lifecycle, Record, Ticket

#: No value yet: no client built, no key read.
NOTHING: Final[Any] = object()


def settle(  # noqa: PLR0913, PLR0917 -- what a cut-short build knows.
    life: Lifecycle[Any],
    ticket: Ticket,
    client: object,
    keyed: bool,  # noqa: FBT001 -- the singleton has a key function.
    now: float,
    doomed: list[Record[Any]],
) -> None:
    """Finish *ticket*'s build after an exception cut its bookkeeping short.

    A built *client* is made live (or closed, through *doomed*); without
    one the build failed with the exception in flight, and anything but an
    ``Exception`` (a ``KeyboardInterrupt``, a cancellation) lets its waiters
    retry (see :meth:`Lifecycle.failed`).
    """
    if client is NOTHING:
        life.failed(ticket, sys.exc_info()[1])
    else:
        fingerprint = key_fingerprint(keyed, ticket.key.value)
        life.built(ticket, client, fingerprint, now, doomed)
