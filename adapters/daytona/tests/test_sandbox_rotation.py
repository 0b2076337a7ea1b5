"""Sandboxes made before their client was retired keep working.

A ``Sandbox`` routes every call through the ``Daytona`` that made it (its
API and toolbox pools). The adapter registers each sandbox its clients
hand out with ``poolkeeper.made_from``: when the singleton retires the
client (healing on a broken connection, a key rotation, ``reset()``), the
old client stays open for its sandboxes, and closes once they are deleted
and dropped. Every request of the old sandboxes must succeed on the
emulator (real SDK), with no ``ClosedDaytonaUsedWarning``; afterwards the
process's file descriptors and threads are back to the baseline.
"""

from __future__ import annotations

import asyncio
import gc
import threading
import time
import warnings

import daytona
import poolkeeper
import pytest
from daytona_test_helpers import (
    ause_sandbox,
    fd_count,
    sandbox_calls,
    settle,
    use_sandbox,
    wait_for,
)
from poolkeeper import _lifecycle

from poolkeeper_daytona import (
    ClosedDaytonaUsedWarning,
    async_daytona_client,
    daytona_client,
)

HOW = ["transport", "key", "reset"]
#: Sandboxes made before the retirement.
SANDBOXES = 3


@pytest.fixture(name="short_backoff")
def _short_backoff(sdk_env):
    """A healing retirement at once: the backoff ends within 0.3 s."""
    sdk_env.setattr(_lifecycle, "BACKOFF_FIRST", 0.05)
    sdk_env.setattr(_lifecycle, "BACKOFF_CAP", 0.2)
    time.sleep(0.3)  # Any spacing an earlier test left has passed.
    return sdk_env


def _all_succeeded(emulator, ids: list[str]) -> list[tuple[str, str, int]]:
    """The requests on *ids* that failed (none, when all succeeded)."""
    return [
        call
        for sandbox_id in ids
        for call in sandbox_calls(emulator, sandbox_id)
        if call[2] >= 400
    ]


def _threads() -> list[str]:
    # The file-key thread watches the key files from the first build on,
    # for as long as the singleton exists (it holds no client).
    return [
        t.name
        for t in threading.enumerate()
        if t.name != "poolkeeper-filekeys"
    ]


@pytest.fixture(name="baseline")
def _baseline(daytona_emulator) -> tuple[int, int]:
    """(fds, threads) with the emulator running, before any client."""
    del daytona_emulator
    poolkeeper.close_all()
    settle()
    return fd_count(), len(_threads())


def _back_to(baseline: tuple[int, int]) -> bool:
    settle()
    return (fd_count(), len(_threads())) == baseline


class TestSyncSandboxes:
    @pytest.mark.parametrize("how", HOW)
    def test_old_sandboxes_work_then_their_client_closes(
        self, how, short_backoff, daytona_emulator, baseline
    ):
        env = short_backoff
        env.setenv("DAYTONA_API_KEY", f"sync-{how}")
        old = daytona_client()
        sandboxes = [old.create() for _ in range(SANDBOXES)]
        ids = [s.id for s in sandboxes]
        closes = daytona_client.statistics().closes
        time.sleep(0.3)  # Older than the backoff: healing retires at once.

        if how == "transport":
            daytona_emulator.break_requests("reset", method="POST")
            with (
                pytest.raises(daytona.DaytonaError),
                daytona_client.lease() as client,
            ):
                client.create()
        elif how == "key":
            env.setenv("DAYTONA_API_KEY", "sync-rotated")
        else:
            assert daytona_client.reset()
        new = daytona_client()
        assert new is not old
        stats = daytona_client.statistics()
        assert (stats.held_open, stats.dependents) == (1, SANDBOXES)
        assert stats.closes == closes

        with warnings.catch_warnings():
            warnings.simplefilter("error", ClosedDaytonaUsedWarning)
            for n, sandbox in enumerate(sandboxes):
                use_sandbox(sandbox, f"old{n}")
            # Deleted three ways: by the new client (the SDK runs
            # sandbox.delete()), by itself, and by the old client.
            new.delete(sandboxes[0])
            sandboxes[1].delete()
            old.delete(sandboxes[2])
        assert [] == _all_succeeded(daytona_emulator, ids)

        del sandboxes, sandbox
        gc.collect()
        # Released by the sweep, closed on a worker thread after it.
        assert wait_for(
            lambda: daytona_client.statistics().closes == closes + 1, 10
        )
        assert daytona_client.statistics().held_open == 0
        poolkeeper.close_all()
        assert wait_for(lambda: _back_to(baseline), 10), (
            (fd_count(), _threads()),
            baseline,
        )


