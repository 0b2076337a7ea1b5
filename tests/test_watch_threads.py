"""poolkeeper.watch and ``scope="thread"``: live clients against a limit.

A thread singleton holds one client per thread that called it and has not
ended. While anything is watched, each of its builds counts its live
clients (with the one to come) against watch()'s *thread_limit*; the
watched classes' censuses leave its clients out, since their limit is for
clients built one per process.
"""

from __future__ import annotations

import threading
import uuid
import warnings

import pytest
from helpers import WAIT

import poolkeeper
from poolkeeper import PoolLeakWarning, process_singleton
from poolkeeper._watch import live_counts


@pytest.fixture(autouse=True)
def _unwatch_after_test():
    yield
    poolkeeper.unwatch()


class Client:
    """A client of a watched class (this module's)."""

    def __init__(self) -> None:
        self.closed = False

    def close(self) -> None:
        self.closed = True


SPEC = f"{__name__}:Client"


class Holding:
    """*n* threads, each holding its client of *single* until released."""

    def __init__(self, single, n: int) -> None:
        self.release = threading.Event()
        self.called = threading.Barrier(n + 1, timeout=WAIT)
        self.errors: list[BaseException] = []
        self.threads = [
            threading.Thread(target=self._run, args=(single,))
            for _ in range(n)
        ]
        for t in self.threads:
            t.start()
        self.called.wait()

    def _run(self, single) -> None:
        try:
            single()
        except BaseException as exc:
            self.errors.append(exc)
        self.called.wait()
        assert self.release.wait(WAIT)

    def end(self) -> None:
        self.release.set()
        for t in self.threads:
            t.join(WAIT)
            assert not t.is_alive(), "worker thread hung"


def _thread_warnings(caught):
    found = [
        w
        for w in caught
        if isinstance(w.message, PoolLeakWarning)
        and w.message.scope == "thread"
    ]
    # Each points at the caller's line, not into poolkeeper.
    assert all(__file__ == w.filename for w in found)
    return [w.message for w in found]


def _single():
    return process_singleton(
        scope="thread", name=f"clients_{uuid.uuid4().hex}"
    )(Client)


class TestThreadLimit:
    def test_warns_when_live_clients_pass_the_limit(self):
        poolkeeper.watch(SPEC, limit=1, thread_limit=4)
        single = _single()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            four = Holding(single, 4)
            assert [] == _thread_warnings(caught)
            fifth = Holding(single, 1)
            found = _thread_warnings(caught)
            fifth.end()
            four.end()
        assert [] == four.errors + fifth.errors
        assert 1 == len(found)
        assert (5, 4, "thread") == (
            found[0].count,
            found[0].limit,
            found[0].scope,
        )
        assert single.statistics().builds == 5
        assert single.statistics().closes == 5
        assert "scope='thread'" in str(found[0])
        # Its clients are the singleton's: Client's own census (limit 1)
        # neither counted them nor warned.
        assert not any(
            isinstance(w.message, PoolLeakWarning)
            and w.message.scope == "process"
            for w in caught
        )
        assert 0 == live_counts().get(f"{__name__}.Client", 0)

    def test_ended_threads_do_not_count(self):
        poolkeeper.watch(SPEC, thread_limit=2)
        single = _single()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            for _ in range(4):
                Holding(single, 2).end()
        assert [] == _thread_warnings(caught)
        assert 8 == single.statistics().builds

    def test_warns_again_when_the_count_doubles(self):
        poolkeeper.watch(SPEC, thread_limit=1)
        single = _single()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            # One thread after the other: 1, 2, 3, 4 live clients.
            held = [Holding(single, 1) for _ in range(4)]
            counts = [w.count for w in _thread_warnings(caught)]
            for holding in held:
                holding.end()
            # Back within the limit, then over it again: a new warning.
            Holding(single, 1).end()
            again = [Holding(single, 1) for _ in range(2)]
            counts_again = [w.count for w in _thread_warnings(caught)]
            for holding in again:
                holding.end()
        # Warned at 2, not at 3 (not yet doubled), again at 4.
        assert [2, 4] == counts
        assert [2, 4, 2] == counts_again

    def test_as_an_error_the_build_fails_and_builds_nothing(self):
        poolkeeper.watch(SPEC, thread_limit=1)
        single = _single()
        with warnings.catch_warnings():
            warnings.simplefilter("error", PoolLeakWarning)
            one = Holding(single, 1)
            two = Holding(single, 1)
        one.end()
        two.end()
        assert [] == one.errors
        assert [PoolLeakWarning] == [type(e) for e in two.errors]
        assert 1 == single.statistics().builds

    def test_nothing_counted_unless_watching(self):
        single = _single()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            Holding(single, 3).end()
            poolkeeper.watch(SPEC, thread_limit=1)
            poolkeeper.unwatch()
            Holding(single, 3).end()
        assert [] == _thread_warnings(caught)

    @pytest.mark.parametrize("bad", [0, -1])
    def test_limit_below_one(self, bad):
        with pytest.raises(ValueError, match="thread_limit"):
            poolkeeper.watch(SPEC, thread_limit=bad)

    @pytest.mark.parametrize("bad", [True, 2.0, "2", None])
    def test_limit_not_int(self, bad):
        with pytest.raises(TypeError, match="thread_limit"):
            poolkeeper.watch(SPEC, thread_limit=bad)
