"""The lifecycle's guarantees, each forced rather than hoped for."""

from __future__ import annotations

import asyncio
import contextvars
import copy
import dataclasses
import gc
import itertools
import logging
import os
import subprocess
import sys
import textwrap
import threading
import weakref

import pytest
from attack import Inject, Pause, join, no_collector, run
from helpers import (
    GIL_PARAMS,
    WAIT,
    Factory,
    FakeClient,
    blocked_in,
    fork_and_check,
    made_as_free_threaded,
    wait_until,
)

from poolkeeper import (
    ReentrantBuildError,
    UnclosedClientWarning,
    aclose_all,
    close_all,
    keys,
    process_singleton,
)

needs_fork = pytest.mark.skipif(not hasattr(os, "fork"), reason="os.fork")


class Tracked:
    """A client that records when its close started, on a global clock."""

    clock = itertools.count()

    def __init__(self, label: object = None) -> None:
        self.label = label
        self.close_started: int | None = None
        self.closes = 0

    def close(self) -> None:
        self.close_started = next(Tracked.clock)
        self.closes += 1


@pytest.fixture(name="env")
def _env(monkeypatch):
    for name in ("PK_G_KEY", "PK_G_OTHER"):
        monkeypatch.delenv(name, raising=False)
    yield os.environ
    for name in ("PK_G_KEY", "PK_G_OTHER"):
        os.environ.pop(name, None)


def env_single():
    """A keys.env singleton whose clients are labelled with the key."""
    return process_singleton(key=keys.env("PK_G_KEY"))(
        lambda: Tracked(os.environ.get("PK_G_KEY"))
    )


class TestNoClosedClient:
    def test_churn_never_serves_a_client_closed_before_the_call(self, env):
        """Threads, rotation and resets: no call gets an already-closed one."""
        env["PK_G_KEY"] = "0"
        single = env_single()
        stop = threading.Event()
        bad: list[object] = []

        def caller():
            while not stop.is_set():
                start = next(Tracked.clock)
                client = single()
                started = client.close_started
                if started is not None and started < start:
                    bad.append((start, started))

        def rotate():
            for i in range(400):
                env["PK_G_KEY"] = str(i % 3)
                if i % 7 == 0:
                    single.reset()

        threads = [threading.Thread(target=caller) for _ in range(4)]
        for t in threads:
            t.start()
        rotator = threading.Thread(target=rotate)
        rotator.start()
        join(rotator)
        stop.set()
        join(*threads)
        assert [] == bad


class TestLeaseNeverRetired:
    @pytest.mark.parametrize("gil", GIL_PARAMS)
    def test_retire_between_hit_and_pin_leases_the_new_client(
        self, gil, monkeypatch
    ):
        """close_all() after the lease's hit, before its pin: it pins anew.

        no-gil: made as on a free-threaded build, the pin is made under the
        lock, after the hit.
        """
        if not gil:
            made_as_free_threaded(monkeypatch)
        single = process_singleton(Factory())
        first = single()
        if gil:
            pause = Pause("__enter__", "self.pin = record")
        else:
            pause = Pause("_enter", "if under(life.lock, life.pin, slot,")
        box: list[object] = []

        def lease():
            with single.lease() as leased:
                box.append((leased, leased.closed))

        thread, _ = run(pause.run(lease))
        assert pause.reached.wait(WAIT)
        close_all()
        assert first.closed
        pause.release.set()
        join(thread)
        leased, was_closed = box[0]
        assert leased is not first
        assert not was_closed
        assert leased is single()

    def test_a_lease_is_entered_once(self):
        """Entering one lease twice is an error, not a lost pin."""
        single = process_singleton(Factory())
        lease = single.lease()
        with lease, pytest.raises(RuntimeError, match="entered once"):
            lease.__enter__()
        single.reset()
        assert 1 == single.statistics().closes


class TestNoStaleKey:
    @pytest.mark.parametrize("gil", GIL_PARAMS)
    def test_call_after_a_write_never_gets_the_old_client(
        self, env, gil, monkeypatch
    ):
        """A caller that read the old key cannot arm it after the write.

        no-gil: made as on a free-threaded build, the write takes the lock,
        so it waits for the stopped caller.
        """
        if not gil:
            made_as_free_threaded(monkeypatch)
        env["PK_G_KEY"] = "old"
        single = env_single()
        old = single()
        env["PK_G_KEY"] = "other"  # Disarm (a write of the same value
        env["PK_G_KEY"] = "old"  # would not), and back.
        pause = Pause("request", "self._arm(live.client")
        thread, box = run(pause.run(single))
        assert pause.reached.wait(WAIT)  # Holding the lock, about to arm.
        writer, _ = run(lambda: env.__setitem__("PK_G_KEY", "new"))
        if gil:
            # Nothing is armed yet: the write returns without the lock.
            join(writer)
        pause.release.set()
        join(thread, writer)
        assert [old] == box
        fresh = single()
        assert fresh is not old
        assert "new" == fresh.label

    def test_del_is_noticed(self, env):
        """Deleting the variable rebuilds for the missing value."""
        env["PK_G_KEY"] = "x"
        single = env_single()
        single()
        del env["PK_G_KEY"]
        assert single().label is None


