"""Servers for the SDK suite: started on 127.0.0.1, bounded, stopped.

Each server runs in a process of its own (so a forked test child inherits
none of its sockets), under ``timeout`` so that it cannot outlive a
crashed test run by more than LIFETIME seconds.
"""

from __future__ import annotations

import contextlib
import http.client
import importlib.util
import itertools
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

_HERE = Path(__file__).resolve().parent
if str(_HERE) not in sys.path:
    sys.path.insert(0, str(_HERE))

# Importable only once _HERE is on the path.
import sdk_outcomes  # noqa: E402
from sdk_drivers import SYNC  # noqa: E402

TIMEOUT = shutil.which("timeout") or "timeout"  # coreutils
RECIPES = _HERE.parent.parent / "docs" / "recipes"
LIFETIME = 1800  # seconds; the whole SDK suite takes a small part of it.
START = 60.0  # seconds for a server to answer.
_serial = itertools.count()


def pytest_sessionfinish(session, exitstatus):
    """With RECORD_THREAD_OUTCOMES=1: write what the 128-thread tests
    measured to docs/threads/outcomes.json (see sdk_outcomes)."""
    sdk_outcomes.write()


class Server:
    """A server process on a loopback port."""

    def __init__(self, name, port, process, log):
        self.name = name
        self.port = port
        self.process = process
        self.log = log
        self.url = f"http://127.0.0.1:{port}"

    def output(self):
        """Return what the server printed, for failure messages."""
        return self.log.read_text(errors="replace")

    def stop(self):
        """SIGTERM the server's group, wait (bounded), then SIGKILL it."""
        if self.process.poll() is None:
            os.killpg(self.process.pid, signal.SIGTERM)
        try:
            self.process.wait(10)
        except subprocess.TimeoutExpired:
            os.killpg(self.process.pid, signal.SIGKILL)
            self.process.wait(10)
        if self.process.stdin is not None:
            self.process.stdin.close()


def _spawn(name, command, tmp, *, pass_fds=(), env=None):
    log = tmp / f"{name}.log"
    with log.open("wb") as output:
        process = subprocess.Popen(
            [TIMEOUT, "-s", "KILL", str(LIFETIME), *command],
            cwd=tmp,
            env={**os.environ, "PYTHONPATH": str(_HERE), **(env or {})},
            pass_fds=pass_fds,
            stdin=subprocess.PIPE,
            stdout=output,
            stderr=subprocess.STDOUT,
            start_new_session=True,
        )
    return process, log


def _wait(server, ready):
    pause = threading.Event()
    deadline = time.monotonic() + START
    while time.monotonic() < deadline:
        if server.process.poll() is not None:
            break
        try:
            if ready():
                return server
        except OSError:
            pass
        pause.wait(0.1)
    server.stop()
    pytest.fail(f"{server.name} never answered:\n{server.output()}")


def _gunicorn(name, app, tmp):
    # The test binds the port and hands gunicorn the socket: no race for a
    # free port. gthread keeps connections alive between requests.
    listener = socket.create_server(("127.0.0.1", 0))
    with listener:
        port = listener.getsockname()[1]
        process, log = _spawn(
            name,
            [
                *(sys.executable, "-m", "gunicorn", f"sdk_apps:{app}"),
                *("--worker-class", "gthread", "--threads", "64"),
                *("--workers", "1", "--keep-alive", "600"),
                *("--bind", f"fd://{listener.fileno()}"),
                "--no-control-socket",
            ],
            tmp,
            pass_fds=[listener.fileno()],
        )
    server = Server(name, port, process, log)

    def ready():
        connection = http.client.HTTPConnection("127.0.0.1", port, timeout=5)
        try:
            connection.request("GET", "/ready")
            return connection.getresponse().status < 500
        finally:
            connection.close()

    return _wait(server, ready)


def _free_port():
    with socket.create_server(("127.0.0.1", 0)) as probe:
        return probe.getsockname()[1]


@pytest.fixture(scope="session", name="http_server")
def _http_server(tmp_path_factory):
    server = _gunicorn("http", "http_app", tmp_path_factory.mktemp("http"))
    yield server
    server.stop()


