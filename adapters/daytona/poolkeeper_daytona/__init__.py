"""poolkeeper-daytona: one ``daytona.Daytona`` per process, closed properly.

The ``daytona`` SDK is optional (the ``sdk`` extra): every name here
imports, and every singleton can be made, without it; the SDK is imported
when the first client is built. Names are imported on first use.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from poolkeeper_daytona._async_client import (
        aclose_daytona,
        async_daytona_client,
    )
    from poolkeeper_daytona._client import (
        DEFAULT_API_KEY_FILE,
        DaytonaCredentialsError,
        daytona_client,
        make_daytona_singleton,
    )
    from poolkeeper_daytona._close import close_daytona
    from poolkeeper_daytona._guard import (
        TESTED_SDK_VERSIONS,
        DaytonaInternalsWarning,
    )
    from poolkeeper_daytona._reuse import ClosedDaytonaUsedWarning
    from poolkeeper_daytona._sdk import (
        SUPPORTED_SDK_RANGE,
        DaytonaVersionWarning,
    )
    from poolkeeper_daytona._transport import is_transport_failure

__all__ = [
    "DEFAULT_API_KEY_FILE",
    "SUPPORTED_SDK_RANGE",
    "TESTED_SDK_VERSIONS",
    "ClosedDaytonaUsedWarning",
    "DaytonaCredentialsError",
    "DaytonaInternalsWarning",
    "DaytonaVersionWarning",
    "aclose_daytona",
    "async_daytona_client",
    "close_daytona",
    "daytona_client",
    "is_transport_failure",
    "make_daytona_singleton",
]

__version__ = "0.1.0"

_WHERE = {
    "DEFAULT_API_KEY_FILE": "_client",
    "SUPPORTED_SDK_RANGE": "_sdk",
    "TESTED_SDK_VERSIONS": "_guard",
    "ClosedDaytonaUsedWarning": "_reuse",
    "DaytonaCredentialsError": "_client",
    "DaytonaInternalsWarning": "_guard",
    "DaytonaVersionWarning": "_sdk",
    "aclose_daytona": "_async_client",
    "async_daytona_client": "_async_client",
    "close_daytona": "_close",
    "daytona_client": "_client",
    "is_transport_failure": "_transport",
    "make_daytona_singleton": "_client",
}


def __getattr__(name: str) -> object:
    module = _WHERE.get(name)
    if module is None:
        msg = f"module {__name__!r} has no attribute {name!r}"
        raise AttributeError(msg)
    value = getattr(importlib.import_module(f"{__name__}.{module}"), name)
    globals()[name] = value
    return value


def __dir__() -> list[str]:
    return sorted([*globals(), *__all__])
