"""Hooks are typed with the client type: a hook for another type fails.

Each ``# type: ignore[arg-type]`` below is an expected error: both
checkers fail on an unused one.
"""

from __future__ import annotations

from typing_extensions import assert_type

from poolkeeper import (
    AsyncProcessSingleton,
    ProcessSingleton,
    process_singleton,
    release_sockets,
)


class Client:
    """Stands in for an SDK client."""

    def close(self) -> None:
        """Close it."""


class Other:
    """Another SDK's client."""

    def shutdown(self) -> None:
        """Close it, its way."""


def close_client(client: Client) -> None:
    """A close hook for Client."""
    client.close()


def close_other(other: Other) -> None:
    """A close hook for Other."""
    other.shutdown()


async def aclose_client(client: Client) -> None:
    """An async close hook for Client."""
    client.close()


@process_singleton(close=close_client, after_fork=release_sockets)
def typed() -> Client:
    """Both hooks fit: release_sockets takes any object."""
    return Client()


@process_singleton(close=Client.close)
def unbound_method() -> Client:
    """An unbound method is a hook typed with its class."""
    return Client()


@process_singleton(after_fork=release_sockets)
def generic_hook() -> Client:
    """A hook taking object keeps the factory's precise type."""
    return Client()


@process_singleton()
def no_hooks() -> Client:
    """No hooks: the factory's type, as before."""
    return Client()


@process_singleton(close=close_other)  # type: ignore[arg-type]
def wrong_close() -> Client:
    """close= written for Other on a Client factory."""
    return Client()


@process_singleton(after_fork=close_other)  # type: ignore[arg-type]
def wrong_after_fork() -> Client:
    """after_fork= written for Other on a Client factory."""
    return Client()


@process_singleton(close=aclose_client)
async def async_typed() -> Client:
    """An async factory with an async hook for its client type."""
    return Client()


@process_singleton(close=close_other)  # type: ignore[arg-type]
async def async_wrong() -> Client:
    """An async factory with a hook for another type."""
    return Client()


assert_type(typed, ProcessSingleton[Client])
assert_type(unbound_method, ProcessSingleton[Client])
assert_type(generic_hook, ProcessSingleton[Client])
assert_type(no_hooks, ProcessSingleton[Client])
assert_type(async_typed, AsyncProcessSingleton[Client])
