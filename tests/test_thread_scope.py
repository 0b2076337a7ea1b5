"""scope="thread": one client per thread, each closed on its own thread."""

from __future__ import annotations

import functools
import gc
import os
import sys
import threading
import time

import pytest
from helpers import (
    WAIT,
    fork_and_check,
    held_in_retirement,
    run_threads,
    wait_until,
)

import poolkeeper
from poolkeeper import keys, process_singleton
from poolkeeper._threads import ThreadCloser

pytestmark = pytest.mark.filterwarnings(
    # Python 3.12+ warns when forking with threads alive; the fork tests
    # fork with threads alive on purpose.
    "ignore:This process .* is multi-threaded:DeprecationWarning"
)

MS = 0.001  # A build and a close each take a millisecond.


class Client:
    """A client that records the threads that built, used and closed it."""

    def __init__(self, label: object = None) -> None:
        self.label = label
        self.pid = os.getpid()
        self.thread = threading.get_ident()
        self.closes: list[tuple[int, int]] = []  # (pid, thread)
        self.in_use = 0
        self.closed_in_use = False
        threading.Event().wait(MS)

    @property
    def closed(self) -> bool:
        return bool(self.closes)

    def use(self) -> Client:
        """Stand for a call in flight on this client."""
        self.in_use += 1
        try:
            threading.Event().wait(MS)
        finally:
            self.in_use -= 1
        return self

    def close(self) -> None:
        self.closed_in_use |= self.in_use > 0
        self.closes.append((os.getpid(), threading.get_ident()))
        threading.Event().wait(MS)


class Made:
    """A factory of Clients that keeps every one it made."""

    def __init__(self, label: object = None) -> None:
        self.built: list[Client] = []
        self.lock = threading.Lock()
        self.label = label

    def __call__(self) -> Client:
        client = Client(self.label)
        with self.lock:
            self.built.append(client)
        return client


def closed_on_own_thread(clients: list[Client]) -> bool:
    """Whether each client was closed once, on the thread that built it."""
    return all(
        [(os.getpid(), c.thread)] == c.closes and not c.closed_in_use
        for c in clients
    )


class Parked:
    """Worker threads that each call a singleton, then wait for orders.

    Each worker runs *step* once per order (``step()`` then ``wait``), and
    ends after ``finish()``. Its results go to ``seen[i]``.
    """

    def __init__(self, n: int, step) -> None:
        self.n = n
        self.step = step
        self.seen: list[list[object]] = [[] for _ in range(n)]
        self.idents = [0] * n
        self.rounds = 0
        self.order = threading.Condition()
        self.done = threading.Barrier(n + 1)
        self.threads = [
            threading.Thread(target=self._run, args=(i,)) for i in range(n)
        ]
        for t in self.threads:
            t.start()
        self.done.wait(WAIT)  # Each made its first step.

    def _run(self, i: int) -> None:
        self.idents[i] = threading.get_ident()
        step = 0
        while True:
            self.seen[i].append(self.step())
            self.done.wait(WAIT)
            with self.order:
                assert self.order.wait_for(
                    functools.partial(self._ordered, step), WAIT
                )
                if self.rounds < 0:
                    return
            step += 1

    def _ordered(self, step: int) -> bool:
        return self.rounds > step or self.rounds < 0

    def again(self) -> None:
        """Each worker steps once more; return when all did."""
        with self.order:
            self.rounds += 1
            self.order.notify_all()
        self.done.wait(WAIT)

    def finish(self) -> None:
        """End the workers (after their last step) and join them."""
        with self.order:
            self.rounds = -1
            self.order.notify_all()
        for t in self.threads:
            t.join(WAIT)
            assert not t.is_alive(), "worker thread hung"


