"""Fork safety: a child never uses or closes its parent's client."""

from __future__ import annotations

import logging
import multiprocessing
import os
import sys
import threading

import pytest
from helpers import (
    WAIT,
    Factory,
    FakeClient,
    fork_and_check,
    held_in_retirement,
    wait_until,
)

from poolkeeper import keys, process_singleton

pytestmark = pytest.mark.skipif(
    not hasattr(os, "fork"), reason="needs os.fork()"
)


class TestChild:
    def test_child_builds_its_own_client(self):
        """The child builds a new client; the parent's stays intact."""
        factory = Factory()
        single = process_singleton(factory)
        parent_client = single()
        parent = os.getpid()

        def child():
            client = single()
            stats = single.statistics()
            return (
                client is not parent_client
                and client.pid == os.getpid() != parent
                and client is single()
                and not parent_client.closed
                and (1, 1, os.getpid())
                == (stats.builds, stats.generation, stats.pid)
            )

        assert 0 == fork_and_check(child)
        assert parent_client is single()
        assert not parent_client.closed
        assert 1 == factory.calls

    def test_child_never_closes_the_inherited_client(self):
        """Nothing the child does closes the parent's client."""
        single = process_singleton(Factory())
        parent_client = single()

        def child():
            single.reset()
            single()
            from poolkeeper import close_all

            close_all()
            return parent_client.closes == []

        assert 0 == fork_and_check(child)

    def test_child_forgets_clients_pending_close(self):
        """A retired, leased client is abandoned, not closed, in the child."""
        single = process_singleton(Factory())
        with single.lease() as leased:
            single.reset()

            def child():
                return 0 == single.statistics().pending_close

            assert 0 == fork_and_check(child)
        assert leased.closed

    def test_fork_keep_shares_the_client(self):
        """fork="keep" opts out: the child uses the parent's client."""
        single = process_singleton(fork="keep")(Factory())
        parent_client = single()

        def child():
            return single() is parent_client

        assert 0 == fork_and_check(child)

    def test_env_keyed_singleton_rebuilds_in_child(self, monkeypatch):
        """Keyed singletons forget the parent's client too."""
        monkeypatch.setenv("PK_FORK_KEY", "k")
        single = process_singleton(key=keys.env("PK_FORK_KEY"))(Factory())
        polled = process_singleton(key=lambda: "k")(Factory())
        a, b = single(), polled()

        def child():
            return single() is not a and polled() is not b

        assert 0 == fork_and_check(child)


class TestAfterFork:
    def test_after_fork_receives_the_inherited_client(self):
        """after_fork runs in the child with the client it abandons."""
        seen: list[FakeClient] = []
        single = process_singleton(after_fork=seen.append)(Factory())
        parent_client = single()

        def child():
            return [parent_client] == seen and not parent_client.closed

        assert 0 == fork_and_check(child)
        assert [] == seen

    def test_after_fork_failure_is_logged_on_first_use(self, caplog):
        """A failing after_fork hook is reported later, never raised."""

        def broken(client):
            raise RuntimeError("cannot release")

        single = process_singleton(after_fork=broken)(Factory())
        single()

        def child():
            with caplog.at_level(logging.WARNING, logger="poolkeeper"):
                single()
            return (
                "after_fork" in caplog.text
                and "RuntimeError raised at" in caplog.text
                and "cannot release" not in caplog.text
            )

        assert 0 == fork_and_check(child)

    @pytest.mark.parametrize("fork", ["rebuild", "keep"])
    def test_after_fork_receives_a_client_whose_close_was_owed(self, fork):
        """Forked after the timer retired the client, before it closed it.

        The timer's thread says the retirement (its log line) between the
        two: a handler there holds it until the fork is made. The close
        was the parent's timer's to run; the child abandons the client
        (after_fork called on it), never closes it, and owes no close.
        """
        seen: list[FakeClient] = []
        name = f"owed-at-fork-{fork}"
        single = process_singleton(
            max_age=0.05, fork=fork, after_fork=seen.append, name=name
        )(Factory())
        parent = os.getpid()

        def child():
            from poolkeeper import close_all

            fresh = single()
            abandoned = [parent_client] == seen
            owed = single.statistics().pending_close
            close_all()
            if not abandoned or owed or parent_client.closed:
                print(f"after_fork saw {seen}, {owed} owed", file=sys.stderr)
                return False
            return fresh is not parent_client and fresh.closed

        with held_in_retirement(name, "max_age") as held:
            parent_client = single()
            assert held.wait(WAIT)
            assert not parent_client.closed
            code = fork_and_check(child)
        assert code == 0
        assert [] == seen
        assert single() is not parent_client
        assert wait_until(lambda: parent_client.closes == [parent])


class TestForkDuringBuild:
    def test_fork_while_another_thread_builds_does_not_deadlock(self):
        """A child forked mid-build gets fresh locks and builds by itself."""
        gate = threading.Event()
        factory = Factory(gate=gate)
        single = process_singleton(factory)
        builder = threading.Thread(target=single)
        builder.start()
        assert factory.entered.wait(WAIT)

        def child():
            # The parent's builder thread does not exist here; its build
            # never ends. A child that waited for it would hang.
            factory.gate = None
            with single._self_life.lock:
                pass
            return isinstance(single(), FakeClient)

        try:
            assert 0 == fork_and_check(child)
        finally:
            gate.set()
            builder.join(WAIT)
        assert not builder.is_alive()
        assert 1 == len(factory.built)

    def test_fork_while_lock_is_held_does_not_deadlock(self):
        """A child forked while a thread holds the lock can still build."""
        single = process_singleton(Factory())
        held, release = threading.Event(), threading.Event()

        def hold():
            with single._self_life.lock:
                held.set()
                release.wait(WAIT)

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(WAIT)
        try:
            assert 0 == fork_and_check(
                lambda: isinstance(single(), FakeClient)
            )
        finally:
            release.set()
            holder.join(WAIT)


def _report(queue):
    from forkhelpers import SINGLE

    client = SINGLE()
    queue.put(
        (os.getpid(), id(client), client.pid, SINGLE.statistics().builds)
    )


def test_multiprocessing_fork_workers_build_their_own():
    """Forked multiprocessing workers each build exactly one client."""
    import forkhelpers

    parent_client = forkhelpers.SINGLE()
    ctx = multiprocessing.get_context("fork")
    queue = ctx.Queue()
    procs = [ctx.Process(target=_report, args=(queue,)) for _ in range(3)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=WAIT) for _ in procs]
    for p in procs:
        p.join(WAIT)
        assert 0 == p.exitcode

    assert 3 == len({pid for pid, *_ in results})
    assert all(pid == client_pid for pid, _, client_pid, _ in results)
    assert all(1 == builds for *_, builds in results)
    assert not parent_client.closed
