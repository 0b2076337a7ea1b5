"""multiprocessing pools and ProcessPoolExecutor: one client per worker."""

from __future__ import annotations

import itertools
import multiprocessing
import os
import pickle
from collections import defaultdict
from concurrent.futures import ProcessPoolExecutor

import procs_tasks
import pytest
from procs_client import read_close_log
from procs_env import WAIT
from procs_tasks import CLIENT, Report, report, shut_down, start_worker

WORKERS = 2
ROUNDS = 10
TASKS = WORKERS * ROUNDS

# Python 3.12+ warns when forking a process that has threads (pytest's
# faulthandler watchdog is one); these tests fork on purpose.
_FORK_WARNING = pytest.mark.filterwarnings(
    r"ignore:.*use of fork\(\) may lead to deadlocks:DeprecationWarning"
)
START_METHODS = [
    pytest.param(method, marks=_FORK_WARNING if method == "fork" else ())
    for method in ("fork", "spawn", "forkserver")
    if method in multiprocessing.get_all_start_methods()
]


@pytest.fixture(name="close_log")
def _close_log(tmp_path, monkeypatch):
    """Return an empty close log, which the parent's client writes to too."""
    path = tmp_path / "closes.log"
    path.touch()
    monkeypatch.setattr(procs_tasks.state, "log", str(path))
    return path


@pytest.fixture(name="parent_client")
def _parent_client(close_log):
    """Build the parent's client before any worker starts (or forks)."""
    client = CLIENT()
    assert os.getpid() == client.pid
    return client


def run_pool(method: str, close_log) -> tuple[list[Report], list[int]]:
    """Run every task, then shut_down, in a multiprocessing.Pool."""
    ctx = multiprocessing.get_context(method)
    barrier = ctx.Barrier(WORKERS)
    jobs = [(CLIENT, task) for task in range(TASKS)]
    # Leaving the block terminates the pool, also when a get() timed out;
    # every task blocks at most STEP seconds, so join() is bounded too.
    with ctx.Pool(
        WORKERS, initializer=start_worker, initargs=(barrier, str(close_log))
    ) as pool:
        reports = pool.starmap_async(report, jobs, chunksize=1).get(WAIT)
        closers = pool.map_async(shut_down, range(WORKERS), 1).get(WAIT)
        pool.close()
        pool.join()
    return reports, closers


def run_executor(method: str, close_log) -> tuple[list[Report], list[int]]:
    """Run every task, then shut_down, in a ProcessPoolExecutor."""
    ctx = multiprocessing.get_context(method)
    barrier = ctx.Barrier(WORKERS)
    singles = itertools.repeat(CLIENT, TASKS)
    with ProcessPoolExecutor(
        WORKERS,
        mp_context=ctx,
        initializer=start_worker,
        initargs=(barrier, str(close_log)),
    ) as executor:
        try:
            reports = list(
                executor.map(report, singles, range(TASKS), timeout=WAIT)
            )
            closers = list(
                executor.map(shut_down, range(WORKERS), timeout=WAIT)
            )
        except BaseException:
            executor.shutdown(wait=False, cancel_futures=True)
            raise
    return reports, closers


def check_one_client_per_worker(reports: list[Report]) -> list[int]:
    """Assert each worker built one client of its own; return their pids."""
    by_pid: dict[int, list[Report]] = defaultdict(list)
    for r in reports:
        by_pid[r.pid].append(r)
    workers = sorted(by_pid)

    # The barrier ran one task of every round in each worker.
    assert dict.fromkeys(workers, ROUNDS) == {
        pid: len(rs) for pid, rs in by_pid.items()
    }
    assert os.getpid() not in workers
    # (builder pid, builds, argument resolved to its own singleton,
    # no client live at worker start), the same for all of its tasks.
    assert {pid: {(pid, 1, True, True)} for pid in workers} == {
        pid: {
            (r.builder_pid, r.builds, r.is_own_singleton, r.started_empty)
            for r in rs
        }
        for pid, rs in by_pid.items()
    }
    assert dict.fromkeys(workers, 1) == {
        pid: len({r.client_id for r in rs}) for pid, rs in by_pid.items()
    }
    return workers


class TestPickle:
    def test_singleton_pickles_by_reference(self):
        """The pickle names the module-level singleton, not its client."""
        client = CLIENT()
        payload = pickle.dumps(CLIENT)

        assert CLIENT is pickle.loads(payload)
        assert b"procs_tasks" in payload
        assert b"RecordingClient" not in payload
        assert client is CLIENT()


@pytest.mark.parametrize("method", START_METHODS)
class TestPool:
    def test_each_worker_builds_one_client(
        self, method, close_log, parent_client
    ):
        """Every Pool worker builds one client and closes only its own."""
        builds = CLIENT.statistics().builds

        reports, closers = run_pool(method, close_log)

        workers = check_one_client_per_worker(reports)
        assert workers == sorted(closers)
        assert [(pid, pid) for pid in workers] == read_close_log(close_log)
        assert parent_client is CLIENT()
        assert [] == parent_client.closes
        assert builds == CLIENT.statistics().builds


@pytest.mark.parametrize("method", START_METHODS)
class TestProcessPoolExecutor:
    def test_each_worker_builds_one_client(
        self, method, close_log, parent_client
    ):
        """Every executor worker builds one client and closes only its own."""
        builds = CLIENT.statistics().builds

        reports, closers = run_executor(method, close_log)

        workers = check_one_client_per_worker(reports)
        assert workers == sorted(closers)
        assert [(pid, pid) for pid in workers] == read_close_log(close_log)
        assert parent_client is CLIENT()
        assert [] == parent_client.closes
        assert builds == CLIENT.statistics().builds


@_FORK_WARNING
@pytest.mark.skipif(
    "fork" not in multiprocessing.get_all_start_methods(),
    reason="needs the fork start method",
)
class TestForkedWorkers:
    def test_forked_worker_never_uses_the_parents_client(
        self, close_log, parent_client
    ):
        """A forked worker starts empty and builds a client of its own."""
        reports, _ = run_pool("fork", close_log)

        # The parent's client is still in each forked worker's memory, so
        # no client of the worker's own can share its id.
        assert {False} == {r.client_id == id(parent_client) for r in reports}
        assert {False} == {r.builder_pid == os.getpid() for r in reports}
        assert {True} == {r.started_empty for r in reports}

    def test_forked_worker_never_closes_the_parents_client(
        self, close_log, parent_client
    ):
        """close_all() in a forked worker leaves the parent's client open."""
        _, closers = run_pool("fork", close_log)

        closes = read_close_log(close_log)
        assert [] == [pair for pair in closes if pair[1] == os.getpid()]
        assert sorted((pid, pid) for pid in closers) == closes
        assert [] == parent_client.closes