@pytest.fixture(scope="session", name="s3_server")
def _s3_server(tmp_path_factory):
    server = _gunicorn("s3", "s3_app", tmp_path_factory.mktemp("s3"))
    yield server
    server.stop()


@pytest.fixture(scope="session", name="redis_server")
def _redis_server(tmp_path_factory):
    binary = shutil.which("redis-server")
    if binary is None:
        message = (
            "redis-server is not installed (apt-get install -y "
            "redis-server); the redis tests cannot run"
        )
        if os.environ.get("CI"):
            pytest.fail(message)
        pytest.skip(message)
    import redis

    tmp = tmp_path_factory.mktemp("redis")
    port = _free_port()
    process, log = _spawn(
        "redis",
        [
            *(binary, "--port", str(port), "--bind", "127.0.0.1"),
            *("--save", "", "--appendonly", "no", "--dir", str(tmp)),
        ],
        tmp,
    )
    server = Server("redis", port, process, log)
    server.url = f"redis://127.0.0.1:{port}"
    admin = redis.Redis(host="127.0.0.1", port=port, socket_timeout=5)
    _wait(server, admin.ping)
    server.admin = admin
    yield server
    admin.close()
    server.stop()


class OwnRedis:
    """A redis-server of one test's own: killed, paused, started again.

    Always on the same port, so that a client built before an outage
    reaches the server that comes back.
    """

    def __init__(self, binary, tmp):
        self.binary = binary
        self.tmp = tmp
        self.port = _free_port()
        self.server = None

    def start(self):
        import redis

        process, log = _spawn(
            f"redis-{self.port}",
            [
                *(self.binary, "--port", str(self.port)),
                *("--bind", "127.0.0.1", "--save", "", "--appendonly"),
                *("no", "--dir", str(self.tmp)),
            ],
            self.tmp,
        )
        self.server = Server("redis", self.port, process, log)
        admin = redis.Redis(host="127.0.0.1", port=self.port, socket_timeout=5)
        try:
            _wait(self.server, admin.ping)
        finally:
            admin.close()

    def kill(self):
        """SIGKILL the server: its connections end, the port refuses."""
        os.killpg(self.server.process.pid, signal.SIGKILL)
        self.server.stop()

    def pause(self):
        """SIGSTOP it: connected, but it answers nothing."""
        os.killpg(self.server.process.pid, signal.SIGSTOP)

    def resume(self):
        os.killpg(self.server.process.pid, signal.SIGCONT)

    def stop(self):
        if self.server is not None:
            with contextlib.suppress(ProcessLookupError):
                self.resume()
            self.server.stop()


@pytest.fixture(name="own_redis")
def _own_redis(tmp_path):
    """A redis-server for one test, which it may kill or pause."""
    binary = shutil.which("redis-server")
    if binary is None:
        pytest.skip("redis-server is not installed")
    server = OwnRedis(binary, tmp_path)
    server.start()
    yield server
    server.stop()


@pytest.fixture(scope="session", name="grpc_server")
def _grpc_server(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("grpc")
    port = _free_port()
    script = str(_HERE / "sdk_grpc_server.py")
    command = [sys.executable, script, "--port", str(port)]
    process, log = _spawn("grpc", command, tmp)
    server = Server("grpc", port, process, log)
    server.url = f"127.0.0.1:{port}"
    _wait(server, lambda: "ready" in server.output())
    yield server
    server.stop()


@pytest.fixture(name="sdk", params=SYNC, ids=lambda cls: cls.__name__)
def _sdk(request, recipe, monkeypatch):
    """A driver of each sync recipe, pointed at its running server."""
    cls = request.param
    server = request.getfixturevalue(cls.server)
    return cls(recipe(cls.recipe), server, monkeypatch)


@pytest.fixture(name="recipe")
def _recipe():
    """Load a docs/recipes module afresh: new singletons, zero counters."""

    def load(name):
        path = RECIPES / f"{name}.py"
        spec = importlib.util.spec_from_file_location(
            f"recipe_{name}_{next(_serial)}", path
        )
        assert spec is not None
        assert spec.loader is not None
        module = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(module)
        return module

    return load
