"""Closing retired clients: hook resolution and failure reporting."""

from __future__ import annotations

import inspect
import logging
import os
import warnings
from typing import TYPE_CHECKING

from poolkeeper.exceptions import UnclosedClientWarning

if TYPE_CHECKING:
    from collections.abc import Callable

log = logging.getLogger("poolkeeper")


def log_close_failure(name: str, generation: int, exc: Exception) -> None:
    """Log *exc* as a failed close, with its traceback."""
    log.warning(
        "Closing the retired %s client (generation %d) failed; "
        "it was dropped.",
        name,
        generation,
        exc_info=exc,
        extra={
            "poolkeeper_factory": name,
            "poolkeeper_generation": generation,
        },
    )


def report_fork_errors(name: str, errors: list[Exception]) -> None:
    """Log, once, the after_fork failures the at-fork hook had to keep quiet.

    Empties *errors*: the hook runs in a forked child where logging could
    deadlock, so the first call in the child reports them instead.
    """
    while errors:
        exc = errors.pop(0)
        log.warning(
            "The after_fork hook of %s failed in process %d.",
            name,
            os.getpid(),
            exc_info=exc,
            extra={"poolkeeper_factory": name},
        )


def close_client(
    name: str,
    client: object,
    hook: Callable[[object], object] | None,
    generation: int,
) -> bool | None:
    """Close a retired *client* and say how it went; never raises.

    The hook is *hook* when given, else the client's own ``close()``, else
    nothing. Runs with no lock held, so a slow close stalls nobody else.

    Returns:
        ``True`` if the close ran, ``False`` if it failed, ``None`` if the
        client has nothing to run.
    """
    extra = {"poolkeeper_factory": name, "poolkeeper_generation": generation}
    if hook is None:
        method = getattr(client, "close", None)
        if not callable(method):
            log.debug(
                "Retired %s client (generation %d) has no close(); "
                "dropping it.",
                name,
                generation,
                extra=extra,
            )
            return None
        run: Callable[[], object] = method
    else:

        def run() -> object:
            return hook(client)

    try:
        result = run()
    except Exception as exc:  # noqa: BLE001 -- logged, counted, not raised.
        log_close_failure(name, generation, exc)
        return False
    if inspect.isawaitable(result):
        if inspect.iscoroutine(result):
            # Silences "never awaited": the warning below says it instead.
            result.close()
        warnings.warn(
            f"Closing the retired {name} client returned an awaitable that "
            "a synchronous retirement cannot await, so the client may stay "
            "open; pass close= a function that closes it synchronously.",
            UnclosedClientWarning,
            stacklevel=2,
        )
        return False
    log.debug(
        "Closed the retired %s client (generation %d).",
        name,
        generation,
        extra=extra,
    )
    return True
