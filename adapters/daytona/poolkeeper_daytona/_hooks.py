"""The close and fork hooks poolkeeper uses for the SDK's client types.

Declared as the ``daytona`` entry point of the ``poolkeeper.adapters``
group: poolkeeper calls :func:`hooks` after it builds a client whose class
comes from the ``daytona`` package, so that a plain
``@process_singleton`` whose factory returns ``daytona.Daytona()`` closes
it fully (and makes it inert in a forked child) with no ``close=`` or
``after_fork=`` written. Importing this module imports neither the SDK nor
the rest of the adapter.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, NamedTuple

if TYPE_CHECKING:
    from collections.abc import Callable

__all__ = ["Hooks", "hooks"]


class Hooks(NamedTuple):
    """A client type's close and fork hooks (see ``poolkeeper._adapters``)."""

    close: Callable[[object], object] | None
    after_fork: Callable[[object], object] | None


def _is(kind: type, name: str) -> bool:
    # By the SDK's class, subclasses included; the SDK is already imported
    # (one of its clients exists), but never imported here.
    return any(
        c.__name__ == name
        and str(getattr(c, "__module__", "")).partition(".")[0] == "daytona"
        for c in kind.__mro__
    )


def hooks(kind: type) -> Hooks | None:
    """Return the hooks for clients of *kind*, or None if it is not one.

    ``daytona.Daytona``: :func:`~poolkeeper_daytona.close_daytona`, and
    the fork hook that makes an inherited client inert.
    ``daytona.AsyncDaytona``: :func:`~poolkeeper_daytona.aclose_daytona`
    (the SDK's ``close()`` misses a sleeping reconnect loop).
    """
    if _is(kind, "AsyncDaytona"):
        from poolkeeper_daytona._async_client import (  # noqa: PLC0415
            aclose_daytona,
        )

        return Hooks(aclose_daytona, None)  # type: ignore[arg-type]
    if _is(kind, "Daytona"):
        from poolkeeper_daytona._close import (  # noqa: PLC0415
            _after_fork,
            close_daytona,
        )

        return Hooks(close_daytona, _after_fork)
    return None
