"""The recommended pattern for a client held per episode, for hours.

An episode takes a ``lease()`` and hands the leased client to its
threads. A key rotation during the episode builds a new client for
everyone else; the episode's client stays open until the lease ends, so
its sandboxes keep working. Afterwards the old client is closed, and a
sandbox created before the rotation is reached again through the new
client by its id.
"""

from __future__ import annotations

import gc
import threading
import warnings

import daytona
import poolkeeper
import pytest
from daytona_test_helpers import wait_for

from poolkeeper_daytona import ClosedDaytonaUsedWarning, daytona_client

_WORKERS = 4


def _run_workers(target, count: int = _WORKERS) -> list[BaseException]:
    errors: list[BaseException] = []

    def guarded(index: int) -> None:
        try:
            target(index)
        except BaseException as exc:
            errors.append(exc)

    threads = [
        threading.Thread(target=guarded, args=(i,)) for i in range(count)
    ]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(30)
    assert not any(t.is_alive() for t in threads)
    return errors


class TestEpisodeLease:
    """A leased client outlives a rotation until its episode ends."""

    def test_rotation_mid_episode_keeps_the_episode_client_open(
        self, sdk_env, daytona_emulator
    ):
        """Threads of the episode keep working on the client they got."""
        sdk_env.setenv("DAYTONA_API_KEY", "episode-old")
        rotated = threading.Barrier(_WORKERS + 1)
        before: list[daytona.Sandbox] = []
        after: list[daytona.Sandbox] = []

        with daytona_client.lease() as episode:

            def work(index: int) -> None:
                before.append(episode.create())
                rotated.wait(10)  # The key rotates here.
                rotated.wait(10)
                after.append(episode.create())
                before[index].refresh_data()

            errors: list[BaseException] = []
            worker_done = threading.Thread(
                target=lambda: errors.extend(_run_workers(work))
            )
            worker_done.start()
            rotated.wait(10)
            sdk_env.setenv("DAYTONA_API_KEY", "episode-new")
            fresh = daytona_client()
            rotated.wait(10)
            worker_done.join(30)

            assert not worker_done.is_alive()
            assert [] == errors
            assert fresh is not episode
            assert 1 == daytona_client.statistics().pending_close
            # Everything of the episode went out with the old key.
            posts = daytona_emulator.requests("episode-old", method="POST")
            assert 2 * _WORKERS == len(posts)
            assert [] == daytona_emulator.requests(
                "episode-new", method="POST"
            )
            assert daytona_emulator.open_connections("episode-old")

        # The episode ended, but its sandboxes still hold its client open
        # (poolkeeper.made_from): they keep working on it.
        stats = daytona_client.statistics()
        assert (stats.pending_close, stats.held_open) == (1, 1)
        assert stats.dependents >= 2 * _WORKERS
        before[0].refresh_data()
        # A sandbox of the old client is also reached through the new one.
        sandbox_id = before[0].id
        again = daytona_client().get(sandbox_id)
        assert sandbox_id == again.id
        assert daytona_emulator.requests(
            "episode-new", method="GET", path=f"/api/sandbox/{again.id}"
        )
        # Once they are gone, the old client closes.
        before.clear()
        after.clear()
        del again
        gc.collect()
        assert wait_for(
            lambda: daytona_client.statistics().pending_close == 0, 10
        )
        assert wait_for(
            lambda: not daytona_emulator.open_connections("episode-old")
        )

    def test_each_episode_gets_the_client_live_at_its_start(
        self, sdk_env, daytona_emulator
    ):
        """Episodes started after a rotation use the new client."""
        sdk_env.setenv("DAYTONA_API_KEY", "ep-a")
        with daytona_client.lease() as first:
            sdk_env.setenv("DAYTONA_API_KEY", "ep-b")
            with daytona_client.lease() as second:
                assert first is not second
                second.create()
            first.create()

        assert daytona_emulator.requests("ep-a", method="POST")
        assert daytona_emulator.requests("ep-b", method="POST")
        assert wait_for(lambda: not daytona_emulator.open_connections("ep-a"))
        assert daytona_emulator.open_connections("ep-b")