class TestBuildAlwaysEnds:
    def test_key_whose_repr_raises(self):
        """A key that cannot be shown still builds, and shows a stand-in."""

        class Ugly:
            def __repr__(self):
                raise RuntimeError("no repr")

        ugly = Ugly()
        single = process_singleton(key=lambda: ugly)(Factory())
        client = single()
        assert client is single()
        assert single.statistics().key_fingerprint is not None

    @pytest.mark.parametrize("exc", [KeyboardInterrupt, RuntimeError])
    def test_exception_at_every_line_after_the_factory(self, exc):
        """Cut the bookkeeping at each line: waiters wake, state heals."""
        n = 1
        while True:
            fired = self._cut_at(n, exc)
            if fired is None:
                break
            n += 1
        assert n > 10  # The build's bookkeeping was really walked.

    def _cut_at(self, n, exc):
        with no_collector():
            return self._cut_at_without_collector(n, exc)

    def _cut_at_without_collector(self, n, exc):
        gate = threading.Event()
        factory = Factory(gate=gate)
        single = process_singleton(key=lambda: "k")(factory)
        inject = Inject(n, exc)
        original = factory.__call__

        def build():
            client = original()
            inject.armed = True
            return client

        single.__wrapped__ = build  # type: ignore[misc]
        single._self_closer.hook = None

        def builder():
            sys.settrace(inject.tracer)
            try:
                return single()
            finally:
                sys.settrace(None)

        b, b_box = run(builder)
        assert factory.entered.wait(WAIT)
        waiters = [run(single) for _ in range(2)]
        assert blocked_in("_acquire", 2)
        gate.set()
        join(b, *(w for w, _ in waiters))
        if inject.fired is None:
            assert isinstance(b_box[0], FakeClient)
            return None
        live = single()  # The next call works, on this thread too.
        assert isinstance(live, FakeClient)
        assert single._self_slot.build is None
        for client in factory.built:
            assert client is live or client.closed
        for _, box in waiters:
            assert isinstance(box[0], FakeClient | BaseException)
        return inject.fired


class TestForkHook:
    @needs_fork
    @pytest.mark.parametrize("exc", [KeyboardInterrupt, SystemExit, OSError])
    def test_raising_after_fork_stops_no_other_singleton(self, exc):
        """Each singleton forgets its parent's client, whatever hooks raise."""

        def bad(client):
            raise exc

        singles = [
            process_singleton(after_fork=bad)(Factory()) for _ in range(4)
        ]
        parents = [s() for s in singles]

        def child():
            return all(
                s() is not p and s().pid == os.getpid()
                for s, p in zip(singles, parents, strict=True)
            ) and not any(p.closed for p in parents)

        assert 0 == fork_and_check(child)
        assert not any(p.closed for p in parents)


class TestCloseOnce:
    def test_same_object_again_closes_nothing(self, env):
        """A rebuild returning the live object retires without closing."""
        shared = FakeClient()
        env["PK_G_KEY"] = "1"
        single = process_singleton(key=keys.env("PK_G_KEY"))(lambda: shared)
        assert shared is single()
        env["PK_G_KEY"] = "2"
        assert shared is single()
        assert not shared.closed
        assert 0 == single.statistics().closes
        single.reset()
        assert [os.getpid()] == shared.closes

    def test_sync_close_all_racing_async_reset_closes_once(self):
        """close_all() on one thread and reset() on a loop: one close."""
        closes: list[object] = []

        class Client:
            async def aclose(self):
                closes.append(self)

        @process_singleton
        async def single():
            return Client()

        for _ in range(50):
            closes.clear()
            ready = threading.Barrier(2)

            async def main(ready=ready):
                client = await single()
                ready.wait(WAIT)
                await single.reset()
                await asyncio.sleep(0.01)
                return client

            thread, box = run(lambda: asyncio.run(main()))
            ready.wait(WAIT)
            close_all()
            join(thread)
            assert [box[0]] == closes


