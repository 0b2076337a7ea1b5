"""The ``daytona`` SDK: optional, imported at the first build, checked once.

poolkeeper-daytona does not install the SDK it adapts (the OpenTelemetry
instrumentation packages' convention): the tested range is the ``sdk``
extra, ``pip install 'poolkeeper-daytona[sdk]'``, and a project that
installs ``daytona`` itself, at any version, never meets a resolver
conflict. Everything in ``poolkeeper_daytona`` imports, and its singletons
can be made at module level, without the SDK; the SDK is imported when the
first client is built. A version outside the tested range warns once, and
the internals that closing a client reaches are still checked at each
close (:class:`~poolkeeper_daytona.DaytonaInternalsWarning`).
"""

from __future__ import annotations

import threading
import warnings
from typing import Final

from poolkeeper import PoolkeeperWarning

from poolkeeper_daytona._guard import TESTED_SDK_VERSIONS, sdk_version

__all__ = [
    "IN_TESTS",
    "SUPPORTED_SDK_RANGE",
    "DaytonaVersionWarning",
    "require_sdk",
]

#: The ``daytona`` releases poolkeeper-daytona supports: from the oldest
#: tested release up to, not including, the next minor release after the
#: newest tested one. The same range is the ``sdk`` extra.
SUPPORTED_SDK_RANGE: Final = (">=0.203", "<0.227")

_INSTALL: Final = (
    "pip install 'poolkeeper-daytona[sdk]' (the tested range), "
    "or pip install daytona"
)
# Where a test without the SDK goes instead.
IN_TESTS: Final = (
    "A test without the SDK replaces the client with the singleton's "
    "override(): with daytona_client.override(fake): ..."
)
_lock = threading.Lock()
_checked = False


class DaytonaVersionWarning(PoolkeeperWarning):
    """The installed ``daytona`` is outside the range the adapter tests.

    Issued once per process, at the first build. Clients are still built
    and closed; each SDK internal that closing one relies on is checked at
    every close, with a :class:`DaytonaInternalsWarning` if one is missing.

    .. versionadded:: 0.1.0
    """


def require_sdk(factory: str, *names: str) -> None:
    """Import the SDK for *factory*'s build, with a clear error if absent.

    A stand-in ``daytona`` module that a test put in ``sys.modules`` is
    used as the SDK, as long as it has the *names* the build takes from
    it; the error says which is missing.

    Args:
        factory: The singleton that needs it, named in the error.
        *names: What the build takes from the ``daytona`` module.

    Raises:
        ModuleNotFoundError: If ``daytona`` is not installed; its message
            names the package, how to install it, and ``override()``.
        ImportError: If the ``daytona`` module lacks one of *names* (a
            test's stand-in); its message names ``override()``.
    """
    try:
        import daytona  # noqa: PLC0415 -- optional: first build only.
    except ModuleNotFoundError as exc:
        if exc.name != "daytona":
            raise  # The SDK is there, one of its own imports failed.
        msg = (
            f"{factory} builds a daytona.Daytona client, but the daytona "
            f"package is not installed: {_INSTALL}. {IN_TESTS}"
        )
        raise ModuleNotFoundError(msg, name="daytona") from exc
    missing = [name for name in names if not hasattr(daytona, name)]
    if missing:
        msg = (
            f"{factory} builds its client with daytona.{missing[0]}, which "
            f"the daytona module ({_origin(daytona)}) lacks: it is not the "
            f"Daytona SDK. {IN_TESTS}"
        )
        raise ImportError(msg, name="daytona")
    _check_version()


def _origin(module: object) -> str:
    path = getattr(module, "__file__", None)
    return f"from {path}" if path else "not from a file"


def _release(text: str) -> tuple[int, ...]:
    parts: list[int] = []
    for part in text.split("."):
        digits = "".join(c for c in part if c.isdigit())
        if not digits:
            break
        parts.append(int(digits))
        if digits != part:
            break  # A pre-release or local suffix ends the release part.
    return tuple(parts)


def in_supported_range(version: str) -> bool:
    """Whether *version* is inside :data:`SUPPORTED_SDK_RANGE`."""
    lower, upper = (_release(b.lstrip("<>=")) for b in SUPPORTED_SDK_RANGE)
    return lower <= _release(version) < upper


def _check_version() -> None:
    global _checked
    with _lock:
        first, _checked = not _checked, True
    if not first:
        return
    version = sdk_version()
    if version == "unknown" or in_supported_range(version):
        return
    warnings.warn(
        f"daytona {version} is outside the range poolkeeper-daytona "
        f"supports ({','.join(SUPPORTED_SDK_RANGE)}; tested on "
        f"{' and '.join(TESTED_SDK_VERSIONS)}). Its clients are built and "
        "closed as usual; closing checks each SDK internal it uses and "
        "warns if one is missing. Install a release in the range "
        f"({_INSTALL}), or report the version to poolkeeper.",
        DaytonaVersionWarning,
        stacklevel=2,
    )


def _reset_for_tests() -> None:
    """Forget that the version was checked (tests only)."""
    global _checked  # noqa: PLW0603 -- once-per-process flag.
    with _lock:
        _checked = False