class TestAsyncSandboxes:
    @pytest.mark.parametrize("how", HOW)
    def test_old_sandboxes_work_then_their_client_closes(
        self, how, short_backoff, daytona_emulator, baseline
    ):
        env = short_backoff
        env.setenv("DAYTONA_API_KEY", f"async-{how}")

        async def main() -> None:
            old = await async_daytona_client()
            sandboxes = [await old.create() for _ in range(SANDBOXES)]
            ids = [s.id for s in sandboxes]
            closes = async_daytona_client.statistics().closes
            await asyncio.sleep(0.3)

            if how == "transport":
                daytona_emulator.break_requests("reset", method="POST")
                with pytest.raises(daytona.DaytonaError):
                    async with async_daytona_client.lease() as client:
                        await client.create()
            elif how == "key":
                env.setenv("DAYTONA_API_KEY", "async-rotated")
            else:
                assert await async_daytona_client.reset()
            new = await async_daytona_client()
            assert new is not old
            stats = async_daytona_client.statistics()
            assert (stats.held_open, stats.dependents) == (1, SANDBOXES)
            assert stats.closes == closes

            with warnings.catch_warnings():
                warnings.simplefilter("error", ClosedDaytonaUsedWarning)
                for n, sandbox in enumerate(sandboxes):
                    await ause_sandbox(sandbox, f"old{n}")
                await new.delete(sandboxes[0])
                await sandboxes[1].delete()
                await old.delete(sandboxes[2])
            assert [] == _all_succeeded(daytona_emulator, ids)

            del sandboxes, sandbox
            gc.collect()
            # The old client closes on this loop: keep it running.
            for _ in range(1000):
                if async_daytona_client.statistics().closes > closes:
                    break
                await asyncio.sleep(0.01)
            stats = async_daytona_client.statistics()
            assert (stats.held_open, stats.closes) == (0, closes + 1)
            await poolkeeper.aclose_all()

        asyncio.run(main())
        assert wait_for(lambda: _back_to(baseline), 10), (
            (fd_count(), _threads()),
            baseline,
        )


class TestWithoutRetirement:
    def test_a_live_clients_sandboxes_hold_nothing_once_gone(
        self, sdk_env, daytona_emulator
    ):
        """Each sandbox handed out is counted; a dropped one goes.

        Deleted or not: the SDK's event subscription (300 s after its last
        use) holds no sandbox alive, the adapter's dispatcher holding its
        handler weakly.
        """
        sdk_env.setenv("DAYTONA_API_KEY", "live")
        client = daytona_client()
        before = daytona_client.statistics().dependents
        sandbox = client.create()
        assert daytona_client.statistics().dependents == before + 1
        listed = list(client.list())
        assert sandbox.id in [s.id for s in listed]
        assert daytona_client.statistics().dependents == before + 1 + len(
            listed
        )
        sandbox.delete()
        del sandbox
        gc.collect()
        # The listed ones, still referenced here, still hold the client.
        held = before + len(listed)
        assert wait_for(
            lambda: daytona_client.statistics().dependents == held, 10
        )
        # Dropped without a delete: gone all the same.
        del listed
        gc.collect()
        assert wait_for(
            lambda: daytona_client.statistics().dependents == before, 10
        )
        assert daytona_client() is client
