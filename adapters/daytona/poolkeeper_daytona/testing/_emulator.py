"""A Daytona API emulator on 127.0.0.1, served from a background thread."""

from __future__ import annotations

import asyncio
import contextlib
import logging
import random
import threading
import time
from pathlib import Path  # noqa: TC003 - Sphinx resolves ca_file's type.
from typing import TYPE_CHECKING, Any, Final, final

from aiohttp import web

from poolkeeper_daytona.testing._app import (
    API_PREFIX,
    EmulatorApp,
    FaultSettings,
)
from poolkeeper_daytona.testing._breaks import BREAK_KINDS, BreakKind
from poolkeeper_daytona.testing._ledger import Ledger
from poolkeeper_daytona.testing._protocol import (
    TrackingProtocol,
    abort_transport,
)
from poolkeeper_daytona.testing._records import (
    ConnectionRecord,
    RequestRecord,
    SocketIOSession,
    client_id,
)
from poolkeeper_daytona.testing._tls import TLSFiles, make_tls_files

if TYPE_CHECKING:
    from collections.abc import (
        Awaitable,
        Callable,
        Collection,
        Coroutine,
        Iterator,
    )
    from types import TracebackType

    from typing_extensions import Self

__all__ = ["DaytonaEmulator"]

_log = logging.getLogger("poolkeeper.daytona.testing")
_START_TIMEOUT: Final = 10.0
_STOP_TIMEOUT: Final = 10.0
_SHUTDOWN_TIMEOUT: Final = 2.0


async def _cancel_leftovers() -> None:
    """Cancel tasks still pending at shutdown (engine.io's ping tasks)."""
    current = asyncio.current_task()
    tasks = [t for t in asyncio.all_tasks() if t is not current]
    for task in tasks:
        task.cancel()
    if tasks:
        await asyncio.wait(tasks, timeout=_SHUTDOWN_TIMEOUT)


