"""The census of one watched class: its live instances, where each was built.

Instances are held through weak references, so counting never keeps one
alive. :data:`lock` guards every census; a forked child gets a new one
(the watchdog's fork hook, in :mod:`poolkeeper._watch`, replaces it).
"""

from __future__ import annotations

import collections
import threading
import weakref
from typing import Any

__all__ = ["Census", "Ref", "exempt", "lock"]

# Guards every census. Weakref callbacks never take it (see Census), so a
# plain lock cannot deadlock when garbage collection runs while it is held.
lock = threading.Lock()

# Its ``depth`` is above 0 while a thread singleton's factory runs on this
# thread: the instances it builds are that singleton's, counted against
# watch()'s thread_limit (poolkeeper._threads), not as the class's.
exempt = threading.local()


class Ref(weakref.ref[Any]):
    __slots__ = ("ident", "site")
    ident: int
    site: tuple[str, int]


class Census:
    """The live instances of one concrete class, and where they were built.

    A weakref callback may run in any thread between any two bytecodes,
    including while :data:`lock` is held. So it only appends to a deque
    (atomic), and whoever next holds the lock takes the dead out.
    """

    __slots__ = ("dead", "live", "name", "sites", "warned_at")

    def __init__(self, name: str) -> None:
        self.name = name
        self.live: dict[int, Ref] = {}
        self.sites: dict[tuple[str, int], int] = {}
        self.dead: collections.deque[Ref] = collections.deque()
        self.warned_at = 0

    def drain(self) -> None:
        while self.dead:
            ref = self.dead.popleft()
            # An id is reused only after its object died, so an entry that
            # is not this very ref belongs to a newer object.
            if self.live.get(ref.ident) is ref:
                del self.live[ref.ident]
                left = self.sites[ref.site] - 1
                if left:
                    self.sites[ref.site] = left
                else:
                    del self.sites[ref.site]
