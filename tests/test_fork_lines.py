"""Forks at chosen points of a max_age retirement, from another thread.

A fork copies one thread: whatever another thread was doing stops where it
stood. These tests hold the thread that takes a due timer, or the thread
that carries out the retirement, at a point of its work, fork, and check
the child: a kept client (fork="keep") still ages out there and is closed
there once, on the right thread; a rebuilt child (fork="rebuild") never
closes the parent's client. The parent's client is closed once, in the
parent, whatever the point.
"""

from __future__ import annotations

import functools
import heapq
import os
import random
import sys
import threading
import types

import pytest
from attack import _ours, _where, join, run
from helpers import (
    WAIT,
    Factory,
    fork_and_check,
    held_in_retirement,
    wait_until,
)
from test_thread_scope import Made, closed_on_own_thread

import poolkeeper
from poolkeeper import _healing, _sync, _timers, process_singleton

pytestmark = [
    pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()"),
    pytest.mark.filterwarnings(
        "ignore:This process .* is multi-threaded:DeprecationWarning"
    ),
]

#: How many points of the retirement each run forks at, sampled.
SAMPLES = 8
#: More points than a retirement's thread runs lines (about 250).
LINES = 320


def _age_timer_of(life):
    """Whether a heap entry is *life*'s max_age timer."""

    def mine(entry) -> bool:
        timer = entry[2]
        return timer.function is _healing.age_due and timer.args[0] is life

    return mine


class TestATimerTakenAtTheFork:
    """The timer thread takes the kept client's due max_age timer."""

    @pytest.mark.parametrize("when", ["popped", "running"])
    def test_the_child_keeps_the_timer(self, monkeypatch, when):
        """Held between taking the timer and marking it running: kept.

        The child's timer thread runs it (the kept client ages out there,
        and is closed there once); before, a fork at that moment lost the
        timer, and the kept client lived on in the child for ever.
        """
        single = process_singleton(fork="keep", max_age=0.05)(Factory())
        mine_of = _age_timer_of(single._self_life)
        parent = os.getpid()
        taken, forked = threading.Event(), threading.Event()

        def hold() -> None:
            if os.getpid() == parent and not taken.is_set():
                taken.set()
                forked.wait(WAIT)

        def heappop(heap):
            ours = bool(heap) and mine_of(heap[0])
            entry = heapq.heappop(heap)
            if ours and when == "popped":
                hold()  # Off the heap, not yet marked running.
            return entry

        class Running(set):
            def add(self, timer) -> None:
                super().add(timer)
                if when == "running" and mine_of((0, 0, timer)):
                    hold()  # Marked running, still on the heap.

        monkeypatch.setattr(
            _timers,
            "heapq",
            types.SimpleNamespace(
                heappop=heappop,
                heappush=heapq.heappush,
                heapify=heapq.heapify,
            ),
        )
        monkeypatch.setattr(_timers, "_running", Running(_timers._running))

        try:
            mine = single()
            assert taken.wait(WAIT)
            code = fork_and_check(functools.partial(_aged_out, single, mine))
        finally:
            forked.set()
        assert code == 0
        assert wait_until(lambda: single() is not mine)
        assert wait_until(lambda: mine.closes == [parent])


def _aged_out(single, kept) -> bool:
    """In a fork="keep" child: *kept* is retired and closed here, once."""
    done = wait_until(lambda: single() is not kept)
    if not done or kept.closes != [os.getpid()]:
        print(f"retired {done}, closes {kept.closes}", file=sys.stderr)
        return False
    return True


class TestATimerAboutToStart:
    """Another thread of the parent was about to start a kept client's timer.

    The child starts it (``_healing.rearm``): before, the kept client
    never aged out, was never probed, or never saw its deferred
    retirement there.
    """

    @pytest.mark.parametrize("timer", ["max_age", "check"])
    def test_a_build_on_another_thread(self, monkeypatch, timer):
        """Forked once the build made its client live, before its timers."""
        probed: list[int] = []

        def check(client) -> bool:
            probed.append(os.getpid())
            return True

        options = (
            {"max_age": 0.05}
            if timer == "max_age"
            else {"check": check, "check_every": 0.05}
        )
        single = process_singleton(fork="keep", **options)(Factory())
        built, forked = threading.Event(), threading.Event()
        start_timers = _sync.start_timers

        parent = os.getpid()

        def held(*args) -> None:
            if os.getpid() == parent and not built.is_set():
                built.set()
                forked.wait(WAIT)
            start_timers(*args)

        monkeypatch.setattr(_sync, "start_timers", held)

        def child() -> bool:
            kept = single()
            if timer == "max_age":
                return _aged_out(single, kept)
            ok = wait_until(lambda: single() is kept and os.getpid() in probed)
            if not ok:
                print(f"probes {probed}", file=sys.stderr)
            return ok

        builder, box = run(single)
        try:
            assert built.wait(WAIT)
            code = fork_and_check(child)
        finally:
            forked.set()
            join(builder)
        assert code == 0
        if timer == "max_age":
            assert wait_until(lambda: single() is not box[0])
        else:  # Due, then run by a call.
            assert wait_until(lambda: single() is box[0] and parent in probed)

    def test_a_deferred_retirement(self):
        """Forked once a reset was deferred, before its timer started."""
        name = "deferred-at-fork"
        single = process_singleton(
            fork="keep", min_rebuild_interval=0.2, name=name
        )(Factory())
        kept = single()

        with held_in_retirement(name, "reset", "deferred") as held:
            resetter, box = run(single.reset)
            assert held.wait(WAIT)
            code = fork_and_check(functools.partial(_aged_out, single, kept))
        join(resetter)
        assert [False] == box
        assert code == 0
        assert wait_until(lambda: single() is not kept)