class TestOnePerThread:
    @pytest.mark.parametrize("n", [32, 128])
    def test_each_thread_gets_its_own(self, n):
        """n threads get n clients, each built once, on its own thread."""
        made = Made()
        single = process_singleton(scope="thread")(made)

        def work():
            first = single()
            return first, single(), threading.get_ident()

        results = run_threads(work, n)
        assert not [r for r in results if isinstance(r, BaseException)]
        assert all(a is b for a, b, _ in results)
        assert n == len({id(a) for a, _, _ in results}) == len(made.built)
        assert all(a.thread == ident for a, _, ident in results)
        # Each ended thread closed its client, on that thread.
        assert closed_on_own_thread(made.built)

    def test_the_main_thread_keeps_its_own(self):
        """A worker's client is not the main thread's, and vice versa."""
        single = process_singleton(scope="thread")(Made())
        mine = single()
        theirs = run_threads(single, 1)[0]
        assert mine is single()
        assert theirs is not mine
        assert not mine.closed

    def test_ident_reuse_gets_a_new_client(self):
        """A thread given a dead thread's ident builds a client of its own."""
        made = Made()
        single = process_singleton(scope="thread")(made)
        seen: dict[int, Client] = {}
        reused = None
        for _ in range(200):
            box: list[Client] = []
            t = threading.Thread(target=lambda out=box: out.append(single()))
            t.start()
            t.join(WAIT)
            client = box[0]
            if client.thread in seen:
                reused = (seen[client.thread], client)
                break
            seen[client.thread] = client
        assert reused is not None, "no thread ident was reused"
        dead, new = reused
        assert dead is not new
        assert dead.thread == new.thread
        assert closed_on_own_thread([dead, new])

    def test_called_with_arguments(self):
        """A call with arguments raises TypeError, hit or miss."""
        single = process_singleton(scope="thread")(Made())
        with pytest.raises(TypeError):
            single(1)
        single()
        with pytest.raises(TypeError):
            single(1)
        with pytest.raises(TypeError):
            single(x=1)


