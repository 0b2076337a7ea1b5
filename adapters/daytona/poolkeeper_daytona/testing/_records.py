"""Immutable snapshots of what the Daytona emulator saw.

Clients are identified by :func:`client_id`, a short hash of the token
they authenticated with, so no snapshot ever holds a raw API key.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Literal

__all__ = [
    "ConnectionKind",
    "ConnectionRecord",
    "RequestRecord",
    "SocketIOSession",
    "client_id",
]

ConnectionKind = Literal["http", "websocket", "dropped"]


def client_id(token: str) -> str:
    """Return the emulator's identifier for the client using *token*.

    Args:
        token: An API key or JWT as sent by the SDK.

    Returns:
        The first 12 hex digits of the token's SHA-256 digest.
    """
    return hashlib.sha256(token.encode()).hexdigest()[:12]


@dataclass(frozen=True, slots=True)
class ConnectionRecord:
    """One TCP connection accepted by the emulator.

    Attributes:
        id: Sequence number of the connection, starting at 1.
        peer_port: The client's local port.
        client: :func:`client_id` of the first token seen on it, if any.
        kind: ``"websocket"`` once a Socket.IO session used it,
            ``"dropped"`` if the emulator dropped it on accept.
        opened_at: ``time.monotonic()`` at accept.
        closed_at: ``time.monotonic()`` at close, or ``None`` while open.
        requests: Number of HTTP requests served on it.
    """

    id: int
    peer_port: int
    client: str | None
    kind: ConnectionKind
    opened_at: float
    closed_at: float | None
    requests: int

    @property
    def is_open(self) -> bool:
        """Whether the connection is still open."""
        return self.closed_at is None


@dataclass(frozen=True, slots=True)
class RequestRecord:
    """One HTTP request received by the emulator.

    Attributes:
        method: The HTTP method.
        path: The request path, without the query string.
        query: The raw query string.
        status: The response status (101 for a websocket upgrade).
        connection: :attr:`ConnectionRecord.id` of the carrying connection.
        client: :func:`client_id` of the bearer token, if any.
        at: ``time.monotonic()`` when the request arrived.
        broken: How the emulator broke its connection (``"eof"``: the
            response was cut without TLS ``close_notify``; ``"reset"``: a
            TCP reset before it was served), or ``None``. A reset
            request's *status* is 0.
    """

    method: str
    path: str
    query: str
    status: int
    connection: int
    client: str | None
    at: float
    broken: Literal["eof", "reset"] | None = None


@dataclass(frozen=True, slots=True)
class SocketIOSession:
    """One Socket.IO session opened by an SDK event dispatcher.

    Attributes:
        sid: The Socket.IO session id.
        client: :func:`client_id` of the auth token.
        connection: :attr:`ConnectionRecord.id` of the websocket.
        connected_at: ``time.monotonic()`` at connect.
        disconnected_at: ``time.monotonic()`` at disconnect, or ``None``.
        reason: python-socketio's disconnect reason, or ``None``.
    """

    sid: str
    client: str
    connection: int
    connected_at: float
    disconnected_at: float | None
    reason: str | None

    @property
    def is_connected(self) -> bool:
        """Whether the session is still connected."""
        return self.disconnected_at is None
