"""The emulator's HTTP routes and Socket.IO server (aiohttp, one loop).

Only what ``daytona.Daytona`` calls for create/get/list/delete, and what
a sandbox calls for ``process.exec`` and ``refresh_activity``, exists:
anything else answers 404, so a test notices when the SDK starts calling
something new.
"""

from __future__ import annotations

import asyncio
import json
import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import socketio
from aiohttp import web

from poolkeeper_daytona.testing._breaks import (
    BreakKind,
    BreakPlan,
    break_transport,
)
from poolkeeper_daytona.testing._records import client_id
from poolkeeper_daytona.testing._sandboxes import Sandbox, SandboxStore
from poolkeeper_daytona.testing._toolbox import TOOLBOX_PREFIX, answer

if TYPE_CHECKING:
    import random
    from collections.abc import Awaitable, Callable, Collection

    from poolkeeper_daytona.testing._ledger import Ledger

API_PREFIX = "/api"
SOCKETIO_PATH = f"{API_PREFIX}/socket.io/"
STATE_EVENT = "sandbox.state.updated"


@dataclass(slots=True)
class FaultSettings:
    """Fault injection knobs, changeable while the emulator runs.

    Attributes:
        failure_rate: Fraction of creates answered with 503.
        latency: Seconds added before answering each request.
        drop_mode: Accept new connections, then drop them at once.
        start_delay: Seconds a new sandbox stays ``creating``.
        rate_limit_rate: Fraction of creates answered with 429.
        retry_after: Seconds sent in the ``Retry-After`` header of a 429.
        slow_rate: Fraction of creates answered *slow_seconds* late; the
            sandbox is created at once, as an API that answers late does.
        slow_seconds: The delay of a slow create's response.
        eof_rate: Fraction of REST requests whose response is cut by a
            close without TLS ``close_notify`` (see ``_breaks``).
        reset_rate: Fraction of REST requests answered by a TCP reset.
        handshake_eof_rate: Fraction of TLS handshakes dropped as they
            start (``tls=True`` only).
    """

    failure_rate: float = 0.0
    latency: float = 0.0
    drop_mode: bool = False
    start_delay: float = 0.0
    rate_limit_rate: float = 0.0
    retry_after: float = 1.0
    slow_rate: float = 0.0
    slow_seconds: float = 0.0
    eof_rate: float = 0.0
    reset_rate: float = 0.0
    handshake_eof_rate: float = 0.0


def _error(
    status: int, message: str, headers: dict[str, str] | None = None
) -> web.Response:
    body = {"statusCode": status, "message": message, "error": message}
    return web.json_response(body, status=status, headers=headers)


def _seconds(value: float) -> str:
    """Format *value* for Retry-After: whole seconds, rounded up."""
    return str(max(0, math.ceil(value)))


def _bearer(request: web.Request) -> str | None:
    header = request.headers.get("Authorization", "")
    scheme, _, token = header.partition(" ")
    return token if scheme.lower() == "bearer" and token else None


