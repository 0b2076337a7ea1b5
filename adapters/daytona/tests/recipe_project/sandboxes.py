"""A user's module: one Daytona client per process, the SDK imported late.

The unit tests of this project run where ``daytona`` is not installed, so
the factory imports it when the first client is built, never at import.
"""

from __future__ import annotations

from typing import Any

from poolkeeper import process_singleton


@process_singleton
def daytona_client() -> Any:  # daytona.Daytona, not imported here.
    """Return the process's client."""
    import daytona  # Here: unit tests run without the SDK.

    return daytona.Daytona()


def create_sandbox() -> Any:
    """Create a sandbox with the shared client."""
    return daytona_client().create()
