"""Exceptions and warnings raised by poolkeeper.

The hierarchy::

    PoolkeeperError(Exception)
    └── ReentrantBuildError(PoolkeeperError, RuntimeError)
    PoolkeeperWarning(Warning)
    ├── PoolLeakWarning(PoolkeeperWarning)
    └── UnclosedClientWarning(PoolkeeperWarning)

Errors raised by a factory or a key function are never wrapped: they reach
the caller unchanged, so code keeps catching the SDK's own exception types.
"""

from __future__ import annotations

__all__ = [
    "PoolLeakWarning",
    "PoolkeeperError",
    "PoolkeeperWarning",
    "ReentrantBuildError",
    "UnclosedClientWarning",
]


class PoolkeeperError(Exception):
    """Base class of the errors poolkeeper itself raises.

    .. versionadded:: 0.1
    """


class ReentrantBuildError(PoolkeeperError, RuntimeError):
    """A build would wait for itself, so the call fails instead of hanging.

    Raised when a factory calls its own singleton while building it
    (directly, or through a task it starts and awaits), and when factories
    on different threads or tasks wait for each other's builds (A's factory
    needs B while B's factory needs A).

    Args:
        name: The qualified name of the factory whose build would be
            waited for.
        cycle: For a cycle, the factories in it, the first one repeated at
            the end (``("a", "b", "a")``); empty for a factory calling
            itself.

    .. versionadded:: 0.1
    """

    def __init__(self, name: str, cycle: tuple[str, ...] = ()) -> None:
        """Name the factory (and the cycle) that would wait for itself."""
        super().__init__(name, cycle)
        self.name = name
        self.cycle = cycle

    def __str__(self) -> str:
        """Say which factories wait for each other and what to do."""
        if len(set(self.cycle)) > 1:
            chain = " -> ".join(f"{name}()" for name in self.cycle)
            return (
                f"The builds of {chain} wait for each other (each factory "
                "calls the next singleton while its build is in progress); "
                "build one without the other, or call them in one order."
            )
        return (
            f"{self.name}() called its own singleton while building it; "
            "build the client without calling the singleton, or split it "
            "into two singletons."
        )


class PoolkeeperWarning(Warning):
    """Base class of the warnings poolkeeper emits.

    .. versionadded:: 0.1
    """


class PoolLeakWarning(PoolkeeperWarning):
    """More instances of a pool-owning client are alive than expected.

    Emitted by :func:`poolkeeper.watch` when the number of live instances
    of one watched class crosses its limit, and again each time that number
    doubles. Each client owns a connection pool (sockets, often threads),
    so many live clients usually mean one is built per call or per retry.
    For a ``scope="thread"`` singleton (*scope* ``"thread"``), when it is
    about to hold more live clients, one per thread, than watch()'s
    *thread_limit*.

    Args:
        name: The client class, as ``module.QualName``, or the thread
            singleton's name.
        count: How many instances are alive now (with the one about to be
            built, for a thread singleton).
        limit: The most instances expected to be alive at once.
        sites: The places (``path:line``) that built the live instances
            most often, each with its number of live instances, most first
            (empty for a thread singleton).
        scope: ``"process"`` for a watched class, ``"thread"`` for a
            thread singleton.

    .. versionadded:: 0.1
    """

    def __init__(
        self,
        name: str,
        count: int,
        limit: int,
        sites: tuple[tuple[str, int], ...],
        scope: str = "process",
    ) -> None:
        """Record the class, the count, the limit and the call sites."""
        super().__init__(name, count, limit, sites, scope)
        self.name = name
        self.count = count
        self.limit = limit
        self.sites = sites
        self.scope = scope

    def __str__(self) -> str:
        """Say how many are alive, where they were built, and the fix."""
        if self.scope == "thread":
            return (
                f"{self.count} live clients of the scope='thread' singleton "
                f"{self.name}, with the one it is building (limit "
                f"{self.limit}): one for each thread that called it and has "
                "not ended. Threads are piling up, or the limit "
                "(poolkeeper.watch(thread_limit=...)) is below the number "
                "of threads that use it."
            )
        built = ", ".join(f"{site} ({n})" for site, n in self.sites)
        return (
            f"{self.count} {self.name} instances are alive at once "
            f"(limit {self.limit}), built at: {built or 'unknown'}; each "
            "owns a connection pool, so build one per process and reuse "
            "it, e.g. with @poolkeeper.process_singleton."
        )


class UnclosedClientWarning(PoolkeeperWarning):
    """A retired client could not be closed properly.

    Emitted, for example, when a close hook returns an awaitable that a
    synchronous retirement cannot await, or when an async client's event
    loop ended without closing it. It is shown by Python's default warning
    filters (it is not a :class:`ResourceWarning`, which they hide), and
    the same message is logged at WARNING on the ``poolkeeper`` logger.
    A warnings filter that makes it an error does not make a close raise:
    the client is counted once in ``close_failures`` and logged, as with
    any filter.

    .. versionadded:: 0.1
    """
