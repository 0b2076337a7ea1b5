"""poolkeeper-daytona: one ``daytona.Daytona`` per process, closed properly.

.. versionadded:: 0.1.0
"""

from __future__ import annotations

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

__all__ = [
    "DEFAULT_API_KEY_FILE",
    "TESTED_SDK_VERSIONS",
    "DaytonaCredentialsError",
    "DaytonaInternalsWarning",
    "aclose_daytona",
    "async_daytona_client",
    "close_daytona",
    "daytona_client",
    "make_daytona_singleton",
]

__version__ = "0.1.0"
