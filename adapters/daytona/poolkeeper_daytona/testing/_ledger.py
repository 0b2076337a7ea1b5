"""Thread-safe bookkeeping of connections, requests and sessions.

The emulator's event loop thread writes; test threads read snapshots.
"""

from __future__ import annotations

import threading
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING

from poolkeeper_daytona.testing._records import (
    ConnectionKind,
    ConnectionRecord,
    RequestRecord,
    SocketIOSession,
)

if TYPE_CHECKING:
    import asyncio

    from poolkeeper_daytona.testing._breaks import BreakKind


@dataclass(slots=True)
class _Connection:
    record: ConnectionRecord
    transport: asyncio.BaseTransport


class Ledger:
    """Records what crossed the emulator's listening socket."""

    def __init__(self) -> None:
        """Create an empty ledger."""
        self._lock = threading.Lock()
        self._connections: list[_Connection] = []
        self._by_transport: dict[int, _Connection] = {}
        self._requests: list[RequestRecord] = []
        self._sessions: dict[str, SocketIOSession] = {}

    def opened(
        self, transport: asyncio.BaseTransport, *, dropped: bool
    ) -> None:
        """Record a newly accepted connection."""
        peer = transport.get_extra_info("peername")
        port = int(peer[1]) if isinstance(peer, tuple) else 0
        kind: ConnectionKind = "dropped" if dropped else "http"
        with self._lock:
            record = ConnectionRecord(
                id=len(self._connections) + 1,
                peer_port=port,
                client=None,
                kind=kind,
                opened_at=time.monotonic(),
                closed_at=None,
                requests=0,
            )
            connection = _Connection(record, transport)
            self._connections.append(connection)
            self._by_transport[id(transport)] = connection

    def closed(self, transport: asyncio.BaseTransport) -> None:
        """Record that *transport*'s connection closed."""
        with self._lock:
            connection = self._by_transport.pop(id(transport), None)
            if connection is not None:
                connection.record = replace(
                    connection.record, closed_at=time.monotonic()
                )

    def request(  # noqa: PLR0913, PLR0917 - one field per recorded column.
        self,
        transport: asyncio.BaseTransport | None,
        method: str,
        path: str,
        query: str,
        status: int,
        client: str | None,
        *,
        broken: BreakKind | None = None,
    ) -> None:
        """Record one HTTP request and attribute its connection."""
        with self._lock:
            connection = self._by_transport.get(id(transport))
            connection_id = 0
            if connection is not None:
                old = connection.record
                connection.record = replace(
                    old,
                    requests=old.requests + 1,
                    client=old.client or client,
                )
                connection_id = old.id
            self._requests.append(
                RequestRecord(
                    method=method,
                    path=path,
                    query=query,
                    status=status,
                    connection=connection_id,
                    client=client,
                    at=time.monotonic(),
                    broken=broken,
                )
            )

    def session_connected(
        self,
        sid: str,
        client: str,
        transport: asyncio.BaseTransport | None,
    ) -> None:
        """Record a Socket.IO session and mark its connection a websocket."""
        with self._lock:
            connection = self._by_transport.get(id(transport))
            connection_id = 0
            if connection is not None:
                connection.record = replace(
                    connection.record, kind="websocket", client=client
                )
                connection_id = connection.record.id
            self._sessions[sid] = SocketIOSession(
                sid=sid,
                client=client,
                connection=connection_id,
                connected_at=time.monotonic(),
                disconnected_at=None,
                reason=None,
            )

    def session_disconnected(self, sid: str, reason: str | None) -> None:
        """Record the end of a Socket.IO session."""
        with self._lock:
            session = self._sessions.get(sid)
            if session is not None and session.disconnected_at is None:
                self._sessions[sid] = replace(
                    session,
                    disconnected_at=time.monotonic(),
                    reason=reason,
                )

    def connections(self) -> list[ConnectionRecord]:
        """Return a snapshot of every connection, oldest first."""
        with self._lock:
            return [c.record for c in self._connections]

    def open_transports(
        self, client: str | None = None
    ) -> list[asyncio.BaseTransport]:
        """Return the transports still open (of *client*, if given)."""
        with self._lock:
            return [
                c.transport
                for c in self._by_transport.values()
                if client is None or c.record.client == client
            ]

    def requests(self) -> list[RequestRecord]:
        """Return a snapshot of every request, oldest first."""
        with self._lock:
            return list(self._requests)

    def sessions(self) -> list[SocketIOSession]:
        """Return a snapshot of every Socket.IO session, oldest first."""
        with self._lock:
            return list(self._sessions.values())
