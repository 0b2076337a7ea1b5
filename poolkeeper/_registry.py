"""Every singleton of the process: fork hook, shutdown and build order."""

from __future__ import annotations

import atexit
import itertools
import os
import weakref
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

#: Orders builds across all singletons so close_all() can go in reverse.
build_sequence = itertools.count(1)


class _Member(Protocol):
    def _forget_parent(self) -> None: ...
    def _detach(self) -> list[tuple[int, Callable[[], None]]]: ...


_members: weakref.WeakSet[_Member] = weakref.WeakSet()


def members() -> list[_Member]:
    """Return the singletons alive now."""
    return list(_members)


def register(member: _Member) -> None:
    """Track *member* weakly for the fork hook and :func:`close_all`."""
    _members.add(member)


def close_all() -> None:
    """Retire and close the live client of every singleton.

    Clients are closed in reverse build order across all singletons, so a
    client built from another one is closed first. Leased clients are
    closed when their last lease exits. Afterwards every singleton builds
    afresh on its next call. Registered with :mod:`atexit`; call it
    yourself at the end of a worker's life. Close failures are logged and
    counted, never raised.

    .. versionadded:: 0.1
    """
    doomed: list[tuple[int, Callable[[], None]]] = []
    for member in list(_members):
        doomed.extend(member._detach())
    doomed.sort(key=lambda pair: pair[0], reverse=True)
    for _, close in doomed:
        close()


def _after_fork_in_child() -> None:
    # Runs in the child with one thread: take no lock, log nothing, never
    # raise. Each member swaps in fresh locks and drops the parent's client.
    for member in list(_members):
        member._forget_parent()


os.register_at_fork(after_in_child=_after_fork_in_child)
atexit.register(close_all)
