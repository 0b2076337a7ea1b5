"""Exceptions and warnings raised by poolkeeper.

The hierarchy::

    PoolkeeperError(Exception)
    └── ReentrantBuildError(PoolkeeperError, RuntimeError)
    PoolkeeperWarning(Warning)
    └── UnclosedClientWarning(PoolkeeperWarning, ResourceWarning)

Errors raised by a factory or a key function are never wrapped: they reach
the caller unchanged, so code keeps catching the SDK's own exception types.
"""

from __future__ import annotations

__all__ = [
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
    """A factory called its own singleton while building it.

    Waiting would deadlock, so the inner call fails instead.

    Args:
        name: The factory's qualified name.

    .. versionadded:: 0.1
    """

    def __init__(self, name: str) -> None:
        """Name the factory that re-entered its own build."""
        super().__init__(name)
        self.name = name

    def __str__(self) -> str:
        """Say which factory re-entered and what to do about it."""
        return (
            f"{self.name}() called its own singleton while building it; "
            "build the client without calling the singleton, or split it "
            "into two singletons."
        )


class PoolkeeperWarning(Warning):
    """Base class of the warnings poolkeeper emits.

    .. versionadded:: 0.1
    """


class UnclosedClientWarning(PoolkeeperWarning, ResourceWarning):
    """A retired client could not be closed properly.

    Emitted, for example, when a close hook returns an awaitable that a
    synchronous retirement cannot await.

    .. versionadded:: 0.1
    """