class EmulatorApp:
    """Builds the aiohttp application and owns the sandbox store."""

    def __init__(
        self,
        ledger: Ledger,
        faults: FaultSettings,
        rng: random.Random,
        api_keys: Collection[str] | None,
    ) -> None:
        """Wire routes, middleware and the Socket.IO server.

        Args:
            ledger: Where requests and sessions are recorded.
            faults: Fault settings, read on every request.
            rng: Drives injected failures and sandbox ids.
            api_keys: Accepted tokens; ``None`` accepts any non-empty one.
        """
        self._ledger = ledger
        self._faults = faults
        self._rng = rng
        self._api_keys = None if api_keys is None else frozenset(api_keys)
        self._tasks: set[asyncio.Task[None]] = set()
        self.breaks = BreakPlan()
        self.store = SandboxStore(rng, "http://127.0.0.1")
        self.sio = socketio.AsyncServer(
            async_mode="aiohttp",
            transports=["websocket"],
            cors_allowed_origins="*",
            logger=False,
            engineio_logger=False,
        )
        self.sio.on("connect", self._sio_connect)
        self.sio.on("disconnect", self._sio_disconnect)
        self.app = web.Application(middlewares=[self._middleware])
        self.sio.attach(self.app, socketio_path=SOCKETIO_PATH)
        sandbox = f"{API_PREFIX}/sandbox"
        self.app.router.add_post(sandbox, self._create)
        self.app.router.add_get(sandbox, self._list)
        self.app.router.add_get(sandbox + "/{id}", self._get)
        self.app.router.add_delete(sandbox + "/{id}", self._delete)
        self.app.router.add_get(
            sandbox + "/{id}/toolbox-proxy-url", self._proxy_url
        )
        self.app.router.add_post(
            sandbox + "/{id}/last-activity", self._refresh_activity
        )
        self.app.router.add_post(
            TOOLBOX_PREFIX + "/{id}/process/execute", self._execute
        )

    def set_origin(self, origin: str) -> None:
        """Tell the store the origin once the port is known."""
        self.store.base_url = origin

    def _authorized(self, token: str | None) -> bool:
        if not token:
            return False
        return self._api_keys is None or token in self._api_keys

    @web.middleware
    async def _middleware(
        self,
        request: web.Request,
        handler: Callable[[web.Request], Awaitable[web.StreamResponse]],
    ) -> web.StreamResponse:
        if self._faults.latency > 0:
            await asyncio.sleep(self._faults.latency)
        token = _bearer(request)
        client = client_id(token) if token else None
        if request.path.startswith(SOCKETIO_PATH):
            # The upgrade's handler only returns when the websocket ends,
            # so record it now; its client is known at Socket.IO connect.
            self._record(request, 101, client)
            return await handler(request)
        broken = self._break_for(request.method)
        transport = request.transport
        if broken == "reset" and transport is not None:
            # Read the whole request first: a reset that lands while the
            # client still sends its body fails the send (urllib3 retries
            # that, even a POST), not the wait for the answer.
            await request.read()
            self._record(request, 0, client, broken)
            break_transport(transport, broken)
            return web.Response(status=204)  # Never sent: the peer is gone.
        if not self._authorized(token):
            response: web.StreamResponse = _error(401, "Unauthorized")
        else:
            try:
                response = await handler(request)
            except web.HTTPException as exc:
                response = _error(exc.status, exc.reason)
        if (
            broken == "eof"
            and transport is not None
            and isinstance(response, web.Response)
        ):
            self._record(request, response.status, client, broken)
            break_transport(transport, broken, response)
            return response  # aiohttp finds the transport closing.
        self._record(request, response.status, client)
        return response

    def _break_for(self, method: str) -> BreakKind | None:
        """Return how to break this request: planned first, then rates."""
        planned = self.breaks.take(method)
        if planned is not None:
            return planned
        faults = self._faults
        # Draw only for the rates that are on, so that a seed gives the
        # same faults whether or not the other knobs exist.
        if faults.eof_rate and self._rng.random() < faults.eof_rate:
            return "eof"
        if faults.reset_rate and self._rng.random() < faults.reset_rate:
            return "reset"
        return None

    def _record(
        self,
        request: web.Request,
        status: int,
        client: str | None,
        broken: BreakKind | None = None,
    ) -> None:
        self._ledger.request(
            request.transport,
            request.method,
            request.path,
            request.query_string,
            status,
            client,
            broken=broken,
        )

    async def _create(self, request: web.Request) -> web.Response:
        faults = self._faults
        if self._rng.random() < faults.failure_rate:
            return _error(503, "Injected failure")
        # Draw only for the faults that are on, so that a seed gives the
        # same 503s whether or not the other knobs exist.
        if faults.rate_limit_rate and (
            self._rng.random() < faults.rate_limit_rate
        ):
            retry_after = {"Retry-After": _seconds(faults.retry_after)}
            return _error(429, "Injected rate limit", retry_after)
        slow = bool(faults.slow_rate) and (
            self._rng.random() < faults.slow_rate
        )
        body = await request.json()
        owner = client_id(_bearer(request) or "")
        sandbox = self.store.create(
            owner, body if isinstance(body, dict) else {}
        )
        self._later(faults.start_delay, sandbox, "started")
        if slow:
            await asyncio.sleep(faults.slow_seconds)
        return web.json_response(sandbox.data)

    async def _get(self, request: web.Request) -> web.Response:
        sandbox = self.store.find(request.match_info["id"])
        if sandbox is None:
            return _error(404, "Sandbox not found")
        return web.json_response(sandbox.data)

    async def _list(self, request: web.Request) -> web.Response:
        query = request.query
        limit = query.get("limit")
        page = self.store.page(
            query.get("cursor"),
            int(limit) if limit else None,
            query.get("labels"),
            query.getall("states", []),
        )
        return web.json_response(page)

    async def _delete(self, request: web.Request) -> web.Response:
        sandbox = self.store.find(request.match_info["id"])
        if sandbox is None:
            return _error(404, "Sandbox not found")
        self._transition(sandbox, "destroying")
        self._later(0.0, sandbox, "destroyed")
        return web.json_response(sandbox.data)

    async def _proxy_url(self, request: web.Request) -> web.Response:
        sandbox = self.store.find(request.match_info["id"])
        if sandbox is None:
            return _error(404, "Sandbox not found")
        return web.json_response({"url": sandbox.data["toolboxProxyUrl"]})

    async def _refresh_activity(self, request: web.Request) -> web.Response:
        sandbox = self.store.find(request.match_info["id"])
        if sandbox is None:
            return _error(404, "Sandbox not found")
        # The API answers 201 with no body; the ledger records the call.
        return web.Response(status=201)

    async def _execute(self, request: web.Request) -> web.Response:
        sandbox = self.store.find(request.match_info["id"])
        if sandbox is None:
            return _error(404, "Sandbox not found")
        if sandbox.state != "started":
            return _error(400, f"Sandbox is {sandbox.state}, not started")
        body = await request.json()
        command = body.get("command") if isinstance(body, dict) else None
        if not isinstance(command, str):
            return _error(400, "command must be a string")
        exit_code, output = answer(command)
        return web.json_response({"exitCode": exit_code, "result": output})

    def _later(self, delay: float, sandbox: Sandbox, state: str) -> None:
        loop = asyncio.get_running_loop()
        loop.call_later(delay, self._transition, sandbox, state)

    def _transition(self, sandbox: Sandbox, state: str) -> None:
        old = sandbox.state
        if old in {state, "destroyed"}:
            return
        sandbox.data["state"] = state
        payload = {
            "sandbox": dict(sandbox.data),
            "oldState": old,
            "newState": state,
        }
        task = asyncio.get_running_loop().create_task(
            self._emit(payload, sandbox.owner)
        )
        # Keep a strong reference until done: the loop holds only a weak one.
        self._tasks.add(task)
        task.add_done_callback(self._tasks.discard)

    async def _emit(self, payload: dict[str, Any], room: str) -> None:
        await self.sio.emit(
            STATE_EVENT, json.loads(json.dumps(payload)), room=room
        )

    async def _sio_connect(
        self, sid: str, environ: dict[str, Any], auth: object
    ) -> None:
        token = auth.get("token") if isinstance(auth, dict) else None
        if not isinstance(token, str) or not self._authorized(token):
            reason = "Unauthorized"
            raise socketio.exceptions.ConnectionRefusedError(reason)
        request = environ.get("aiohttp.request")
        transport = getattr(request, "transport", None)
        client = client_id(token)
        self._ledger.session_connected(sid, client, transport)
        await self.sio.enter_room(sid, client)

    async def _sio_disconnect(self, sid: str, reason: object) -> None:
        self._ledger.session_disconnected(sid, str(reason))

    async def shutdown(self) -> None:
        """Cancel pending event emissions and stop Socket.IO's tasks."""
        for task in list(self._tasks):
            task.cancel()
        await self.sio.shutdown()
