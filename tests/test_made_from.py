"""Objects made from a client keep it open: ``poolkeeper.made_from``.

An object an SDK client makes and that goes on using the client (a Daytona
sandbox, a redis ``PubSub``, a boto3 resource) must keep working after the
singleton retires that client. ``made_from(obj, client)`` holds the client
open until the object is gone and the client's last lease has ended, or
until ``close_all()``; then the client is closed once.
"""

from __future__ import annotations

import asyncio
import gc
import os
import random
import threading

import pytest
from helpers import WAIT, Factory, FakeClient, fork_and_check, wait_until

import poolkeeper
from poolkeeper import keys, made_from, process_singleton


class Made:
    """An object made from a client, which keeps using it."""

    def __init__(self, client: FakeClient) -> None:
        self.client = client

    def use(self) -> bool:
        """Whether its client is still open (a real one would fail)."""
        return not self.client.closes


def _collected(single, client: FakeClient) -> bool:
    """After its objects are dropped: *client* closed once, nothing held."""
    gc.collect()
    if not wait_until(lambda: client.closes == [os.getpid()], WAIT):
        return False
    stats = single.statistics()
    return (stats.dependents, stats.held_open, stats.pending_close) == (
        0,
        0,
        0,
    )


@pytest.fixture(name="rotated")
def _rotated(monkeypatch):
    monkeypatch.setenv("PK_MADE_FROM_KEY", "one")
    return lambda: monkeypatch.setenv("PK_MADE_FROM_KEY", "two")


class TestHeldAcrossRetirement:
    @pytest.mark.parametrize("how", ["reset", "retire", "key"])
    def test_the_retired_client_stays_open_while_its_object_lives(
        self, how, rotated
    ):
        single = process_singleton(key=keys.env("PK_MADE_FROM_KEY"))(Factory())
        client = single()
        made = made_from(Made(client), client)
        assert single.statistics().dependents == 1
        if how == "reset":
            single.reset()
        elif how == "retire":
            assert single.retire(client)
        else:
            rotated()
        assert single() is not client  # Replaced...
        assert made.use()  # ...and the object still works on its own.
        stats = single.statistics()
        assert (stats.dependents, stats.held_open) == (1, 1)
        assert stats.leases == 0  # An object is not a lease.
        del made
        assert _collected(single, client)

    def test_max_age_waits_for_the_object(self):
        single = process_singleton(max_age=0.05)(Factory())
        client = single()
        made = made_from(Made(client), client)
        assert wait_until(lambda: single() is not client)
        assert made.use()
        del made
        assert _collected(single, client)

    def test_a_live_client_is_not_closed_when_its_object_goes(self):
        single = process_singleton(Factory())
        client = single()
        made_from(Made(client), client)  # Dropped at once.
        gc.collect()
        assert wait_until(lambda: single.statistics().dependents == 0)
        assert single() is client
        assert not client.closes
        single.reset()
        assert client.closes == [os.getpid()]

    def test_many_objects_one_client(self):
        single = process_singleton(Factory())
        client = single()
        made = [made_from(Made(client), client) for _ in range(50)]
        single.reset()
        assert single.statistics().dependents == 50
        while len(made) > 1:
            made.pop()
        gc.collect()
        assert wait_until(lambda: single.statistics().dependents == 1)
        assert not client.closes  # One object left.
        made.clear()
        assert _collected(single, client)


class TestWithLeases:
    @pytest.mark.parametrize("last", ["lease", "object"])
    def test_closed_after_both_the_lease_and_the_object(self, last):
        single = process_singleton(Factory())
        client = single()
        made = made_from(Made(client), client)
        lease = single.lease()
        assert lease.__enter__() is client
        single.reset()
        if last == "lease":
            del made
            gc.collect()
            assert wait_until(lambda: single.statistics().dependents == 0)
            assert not client.closes  # The lease holds it.
            lease.__exit__(None, None, None)
        else:
            lease.__exit__(None, None, None)
            assert not client.closes  # The object holds it.
            del made
        assert _collected(single, client)


class TestCloseAll:
    def test_close_all_closes_a_held_client_once(self):
        single = process_singleton(Factory())
        client = single()
        made = made_from(Made(client), client)
        single.reset()
        poolkeeper.close_all()
        assert client.closes == [os.getpid()]
        del made
        gc.collect()
        assert wait_until(lambda: single.statistics().dependents == 0)
        assert client.closes == [os.getpid()]  # Not a second time.