class TestCloseAllNeverRaises:
    def test_close_lookup_that_raises(self, caplog):
        """A client whose close attribute raises is logged; others close."""

        class Hostile:
            @property
            def close(self):
                raise RuntimeError("no close for you")

        hostile = process_singleton(Hostile)
        fine = process_singleton(Factory())
        hostile()
        client = fine()
        with caplog.at_level(logging.WARNING, "poolkeeper"):
            close_all()
        assert client.closed
        assert 1 == hostile.statistics().close_failures
        assert "RuntimeError raised at test_guarantees.py" in caplog.text
        assert "no close for you" not in caplog.text  # Never the message.

    def test_sync_close_all_inside_a_loop_with_an_idle_loop(self):
        """close_all() inside a running loop still closes an idle loop's."""
        closed_on: list[object] = []

        class Client:
            async def aclose(self):
                closed_on.append(asyncio.get_running_loop())

        @process_singleton
        async def single():
            return Client()

        plain = process_singleton(Factory())
        other = plain()
        idle = asyncio.new_event_loop()
        try:
            idle.run_until_complete(single())

            async def main():
                close_all()  # Synchronously, inside this loop.

            asyncio.run(main())
            assert [idle] == closed_on
            assert other.closed
        finally:
            idle.close()


class TestKeysByValue:
    def test_minus_one_to_minus_two_rebuilds(self):
        """hash(-1) == hash(-2), yet the key changed."""
        box = [-1]
        single = process_singleton(key=lambda: box[0])(Factory())
        first = single()
        box[0] = -2
        second = single()
        assert first is not second
        assert first.closed


class TestEnvironb:
    @pytest.mark.skipif(not hasattr(os, "environb"), reason="POSIX only")
    def test_change_through_environb_is_noticed(self, env):
        """os.environb shares os.environ's data, and its changes count."""
        env["PK_G_KEY"] = "1"
        single = env_single()
        first = single()
        os.environb[b"PK_G_KEY"] = b"2"
        second = single()
        assert first is not second
        assert "2" == second.label
        del os.environb[b"PK_G_KEY"]
        assert single().label is None


class TestCycles:
    def test_two_factories_needing_each_other_raise(self):
        """A needs B while B needs A, on two threads: an error, no hang."""
        both = threading.Barrier(2)

        @process_singleton
        def a():
            both.wait(WAIT)
            b()
            return FakeClient("a")  # pragma: no cover

        @process_singleton
        def b():
            both.wait(WAIT)
            a()
            return FakeClient("b")  # pragma: no cover

        ta, box_a = run(a)
        tb, box_b = run(b)
        join(ta, tb)
        errors = [box_a[0], box_b[0]]
        assert all(isinstance(e, ReentrantBuildError) for e in errors)
        text = " ".join(str(e) for e in errors)
        assert "a()" in text
        assert "b()" in text

    def test_async_factory_awaiting_itself_through_gather(self):
        """A factory awaiting its own singleton in another task fails."""

        @process_singleton
        async def single():
            await asyncio.gather(single())
            return FakeClient()  # pragma: no cover

        with pytest.raises(ReentrantBuildError):
            asyncio.run(asyncio.wait_for(single(), WAIT))


class Recorder:
    """An async client that records the loop it was closed on."""

    def __init__(self) -> None:
        self.loop = asyncio.get_running_loop()
        self.closed_on: list[tuple[object, bool]] = []

    async def aclose(self) -> None:
        loop = asyncio.get_running_loop()
        self.closed_on.append((loop, loop.is_running()))


class TestLoopEnd:
    def test_three_hundred_runs_close_each_client_on_its_loop(self):
        """asyncio.run() ends: its client closes on it; no loop is kept."""

        @process_singleton
        async def single():
            return Recorder()

        clients: list[Recorder] = []
        loops: list[weakref.ref[asyncio.AbstractEventLoop]] = []

        async def main():
            client = await single()
            clients.append(client)
            loops.append(weakref.ref(asyncio.get_running_loop()))

        for _ in range(300):
            asyncio.run(main())
        gc.collect()
        assert 300 == len({id(c) for c in clients})
        assert all([(c.loop, True)] == c.closed_on for c in clients)
        assert 300 == single.statistics().closes
        clients.clear()
        gc.collect()
        assert [] == [ref for ref in loops if ref() is not None]

    def test_runner_closes_too(self):
        """asyncio.Runner shuts generators down the same way."""
        if not hasattr(asyncio, "Runner"):
            pytest.skip("asyncio.Runner is 3.11+")

        @process_singleton
        async def single():
            return Recorder()

        with asyncio.Runner() as runner:
            client = runner.run(single())
        assert 1 == len(client.closed_on)

    def test_loop_closed_without_shutdown_warns_and_is_not_kept(self):
        """No shutdown: a visible warning, and the loop can be collected."""

        class Plain:
            async def aclose(self):  # pragma: no cover -- never reached.
                raise AssertionError

        @process_singleton
        async def single():
            return Plain()

        loop = asyncio.new_event_loop()
        loop.run_until_complete(single())
        loop.close()
        ref = weakref.ref(loop)
        del loop
        with pytest.warns(UnclosedClientWarning, match="closed"):
            asyncio.run(single())  # Another loop: the dead slot is pruned.
        gc.collect()
        assert ref() is None


