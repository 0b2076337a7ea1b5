"""128 threads on one ``daytona_client()``: shared, pooled, threads bounded.

The incident's job ran 128 threads on one client. Here they create
sandboxes on the emulator through one ``daytona_client()``, run a command
in each (``process.exec``, served by the emulator's toolbox routes), keep
it alive and delete it: no error, one build, no "pool is full" warning
from urllib3, and no more connections than the threads can hold at once.

Under faults (503s and cut responses, as in the issue), the threads the
client's event dispatcher starts stay bounded (see
``poolkeeper_daytona._threads`` for why they were not).
"""

from __future__ import annotations

import contextlib
import logging
import threading

import daytona
import engineio.packet
import pytest
from daytona_test_helpers import use_sandbox, wait_for

from poolkeeper_daytona import close_daytona, daytona_client
from poolkeeper_daytona.testing import DaytonaEmulator

#: The issue's job: 128 threads on one client.
THREADS = 128
#: Sandboxes each thread creates and deletes.
ROUNDS = 2
JOIN = 120.0
KEY = "shared-by-threads"
#: The name of the tests' own threads.
WORKER = "test-worker"


@pytest.fixture(name="pool_warnings")
def _pool_warnings():
    """Collect what urllib3's pools log at WARNING ("pool is full")."""
    seen: list[str] = []
    handler = logging.Handler(logging.WARNING)
    handler.emit = lambda record: seen.append(record.getMessage())  # type: ignore[method-assign]
    logger = logging.getLogger("urllib3.connectionpool")
    logger.addHandler(handler)
    try:
        yield seen
    finally:
        logger.removeHandler(handler)


def _run(work, threads=THREADS):
    """Start *threads* running *work* together; return their errors."""
    barrier = threading.Barrier(threads, timeout=JOIN)
    errors: list[BaseException] = []

    def run():
        try:
            barrier.wait()
            work()
        except BaseException as exc:
            errors.append(exc)

    started = [
        threading.Thread(target=run, name=f"{WORKER}-{n}")
        for n in range(threads)
    ]
    for thread in started:
        thread.start()
    for thread in started:
        thread.join(JOIN)
        assert not thread.is_alive()
    return errors


def _rounds():
    word = threading.current_thread().name
    for _ in range(ROUNDS):
        client = daytona_client()
        sandbox = client.create()
        use_sandbox(sandbox, word)
        client.delete(sandbox)


class TestSharedByThreads:
    def test_128_threads_share_one_client_within_its_pool(
        self, sdk_env, daytona_emulator, pool_warnings
    ):
        """Creates, execs and deletes from 128 threads: no error, no churn."""
        sdk_env.setenv("DAYTONA_API_KEY", KEY)
        builds = daytona_client.statistics().builds
        assert [] == _run(_rounds)
        assert builds + 1 == daytona_client.statistics().builds
        assert [] == pool_warnings
        # Every create, command, keep-alive and delete went through.
        calls = [
            (r.method, r.path.rpartition("/")[2], r.status)
            for r in daytona_emulator.requests(KEY)
        ]
        done = THREADS * ROUNDS
        assert done == calls.count(("POST", "sandbox", 200))
        assert done == calls.count(("POST", "execute", 200))
        assert done == calls.count(("POST", "last-activity", 201))
        assert done == sum(m == "DELETE" and ok == 200 for m, _, ok in calls)
        # At most one pooled connection per thread in each of the client's
        # two pools (the API's and the toolbox's; the SDK keeps 250 each),
        # plus the websocket of each Socket.IO session.
        sessions = len(daytona_emulator.socketio_sessions(KEY))
        assert 1 == sessions
        opened = daytona_emulator.total_connections(KEY)
        assert opened <= 2 * THREADS + sessions


def _message_threads(sio) -> list[threading.Thread]:
    """Threads running *sio*'s messages: engine.io's, or the adapter's."""
    owners = {id(sio), id(sio.eio.__dict__.get("start_background_task"))}
    owners.discard(id(None))
    return [
        thread
        for thread in threading.enumerate()
        if id(getattr(getattr(thread, "_target", None), "__self__", None))
        in owners
    ]


