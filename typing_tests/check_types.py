"""Static checks of poolkeeper's types, run by mypy and pyright; never run."""

from __future__ import annotations

from typing_extensions import assert_type

from poolkeeper import (
    AsyncProcessSingleton,
    ProcessSingleton,
    Statistics,
    aclose_all,
    fingerprint,
    keys,
    process_singleton,
)


class Client:
    """Stands in for an SDK client."""

    def close(self) -> None:
        """Close it."""


@process_singleton
def bare() -> Client:
    """Bare form."""
    return Client()


@process_singleton(
    key=(keys.env("API_KEY"), keys.file("/run/secrets/key")),
    close=Client.close,
    min_rebuild_interval=5,
)
def called() -> Client:
    """Called form."""
    return Client()


@process_singleton(scope="thread", close=Client.close)
def per_thread() -> Client:
    """One client per thread."""
    return Client()


assert_type(bare, ProcessSingleton[Client])
assert_type(called, ProcessSingleton[Client])
assert_type(per_thread, ProcessSingleton[Client])
assert_type(per_thread.statistics().live, int)
assert_type(bare(), Client)
assert_type(called(), Client)
assert_type(bare.current(), Client | None)
assert_type(bare.reset(), bool)
assert_type(bare.statistics(), Statistics)
assert_type(bare.statistics().key_fingerprint, str | None)
assert_type(fingerprint("x"), str)
assert_type(keys.env("A")(), tuple[str | None, ...])
assert_type(keys.file("p")(), tuple[str, str | None])

with bare.lease() as leased:
    assert_type(leased, Client)
with bare.override(Client()) as overridden:
    assert_type(overridden, Client)


@process_singleton
async def async_factory() -> Client:
    """Async factory."""
    return Client()


@process_singleton(key=keys.env("API_KEY"))
async def async_keyed() -> Client:
    """Async factory, called form."""
    return Client()


async def use_async() -> None:
    """Exercise the async API."""
    assert_type(async_factory, AsyncProcessSingleton[Client])
    assert_type(async_keyed, AsyncProcessSingleton[Client])
    assert_type(await async_factory(), Client)
    assert_type(await async_keyed.reset(), bool)
    async with async_factory.lease() as leased_async:
        assert_type(leased_async, Client)
    assert_type(bare.proxy(), Client)
    await aclose_all()