class TestThreadEnd:
    def test_thread_end_closes_on_that_thread(self):
        """A thread's end closes its client there, never another's."""
        made = Made()
        single = process_singleton(scope="thread")(made)
        mine = single()
        workers = Parked(8, single)
        assert not any(c.closed for c in made.built)
        workers.finish()
        theirs = [s[0] for s in workers.seen]
        assert closed_on_own_thread(theirs)
        assert not mine.closed
        stats = single.statistics()
        assert (9, 8, 1) == (stats.builds, stats.closes, stats.live)

    def test_no_dummy_threads_left(self):
        """A close at a thread's end leaves no _DummyThread behind."""
        single = process_singleton(scope="thread")(Made())
        before = threading.active_count()
        run_threads(single, 16)
        assert wait_until(lambda: threading.active_count() <= before)
        names = [t.name for t in threading.enumerate()]
        assert not [n for n in names if n.startswith("Dummy")]

    def test_current_thread_in_a_close_hook(self):
        """A close hook asking for its thread leaves no _DummyThread."""
        names: list[str] = []

        def close(client: Client) -> None:
            names.append(threading.current_thread().name)
            client.close()

        single = process_singleton(scope="thread", close=close)(Made())
        threads = [
            threading.Thread(target=single, name=f"w{i}") for i in range(4)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
        assert ["w0", "w1", "w2", "w3"] == sorted(names)
        left = [t.name for t in threading.enumerate()]
        assert not [n for n in left if n.startswith("Dummy")]


class TestReset:
    def test_reset_closes_each_on_its_own_thread(self):
        """reset(): each thread's client closes at that thread's next call."""
        made = Made()
        single = process_singleton(scope="thread")(made)
        workers = Parked(16, single)
        old = [s[0] for s in workers.seen]
        single.reset()
        assert not any(c.closed for c in old)  # No thread called again yet.
        workers.again()
        new = [s[1] for s in workers.seen]
        assert closed_on_own_thread(old)
        assert all(a is not b for a, b in zip(old, new, strict=True))
        assert not any(c.closed for c in new)
        workers.finish()
        assert closed_on_own_thread(new)

    def test_reset_then_thread_end(self):
        """A thread that never calls again closes its old client at its end."""
        made = Made()
        single = process_singleton(scope="thread")(made)
        workers = Parked(8, single)
        old = [s[0] for s in workers.seen]
        single.reset()
        workers.finish()
        assert closed_on_own_thread(old)
        assert 8 == len(made.built)

    def test_reset_retires_the_callers_at_once(self):
        """The thread calling reset() has its client retired and closed now."""
        single = process_singleton(scope="thread")(Made())
        mine = single()
        assert single.reset()
        assert closed_on_own_thread([mine])
        assert single.current() is None
        assert single() is not mine
        assert 1 == single.statistics().retirements["reset"]

    def test_never_under_a_lease(self):
        """A leased client retired by reset() closes at the lease's exit."""
        made = Made()
        single = process_singleton(scope="thread")(made)
        inside = threading.Event()
        reset = threading.Event()
        out: list[object] = []

        def work():
            with single.lease() as leased:
                inside.set()
                assert reset.wait(WAIT)
                fresh = single()  # Its next call: retires, cannot close.
                out.extend((leased, fresh, leased.closed))
                leased.use()
            out.append(leased.closed)

        t = threading.Thread(target=work)
        t.start()
        assert inside.wait(WAIT)
        single.reset()
        reset.set()
        t.join(WAIT)
        leased, fresh, closed_inside, closed_after = out
        assert fresh is not leased
        assert (False, True) == (closed_inside, closed_after)
        assert closed_on_own_thread([leased, fresh])

    def test_key_rotation_closes_on_own_threads(self, monkeypatch):
        """A keys.env change: each thread rotates, and closes, on its own."""
        name = "POOLKEEPER_TEST_THREAD_SCOPE_KEY"
        monkeypatch.setenv(name, "a")
        made = Made()
        single = process_singleton(scope="thread", key=keys.env(name))(made)
        workers = Parked(16, single)
        old = [s[0] for s in workers.seen]
        monkeypatch.setenv(name, "b")
        assert not any(c.closed for c in old)
        workers.again()
        assert closed_on_own_thread(old)
        new = [s[1] for s in workers.seen]
        assert all(a is not b for a, b in zip(old, new, strict=True))
        monkeypatch.setenv(name, "c")
        workers.finish()  # Never called again: closed at their end.
        assert closed_on_own_thread(new)

    def test_polled_key(self):
        """A key function is evaluated on every call of each thread."""
        value = ["a"]
        made = Made()
        single = process_singleton(scope="thread", key=lambda: value[0])(made)
        first = single()
        assert first is single()
        value[0] = "b"
        second = single()
        assert second is not first
        assert closed_on_own_thread([first])


class TestChurn:
    def test_never_closed_under_a_call(self, monkeypatch):
        """Resets and key changes under busy threads close on owners only."""
        name = "POOLKEEPER_TEST_THREAD_SCOPE_CHURN"
        monkeypatch.setenv(name, "0")
        made = Made()
        single = process_singleton(scope="thread", key=keys.env(name))(made)
        stop = threading.Event()

        def work() -> int:
            calls = 0
            while not stop.is_set() or calls < 20:
                single().use()
                calls += 1
            return calls

        threads = [threading.Thread(target=work) for _ in range(16)]
        for t in threads:
            t.start()
        pause = threading.Event()
        for i in range(20):
            pause.wait(0.005)
            if i % 2:
                single.reset()
            else:
                monkeypatch.setenv(name, str(i))
        stop.set()
        for t in threads:
            t.join(WAIT)
            assert not t.is_alive(), "worker thread hung"
        workers = [c for c in made.built if c.thread != threading.get_ident()]
        assert len(workers) > 16  # Each thread rotated at least once.
        assert closed_on_own_thread(workers)


class TestCloseAll:
    def test_close_all_closes_them_all(self):
        """close_all() closes every thread's client; each builds anew."""
        made = Made()
        single = process_singleton(scope="thread")(made)
        mine = single()
        workers = Parked(8, single)
        poolkeeper.close_all()
        assert all(c.closes for c in made.built)
        assert all(len(c.closes) == 1 for c in made.built)
        workers.again()
        assert all(s[0] is not s[1] for s in workers.seen)
        assert single() is not mine
        workers.finish()
        assert closed_on_own_thread([s[1] for s in workers.seen])
        assert all(len(c.closes) <= 1 for c in made.built)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
class TestFork:
    def test_child_closes_none_of_the_parents(self):
        """A forked child closes no parent client, and builds its own."""
        made = Made()
        single = process_singleton(scope="thread")(made)
        mine = single()
        workers = Parked(8, single)
        parents = list(made.built)

        def child():
            gc.collect()  # The parent's threads' locals, if they linger.
            fresh = single()
            ended: list[Client] = []
            t = threading.Thread(target=lambda: ended.append(single()))
            t.start()
            t.join(WAIT)
            poolkeeper.close_all()
            gc.collect()
            return (
                fresh is not mine
                and fresh.pid == os.getpid()
                and not any(c.closed for c in parents)
                and ended[0].closes == [(os.getpid(), ended[0].thread)]
                and fresh.closes == [(os.getpid(), fresh.thread)]
            )

        try:
            assert 0 == fork_and_check(child)
            assert not any(c.closed for c in parents)
        finally:
            workers.finish()
        assert closed_on_own_thread([s[0] for s in workers.seen])

    def test_an_override_across_a_fork(self):
        """An override block open at a fork still serves obj in the child."""
        single = process_singleton(scope="thread")(Made())
        single()
        stand_in = object()
        with single.override(stand_in):

            def child():
                ended = run_threads(single, 2)
                return single() is stand_in and all(
                    c is stand_in for c in ended
                )

            assert 0 == fork_and_check(child)


def closed_in_child(single, mine: Client, fork: str) -> bool:
    """In a forked child: whether *mine*, retired in the parent, is closed.

    fork="keep": at the child's next call, on this thread, once;
    fork="rebuild": never. close_all() closes the child's own client.
    """
    fresh = single()
    closes = [(os.getpid(), mine.thread)] if fork == "keep" else []
    if fresh is mine or mine.closes != closes:
        print(f"kept {mine.closes}, want {closes}", file=sys.stderr)
        return False
    poolkeeper.close_all()
    return mine.closes == closes and fresh.closed


class TestForkKeep:
    """fork="keep": the child keeps the forking thread's client only."""

    def test_the_child_keeps_the_forking_threads_client_only(self):
        """The others' clients are abandoned: never served, never closed."""
        made = Made()
        single = process_singleton(scope="thread", fork="keep")(made)
        mine = single()
        workers = Parked(4, single)
        others = [seen[0] for seen in workers.seen]

        def child():
            kept = single()
            ended: list[Client] = []
            t = threading.Thread(target=lambda: ended.append(single()))
            t.start()
            t.join(WAIT)
            live_before = single.statistics().live
            poolkeeper.close_all()
            gc.collect()
            return (
                kept is mine
                and ended[0] not in (mine, *others)
                and ended[0].pid == os.getpid()
                # The thread's end closed its own client, on that thread.
                and ended[0].closes == [(os.getpid(), ended[0].thread)]
                and live_before == 1
                # close_all() closes the kept client: it is the child's now.
                and mine.closes == [(os.getpid(), mine.thread)]
                and not any(c.closed for c in others)
            )

        try:
            assert 0 == fork_and_check(child)
            assert not mine.closed
            assert not any(c.closed for c in others)
        finally:
            workers.finish()
        assert closed_on_own_thread(others)
        assert mine is single()

    def test_the_kept_client_ages_out_in_the_child(self):
        """A kept client's max_age timer goes on in the child's thread."""
        made = Made()
        max_age = 0.5
        single = process_singleton(
            scope="thread", fork="keep", max_age=max_age
        )(made)
        before = time.monotonic()
        mine = single()
        workers = Parked(2, single)
        others = [seen[0] for seen in workers.seen]

        def child():
            first = single()
            # The age timer is due max_age after the build, which began
            # after `before`: a call that returned sooner was served the
            # kept client. A child that starts later (a loaded machine, a
            # large process to fork) may find it aged out already, by its
            # own timer or by the parent's before the fork.
            if time.monotonic() < before + max_age and first is not mine:
                print("the kept client was not served", file=sys.stderr)
                return False
            # Aged out by the timer, closed at this thread's next call.
            assert wait_until(lambda: single() is not mine)
            if mine.closes != [(os.getpid(), mine.thread)] or any(
                c.closed for c in others
            ):
                print(
                    f"closes: kept {mine.closes}, others "
                    f"{[c.closes for c in others]}, child {os.getpid()} "
                    f"on {mine.thread}",
                    file=sys.stderr,
                )
                return False
            return True

        try:
            assert 0 == fork_and_check(child)
            assert not any(c.closed for c in others)
        finally:
            workers.finish()

    @pytest.mark.parametrize("fork", ["keep", "rebuild"])
    def test_a_close_left_to_the_forking_thread(self, fork):
        """Aged out before the fork, its close waiting for this thread.

        fork="keep": the child's next call closes it there, once; with
        fork="rebuild" it is the parent's, never closed in the child.
        Either way the parent closes it at its own next call.
        """
        single = process_singleton(scope="thread", fork=fork, max_age=0.05)(
            Made()
        )
        mine = single()
        # Retired by its timer; its close waits for this thread's call.
        # The fork may land before or after the timer's thread handed the
        # close to this thread (the next test forks between the two).
        assert wait_until(
            lambda: single.statistics().retirements["max_age"] == 1
        )
        assert not mine.closed

        child = functools.partial(closed_in_child, single, mine, fork)

        assert 0 == fork_and_check(child)
        assert not mine.closed
        assert single() is not mine
        assert closed_on_own_thread([mine])

    @pytest.mark.parametrize("fork", ["keep", "rebuild"])
    def test_a_fork_between_a_retirement_and_its_hand_over(self, fork):
        """Forked after the timer retired the client, before it handed over.

        The timer's thread says the retirement (its log line) after the
        retirement and before it hands the close to this thread: a handler
        there holds it until the fork is made. fork="keep": the child's
        next call closes the client all the same, once, on this thread;
        fork="rebuild": never in the child. The parent closes it at its own
        next call.
        """
        name = f"handed-over-at-fork-{fork}"
        single = process_singleton(
            scope="thread", fork=fork, max_age=0.05, name=name
        )(Made())
        me = threading.get_ident()

        def handed_over() -> bool:
            return any(
                r.client is mine
                for c in gc.get_objects()
                if isinstance(c, ThreadCloser) and c.owner == me
                for r in c.left_here()
            )

        with held_in_retirement(name, "max_age") as held:
            mine = single()
            assert held.wait(WAIT)
            # In the window: retired, its close not handed over yet.
            assert single.statistics().retirements["max_age"] == 1
            assert not handed_over()
            code = fork_and_check(
                functools.partial(closed_in_child, single, mine, fork)
            )
        assert code == 0
        assert wait_until(handed_over)
        assert not mine.closed
        assert single() is not mine
        assert closed_on_own_thread([mine])


class TestMadeFrom:
    def test_an_object_keeps_its_threads_retired_client_open(self):
        """Retired while an object made from it lives: closed after, there."""
        made = Made()
        single = process_singleton(scope="thread")(made)
        held: list[object] = []
        first: list[Client] = []
        go = threading.Event()
        dropped = threading.Event()
        results: list[bool] = []

        def worker():
            client = single()
            first.append(client)
            held.append(poolkeeper.made_from(Made(), client))
            assert go.wait(WAIT)
            # Retired by the reset: this call builds a new client, and the
            # object keeps the old one open.
            results.append(single() is not client and not client.closed)
            held.clear()
            dropped.set()
            # Closed on this thread, at a call once the object is gone.
            results.append(
                wait_until(lambda: single() is not None and client.closed)
            )

        t = threading.Thread(target=worker)
        t.start()
        try:
            assert wait_until(lambda: bool(held))
            single.reset()
            go.set()
            assert dropped.wait(WAIT)
        finally:
            go.set()
            t.join(WAIT)
        assert not t.is_alive()
        assert [True, True] == results
        assert closed_on_own_thread(first)


class TestRefused:
    def test_async_factory(self):
        """An async factory with scope="thread" is refused, saying why."""

        async def api() -> object:
            return object()

        with pytest.raises(TypeError, match="one client per event loop"):
            process_singleton(scope="thread")(api)

    def test_unknown_scope(self):
        """An unknown scope names the factory and the allowed values."""

        def api() -> object:
            return object()

        with pytest.raises(ValueError, match=r"api.*'process'.*'thread'"):
            process_singleton(scope="loop")(api)  # type: ignore[call-overload]

    def test_min_rebuild_interval(self):
        """min_rebuild_interval cannot go with scope="thread"."""
        with pytest.raises(ValueError, match="scope='thread'"):
            process_singleton(scope="thread", min_rebuild_interval=1)(Made())


class TestOverride:
    def test_override_is_process_wide(self):
        """Inside override(obj), every thread gets obj; after, its own."""
        made = Made()
        single = process_singleton(scope="thread")(made)
        mine = single()
        stand_in = object()
        workers = Parked(4, single)
        with single.override(stand_in):
            assert single() is stand_in
            assert single.current() is stand_in
            with single.lease() as leased:
                assert leased is stand_in
            workers.again()
            assert all(s[1] is stand_in for s in workers.seen)
            assert all(run_threads(single, 4)[i] is stand_in for i in range(4))
            assert single.statistics().is_overridden
        assert single() is mine
        workers.again()
        assert all(s[2] is s[0] for s in workers.seen)
        workers.finish()


class TestPerThread:
    def test_retire_retires_the_callers_only(self):
        """retire(client) retires the caller's own client, not another's."""
        single = process_singleton(scope="thread")(Made())
        mine = single()
        theirs: list[object] = []

        def other():
            theirs.append(single.retire(mine))
            theirs.append(single())

        t = threading.Thread(target=other)
        t.start()
        t.join(WAIT)
        assert theirs[0] is False
        assert single() is mine
        assert single.retire(mine)
        assert closed_on_own_thread([mine])
        assert single() is not mine

    def test_retire_on_through_a_proxy(self):
        """A proxy resolves to the calling thread's client; retire_on heals."""

        class BrokenError(Exception):
            pass

        class Failing(Client):
            def fail(self) -> None:
                raise BrokenError

        single = process_singleton(scope="thread", retire_on=BrokenError)(
            Failing
        )
        handle = single.proxy()
        mine = single()
        assert handle.thread == threading.get_ident()
        out: list[object] = []

        def other():
            out.append(handle.thread)
            with pytest.raises(BrokenError):
                handle.fail()
            out.append(single())

        t = threading.Thread(target=other)
        t.start()
        t.join(WAIT)
        assert out[0] != threading.get_ident()
        assert single() is mine
        assert not mine.closed

    def test_a_reset_under_every_build(self):
        """A build reset every time gives up after a bounded number."""
        made = Made()

        def factory() -> Client:
            # Another thread resets during each build of this thread's.
            run_threads(single.reset, 1)
            return made()

        single = process_singleton(scope="thread")(factory)
        with pytest.raises(poolkeeper.PoolkeeperError, match="retired"):
            single()
        assert closed_on_own_thread(made.built[:-1])

    def test_inner_singleton_serves_the_override(self):
        """A thread's own singleton, called in an override, serves obj."""
        single = process_singleton(scope="thread")(Made())
        mine = single()
        inner = single._self_scope.here()
        single.reset()  # Its next call takes the slow path.
        stand_in = object()
        with single.override(stand_in):
            assert inner() is stand_in
        assert single() is not mine

    def test_a_thread_without_a_client(self):
        """A thread with no client: current() is None, retire() False."""
        single = process_singleton(scope="thread")(Made())
        other = single()
        assert [None, False] == run_threads(
            lambda: [single.current(), single.retire(other)], 1
        )[0]
        assert not other.closed

    def test_lease_pins_the_callers(self):
        """lease() pins the calling thread's own client."""
        single = process_singleton(scope="thread")(Made())
        with single.lease() as leased:
            assert leased is single()
            other = run_threads(single, 1)[0]
            assert other is not leased
        assert closed_on_own_thread([other])

    def test_check_per_thread(self):
        """A failing check retires that thread's client, on that thread."""
        bad: set[int] = set()
        made = Made()
        single = process_singleton(
            scope="thread",
            check=lambda c: id(c) not in bad,
            check_every=0.01,
        )(made)
        workers = Parked(4, single)
        target = workers.seen[0][0]
        bad.add(id(target))
        assert wait_until(lambda: workers.again() or target.closed)
        assert closed_on_own_thread([target])
        assert all(not s[0].closed for s in workers.seen[1:])
        workers.finish()

    def test_max_age_closes_on_the_owner(self):
        """An aged client is closed on its thread, not on a timer's."""
        made = Made()
        single = process_singleton(scope="thread", max_age=0.05)(made)
        workers = Parked(4, single)
        first = [s[0] for s in workers.seen]
        assert wait_until(
            lambda: single.statistics().retirements["max_age"] >= 4
        )
        workers.again()
        assert closed_on_own_thread(first)
        workers.finish()
        assert all(c.closes == [(os.getpid(), c.thread)] for c in made.built)


class TestStatistics:
    def test_counts_live_clients(self):
        """live counts the threads' live clients; counters are summed."""
        single = process_singleton(scope="thread")(Made())
        single()
        workers = Parked(5, single)
        stats = single.statistics()
        assert (6, 6, 1) == (stats.live, stats.builds, stats.generation)
        assert "6 live clients" in repr(single)
        workers.finish()
        stats = single.statistics()
        assert (1, 6, 5) == (stats.live, stats.builds, stats.closes)
        assert 5 == stats.retirements["close_all"]

    def test_process_singleton_live(self):
        """A process singleton's live is 0 or 1."""
        single = process_singleton(Made())
        assert 0 == single.statistics().live
        single()
        assert 1 == single.statistics().live

    def test_metrics_count_each_threads_client(self):
        """The live-client gauge's census counts one client per thread."""
        from poolkeeper import _registry

        name = "pk-thread-census"
        single = process_singleton(scope="thread", name=name)(Made())
        single()
        workers = Parked(3, single)
        assert 4 == _registry.census()[name].live
        workers.finish()
        assert 1 == _registry.census()[name].live
