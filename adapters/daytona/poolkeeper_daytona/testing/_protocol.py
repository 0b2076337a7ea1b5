"""A connection-tracking protocol in front of aiohttp's request handler.

aiohttp has no public hook for "connection accepted" and "connection
closed", so the emulator's listening socket uses this thin protocol, which
records both in the ledger and forwards everything else to aiohttp. It also
implements drop mode: the connection is accepted, recorded, and aborted
before aiohttp ever sees it.
"""

from __future__ import annotations

import asyncio
from typing import TYPE_CHECKING, Protocol

if TYPE_CHECKING:
    from collections.abc import Callable

    from poolkeeper_daytona.testing._ledger import Ledger


def abort_transport(transport: asyncio.BaseTransport) -> None:
    """Close *transport* at once, without flushing (a reset for TCP)."""
    abort = getattr(transport, "abort", None)
    if callable(abort):
        abort()
    else:  # pragma: no cover - every TCP transport has abort().
        transport.close()


class Faults(Protocol):
    """The fault settings the protocol reads on every accept."""

    drop_mode: bool


class TrackingProtocol(asyncio.Protocol):
    """Records open/close of one connection; delegates to aiohttp."""

    def __init__(
        self,
        ledger: Ledger,
        faults: Faults,
        make_handler: Callable[[], asyncio.Protocol],
    ) -> None:
        """Prepare to serve one connection.

        Args:
            ledger: Where the connection is recorded.
            faults: Read once, at accept, for drop mode.
            make_handler: aiohttp's protocol factory (its web ``Server``).
        """
        self._ledger = ledger
        self._faults = faults
        self._make_handler = make_handler
        self._inner: asyncio.Protocol | None = None
        self._transport: asyncio.BaseTransport | None = None

    def connection_made(self, transport: asyncio.BaseTransport) -> None:
        """Record the connection, then drop it or hand it to aiohttp."""
        self._transport = transport
        dropped = self._faults.drop_mode
        self._ledger.opened(transport, dropped=dropped)
        if dropped:
            # abort() rather than close(): the peer sees a reset, as it does
            # from an overloaded edge refusing a process.
            abort_transport(transport)
            return
        self._inner = self._make_handler()
        self._inner.connection_made(transport)

    def data_received(self, data: bytes) -> None:
        """Forward received bytes to aiohttp."""
        if self._inner is not None:
            self._inner.data_received(data)

    def eof_received(self) -> bool | None:
        """Forward the peer's EOF to aiohttp."""
        if self._inner is not None:
            return self._inner.eof_received()
        return None

    def pause_writing(self) -> None:
        """Forward write flow control to aiohttp."""
        if self._inner is not None:
            self._inner.pause_writing()

    def resume_writing(self) -> None:
        """Forward write flow control to aiohttp."""
        if self._inner is not None:
            self._inner.resume_writing()

    def connection_lost(self, exc: Exception | None) -> None:
        """Record the close and let aiohttp clean up."""
        if self._transport is not None:
            self._ledger.closed(self._transport)
        if self._inner is not None:
            self._inner.connection_lost(exc)