@final
class DaytonaEmulator:
    """Emulates the Daytona API that ``daytona.Daytona`` talks to.

    The emulator serves REST (create, get, list, delete, toolbox proxy URL,
    a sandbox's ``refresh_activity()``), a sandbox's toolbox (its
    ``process.exec()``, answered by a four-command shell that runs
    nothing: ``echo``, ``true``, ``false``, ``exit N``) and the Socket.IO
    event channel on ``127.0.0.1`` on a free port, from an event loop
    owned by one background thread. It records every
    connection, request and Socket.IO session, so tests can assert that a
    client reuses its connections and that a closed client's connections
    are gone. It stops itself after *max_lifetime* seconds.

    With ``tls=True`` it serves HTTPS and WSS with a certificate signed by
    a certificate authority made for it at start (:attr:`ca_file`); the
    SDK trusts it once :meth:`trust_env`'s variables are set.

    Example::

        with DaytonaEmulator(failure_rate=0.3, seed=1) as emu:
            client = Daytona(DaytonaConfig(api_key="k", api_url=emu.api_url))

    .. versionadded:: 0.1.0
    """

    def __init__(  # noqa: PLR0913 - every knob is keyword-only.
        self,
        *,
        failure_rate: float = 0.0,
        latency: float = 0.0,
        drop_mode: bool = False,
        seed: int | None = None,
        start_delay: float = 0.0,
        api_keys: Collection[str] | None = None,
        max_lifetime: float = 600.0,
        rate_limit_rate: float = 0.0,
        retry_after: float = 1.0,
        slow_rate: float = 0.0,
        slow_seconds: float = 0.0,
        tls: bool = False,
        eof_rate: float = 0.0,
        reset_rate: float = 0.0,
        handshake_eof_rate: float = 0.0,
    ) -> None:
        """Configure an emulator; :meth:`start` or ``with`` runs it.

        Args:
            failure_rate: Fraction of creates answered with HTTP 503.
            latency: Seconds added before answering each request.
            drop_mode: Accept new connections, then drop them at once.
            seed: Seed for injected failures and sandbox ids.
            start_delay: Seconds a new sandbox stays ``creating``.
            api_keys: Tokens accepted; ``None`` accepts any non-empty one.
            max_lifetime: Seconds after which the emulator stops itself.
            rate_limit_rate: Fraction of creates answered with HTTP 429.
            retry_after: Seconds in the 429's ``Retry-After`` header
                (rounded up to whole seconds).
            slow_rate: Fraction of creates whose response is delayed by
                *slow_seconds*; the sandbox exists at once, so a client
                that timed out leaves one behind, as with the real API.
            slow_seconds: The delay of a slow create's response.
            tls: Serve HTTPS/WSS with a throwaway CA (needs the
                ``openssl`` command) instead of plain HTTP/WS.
            eof_rate: Fraction of REST requests (any endpoint) served and
                then cut mid-response, closed without TLS
                ``close_notify``: ``ssl.SSLEOFError`` in the client.
            reset_rate: Fraction of REST requests answered by a TCP reset
                before they are served.
            handshake_eof_rate: Fraction of TLS handshakes (REST and
                Socket.IO connections alike) dropped as they start, with
                ``tls=True``: ``SSLEOFError`` in the client's handshake.

        Raises:
            ValueError: If a rate, delay or lifetime is out of range.
        """
        rates = {
            "failure_rate": failure_rate,
            "rate_limit_rate": rate_limit_rate,
            "slow_rate": slow_rate,
            "eof_rate": eof_rate,
            "reset_rate": reset_rate,
            "handshake_eof_rate": handshake_eof_rate,
        }
        for name, rate in rates.items():
            if not 0.0 <= rate <= 1.0:
                msg = f"{name} must be within [0, 1]."
                raise ValueError(msg)
        delays = (latency, start_delay, retry_after, slow_seconds)
        if min(delays) < 0 or max_lifetime <= 0:
            msg = (
                "latency, start_delay, retry_after and slow_seconds must "
                "be >= 0, max_lifetime > 0."
            )
            raise ValueError(msg)
        self.faults: Final = FaultSettings(
            failure_rate=failure_rate,
            latency=latency,
            drop_mode=drop_mode,
            start_delay=start_delay,
            rate_limit_rate=rate_limit_rate,
            retry_after=retry_after,
            slow_rate=slow_rate,
            slow_seconds=slow_seconds,
            eof_rate=eof_rate,
            reset_rate=reset_rate,
            handshake_eof_rate=handshake_eof_rate,
        )
        self._tls = tls
        self._tls_files: TLSFiles | None = None
        self._handshake_lock = threading.Lock()
        self._handshakes_to_drop = 0
        self._dropped_handshakes = 0
        self._server: asyncio.Server | None = None
        self._serve_again: Callable[[], Awaitable[None]] | None = None
        self._rng = random.Random(seed)  # noqa: S311 - not cryptographic.
        self._api_keys = api_keys
        self._max_lifetime = max_lifetime
        self._ledger = Ledger()
        self._thread: threading.Thread | None = None
        self._loop: asyncio.AbstractEventLoop | None = None
        self._stop: asyncio.Event | None = None
        self._ready = threading.Event()
        self._app: EmulatorApp | None = None
        self._port = 0
        self._error: BaseException | None = None

    # -- lifecycle ---------------------------------------------------------

    def start(self) -> Self:
        """Start serving and return once the port is bound.

        Raises:
            RuntimeError: If already started, or the server fails to start.
        """
        if self._thread is not None:
            msg = "DaytonaEmulator can only be started once."
            raise RuntimeError(msg)
        if self._tls:
            self._tls_files = make_tls_files()
        self._thread = threading.Thread(
            target=self._run, name="daytona-emulator", daemon=True
        )
        self._thread.start()
        if not self._ready.wait(_START_TIMEOUT) or self._error is not None:
            self.stop()
            msg = "DaytonaEmulator failed to start."
            raise RuntimeError(msg) from self._error
        return self

    def stop(self) -> None:
        """Stop serving, close every connection and join the thread.

        Idempotent. Waits at most about ten seconds.
        """
        loop, stop, thread = self._loop, self._stop, self._thread
        if loop is not None and stop is not None:
            with contextlib.suppress(RuntimeError):  # Loop already closed.
                loop.call_soon_threadsafe(stop.set)
        if thread is not None:
            thread.join(_STOP_TIMEOUT)
            if thread.is_alive():
                _log.warning("Daytona emulator thread did not stop in time.")
        if self._tls_files is not None and not self.is_running:
            self._tls_files.remove()

    def __enter__(self) -> Self:
        """Start the emulator."""
        return self.start()

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        """Stop the emulator."""
        self.stop()

    @property
    def is_running(self) -> bool:
        """Whether the server thread is serving."""
        thread = self._thread
        return (
            thread is not None and thread.is_alive() and self._ready.is_set()
        )

    @property
    def port(self) -> int:
        """The bound TCP port (0 before :meth:`start`)."""
        return self._port

    @property
    def api_url(self) -> str:
        """The URL to pass as ``DaytonaConfig(api_url=...)``."""
        return f"{self._scheme}://127.0.0.1:{self._port}{API_PREFIX}"

    @property
    def _scheme(self) -> str:
        return "https" if self._tls else "http"

    @property
    def ca_file(self) -> Path | None:
        """The CA certificate (PEM) to trust, with ``tls=True`` once started.

        The folder holding it is deleted by :meth:`stop`.
        """
        files = self._tls_files
        return None if files is None else files.ca_file

    def trust_env(self) -> dict[str, str]:
        """Return the environment variables that make the SDK trust us.

        ``SSL_CERT_FILE`` is read whenever a default SSL context loads its
        certificates: by urllib3 for every new connection of the sync
        client, by ``AsyncDaytona`` when it is built, by websocket-client
        for the sync Socket.IO channel, and by httpx. aiohttp's own default
        context, which the *async* Socket.IO channel uses, is made when
        aiohttp is imported: there it counts only if set before that.

        Returns:
            ``{"SSL_CERT_FILE": <ca_file>}``; empty without TLS.
        """
        ca_file = self.ca_file
        return {} if ca_file is None else {"SSL_CERT_FILE": str(ca_file)}

    def _run(self) -> None:
        loop = asyncio.new_event_loop()
        self._loop = loop
        try:
            loop.run_until_complete(self._serve())
        except BaseException as exc:  # noqa: BLE001 -- reported to start().
            self._error = exc
            _log.warning("Daytona emulator crashed.", exc_info=True)
        finally:
            self._ready.set()
            with contextlib.suppress(Exception):
                loop.run_until_complete(_cancel_leftovers())
                loop.run_until_complete(loop.shutdown_asyncgens())
            loop.close()

    async def _serve(self) -> None:
        self._stop = asyncio.Event()
        app = self._app = EmulatorApp(
            self._ledger, self.faults, self._rng, self._api_keys
        )
        runner = web.AppRunner(
            app.app, access_log=None, shutdown_timeout=_SHUTDOWN_TIMEOUT
        )
        await runner.setup()
        handler_factory = runner.server
        if handler_factory is None:  # pragma: no cover - setup() sets it.
            msg = "aiohttp runner has no server after setup()"
            raise RuntimeError(msg)
        files = self._tls_files
        context = (
            None
            if files is None
            else files.server_context(self._drop_handshake)
        )

        async def listen(port: int) -> None:
            self._server = await asyncio.get_running_loop().create_server(
                lambda: TrackingProtocol(
                    self._ledger, self.faults, handler_factory
                ),
                "127.0.0.1",
                port,
                ssl=context,
            )

        await listen(0)
        server = self._server
        if server is None:  # pragma: no cover - listen() sets it.
            msg = "the emulator's server did not start"
            raise RuntimeError(msg)
        self._port = int(server.sockets[0].getsockname()[1])
        self._serve_again = lambda: listen(self._port)
        app.set_origin(f"{self._scheme}://127.0.0.1:{self._port}")
        self._ready.set()
        try:
            with contextlib.suppress(TimeoutError):
                await asyncio.wait_for(self._stop.wait(), self._max_lifetime)
        finally:
            server = self._server
            self._server = None
            if server is not None:
                server.close()
            await app.shutdown()
            await runner.cleanup()
            for transport in self._ledger.open_transports():
                abort_transport(transport)
            if server is not None:
                with contextlib.suppress(TimeoutError):
                    await asyncio.wait_for(
                        server.wait_closed(), _SHUTDOWN_TIMEOUT
                    )
            # Let connection_lost callbacks of aborted transports run.
            await asyncio.sleep(0)

    # -- fault control -----------------------------------------------------

    def drop_connections(self, token: str | None = None) -> None:
        """Abort open connections (all, or those of *token*'s client).

        A dropped websocket makes the SDK's Socket.IO client reconnect.
        """
        loop = self._loop
        if loop is None:
            return
        wanted = client_id(token) if token is not None else None

        async def _drop() -> None:
            for transport in self._ledger.open_transports(wanted):
                abort_transport(transport)

        asyncio.run_coroutine_threadsafe(_drop(), loop).result(_STOP_TIMEOUT)

    def break_requests(
        self, kind: BreakKind, count: int = 1, *, method: str | None = None
    ) -> None:
        """Break the next *count* REST requests (with *method*, if given).

        ``"eof"`` serves each request, then cuts its response half-way and
        closes the connection without TLS ``close_notify`` (the client
        reads ``ssl.SSLEOFError`` over TLS); ``"reset"`` answers it with a
        TCP reset before serving it. Planned breaks are used before
        the ``eof_rate``/``reset_rate`` of ``faults`` are drawn; Socket.IO
        traffic is never broken. Note that urllib3 retries idempotent
        requests (GET, DELETE) after a broken connection by itself.

        Raises:
            ValueError: If *kind* is unknown or *count* is below 1.
        """
        if kind not in BREAK_KINDS or count < 1:
            msg = (
                f"break_requests() takes kind 'eof' or 'reset' and a "
                f"count >= 1, not {kind!r}, {count!r}."
            )
            raise ValueError(msg)
        app = self._app
        if app is None:
            msg = "Start the DaytonaEmulator before break_requests()."
            raise RuntimeError(msg)
        app.breaks.add(kind, count, method)

    def break_handshakes(self, count: int = 1) -> None:
        """Drop the next *count* TLS handshakes (``tls=True`` only).

        The emulator closes each of those connections as its handshake
        starts, sending nothing: the client's handshake fails with
        ``ssl.SSLEOFError`` ("EOF occurred in violation of protocol"),
        which urllib3 retries and then reports as ``MaxRetryError`` caused
        by ``SSLError(SSLEOFError(...))``, the incident's error. Only new
        connections handshake: :meth:`drop_connections` first makes the
        SDK open some.

        Raises:
            ValueError: If *count* is below 1.
            RuntimeError: Without ``tls=True``.
        """
        if count < 1:
            msg = f"break_handshakes() takes a count >= 1, not {count!r}."
            raise ValueError(msg)
        if not self._tls:
            msg = "break_handshakes() needs DaytonaEmulator(tls=True)."
            raise RuntimeError(msg)
        with self._handshake_lock:
            self._handshakes_to_drop += count

    @property
    def dropped_handshakes(self) -> int:
        """How many TLS handshakes the emulator dropped so far."""
        with self._handshake_lock:
            return self._dropped_handshakes

    def clear_breaks(self) -> None:
        """Forget the planned breaks not used yet (requests, handshakes)."""
        with self._handshake_lock:
            self._handshakes_to_drop = 0
        app = self._app
        if app is not None:
            app.breaks.clear()

    def _drop_handshake(self) -> bool:
        rate = self.faults.handshake_eof_rate
        with self._handshake_lock:
            drop = self._handshakes_to_drop > 0
            if drop:
                self._handshakes_to_drop -= 1
            else:
                # Handshakes run on the emulator's loop, as requests do:
                # the seeded draws stay in one order.
                drop = bool(rate) and self._rng.random() < rate
            if drop:
                self._dropped_handshakes += 1
            return drop

    def begin_outage(self) -> None:
        """Stop listening and reset every open connection.

        Until :meth:`end_outage`, new connections are refused by the
        kernel (``ConnectionRefusedError`` in the client) and the SDK's
        Socket.IO channel keeps trying to reconnect. Idempotent.
        """
        self._on_loop(self._begin_outage())

    def end_outage(self) -> None:
        """Listen again on the same port; idempotent.

        Raises:
            OSError: If the port was taken meanwhile (not seen on
                loopback, where the kernel hands out ephemeral ports in
                turn).
        """
        self._on_loop(self._end_outage())

    @contextlib.contextmanager
    def outage(self) -> Iterator[None]:
        """Refuse every connection inside the ``with`` block."""
        self.begin_outage()
        try:
            yield
        finally:
            self.end_outage()

    @property
    def in_outage(self) -> bool:
        """Whether the emulator is refusing connections."""
        return self._server is None and self.is_running

    async def _begin_outage(self) -> None:
        server, self._server = self._server, None
        if server is None:
            return
        server.close()
        for transport in self._ledger.open_transports():
            abort_transport(transport)
        with contextlib.suppress(TimeoutError):
            await asyncio.wait_for(server.wait_closed(), _SHUTDOWN_TIMEOUT)

    async def _end_outage(self) -> None:
        serve_again = self._serve_again
        if self._server is None and serve_again is not None:
            await serve_again()

    def _on_loop(self, work: Coroutine[Any, Any, None]) -> None:
        loop = self._loop
        if loop is None or not self.is_running:
            work.close()
            msg = "The DaytonaEmulator is not running."
            raise RuntimeError(msg)
        asyncio.run_coroutine_threadsafe(work, loop).result(_STOP_TIMEOUT)

    # -- observations ------------------------------------------------------

    def connections(self, token: str | None = None) -> list[ConnectionRecord]:
        """Return every connection so far (of *token*'s client, if given)."""
        records = self._ledger.connections()
        if token is None:
            return records
        wanted = client_id(token)
        return [c for c in records if c.client == wanted]

    def open_connections(
        self, token: str | None = None
    ) -> list[ConnectionRecord]:
        """Return the connections still open (of *token*'s client)."""
        return [c for c in self.connections(token) if c.is_open]

    def total_connections(self, token: str | None = None) -> int:
        """Return how many connections were accepted (for *token*)."""
        return len(self.connections(token))

    def requests(
        self,
        token: str | None = None,
        *,
        method: str | None = None,
        path: str | None = None,
    ) -> list[RequestRecord]:
        """Return the recorded HTTP requests matching every filter given."""
        wanted = client_id(token) if token is not None else None
        return [
            r
            for r in self._ledger.requests()
            if (wanted is None or r.client == wanted)
            and (method is None or r.method == method)
            and (path is None or r.path == path)
        ]

    def socketio_sessions(
        self, token: str | None = None
    ) -> list[SocketIOSession]:
        """Return every Socket.IO session so far (of *token*'s client)."""
        sessions = self._ledger.sessions()
        if token is None:
            return sessions
        wanted = client_id(token)
        return [s for s in sessions if s.client == wanted]

    def sandbox_states(self) -> dict[str, str]:
        """Return the state of every emulated sandbox, by id."""
        loop, app = self._loop, self._app
        if loop is None or app is None:
            return {}

        async def _states() -> dict[str, str]:
            return app.store.states()

        future = asyncio.run_coroutine_threadsafe(_states(), loop)
        return future.result(_STOP_TIMEOUT)

    @staticmethod
    def wait_until(
        predicate: Callable[[], bool],
        timeout: float = 5.0,
        interval: float = 0.01,
    ) -> bool:
        """Poll *predicate* until it is true or *timeout* seconds pass.

        Returns:
            The last value of *predicate*.
        """
        deadline = time.monotonic() + timeout
        while not predicate():
            if time.monotonic() >= deadline:
                return predicate()
            time.sleep(interval)
        return True