class PauseAt:
    """Holds the thread retiring *life*'s client at its *n*-th line.

    Only the poolkeeper lines of the thread that runs *life*'s max_age
    retirement count, from its ``age_due`` call on.
    """

    def __init__(self, life, n: int) -> None:
        self.life = life
        self.n = n
        self.seen = 0
        self.thread: int | None = None
        self.where: str | None = None
        self.reached = threading.Event()
        self.release = threading.Event()

    def tracer(self, frame, event, arg):
        if event != "call" or not _ours(frame):
            return None
        if self.thread is None:
            # Lines count from the call of age_due for this lifecycle.
            if frame.f_code is not _healing.age_due.__code__:
                return None
            if frame.f_locals.get("life") is not self.life:
                return None
            self.thread = threading.get_ident()
        return self._line if self.thread == threading.get_ident() else None

    def _line(self, frame, event, arg):
        if event == "line" and self.where is None:
            self.seen += 1
            if self.seen == self.n:
                self.where = f"{_where(frame)}:{frame.f_lineno}"
                self.reached.set()
                self.release.wait(WAIT)
        return self._line


def _seed() -> int:
    seed = os.environ.get("POOLKEEPER_FORK_LINES_SEED")
    return int(seed) if seed else random.randrange(2**32)


def _closed_in_child(single, mine, fork: str) -> bool:
    """The thread singleton's child: *mine* closed here once, or never."""
    here = threading.get_ident()
    want = [(os.getpid(), here)] if fork == "keep" else []
    if fork == "keep":
        served = wait_until(lambda: single() is not mine and bool(mine.closes))
    else:
        served = single() is not mine
    poolkeeper.close_all()
    if not served or mine.closes != want:
        print(f"closes {mine.closes}, want {want}", file=sys.stderr)
        return False
    return True


def _fork_at(fork: str, n: int, seed: int) -> str | None:
    """Fork with the retiring thread held at line *n*; where, or None.

    None when the retirement ran fewer lines than *n* (or began before
    the tracer was set): then nothing forks.
    """
    single = process_singleton(scope="thread", fork=fork, max_age=0.1)(Made())
    mine = single()
    # The calling thread's own singleton's lifecycle: its timer's.
    pause = PauseAt(single._self_scope.here()._self_life, n)
    before = threading.gettrace() if hasattr(threading, "gettrace") else None
    threading.settrace(pause.tracer)
    try:
        assert wait_until(
            lambda: (
                pause.reached.is_set()
                or single.statistics().retirements["max_age"] == 1
            )
        )
    finally:
        threading.settrace(before)
    if pause.reached.is_set():
        try:
            code = fork_and_check(
                functools.partial(_closed_in_child, single, mine, fork)
            )
        finally:
            pause.release.set()
        assert code == 0, f"seed {seed}, line {n}: {pause.where}"
    assert wait_until(lambda: single() is not mine and mine.closed)
    assert closed_on_own_thread([mine]), f"seed {seed}, line {n}"
    poolkeeper.close_all()
    return pause.where


@pytest.mark.parametrize("fork", ["keep", "rebuild"])
def test_a_thread_client_forked_at_points_of_its_retirement(fork):
    """scope="thread": fork at sampled lines of the max_age retirement.

    The seed is printed: POOLKEEPER_FORK_LINES_SEED replays a run.
    """
    seed = _seed()
    print(f"POOLKEEPER_FORK_LINES_SEED={seed}", file=sys.stderr)
    rng = random.Random(seed)
    # One point among the first lines, which every retirement runs.
    points = sorted(
        {rng.randrange(1, 100), *rng.sample(range(1, LINES), SAMPLES - 1)}
    )
    forked_at = [(n, _fork_at(fork, n, seed)) for n in points]
    print(f"forked at {forked_at}", file=sys.stderr)
    # The first point is within the lines every retirement runs.
    assert forked_at[0][1] is not None, f"seed {seed}"
