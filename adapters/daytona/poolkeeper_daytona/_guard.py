"""Version guard for the SDK internals that closing a client relies on."""

from __future__ import annotations

import logging
import threading
import warnings
from typing import Final

from poolkeeper import PoolkeeperWarning

__all__ = [
    "TESTED_SDK_VERSIONS",
    "DaytonaInternalsWarning",
    "is_sdk_object",
    "sdk_version",
    "unrecognised",
]

#: The ``daytona`` releases the adapter's suite runs on in CI: the oldest
#: and the newest that its dependency range allows. Releases in between
#: are handled on a best-effort basis, and a warning is issued when an
#: internal that ``close_daytona`` uses is missing.
TESTED_SDK_VERSIONS: Final = ("0.203.0", "0.226.1")

_log = logging.getLogger("poolkeeper.daytona")
_lock = threading.Lock()
_warned = False


class DaytonaInternalsWarning(PoolkeeperWarning):
    """The installed SDK lacks an internal that closing a client uses.

    Issued once per process; whatever could be found was still released.

    .. versionadded:: 0.1.0
    """


def sdk_version() -> str:
    """Return the installed ``daytona`` version, or ``"unknown"``."""
    # Imported here: importlib.metadata costs dozens of modules, and is
    # needed only for a warning.
    import importlib.metadata  # noqa: PLC0415

    try:
        return importlib.metadata.version("daytona")
    except importlib.metadata.PackageNotFoundError:
        return "unknown"


def is_sdk_object(obj: object) -> bool:
    """Whether *obj* is an instance of a class the ``daytona`` SDK defines.

    A test double (a ``SimpleNamespace``, a mock, a fake class) is not:
    its missing internals say nothing about the installed SDK. Read from
    the class's module name, so the SDK is never imported here.
    """
    return any(
        getattr(cls, "__module__", "").partition(".")[0] == "daytona"
        for cls in type(obj).__mro__
    )


def unrecognised(what: str) -> None:
    """Report an SDK internal that is missing or of an unexpected shape.

    The first report in a process is a :class:`DaytonaInternalsWarning`;
    later ones are logged at DEBUG only, so a loop of closes cannot flood.

    Args:
        what: Dotted path of the internal, e.g. ``"Daytona._http_client"``.
    """
    global _warned
    with _lock:
        first, _warned = not _warned, True
    if not first:
        _log.debug("Unrecognised Daytona SDK internal: %s", what)
        return
    warnings.warn(
        f"poolkeeper-daytona does not recognise {what} in daytona "
        f"{sdk_version()} (tested on {' and '.join(TESTED_SDK_VERSIONS)}); "
        "it released what it could find. Install a tested daytona "
        "release, or report the daytona version to poolkeeper.",
        DaytonaInternalsWarning,
        stacklevel=4,
    )


def _reset_for_tests() -> None:
    """Forget that the warning was issued (tests only)."""
    global _warned  # noqa: PLW0603 - once-per-process flag.
    with _lock:
        _warned = False
