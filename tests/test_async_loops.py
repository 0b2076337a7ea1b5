"""Async singletons at the edges: leases, overrides, reprs."""

from __future__ import annotations

import asyncio
import os

import pytest
from helpers import WAIT

from poolkeeper import aclose_all, process_singleton


class Client:
    """An async client that records the pid of its closes."""

    def __init__(self) -> None:
        self.pid = os.getpid()
        self.closes: list[int] = []

    async def aclose(self) -> None:
        self.closes.append(os.getpid())


class TestLease:
    def test_lease_of_an_overridden_singleton_yields_the_override(self):
        """async with lease() inside override() yields the override."""

        async def build() -> Client:
            return Client()

        single = process_singleton(build)
        stand_in = Client()

        async def main():
            with single.override(stand_in):
                async with single.lease() as leased:
                    return leased

        assert stand_in is asyncio.run(main())
        assert 0 == single.statistics().builds

    def test_lease_whose_build_fails_propagates_and_pins_nothing(self):
        """A failing factory's error leaves lease() with nothing leased."""

        async def build() -> Client:
            raise ConnectionError("refused")

        single = process_singleton(build)

        async def main():
            with pytest.raises(ConnectionError):
                async with single.lease():
                    pass  # pragma: no cover -- the build raised.
            return single.statistics()

        stats = asyncio.run(main())
        assert (0, 1, 0) == (stats.builds, stats.build_failures, stats.leases)


class TestRepr:
    def test_repr_counts_loops_and_names_the_factory(self):
        """repr() names the factory, the loops served and the pid."""

        async def build() -> Client:
            return Client()

        single = process_singleton(build)

        async def main():
            await single()
            return repr(single)

        text = asyncio.run(main())
        assert "AsyncProcessSingleton" in text
        assert "build" in text
        assert f"(1 loops, pid {os.getpid()})" in text


class TestShutdownDuringABuild:
    def test_build_finishing_after_the_loop_shut_down_its_slot(self):
        """A client built for a shut-down slot is closed; callers rebuild."""
        gate: asyncio.Event | None = None
        built: list[Client] = []

        async def build() -> Client:
            if not built and gate is not None:
                await asyncio.wait_for(gate.wait(), WAIT)
            client = Client()
            built.append(client)
            return client

        single = process_singleton(build)
        loop = asyncio.new_event_loop()
        try:

            async def start():
                nonlocal gate
                gate = asyncio.Event()
                tasks = [asyncio.ensure_future(single()) for _ in range(2)]
                for _ in range(10):
                    await asyncio.sleep(0)
                return tasks

            def shut_down_during_the_build():
                tasks = loop.run_until_complete(start())
                # The loop's slot closes (as asyncio.run() ends it) while
                # the first build is still waiting on its gate.
                loop.run_until_complete(loop.shutdown_asyncgens())
                loop.call_soon(gate.set)
                return loop.run_until_complete(
                    asyncio.wait_for(asyncio.gather(*tasks), WAIT)
                )

            # asyncio's own warning: the new slot's loop-end hook comes
            # after the shutdown, so only an explicit close reaches it. It
            # is expected from before the tasks are made: where warnings
            # follow the context (3.14t's default), a task sees the one it
            # was made in.
            with pytest.warns(ResourceWarning, match="shutdown_asyncgens"):
                results = shut_down_during_the_build()
            loop.run_until_complete(aclose_all())
        finally:
            loop.close()
        first, second = built
        assert [os.getpid()] == first.closes  # Built for a dropped slot.
        assert [second, second] == results
        assert [os.getpid()] == second.closes
