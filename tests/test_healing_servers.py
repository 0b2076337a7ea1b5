"""Healing against a real client and a real server (issue 21).

A shared ``httpx.Client`` (and ``httpx.AsyncClient``) talks to a stdlib
``http.server`` on 127.0.0.1 in a thread of this process: a client closed
by user code is replaced on the next lease or proxy call, racing
``retire()`` calls retire once, and an outage heals within the backoff's
bound without growing the open file descriptors.
"""

from __future__ import annotations

import asyncio
import contextlib
import http.server
import os
import socket
import threading
import time

import pytest
from helpers import WAIT, run_threads, wait_until

httpx = pytest.importorskip("httpx")

from poolkeeper import process_singleton  # noqa: E402

_CLOSED = "client has been closed"


def _closed_client(exc: BaseException) -> bool:
    """httpx's error for a request on a closed client (sync and async)."""
    return isinstance(exc, RuntimeError) and _CLOSED in str(exc)


def fd_count() -> int:
    """Return the number of open file descriptors of this process."""
    return len(os.listdir("/proc/self/fd"))  # noqa: PTH208 -- a count.


class _Handler(http.server.BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"  # Keep-alive: the pool holds connections.

    def do_GET(self) -> None:
        if self.path == "/slow":
            self.server.slow_entered.set()
            assert self.server.gate.wait(WAIT)
        body = b"ok"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def log_message(self, *args: object) -> None:
        """Quiet."""


class _Server(http.server.ThreadingHTTPServer):
    daemon_threads = True
    # 32-64 clients reconnect at once when it comes back: socketserver's
    # backlog of 5 would drop their SYNs (retried after 1 s, 3 s, 7 s...).
    request_queue_size = 128

    def __init__(self, address: tuple[str, int]) -> None:
        self.connections: set[socket.socket] = set()
        self.connections_lock = threading.Lock()
        # GET /slow answers once the gate opens.
        self.slow_entered = threading.Event()
        self.gate = threading.Event()
        super().__init__(address, _Handler)

    def process_request(self, request, client_address) -> None:
        with self.connections_lock:
            self.connections.add(request)
        super().process_request(request, client_address)

    def handle_error(self, request, client_address) -> None:
        """Quiet: the outage cuts connections on purpose."""

    def shutdown_request(self, request) -> None:
        with self.connections_lock:
            self.connections.discard(request)
        super().shutdown_request(request)


class LoopbackServer:
    """An HTTP server in a thread on 127.0.0.1 that can go away and back."""

    def __init__(self) -> None:
        self.port = 0
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> None:
        server = _Server(("127.0.0.1", self.port))
        self.port = server.server_address[1]
        self._server = server
        self._thread = threading.Thread(
            target=server.serve_forever, kwargs={"poll_interval": 0.05}
        )
        self._thread.start()

    def stop(self) -> None:
        """Stop listening and cut every open connection."""
        server, self._server = self._server, None
        if server is None:
            return
        server.gate.set()
        server.shutdown()
        server.server_close()
        assert self._thread is not None
        self._thread.join(WAIT)
        assert not self._thread.is_alive()
        with server.connections_lock:
            open_now = list(server.connections)
        for sock in open_now:
            with contextlib.suppress(OSError):
                sock.shutdown(socket.SHUT_RDWR)
        # The handler threads see the EOF and close their sockets.
        assert wait_until(lambda: not server.connections, WAIT)

    @property
    def http(self) -> _Server:
        assert self._server is not None
        return self._server

    @contextlib.contextmanager
    def outage(self):
        """Refuse connections (same port) for the duration of the block."""
        self.stop()
        try:
            yield
        finally:
            self.start()


@pytest.fixture(name="server")
def _server():
    server = LoopbackServer()
    server.start()
    yield server
    server.stop()


class CloseCounter:
    """A close hook that counts, per client, how often it ran."""

    def __init__(self) -> None:
        self.closed: list[object] = []

    def __call__(self, client) -> None:
        self.closed.append(client)
        client.close()

    async def aclose(self, client) -> None:
        self.closed.append(client)
        await client.aclose()


def _retired(single, reason: str) -> int:
    return single.statistics().retirements.get(reason, 0)


# -- a client closed by user code ------------------------------------------


def _get_under_lease(single) -> None:
    with single.lease() as client:
        client.get("/")


def _close_directly(single) -> None:
    single().close()


def _close_with_block(single) -> None:
    # The common idiom that closes the shared client on the way out.
    with single() as client:
        client.get("/")


class TestClosedByUser:
    """`api().close()` or `with api() as c:` no longer breaks every caller."""

    @pytest.mark.parametrize(
        "close_it", [_close_directly, _close_with_block], ids=["close", "with"]
    )
    def test_a_lease_replaces_the_closed_client(self, server, close_it):
        """The failing lease retires it; the next lease gets a new one."""
        closes = CloseCounter()

        @process_singleton(retire_on=_closed_client, close=closes)
        def api() -> httpx.Client:
            return httpx.Client(base_url=server.url)

        first = api()
        close_it(api)

        assert api.current() is first
        with pytest.raises(RuntimeError, match=_CLOSED) as info:
            _get_under_lease(api)
        # Propagated unchanged: httpx's own exception, nothing wrapped.
        assert type(info.value) is RuntimeError
        assert api.current() is not first
        with api.lease() as client:
            assert client is not first
            assert 200 == client.get("/").status_code

        stats = api.statistics()
        assert 1 == _retired(api, "retire_on")
        assert 2 == stats.builds
        assert [first] == closes.closed

    def test_a_proxy_call_replaces_the_closed_client(self, server):
        """A method called through proxy() retires it the same way."""

        @process_singleton(retire_on=_closed_client)
        def api() -> httpx.Client:
            return httpx.Client(base_url=server.url)

        client = api.proxy()
        first = api()
        first.close()

        with pytest.raises(RuntimeError, match=_CLOSED):
            client.get("/")
        assert 200 == client.get("/").status_code
        assert api() is not first
        assert 1 == _retired(api, "retire_on")
        assert 2 == api.statistics().builds

    def test_without_retire_on_the_closed_client_stays(self, server):
        """The failure the option fixes: every caller fails for ever."""

        @process_singleton
        def api() -> httpx.Client:
            return httpx.Client(base_url=server.url)

        first = api()
        first.close()
        for _ in range(3):
            with pytest.raises(RuntimeError, match=_CLOSED):
                _get_under_lease(api)
        assert api() is first
        assert 1 == api.statistics().builds

    def test_an_async_lease_replaces_the_closed_client(self, server):
        """`async with api.lease()` on an httpx.AsyncClient closed by user."""
        closes = CloseCounter()

        @process_singleton(retire_on=_closed_client, close=closes.aclose)
        async def api() -> httpx.AsyncClient:
            return httpx.AsyncClient(base_url=server.url)

        async def main() -> tuple[object, object, int]:
            first = await api()
            async with first:  # The idiom: closes the shared client.
                await first.get("/")
            with pytest.raises(RuntimeError, match=_CLOSED):
                async with api.lease() as client:
                    await client.get("/")
            async with api.lease() as client:
                status = (await client.get("/")).status_code
            return first, client, status

        first, second, status = asyncio.run(main())

        assert first is not second
        assert 200 == status
        assert 1 == _retired(api, "retire_on")
        assert 2 == api.statistics().builds
        # Closed on its loop when retired, and the second one at loop end.
        assert [first, second] == closes.closed


# -- compare-and-retire ----------------------------------------------------


class TestRetire:
    """retire(client) retires only the live client it names."""

    @pytest.mark.parametrize("threads", [32])
    def test_racing_retires_retire_once_and_build_once(self, server, threads):
        """32 threads retire the same client: 1 retirement, 1 new build."""

        @process_singleton
        def api() -> httpx.Client:
            return httpx.Client(base_url=server.url)

        bad = api()

        def retire_then_call() -> tuple[bool, object]:
            retired = api.retire(bad)
            with api.lease() as client:
                assert 200 == client.get("/").status_code
            return retired, client

        results = run_threads(retire_then_call, threads)

        assert all(isinstance(r, tuple) for r in results), results
        assert 1 == sum(retired for retired, _ in results)
        assert 1 == len({id(client) for _, client in results})
        assert bad not in {client for _, client in results}
        assert 2 == api.statistics().builds
        assert 1 == _retired(api, "retire")
        assert bad.is_closed

    def test_a_stale_retire_after_a_rotation_is_refused(
        self, server, monkeypatch
    ):
        """retire(old) after the key rotated leaves the new client alone."""
        monkeypatch.setenv("HEALING_TEST_KEY", "one")

        @process_singleton(key=lambda: os.environ["HEALING_TEST_KEY"])
        def api() -> httpx.Client:
            return httpx.Client(base_url=server.url)

        old = api()
        monkeypatch.setenv("HEALING_TEST_KEY", "two")
        new = api()

        assert new is not old
        assert api.retire(old) is False
        assert api.current() is new
        assert 200 == new.get("/").status_code
        assert 0 == _retired(api, "retire")
        assert 1 == _retired(api, "key")
        assert 2 == api.statistics().builds


# -- an outage -------------------------------------------------------------

# The outage in the default suite (seconds); the run is 10 s with
# 64 threads: HEALING_OUTAGE=10 HEALING_THREADS=64.
_OUTAGE = float(os.environ.get("HEALING_OUTAGE", "3"))
_THREADS = int(os.environ.get("HEALING_THREADS", "32"))


def healing_builds_bound(seconds: float, first: float, cap: float) -> int:
    """The most healing builds in *seconds* from the first one.

    The first is immediate; the n-th waits first * 2**(n-2) after the one
    before it (up to *cap*), so build n is at first * (2**(n-1) - 1) at
    the earliest.
    """
    builds, at, spacing = 1, 0.0, first
    while at + spacing <= seconds:
        at += spacing
        builds += 1
        spacing = min(2 * spacing, cap)
    return builds


def test_the_bound_counts_the_doublings():
    """1 s doubling: builds at 0, 1, 3, 7, 15 s; a 2 s cap: every 2 s."""
    assert 3 == healing_builds_bound(3.0, 1.0, 60.0)
    assert 4 == healing_builds_bound(10.0, 1.0, 60.0)
    assert 5 == healing_builds_bound(15.0, 1.0, 60.0)
    assert 6 == healing_builds_bound(10.0, 1.0, 2.0)


class Callers:
    """Threads calling ``GET /`` (*get* returns its status) until stopped.

    A transport error is a failed call, retried shortly as a caller's own
    loop would; anything else ends the thread, kept in ``failures``.
    """

    def __init__(self, get, threads: int) -> None:
        self.get = get
        self.stop = threading.Event()
        self.back = 0.0  # When the server listens again (monotonic).
        self.warm: set[int] = set()  # Threads that had an answer.
        self.ok_after: dict[int, float] = {}  # Their first since back.
        self.refused = 0
        self.failures: list[BaseException] = []
        self.lock = threading.Lock()
        self.threads = [
            threading.Thread(target=self.call, args=(i,), daemon=True)
            for i in range(threads)
        ]

    def call(self, i: int) -> None:
        while not self.stop.is_set():
            try:
                status = self.get()
            except httpx.TransportError:
                with self.lock:
                    self.refused += 1
                time.sleep(0.01)
                continue
            except BaseException as exc:
                with self.lock:
                    self.failures.append(exc)
                return
            now = time.monotonic()
            with self.lock:
                if status != 200:
                    self.failures.append(AssertionError(status))
                self.warm.add(i)
                if self.back and i not in self.ok_after:
                    self.ok_after[i] = now
            time.sleep(0.005)

    def start(self) -> None:
        for thread in self.threads:
            thread.start()

    def join(self) -> None:
        self.stop.set()
        for thread in self.threads:
            thread.join(WAIT)
        assert not any(t.is_alive() for t in self.threads)


def _leased_get(api):
    """``GET /`` under a lease of *api*: its status."""

    def get() -> int:
        with api.lease() as client:
            return client.get("/").status_code

    return get


class TestOutage:
    """The server goes away while every thread calls under a lease."""

    @pytest.mark.timeout(120)
    def test_builds_stay_bounded_fds_flat_and_callers_recover(self, server):
        """Healing builds <= the bound, fds flat, every caller recovers."""
        from poolkeeper import _lifecycle

        first = _lifecycle.BACKOFF_FIRST
        cap = _lifecycle.BACKOFF_CAP

        @process_singleton(retire_on=httpx.TransportError)
        def api() -> httpx.Client:
            return httpx.Client(base_url=server.url, timeout=5.0)

        baseline = fd_count()
        samples: list[int] = []
        callers = Callers(_leased_get(api), _THREADS)
        callers.start()
        try:
            time.sleep(0.5)  # Warm: the threads have their connections.
            before = fd_count()
            builds_before = api.statistics().builds
            began = time.monotonic()
            with server.outage():
                while time.monotonic() - began < _OUTAGE:
                    samples.append(fd_count())
                    time.sleep(0.05)
                builds_in_outage = api.statistics().builds - builds_before
                window = time.monotonic() - began
            back = callers.back = time.monotonic()
            assert wait_until(
                lambda: len(callers.ok_after) == _THREADS, cap + 10
            )
            recovered = max(callers.ok_after.values()) - back
            time.sleep(0.5)
            after = fd_count()
        finally:
            callers.join()
        api.reset()
        closed = wait_until(lambda: fd_count() <= baseline, 5.0)
        end = fd_count()

        # Every build in the window is a healing build.
        bound = healing_builds_bound(window, first, cap)
        print(
            f"\noutage {window:.2f}s, {_THREADS} threads: healing builds"
            f" {builds_in_outage} (bound {bound}); fds before {before},"
            f" during {min(samples)}..{max(samples)}, after {after},"
            f" at the end {end} (baseline {baseline});"
            f" every caller ok {recovered:.2f}s after the server returned;"
            f" retirements {api.statistics().retirements['retire_on']}"
        )
        assert [] == callers.failures
        assert builds_in_outage <= bound
        # Flat: nothing grows while healing (the server's ends of the
        # connections are gone, so fewer); after it, at most a connection
        # per thread (both ends in this process); nothing left at the end.
        assert max(samples) <= before + 4
        assert after <= baseline + 2 * _THREADS + 4
        assert closed, (end, baseline)
        # Within one cap (in practice at once: the live client works).
        assert recovered <= cap


class TestProxyInFlight:
    """A call in flight through proxy() when healing retires its client."""

    def test_a_retired_client_is_closed_after_the_call_ends(self, server):
        """The retired client stays open until the in-flight call ends."""

        @process_singleton(retire_on=httpx.TransportError)
        def api() -> httpx.Client:
            return httpx.Client(base_url=server.url, timeout=3.0)

        client = api.proxy()
        first = api()
        answers: list[object] = []

        def slow_call() -> None:
            try:
                answers.append(client.get("/slow").status_code)
            except BaseException as exc:
                answers.append(exc)

        caller = threading.Thread(target=slow_call)
        caller.start()
        assert server.http.slow_entered.wait(WAIT)
        assert api.retire(first)  # As a failing call on another thread.
        server.http.gate.set()
        caller.join(WAIT)
        assert not caller.is_alive()

        if isinstance(answers[0], BaseException):
            raise answers[0]
        assert [200] == answers