class TestAsyncMatchesSync:
    def test_lease_never_yields_a_retired_client(self):
        """close_all() between acquire and lease: the lease takes a new one."""

        @process_singleton
        async def single():
            return FakeClient()

        pause = Pause("lease", "life.lease(")
        box: list[object] = []

        async def main():
            first = await single()
            async with single.lease() as leased:
                box.append((first, leased, leased.closed))

        thread, _ = run(pause.run(lambda: asyncio.run(main())))
        assert pause.reached.wait(WAIT)
        closer, _ = run(close_all)
        slots = single._self_life.slots
        # close_all() retires the client at once; its close waits for the
        # paused loop.
        assert wait_until(
            lambda: all(s.live is None for s in list(slots.values()))
        )
        pause.release.set()
        join(thread, closer)
        first, leased, was_closed = box[0]
        assert leased is not first
        assert not was_closed

    def test_nested_overrides_leave_out_of_order_by_identity(self):
        """Equal objects: each block removes its own override."""

        @process_singleton
        async def single():
            return FakeClient()

        one, two = [1], [1]  # Equal, not identical.
        outer = single.override(one)
        inner = single.override(two)
        outer.__enter__()
        inner.__enter__()
        outer.__exit__(None, None, None)
        assert asyncio.run(single()) is two
        inner.__exit__(None, None, None)
        assert isinstance(asyncio.run(single()), FakeClient)

    @needs_fork
    def test_fork_keep_reports_the_childs_pid(self):
        """fork="keep": the child's statistics name the child."""

        @process_singleton(fork="keep")
        async def single():
            return FakeClient()

        assert 0 == fork_and_check(
            lambda: single.statistics().pid == os.getpid()
        )

    def test_waiter_for_another_key_is_not_failed(self):
        """A build's error reaches only the tasks waiting for its key."""
        which: contextvars.ContextVar[str] = contextvars.ContextVar("which")
        gate = asyncio.Event

        async def main():
            opened = gate()

            @process_singleton(key=which.get)
            async def single():
                await opened.wait()
                if which.get() == "bad":
                    raise OSError("bad key")
                return FakeClient(which.get())

            async def call(value):
                which.set(value)
                return await single()

            bad = asyncio.create_task(call("bad"))
            await asyncio.sleep(0)
            good = asyncio.create_task(call("good"))
            await asyncio.sleep(0)
            opened.set()
            results = await asyncio.gather(bad, good, return_exceptions=True)
            await aclose_all()
            return results

        bad, good = asyncio.run(main())
        assert isinstance(bad, OSError)
        assert isinstance(good, FakeClient)
        assert "good" == good.label

    def test_generations_never_repeat_across_loops(self):
        """Builds on four loops at once: every generation is distinct."""

        @process_singleton
        async def single():
            await asyncio.sleep(0)
            return FakeClient()

        generations: list[int] = []
        lock = threading.Lock()

        async def main():
            for _ in range(25):
                await single()
                with lock:
                    generations.append(single.statistics().generation)
                await single.reset()

        threads = [run(lambda: asyncio.run(main()))[0] for _ in range(4)]
        join(*threads)
        assert 100 == len(generations)
        assert len(set(generations)) == len(generations)


