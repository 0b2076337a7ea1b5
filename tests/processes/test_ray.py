"""A local Ray cluster: every task and actor process builds one client."""

from __future__ import annotations

import os
import shutil
import tempfile
from collections import defaultdict

import pytest
from procs_env import WAIT, child_pythonpath
from procs_ray import CLIENT, Holder, Report, report

ray = pytest.importorskip("ray")

# Starting the cluster alone can take most of a minute on a busy 2-core
# machine; the module's first test pays for it.
pytestmark = [pytest.mark.ray, pytest.mark.timeout(300)]

TASKS = 40
CALLS = 10


@pytest.fixture(name="cluster", scope="module")
def _cluster():
    """Start a 2-CPU Ray cluster on 127.0.0.1 for this module only."""
    temp = tempfile.mkdtemp(prefix="pkray-")  # Short: Ray binds sockets.
    try:
        with pytest.MonkeyPatch.context() as patch:
            # Workers inherit the raylet's environment: this finds
            # procs_ray without a runtime_env, whose setup adds seconds
            # per worker.
            patch.setenv("PYTHONPATH", child_pythonpath())
            # No usage report leaves the machine.
            patch.setenv("RAY_USAGE_STATS_ENABLED", "0")
            # Keep the node address 127.0.0.1, which makes every Ray
            # server bind loopback only. Ray swaps in the machine's
            # address unless it runs as a single-machine cluster; it
            # reads that switch from the environment at import (hence the
            # attribute, for this process) and in the processes it starts
            # (hence the variable).
            patch.setenv("RAY_ENABLE_WINDOWS_OR_OSX_CLUSTER", "0")
            patch.setattr(
                ray._private.ray_constants, "ENABLE_RAY_CLUSTER", False
            )
            ray.init(
                num_cpus=2,
                include_dashboard=False,
                log_to_driver=False,
                _node_ip_address="127.0.0.1",
                _temp_dir=temp,
            )
        assert "127.0.0.1" == ray.util.get_node_ip_address()
        yield
    finally:
        ray.shutdown()
        shutil.rmtree(temp, ignore_errors=True)


def check_one_client_per_process(reports: list[Report]) -> list[int]:
    """Assert each process built one client of its own; return the pids."""
    by_pid: dict[int, list[Report]] = defaultdict(list)
    for r in reports:
        by_pid[r.pid].append(r)
    pids = sorted(by_pid)

    assert os.getpid() not in pids
    # (builder pid, builds, argument resolved to its own singleton),
    # the same for every call a process served.
    assert {pid: {(pid, 1, True)} for pid in pids} == {
        pid: {(r.builder_pid, r.builds, r.is_own_singleton) for r in rs}
        for pid, rs in by_pid.items()
    }
    assert dict.fromkeys(pids, 1) == {
        pid: len({r.client_id for r in rs}) for pid, rs in by_pid.items()
    }
    return pids


@pytest.mark.usefixtures("cluster")
class TestRayTasks:
    def test_each_task_worker_builds_one_client(self):
        """Tasks given the singleton by reference build once per worker."""
        driver_client = CLIENT()
        task = ray.remote(report)

        reports = ray.get(
            [task.remote(CLIENT) for _ in range(TASKS)], timeout=WAIT
        )

        check_one_client_per_process(reports)
        assert TASKS == len(reports)
        assert driver_client is CLIENT()
        assert [] == driver_client.closes


@pytest.mark.usefixtures("cluster")
class TestRayActors:
    def test_each_actor_builds_one_client(self):
        """Each actor builds one client, via its field or an argument."""
        driver_client = CLIENT()
        holder = ray.remote(Holder)
        actors = [holder.remote(CLIENT) for _ in range(2)]
        try:
            reports = ray.get(
                [
                    call
                    for actor in actors
                    for _ in range(CALLS)
                    for call in (
                        actor.report.remote(),
                        actor.report_arg.remote(CLIENT),
                    )
                ],
                timeout=WAIT,
            )
        finally:
            for actor in actors:
                ray.kill(actor)

        # An actor has a process of its own, so two actors are two pids.
        pids = check_one_client_per_process(reports)
        assert 2 == len(pids)
        assert dict.fromkeys(pids, 2 * CALLS) == {
            pid: sum(r.pid == pid for r in reports) for pid in pids
        }
        assert driver_client is CLIENT()