class TestWhatIsNotHeld:
    def test_an_object_without_weak_references_is_refused(self):
        single = process_singleton(Factory())
        client = single()
        with pytest.raises(TypeError, match=r"made_from\(\).*a tuple.*lease"):
            made_from((1, 2), client)
        assert single.statistics().dependents == 0

    def test_an_override_stand_in_holds_nothing(self):
        single = process_singleton(Factory())
        stand_in = FakeClient("stand-in")
        with single.override(stand_in):
            made = made_from(Made(stand_in), stand_in)
            assert made.client is stand_in
        assert single.statistics().dependents == 0

    def test_a_closed_client_holds_nothing(self):
        single = process_singleton(Factory())
        client = single()
        single.reset()
        assert client.closes
        made_from(Made(client), client)
        assert single.statistics().dependents == 0


class TestAsync:
    def test_an_async_client_is_closed_on_its_loop_once_its_object_goes(
        self,
    ):
        class AsyncClient:
            def __init__(self) -> None:
                self.closes: list[asyncio.AbstractEventLoop] = []

            async def aclose(self) -> None:
                self.closes.append(asyncio.get_running_loop())

        async def make() -> AsyncClient:
            return AsyncClient()

        single = process_singleton(make)

        async def main() -> None:
            loop = asyncio.get_running_loop()
            client = await single()
            made = made_from(Made(client), client)  # type: ignore[arg-type]
            assert await single.reset()
            assert await single() is not client
            assert single.statistics().held_open == 1
            del made
            gc.collect()
            for _ in range(int(WAIT / 0.01)):
                if client.closes:
                    break
                await asyncio.sleep(0.01)
            assert client.closes == [loop]

        asyncio.run(main())


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
class TestFork:
    def test_a_child_never_closes_the_parents_held_client(self):
        single = process_singleton(Factory())
        client = single()
        made = made_from(Made(client), client)

        def child() -> bool:
            nonlocal made
            mine = single()
            del made
            gc.collect()
            threading.Event().wait(3 * 0.5)  # Three sweeps.
            return mine is not client and not client.closes

        assert 0 == fork_and_check(child)
        single.reset()
        assert not client.closes  # The parent's object still holds it.
        del made
        assert _collected(single, client)

    def test_a_kept_client_is_held_in_the_child(self):
        single = process_singleton(fork="keep")(Factory())
        client = single()
        made = made_from(Made(client), client)

        def child() -> bool:
            nonlocal made
            single.reset()
            if client.closes or not made.use():
                return False
            del made
            return _collected(single, client)

        assert 0 == fork_and_check(child)
        assert not client.closes


class TestChurn:
    def test_objects_made_and_dropped_while_clients_are_retired(self):
        """8 threads make and drop objects; another retires the client.

        No object ever sees its client closed, and every client built is
        closed exactly once once they are all gone.
        """
        factory = Factory()
        single = process_singleton(factory)
        stop = threading.Event()
        broken: list[FakeClient] = []

        def user(seed: int) -> None:
            rng = random.Random(seed)
            kept: list[Made] = []
            while not stop.is_set():
                # Made inside a lease: the client cannot close meanwhile.
                with single.lease() as client:
                    kept.append(made_from(Made(client), client))
                if rng.random() < 0.5:
                    kept.pop(rng.randrange(len(kept)))
                broken.extend(m.client for m in kept if not m.use())
                if len(kept) > 20:
                    kept.clear()

        threads = [threading.Thread(target=user, args=(i,)) for i in range(8)]
        for thread in threads:
            thread.start()
        try:
            for _ in range(200):
                single.reset()
                threading.Event().wait(0.002)
        finally:
            stop.set()
            for thread in threads:
                thread.join(WAIT)
        assert not any(t.is_alive() for t in threads)
        assert broken == []
        built = factory.built
        assert len(built) > 10
        single.reset()
        gc.collect()
        assert wait_until(
            lambda: all(c.closes == [os.getpid()] for c in built), WAIT
        )
        stats = single.statistics()
        assert (stats.dependents, stats.held_open, stats.pending_close) == (
            0,
            0,
            0,
        )
