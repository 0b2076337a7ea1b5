"""A closed ``daytona.Daytona`` that is used again says so, once.

After :func:`~poolkeeper_daytona.close_daytona` cleared its pools, a client
still half-works: urllib3 opens new connections on the next request, and
nothing will ever close them. That is what a client kept in a closure
across a key rotation does. The first request through either of its pool
managers then issues a :class:`ClosedDaytonaUsedWarning`, pointing at the
caller's line, and later requests go through unchanged.
"""

from __future__ import annotations

import contextlib
import sys
import warnings
from typing import TYPE_CHECKING, Any, Final

from poolkeeper import PoolkeeperWarning

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["ClosedDaytonaUsedWarning", "guard_reuse"]

# Frames of these packages are skipped when the warning names a line.
_SKIPPED: Final = frozenset(
    (
        "daytona",
        "daytona_api_client",
        "daytona_toolbox_api_client",
        "poolkeeper",
        "poolkeeper_daytona",
        "pydantic",
        "urllib3",
        "wrapt",
    )
)


class ClosedDaytonaUsedWarning(PoolkeeperWarning):
    """A ``daytona.Daytona`` that was closed is used again.

    Its pools reopen connections that nothing will close. Issued once per
    client, at its first request after the close. Keep
    ``daytona_client.proxy()`` where a client is held for long (it follows
    rotation), or hold a ``lease()`` for as long as the work uses it.

    .. versionadded:: 0.1.0
    """


def guard_reuse(pools: Iterable[object]) -> None:
    """Make the first request through any of *pools* warn, then pass.

    Args:
        pools: A closed client's urllib3 pool managers.
    """
    managers = [p for p in pools if callable(getattr(p, "urlopen", None))]
    # One token per client: whichever pool is used first takes it.
    token: list[None] = [None]
    for manager in managers:
        manager.urlopen = _guarded(manager, token, managers)  # type: ignore[attr-defined]


def _guarded(manager: Any, token: list[None], managers: list[Any]) -> Any:  # noqa: ANN401
    original = manager.urlopen

    def urlopen(*args: object, **kwargs: object) -> object:
        try:
            token.pop()  # Atomic: one caller wins, however many threads.
        except IndexError:
            pass
        else:
            for each in managers:  # The class's urlopen again.
                with contextlib.suppress(AttributeError):
                    del each.urlopen
            warnings.warn(
                "A daytona.Daytona that poolkeeper-daytona closed (retired "
                "by a key rotation, reset() or close_all()) is used again: "
                "its pools reopen connections that nothing will close. "
                "Keep daytona_client.proxy() where the client is held for "
                "long (it follows rotation), or hold a lease() while the "
                "work uses it.",
                ClosedDaytonaUsedWarning,
                stacklevel=_user_level(),
            )
        return original(*args, **kwargs)

    return urlopen


def _user_level() -> int:
    # 0 is this function, 1 the guarded urlopen, 2 its caller.
    level = 2
    frame = sys._getframe(2)
    while frame.f_back is not None:
        name = str(frame.f_globals.get("__name__", ""))
        if name.partition(".")[0] not in _SKIPPED:
            break
        frame = frame.f_back
        level += 1
    return level