class TestDroppedSingleton:
    def test_polled_key_reaching_its_singleton_does_not_keep_it(self):
        """A key whose closure holds the singleton: still collected, closed."""

        class Holder:
            key = "a"
            single: object = None

        def armed_and_dropped() -> tuple[weakref.ref[object], FakeClient]:
            holder = Holder()
            single = process_singleton(key=lambda: holder.key)(Factory())
            holder.single = single
            client = single()
            assert client is single()  # Armed: the class holds the key.
            return weakref.ref(single), client

        ref, client = armed_and_dropped()
        gc.collect()
        assert ref() is None
        assert client.closed

    def test_collected_singleton_closes_its_client(self):
        """A singleton garbage collected with a live client closes it."""
        client = process_singleton(Factory())()
        gc.collect()
        assert client.closed

    def test_close_all_reaches_an_uncollected_dropped_singleton(self):
        """Before the collector runs, close_all() still closes it."""
        gc.disable()
        try:
            single = process_singleton(Factory())
            client = single()
            cycle = [single]
            cycle.append(cycle)  # type: ignore[arg-type]
            del single, cycle
            close_all()
            assert client.closed
        finally:
            gc.enable()

    def test_leased_client_of_a_dropped_singleton_closes_at_lease_end(self):
        """A lease outlives its singleton; the close waits for it."""
        single = process_singleton(Factory())
        lease = single.lease()
        client = lease.__enter__()
        del single
        gc.collect()
        assert not client.closed
        lease.__exit__(None, None, None)
        assert client.closed


class TestCopy:
    def test_copies_are_the_singleton(self):
        """copy, deepcopy and dataclasses.asdict keep the identity."""
        single = process_singleton(Factory())
        proxy = single.proxy()
        assert copy.copy(single) is single
        assert copy.deepcopy(single) is single
        assert copy.copy(proxy) is proxy
        assert copy.deepcopy(proxy) is proxy

        @dataclasses.dataclass
        class Holder:
            single: object

        assert {"single": single} == dataclasses.asdict(Holder(single))


class TestArguments:
    def test_generator_factory_is_rejected(self):
        """A generator function is not a factory."""

        def gen():
            yield FakeClient()

        with pytest.raises(TypeError, match="generator"):
            process_singleton(gen)

    def test_same_message_in_every_state(self, env):
        """single(1) says <factory>() takes no arguments, whatever state."""

        def make_client():
            return FakeClient()

        single = process_singleton(key=keys.env("PK_G_KEY"))(make_client)
        polled = process_singleton(key=lambda: 1)(make_client)

        def message(call):
            with pytest.raises(TypeError) as info:
                call()
            return str(info.value)

        expected = message(lambda: single(1))  # Nothing built yet.
        assert ".make_client() takes no arguments (1 given)" in expected
        single()  # Armed.
        assert expected == message(lambda: single(1))
        assert expected == message(lambda: polled(1))
        with single.override(FakeClient()):
            assert expected == message(lambda: single(1))
        assert "(1 given)" in message(lambda: single(x=1))

        @process_singleton
        async def make_async():
            return FakeClient()

        assert ".make_async() takes no arguments" in message(
            lambda: make_async(1)
        )


class TestUnclosedIsVisible:
    def test_default_filters_show_it_at_the_users_line(self, tmp_path):
        """Default warning filters show it, naming the user's file."""
        script = tmp_path / "user_code.py"
        script.write_text(
            textwrap.dedent(
                """
                import logging, os
                from poolkeeper import keys, process_singleton

                async def close(client):
                    pass

                @process_singleton(key=keys.env("PK_V"), close=close)
                def single():
                    return object()

                os.environ["PK_V"] = "1"
                single()
                os.environ["PK_V"] = "2"
                single()  # line 15: the rotation that cannot close.
                """
            )
        )
        result = subprocess.run(
            [sys.executable, str(script)],
            capture_output=True,
            text=True,
            timeout=WAIT,
            check=False,
            env={**os.environ, "PYTHONWARNINGS": ""},
        )
        assert 0 == result.returncode, result.stderr
        assert "UnclosedClientWarning" in result.stderr
        assert "user_code.py:15" in result.stderr
        assert "Could not close" in result.stderr  # The log record too.


class TestLeaseOfADroppedSingleton:
    def test_entering_after_the_singleton_is_gone_says_so(self):
        """A lease entered after its singleton is gone: ReferenceError."""
        lease = process_singleton(Factory()).lease()
        gc.collect()
        with pytest.raises(ReferenceError, match="garbage collected"):
            lease.__enter__()

    def test_switches_of_a_collected_singleton_do_nothing(self):
        """The lifecycle outlives its singleton; arming it then is a no-op."""
        single = process_singleton(key=lambda: "k")(Factory())
        single()
        life = single._self_life
        live = single._self_slot.live
        del single
        gc.collect()
        life.arm(
            object(), None, True
        )  # No class left to arm: nothing happens.
        life.arm(live.client, live, False)
