"""Broken connections, the way an overloaded API edge breaks them.

Two kinds, chosen per request by :class:`BreakPlan` or by a rate:

``"eof"``
    The request is served, then its response is cut: the status line, the
    headers and half the body are sent and the TCP connection is closed
    without a TLS ``close_notify``. Over TLS the client reads
    ``ssl.SSLEOFError`` ("EOF occurred in violation of protocol"), the
    incident's error; over plain HTTP a short body. The API did the work
    (a create made its sandbox), as an edge that drops a response does.
``"reset"``
    The connection is reset (``SO_LINGER`` 0, then close: a TCP RST)
    before the request is served, so the API did nothing.
"""

from __future__ import annotations

import socket
import struct
import threading
from collections import deque
from dataclasses import dataclass
from typing import TYPE_CHECKING, Literal

from poolkeeper_daytona.testing._protocol import abort_transport

if TYPE_CHECKING:
    import asyncio

    from aiohttp import web

__all__ = ["BREAK_KINDS", "BreakKind", "BreakPlan", "break_transport"]

BreakKind = Literal["eof", "reset"]
BREAK_KINDS: frozenset[str] = frozenset({"eof", "reset"})
# l_onoff=1, l_linger=0: close() sends RST and drops unsent data.
_LINGER_ZERO = struct.pack("ii", 1, 0)


@dataclass(slots=True)
class _Planned:
    kind: BreakKind
    method: str | None
    remaining: int


class BreakPlan:
    """Breaks scheduled for the next matching requests (thread-safe)."""

    def __init__(self) -> None:
        """Create an empty plan."""
        self._lock = threading.Lock()
        self._planned: deque[_Planned] = deque()

    def add(self, kind: BreakKind, count: int, method: str | None) -> None:
        """Break the next *count* requests with *method* (any if None)."""
        with self._lock:
            self._planned.append(_Planned(kind, method, count))

    def clear(self) -> None:
        """Forget every planned break not yet used."""
        with self._lock:
            self._planned.clear()

    def take(self, method: str) -> BreakKind | None:
        """Return the break for a request with *method*, using it up."""
        with self._lock:
            for planned in self._planned:
                if planned.method is None or planned.method == method:
                    planned.remaining -= 1
                    if planned.remaining <= 0:
                        self._planned.remove(planned)
                    return planned.kind
        return None


def _reset(transport: asyncio.BaseTransport) -> None:
    # The TCP socket under the (TLS) transport; asyncio hands out a
    # wrapper that still allows setsockopt.
    sock = transport.get_extra_info("socket")
    if sock is not None:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_LINGER, _LINGER_ZERO)
    abort_transport(transport)


def _head(response: web.Response, body: bytes) -> bytes:
    reason = response.reason or ""
    lines = [f"HTTP/1.1 {response.status} {reason}"]
    lines.extend(
        f"{name}: {value}"
        for name, value in response.headers.items()
        if name.lower() not in {"content-length", "connection"}
    )
    lines.append(f"Content-Length: {len(body)}")
    return ("\r\n".join(lines) + "\r\n\r\n").encode("latin-1")


def break_transport(
    transport: asyncio.BaseTransport,
    kind: BreakKind,
    response: web.Response | None = None,
) -> None:
    """Break *transport*'s connection the way *kind* says.

    Args:
        transport: The request's transport (TLS or plain).
        kind: ``"eof"`` sends the head and half the body of *response*,
            then closes without ``close_notify``; ``"reset"`` sends a RST.
        response: The answer an ``"eof"`` cuts short.
    """
    if kind == "reset" or response is None:
        _reset(transport)
        return
    body = bytes(response.body) if isinstance(response.body, bytes) else b""
    write = getattr(transport, "write", None)
    if callable(write):
        # Written at once (nothing is buffered ahead of it), so the bytes
        # reach the socket before the abort below.
        write(_head(response, body) + body[: len(body) // 2])
    # abort(), not close(): no TLS close_notify, and no FIN-after-flush
    # handshake with the peer; the kernel sends what was written, then FIN.
    abort_transport(transport)
