"""Issue 25's third round of attack findings (points 1, 2, 3, 5, 7, 8).

Each class is one promise the attacks broke; each test failed before its
fix.
"""

from __future__ import annotations

import asyncio

import pytest
from helpers import WAIT, Factory, FakeClient

from poolkeeper import process_singleton


class Custom(BaseException):
    """A BaseException that is neither KeyboardInterrupt nor SystemExit."""


BASE_EXCEPTIONS = [KeyboardInterrupt, SystemExit, GeneratorExit, Custom]


class TestEveryFactoryErrorIsCounted:
    """Point 7: build_failures counts factory calls that raised anything."""

    @pytest.mark.parametrize("exc", BASE_EXCEPTIONS)
    def test_sync_factory(self, exc):
        """A sync factory's BaseException is counted, and propagates."""
        factory = Factory(fail_with=exc())
        single = process_singleton(factory)

        with pytest.raises(exc):
            single()

        assert 1 == single.statistics().build_failures
        assert 0 == single.statistics().builds
        factory.fail_with = None
        assert single() is factory.built[0]
        assert (1, 1) == (
            single.statistics().builds,
            single.statistics().build_failures,
        )

    @pytest.mark.parametrize("exc", [SystemExit, GeneratorExit, Custom])
    def test_async_factory(self, exc):
        """An async factory's BaseException is counted too."""

        @process_singleton
        async def single() -> FakeClient:
            await asyncio.sleep(0)
            raise exc

        async def main():
            with pytest.raises(exc):
                await single()

        asyncio.run(main())
        assert 1 == single.statistics().build_failures

    def test_a_cancelled_async_build_is_no_failure(self):
        """Cancelling the builder is the caller's doing, not the factory's."""
        started: list[asyncio.Event] = []

        @process_singleton
        async def single() -> FakeClient:
            started[0].set()
            await asyncio.sleep(3600)
            raise AssertionError  # pragma: no cover -- cancelled first.

        async def main():
            started.append(asyncio.Event())
            task = asyncio.ensure_future(single())
            await asyncio.wait_for(started[0].wait(), WAIT)
            task.cancel()
            with pytest.raises(asyncio.CancelledError):
                await task

        asyncio.run(main())
        assert 0 == single.statistics().build_failures