class TestProxyAcrossRotation:
    """proxy() for code that must always use the live client."""

    def test_proxy_held_by_threads_follows_the_rotation(
        self, sdk_env, daytona_emulator
    ):
        """Calls through a stored proxy go out with the current key."""
        sdk_env.setenv("DAYTONA_API_KEY", "proxy-old")
        client = daytona_client.proxy()
        assert [] == _run_workers(lambda _: client.create())

        sdk_env.setenv("DAYTONA_API_KEY", "proxy-new")
        assert [] == _run_workers(lambda _: client.create())

        old = daytona_emulator.requests("proxy-old", method="POST")
        new = daytona_emulator.requests("proxy-new", method="POST")
        assert (_WORKERS, _WORKERS) == (len(old), len(new))
        assert isinstance(client, daytona.Daytona)
        assert wait_for(
            lambda: not daytona_emulator.open_connections("proxy-old")
        )


class _Episode:
    """The incident's episode shape: the client held in closures for hours.

    A worker thread creates the sandbox, another thread deletes it later,
    and a reaper thread deletes what a cancelled episode left behind. The
    episode keeps sandbox ids, never ``Sandbox`` objects: a ``Sandbox``
    works through the client that created it, while an id is reached
    through whichever client is live.
    """

    def __init__(self, client) -> None:
        self.client = client  # Captured once, used by every closure.
        self.sandboxes: list[str] = []
        self.cancelled: list[str] = []

    def create(self) -> None:
        self.sandboxes.append(self.client.create().id)

    def delete(self) -> None:
        self.client.delete(self.client.get(self.sandboxes.pop()))

    def reap(self) -> None:
        while self.cancelled:
            self.client.delete(self.client.get(self.cancelled.pop()))


def _in_thread(target) -> None:
    errors = _run_workers(lambda _: target(), count=1)
    assert [] == errors


class TestEpisodeShapeWithProxy:
    """The long-held shape holds daytona_client.proxy(): nothing leaks."""

    def test_no_connection_left_after_rotation_and_close_all(
        self, sdk_env, daytona_emulator
    ):
        """Create, rotate, delete and reap from threads; then close_all()."""
        sdk_env.setenv("DAYTONA_API_KEY", "shape-old")
        episode = _Episode(daytona_client.proxy())
        _in_thread(episode.create)
        _in_thread(episode.create)
        episode.cancelled.append(episode.sandboxes.pop())

        sdk_env.setenv("DAYTONA_API_KEY", "shape-new")
        _in_thread(episode.delete)  # Hours later, from another thread.
        _in_thread(episode.reap)  # The cancel reaper.

        # The old client was closed at the rotation, and nothing reopened
        # it: both later deletes went out with the new key.
        assert wait_for(
            lambda: not daytona_emulator.open_connections("shape-old")
        )
        deletes = daytona_emulator.requests("shape-new", method="DELETE")
        assert 2 == len(deletes)
        poolkeeper.close_all()
        assert wait_for(
            lambda: not daytona_emulator.open_connections("shape-new")
        )
        assert [] == daytona_emulator.open_connections("shape-old")

    def test_a_raw_client_used_after_its_close_warns_once(
        self, sdk_env, daytona_emulator
    ):
        """The same shape with the client itself: the reuse is reported."""
        sdk_env.setenv("DAYTONA_API_KEY", "raw-old")
        episode = _Episode(daytona_client())
        _in_thread(episode.create)
        _in_thread(episode.create)

        sdk_env.setenv("DAYTONA_API_KEY", "raw-new")
        daytona_client()  # Someone else's call retires the old client.
        assert wait_for(
            lambda: not daytona_emulator.open_connections("raw-old")
        )
        with pytest.warns(ClosedDaytonaUsedWarning) as caught:
            episode.delete()
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            episode.delete()  # Said once: no second warning.

        assert 1 == len(caught)
        assert __file__ == caught[0].filename
        # What the warning is about: the retired client reopened a pool.
        assert daytona_emulator.open_connections("raw-old")
        # Released by hand here: _mark_closed makes close_daytona a no-op
        # on a client it closed, so its reopened pool is cleared directly.
        for owner in ("_api_client", "_toolbox_api_client"):
            getattr(episode.client, owner).rest_client.pool_manager.clear()
        assert wait_for(
            lambda: not daytona_emulator.open_connections("raw-old")
        )