class TestMessageThreads:
    def test_messages_wait_on_one_thread_while_the_dispatcher_is_busy(
        self, sdk_env, daytona_emulator
    ):
        """Events for a busy dispatcher queue on one thread, not one each.

        The dispatcher's lock is held (as the threads subscribing and
        unsubscribing hold it): engine.io started a thread per message,
        each waiting for that lock.
        """
        sdk_env.setenv("DAYTONA_API_KEY", KEY)
        client = daytona_client()
        kept = client.create()  # Registers the event handlers.
        dispatcher = client._event_dispatcher
        assert wait_for(lambda: dispatcher.is_connected)
        sio = dispatcher._sio
        received = []
        receive = sio.eio._receive_packet

        def counting(pkt):
            if pkt.packet_type == engineio.packet.MESSAGE:
                received.append(pkt)
            return receive(pkt)

        sio.eio._receive_packet = counting
        # Same API key, same room: its sandboxes' events reach *client*.
        config = daytona.DaytonaConfig(
            api_key=KEY, api_url=daytona_emulator.api_url
        )
        other = daytona.Daytona(config)
        events = 20
        try:
            with dispatcher._lock:
                for _ in range(events):
                    other.create()
                assert wait_for(lambda: len(received) >= events)
                assert 1 == len(_message_threads(sio))
            assert wait_for(lambda: not _message_threads(sio))
        finally:
            close_daytona(other)
        client.delete(kept)


class TestIdleTimers:
    def test_a_timer_stored_over_another_cancels_it(self, sdk_env):
        """Unsubscribing with no listener left, 10 times: one live timer.

        The SDK starts a 30 s idle-disconnect timer at each and stored it
        over the last one without cancelling it: 10 sleeping threads.
        """
        sdk_env.setenv("DAYTONA_API_KEY", KEY)
        dispatcher = daytona_client()._event_dispatcher
        unsubscribe = dispatcher.subscribe("x", lambda *_: None, ["e"])
        for _ in range(10):
            unsubscribe()
        live = [
            timer
            for timer in threading.enumerate()
            if isinstance(timer, threading.Timer)
            and getattr(timer.function, "__self__", None) is dispatcher
            and not timer.finished.is_set()
        ]
        assert [dispatcher._disconnect_timer] == live


def _sdk_threads() -> list[threading.Thread]:
    """Live threads the SDK started: not ours, not poolkeeper's.

    A timer that was cancelled is left out: it runs nothing, and ends at
    its next turn on the CPU.
    """
    main = threading.main_thread()
    return [
        thread
        for thread in threading.enumerate()
        if thread is not main
        and not thread.name.startswith(
            (WORKER, "poolkeeper", "daytona-emulator")
        )
        and not (
            isinstance(thread, threading.Timer) and thread.finished.is_set()
        )
    ]


def _is_call_timer(thread: threading.Thread) -> bool:
    """Whether *thread* is the SDK's timeout of one call (``with_timeout``).

    One per call in flight: the calling thread's own, bounded by them.
    """
    function = getattr(thread, "function", None)
    name = getattr(function, "__qualname__", "")
    return name.endswith("_timeout_handler")


def _kinds() -> dict[str, int]:
    """Count the SDK's live threads by name, for a failure's message."""
    kinds: dict[str, int] = {}
    for thread in _sdk_threads():
        kind = thread.name.partition(" ")[2] or getattr(
            getattr(thread, "function", None), "__qualname__", "?"
        )
        kinds[kind] = kinds.get(kind, 0) + 1
    return kinds


#: What one client's dispatcher runs at most: engine.io's read and write
#: loops, python-socketio's reconnect loop, the dispatcher's connect
#: thread, the subscription expiry worker, the message thread (and the
#: one before it, ending), the idle timer (and one firing).
PER_CLIENT = 2 + 1 + 1 + 1 + 2 + 2


class TestThreadsStayBounded:
    def test_threads_per_client_under_faults(self, sdk_env):
        """128 threads, 30 % 503s, 6 % cut responses: threads bounded."""
        with DaytonaEmulator(
            failure_rate=0.3, eof_rate=0.06, seed=34, max_lifetime=300.0
        ) as emulator:
            sdk_env.setenv("DAYTONA_API_URL", emulator.api_url)
            sdk_env.setenv("DAYTONA_API_KEY", KEY)
            daytona_client()
            samples: list[tuple[int, int]] = []
            done = threading.Event()

            def rounds():
                for _ in range(ROUNDS):
                    with (
                        contextlib.suppress(daytona.DaytonaError),
                        daytona_client.lease() as client,
                    ):
                        client.delete(client.create())

            def sample():
                while not done.wait(0.05):
                    before = daytona_client.statistics()
                    threads = _sdk_threads()
                    calls = sum(map(_is_call_timer, threads))
                    after = daytona_client.statistics()
                    # Clients not closed yet, counted generously: built
                    # by the end of the count, closed by its start.
                    clients = after.builds - before.closes
                    samples.append((len(threads) - calls, calls, clients))

            sampler = threading.Thread(target=sample, name=f"{WORKER}-sampler")
            sampler.start()
            try:
                errors = _run(rounds)
            finally:
                done.set()
                sampler.join(JOIN)
            assert [] == errors
            assert samples
            over = [s for s in samples if s[0] > PER_CLIENT * s[2]]
            assert [] == over, f"max {max(samples)}: {_kinds()}"
            assert max(calls for _, calls, _ in samples) <= THREADS
