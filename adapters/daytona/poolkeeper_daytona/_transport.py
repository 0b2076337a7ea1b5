"""Telling a broken connection from an answer of the Daytona API.

The SDK reports both as ``DaytonaError``: a 503 and a TLS EOF differ only
in what the exception carries (a status code) and in what it was raised
from. :func:`is_transport_failure` reads that chain. It imports nothing
from the SDK: the HTTP libraries' types are looked up when first needed,
and a library that is not installed simply matches nothing.
"""

from __future__ import annotations

import asyncio
import functools
import importlib
import ssl

__all__ = ["is_transport_failure"]

# A chain is a few links long (DaytonaError <- MaxRetryError <- SSLError
# <- SSLEOFError); a cycle or a pathological chain stops here.
_MAX_LINKS = 32

# (module, class) pairs, looked up lazily: the SDK's HTTP stacks.
_TRANSPORT_NAMES = (
    ("urllib3.exceptions", "ProtocolError"),
    ("urllib3.exceptions", "SSLError"),
    ("urllib3.exceptions", "NewConnectionError"),
    ("aiohttp", "ClientConnectionError"),
    ("aiohttp", "ClientPayloadError"),
    ("httpx", "NetworkError"),
    ("httpx", "RemoteProtocolError"),
    ("daytona", "DaytonaConnectionError"),
)
_TIMEOUT_NAMES = (
    ("urllib3.exceptions", "TimeoutError"),
    ("httpx", "TimeoutException"),
    ("daytona", "DaytonaTimeoutError"),
)


def _lookup(names: tuple[tuple[str, str], ...]) -> tuple[type, ...]:
    found: list[type] = []
    for module_name, name in names:
        try:
            module = importlib.import_module(module_name)
        except ImportError:
            continue
        value = getattr(module, name, None)
        if isinstance(value, type):
            found.append(value)
    return tuple(found)


@functools.cache
def _types() -> tuple[tuple[type, ...], tuple[type, ...], tuple[type, ...]]:
    """Return (transport, timeout, not-a-timeout) exception types."""
    # Imported at the first classification, not with daytona_client.
    import http.client  # noqa: PLC0415

    transport = (
        ssl.SSLError,
        ConnectionError,
        http.client.RemoteDisconnected,
        http.client.IncompleteRead,
        *_lookup(_TRANSPORT_NAMES),
    )
    timeouts = (TimeoutError, asyncio.TimeoutError, *_lookup(_TIMEOUT_NAMES))
    # urllib3 makes NewConnectionError (connection refused) a subclass of
    # ConnectTimeoutError; it is a broken connection, not a slow one.
    not_timeouts = _lookup((("urllib3.exceptions", "NewConnectionError"),))
    return transport, timeouts, not_timeouts


def _status(exc: BaseException) -> int:
    """Return the HTTP status an exception carries, or 0 if none."""
    # DaytonaError.status_code; the generated clients' ApiException.status
    # (0 when rest.py wraps an SSL error, which is not an answer).
    for attribute in ("status_code", "status"):
        value = getattr(exc, attribute, None)
        if isinstance(value, int) and not isinstance(value, bool):
            return value
    return 0


def _next(exc: BaseException) -> BaseException | None:
    # urllib3's MaxRetryError names the last attempt's error in .reason
    # (and, in urllib3 2, raises from it); prefer it when it is set.
    reason = getattr(exc, "reason", None)
    if isinstance(reason, BaseException):
        return reason
    return exc.__cause__ or exc.__context__


def is_transport_failure(exc: BaseException) -> bool:
    """Return whether *exc* reports a broken connection, not an answer.

    True when the SDK's exception was raised from an SSL error (the
    incident's ``SSLEOFError`` included), a reset, aborted or refused
    connection, a response cut short, or another protocol error of
    urllib3, aiohttp or httpx, however the SDK wrapped it
    (``DaytonaConnectionError``, a plain ``DaytonaError`` around urllib3's
    ``MaxRetryError``, the generated client's ``ApiException(status=0)``):
    the chain of ``__cause__``/``__context__`` (and ``MaxRetryError``'s
    ``reason``) is walked from the outside in.

    False for every answer of the API (any exception carrying an HTTP
    status: 4xx, 429 rate limits, 5xx), for timeouts (a slow answer, whose
    client is not broken: urllib3 already drops such a connection), and
    for anything else.

    It is the ``retire_on`` of :data:`~poolkeeper_daytona.daytona_client`
    and, by default, of :func:`~poolkeeper_daytona.make_daytona_singleton`
    and :data:`~poolkeeper_daytona.async_daytona_client`.

    Args:
        exc: An exception raised by a ``daytona.Daytona`` or
            ``daytona.AsyncDaytona`` call.

    Returns:
        Whether the connection, not the API, failed.

    .. versionadded:: 0.1.0
    """
    transport, timeouts, not_timeouts = _types()
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and len(seen) < _MAX_LINKS:
        if id(current) in seen:
            break
        seen.add(id(current))
        if _status(current) > 0:
            return False
        if isinstance(current, timeouts) and not isinstance(
            current, not_timeouts
        ):
            return False
        if isinstance(current, transport):
            return True
        current = _next(current)
    return False
