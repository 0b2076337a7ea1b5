"""gunicorn --preload: the master builds a client, each worker its own."""

from __future__ import annotations

import http.client
import json
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections import defaultdict
from concurrent.futures import ThreadPoolExecutor

import pytest
from procs_client import read_close_log
from procs_env import STEP, WAIT, child_pythonpath

pytest.importorskip("gunicorn")

WORKERS = 3
ROUNDS = 4


class Gunicorn:
    """A gunicorn master serving procs_wsgi:app on a loopback port."""

    def __init__(self, tmp_path) -> None:
        self.close_log = tmp_path / "closes.log"
        self.close_log.touch()
        self.output = tmp_path / "gunicorn.log"
        barriers = tmp_path / "barriers"
        barriers.mkdir()
        # The test binds the port and hands gunicorn the socket: no race
        # for a free port, and nothing listens beyond 127.0.0.1.
        listener = socket.create_server(("127.0.0.1", 0))
        self.port = listener.getsockname()[1]
        env = {
            **os.environ,
            "PYTHONPATH": child_pythonpath(),
            "PK_CLOSE_LOG": str(self.close_log),
            "PK_BARRIER_DIR": str(barriers),
            "PK_WORKERS": str(WORKERS),
        }
        command = [
            *(sys.executable, "-m", "gunicorn", "procs_wsgi:app"),
            "--preload",
            *("--workers", str(WORKERS)),
            *("--worker-class", "sync"),
            *("--bind", f"fd://{listener.fileno()}"),
            *("--graceful-timeout", str(int(STEP))),
            "--no-control-socket",
        ]
        # cwd: the test's own folder, so no stray gunicorn.conf.py is read.
        with listener, self.output.open("wb") as output:
            self.process = subprocess.Popen(
                command,
                env=env,
                cwd=tmp_path,
                pass_fds=[listener.fileno()],
                stdin=subprocess.DEVNULL,
                stdout=output,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )

    @property
    def log(self) -> str:
        """Return what gunicorn printed, for failure messages."""
        return self.output.read_text(errors="replace")

    def get(self, path: str = "/") -> dict[str, object]:
        """Return the JSON body of a GET to *path*."""
        connection = http.client.HTTPConnection(
            "127.0.0.1", self.port, timeout=STEP
        )
        try:
            connection.request("GET", path)
            response = connection.getresponse()
            body = response.read()
        finally:
            connection.close()
        assert 200 == response.status, body
        reply = json.loads(body)
        assert isinstance(reply, dict)
        return reply

    def wait_ready(self) -> None:
        """Poll until a worker answers, within WAIT seconds."""
        pause = threading.Event()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            assert self.process.poll() is None, self.log
            try:
                self.get()
            except (ConnectionError, http.client.HTTPException):
                pause.wait(0.1)
            else:
                return
        pytest.fail(f"gunicorn never answered:\n{self.log}")

    def rounds(self, n: int) -> list[dict[str, object]]:
        """Send *n* rounds of WORKERS concurrent requests; one per worker."""
        replies = []
        with ThreadPoolExecutor(WORKERS) as pool:
            for i in range(n):
                paths = [f"/?round={i}"] * WORKERS
                replies.extend(pool.map(self.get, paths, timeout=WAIT))
        return replies

    def stop(self) -> int:
        """SIGTERM the master, wait (bounded), SIGKILL the group if stuck."""
        if self.process.poll() is None:
            self.process.send_signal(signal.SIGTERM)
        try:
            return self.process.wait(WAIT)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(STEP)
            pytest.fail(f"gunicorn ignored SIGTERM:\n{self.log}")


@pytest.fixture(name="server")
def _server(tmp_path):
    """Start gunicorn, wait until it answers, and always stop it."""
    server = Gunicorn(tmp_path)
    try:
        server.wait_ready()
        yield server
    finally:
        server.stop()


def by_worker(replies) -> dict[int, list[dict[str, object]]]:
    """Group replies by the pid of the worker that served them."""
    grouped: dict[int, list[dict[str, object]]] = defaultdict(list)
    for reply in replies:
        pid = reply["pid"]
        assert isinstance(pid, int)
        grouped[pid].append(reply)
    return grouped


class TestPreloadedGunicorn:
    def test_master_builds_at_import(self, server):
        """--preload runs the module-level call once, in the master."""
        replies = server.rounds(1)

        assert {server.process.pid} == {r["imported_by"] for r in replies}
        assert server.process.pid not in by_worker(replies)

    def test_each_worker_builds_its_own_client(self, server):
        """Every worker builds one client and never uses the master's."""
        workers = by_worker(server.rounds(ROUNDS))

        # The barrier put one request of every round in each worker.
        assert dict.fromkeys(workers, ROUNDS) == {
            pid: len(replies) for pid, replies in workers.items()
        }
        assert WORKERS == len(workers)
        # (builder pid, builds, is the master's client, its closes seen
        # by the worker), the same for every request a worker served.
        assert {pid: {(pid, 1, False, ())} for pid in workers} == {
            pid: {
                (
                    r["builder_pid"],
                    r["builds"],
                    r["is_import_client"],
                    tuple(r["import_client_closes"]),
                )
                for r in replies
            }
            for pid, replies in workers.items()
        }
        assert dict.fromkeys(workers, 1) == {
            pid: len({r["client_id"] for r in replies})
            for pid, replies in workers.items()
        }

    def test_no_worker_closes_the_masters_client(self, server):
        """At shutdown each process closes only the client it built."""
        workers = sorted(by_worker(server.rounds(ROUNDS)))
        master = server.process.pid

        assert 0 == server.stop(), server.log

        # Workers close theirs at exit (atexit), the master its own last;
        # a worker closing the master's copy would log (worker, master).
        expected = sorted([(pid, pid) for pid in workers] + [(master, master)])
        assert expected == read_close_log(server.close_log), server.log
