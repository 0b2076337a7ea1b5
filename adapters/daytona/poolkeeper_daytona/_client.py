"""Process-wide ``daytona.Daytona`` singletons, keyed on their config."""

from __future__ import annotations

import contextlib
import importlib
import os
import sys
import warnings
from collections.abc import Mapping
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TypeVar

from poolkeeper import fingerprint, keys, process_singleton

from poolkeeper_daytona._close import _after_fork, close_daytona
from poolkeeper_daytona._made import hold_sandboxes
from poolkeeper_daytona._sdk import IN_TESTS, require_sdk
from poolkeeper_daytona._threads import bound_threads
from poolkeeper_daytona._transport import is_transport_failure

if TYPE_CHECKING:
    from collections.abc import Callable, Hashable

    import daytona
    from poolkeeper import ProcessSingleton

    _Client = TypeVar("_Client", daytona.Daytona, daytona.AsyncDaytona)

__all__ = [
    "DEFAULT_API_KEY_FILE",
    "DaytonaCredentialsError",
    "daytona_client",
    "make_daytona_singleton",
]

#: Where :data:`daytona_client` looks for the API key when neither
#: ``DAYTONA_API_KEY`` nor a JWT is set and ``DAYTONA_API_KEY_FILE`` is not.
DEFAULT_API_KEY_FILE: Final = "~/.config/daytona/api_key"

# Every variable the SDK's constructor reads, plus the key file's name.
_ENV_VARS: Final = (
    "DAYTONA_API_KEY",
    "DAYTONA_API_KEY_FILE",
    "DAYTONA_API_URL",
    "DAYTONA_SERVER_URL",
    "DAYTONA_TARGET",
    "DAYTONA_JWT_TOKEN",
    "DAYTONA_ORGANIZATION_ID",
    "DAYTONA_USE_DEPRECATED_POLLING",
    "DAYTONA_OTEL_ENABLED",
    "DAYTONA_EXPERIMENTAL_OTEL_ENABLED",
)
# The SDK also reads DAYTONA_* values from these files in the working
# directory; .env.local wins over .env (the API URL too, before 0.226).
_DOTENV_FILES: Final = (".env.local", ".env")
# The values that authenticate, in the SDK's order.
_CREDENTIALS: Final = ("DAYTONA_API_KEY", "DAYTONA_JWT_TOKEN")


class DaytonaCredentialsError(ValueError):
    """No Daytona credentials were found in the environment or key file.

    Args:
        key_file: The API key file that was looked for.

    .. versionadded:: 0.1.0
    """

    def __init__(self, key_file: str) -> None:
        """Remember which key file was looked for (never a secret)."""
        super().__init__(key_file)
        self.key_file = key_file

    def __str__(self) -> str:
        """Name the variables and the key file to set."""
        return (
            "No Daytona credentials found: set DAYTONA_API_KEY, or both "
            "DAYTONA_JWT_TOKEN and DAYTONA_ORGANIZATION_ID, or write the API "
            f"key to {self.key_file} (path taken from DAYTONA_API_KEY_FILE). "
            f"{IN_TESTS}"
        )


# How often the checker thread looks at the key file and the dotenv files.
_RECHECK_SECONDS: Final = 5.0

# What a build imports on first use. A fork while another thread is in the
# middle of importing one of them would leave that module's import lock
# held in the child, by a thread that does not exist there: the child's
# first build would wait on it for ever. So before a fork, an import that
# has begun is waited for (an import of a module not begun is not started).
_LAZY_IMPORTS: tuple[str, ...] = ("dotenv", "daytona")


def _finish_imports() -> None:
    """Before a fork: let a begun import of a lazy module finish.

    A module that is absent (python-dotenv beside a test's stand-in
    ``daytona``) or blocked (``None`` in ``sys.modules``) is not imported.
    """
    for name in _LAZY_IMPORTS:
        if sys.modules.get(name) is not None:
            with contextlib.suppress(Exception):
                importlib.import_module(name)


if hasattr(os, "register_at_fork"):  # pragma: no branch -- not on Windows.
    os.register_at_fork(before=_finish_imports)


def _key_file_path() -> str:
    name = os.environ.get("DAYTONA_API_KEY_FILE") or DEFAULT_API_KEY_FILE
    return os.path.expanduser(name)  # noqa: PTH111 -- str in, str out.


def _in_cwd(name: str) -> Callable[[], str]:
    def path() -> str:
        return os.path.join(os.getcwd(), name)  # noqa: PTH109, PTH118

    path.__qualname__ = path.__name__ = f"<working directory>/{name}"
    return path


# The key file (wherever DAYTONA_API_KEY_FILE points) and the working
# directory's dotenv files, watched by poolkeeper's checker thread. Their
# paths are functions: a changed DAYTONA_API_KEY_FILE is pushed by the env
# key, and the slow path then looks at the file it names now; a changed
# working directory is seen by the checker (its paths change).
_file_keys = (
    keys.file(_key_file_path, recheck_seconds=_RECHECK_SECONDS),
    *(
        keys.file(_in_cwd(name), recheck_seconds=_RECHECK_SECONDS)
        for name in _DOTENV_FILES
    ),
)
_env_key = keys.env(*_ENV_VARS)
# Every part is pushed, so the tuple is too: a hit reads nothing.
_KEY: Final[tuple[Callable[[], object], ...]] = (_env_key, *_file_keys)


def _key_file() -> Path:
    return Path(_key_file_path())


def _sdk_setting(name: str, files: list[dict[str, str | None]]) -> str | None:
    """Read *name* with the SDK's precedence (its ``DaytonaEnvReader``).

    A variable set in the process environment wins even when empty; else
    the first dotenv file that has the name, even with an empty value.
    """
    value = os.environ.get(name)
    if value is not None:
        return value
    for values in files:
        if values.get(name) is not None:
            return values[name]
    return None


def _dotenv_files() -> list[dict[str, str | None]]:
    """Return the working directory's dotenv files, as the SDK reads them.

    The SDK reads them with python-dotenv, which it imports with itself
    (every release in the supported range). Without python-dotenv, the
    ``daytona`` module in use is not the SDK but a test's stand-in, which
    reads no dotenv file: neither does this.
    """
    try:
        # Imported here: needed only when a client is built.
        from dotenv import dotenv_values  # noqa: PLC0415
    except ModuleNotFoundError as exc:
        if exc.name != "dotenv":
            raise
        return []
    return [dotenv_values(name) for name in _DOTENV_FILES]


def _sdk_finds_credentials() -> bool:
    """Whether ``daytona.Daytona()`` finds an API key or a JWT by itself."""
    files = _dotenv_files()
    return any(_sdk_setting(name, files) for name in _CREDENTIALS)


def _key_from_file() -> str:
    key_file = _key_file()
    try:
        api_key = key_file.read_text(encoding="utf-8").strip()
    except OSError:
        api_key = ""
    if not api_key:
        raise DaytonaCredentialsError(str(key_file))
    return api_key


def _build(cls: type[_Client], factory: str) -> _Client:
    """Build *cls* configured exactly as the SDK configures itself.

    The SDK resolves every setting in its own constructor, so whatever a
    release does (which variables, which dotenv files, which order) holds
    unchanged. poolkeeper adds one thing: when the SDK would find no API
    key and no JWT, the API key is read from the key file, and the SDK
    still resolves everything else (URL, target, organization). Each
    sandbox the client hands out keeps it open (see ``_made``).
    """
    client = _configured(cls, factory)
    hold_sandboxes(client)
    return client


def _configured(cls: type[_Client], factory: str) -> _Client:
    if _sdk_finds_credentials():
        return cls()
    api_key = _key_from_file()
    require_sdk(factory, "DaytonaConfig")
    from daytona import DaytonaConfig  # noqa: PLC0415 -- the SDK is optional.

    config = DaytonaConfig(api_key=api_key)
    with warnings.catch_warnings():
        # With a config but no api_url the SDK reads the deprecated
        # config.server_url, which warns although nobody set it. The
        # filter is process-wide for the moment of the build (builds are
        # rare: once per key) and hides only that message.
        warnings.filterwarnings(
            "ignore", "[`']server_url[`'] is deprecated", DeprecationWarning
        )
        return cls(config)


@process_singleton(
    key=_KEY,
    close=close_daytona,
    after_fork=_after_fork,
    retire_on=is_transport_failure,
)
def daytona_client() -> daytona.Daytona:
    """Return the process's ``daytona.Daytona``, configured from the env.

    The SDK configures the client itself, exactly as ``daytona.Daytona()``
    does: each setting from the process environment, then ``.env.local``,
    then ``.env`` in the working directory (the API URL from the process
    environment only, since daytona 0.226). poolkeeper adds one fallback:
    when the SDK would find neither ``DAYTONA_API_KEY`` nor
    ``DAYTONA_JWT_TOKEN``, the API key is read from the file named by
    ``DAYTONA_API_KEY_FILE`` (default ``~/.config/daytona/api_key``).

    The client is built once per process and reused by every thread. When
    any of those values changes, the next call builds a new client and the
    old one is closed with :func:`close_daytona` once its last lease ends:

    - a ``DAYTONA_*`` variable changed through ``os.environ``: at once
      (pushed; a call reads nothing);
    - the key file, ``.env`` or ``.env.local`` rewritten, replaced,
      created or deleted, or the working directory changed: within 5
      seconds (poolkeeper's checker thread ``stat()``-s them; see
      :func:`poolkeeper.keys.file`). A changed ``DAYTONA_API_KEY_FILE``
      makes the next call look at the file it names at once.

    A forked child builds its own and leaves the parent's untouched.

    Each sandbox the client hands out (``create``, ``get``, ``find_one``,
    ``list``) keeps it open after a retirement
    (:func:`poolkeeper.made_from`): a retired client closes once its last
    lease has ended and its last sandbox is gone.

    A broken connection retires the client (``retire_on`` is
    :func:`~poolkeeper_daytona.is_transport_failure`): when a call made
    inside ``with daytona_client.lease() as client:``, or through
    ``daytona_client.proxy()``, fails because the connection broke (a TLS
    EOF, a reset, a refused connection), the client is retired and the
    exception propagates unchanged; the next call builds a new client,
    with poolkeeper's healing backoff. An answer of the API (4xx, 429,
    5xx) and a timeout retire nothing. A client taken with a plain
    ``daytona_client()`` call is not watched: its errors never reach
    poolkeeper.

    The ``daytona`` SDK is imported at the first build, not when this
    module is: a project without it imports and decorates freely. A
    stand-in ``daytona`` module that a test put in ``sys.modules`` is
    built from as the SDK would be (its ``Daytona()``, or its
    ``Daytona(DaytonaConfig(api_key=...))`` with the key file); without
    python-dotenv, no dotenv file is read, as no SDK could have read one.
    In tests, ``daytona_client.override(fake)`` needs neither.

    Raises:
        DaytonaCredentialsError: If the SDK finds no credentials and the
            key file is missing or empty.
        ModuleNotFoundError: If the ``daytona`` package is not installed
            (``pip install 'poolkeeper-daytona[sdk]'``).
        ImportError: If the ``daytona`` module lacks ``Daytona`` (or
            ``DaytonaConfig``, needed with the key file): a stand-in.

    .. versionadded:: 0.1.0
    """
    require_sdk("daytona_client", "Daytona")
    from daytona import Daytona  # noqa: PLC0415 -- the SDK is optional.

    client = _build(Daytona, "daytona_client")
    bound_threads(client)
    return client


def _config_key(config: daytona.DaytonaConfig | Mapping[str, Any]) -> Hashable:
    """Return what identifies *config*: its field values, or a fingerprint.

    Reading the fields is cheap; the dump and fingerprint are only for a
    config holding an unhashable value. The values are kept sealed by
    poolkeeper for comparison and shown only as fingerprints.
    """
    if isinstance(config, Mapping):
        fields = tuple(sorted(config.items()))
        try:
            hash(fields)
        except TypeError:
            return fingerprint(repr(fields))
        return (dict, fields)
    values = (
        type(config),
        tuple(config.__dict__.items()),
        tuple((config.__pydantic_extra__ or {}).items()),
    )
    try:
        hash(values)
    except TypeError:
        return fingerprint(repr(sorted(config.model_dump().items())))
    return values


def make_daytona_singleton(
    config_factory: Callable[[], daytona.DaytonaConfig | Mapping[str, Any]],
    **options: Any,  # noqa: ANN401 - forwarded to process_singleton.
) -> ProcessSingleton[daytona.Daytona]:
    """Make a process-wide ``daytona.Daytona`` built from your own config.

    By default the singleton is keyed on the config that *config_factory*
    returns and on every ``DAYTONA_*`` value the SDK's constructor reads
    from the environment and dotenv files; a change builds a new client
    and closes the old one with :func:`close_daytona`.

    What a call costs: *config_factory* is called on every call (the
    singleton cannot know when your config changes), then its fields are
    read and hashed (a fingerprint of its dump only when a field holds an
    unhashable value). The environment and the files cost nothing per
    call: their changes are pushed as for :data:`daytona_client` (at once
    for variables, within 5 seconds for files). So keep *config_factory*
    cheap, e.g. return a config built once and replaced when it changes.

    Nothing here needs the SDK until the first build: the singleton can
    be made at module level in a project where ``daytona`` is absent.
    *config_factory* may return the ``DaytonaConfig``'s fields as a
    mapping (``{"api_key": ..., "api_url": ...}``), so that the module
    making the singleton never imports the SDK; the config is then built
    from them at each build.

    A broken connection retires the client, as for
    :data:`daytona_client`: ``retire_on`` defaults to
    :func:`~poolkeeper_daytona.is_transport_failure`. Pass your own
    ``retire_on`` to replace it, or ``retire_on=None`` to retire nothing.

    Args:
        config_factory: Returns the ``DaytonaConfig`` to build with, or
            a mapping of its keyword arguments.
        **options: Passed to :func:`poolkeeper.process_singleton`; ``key``,
            ``close``, ``after_fork`` and ``retire_on`` replace this
            function's defaults.

    Returns:
        The singleton; call it to get the client.

    .. versionadded:: 0.1.0
    """

    def config_key() -> Hashable:
        return _config_key(config_factory())

    def build() -> daytona.Daytona:
        require_sdk(name, "Daytona")
        from daytona import Daytona  # noqa: PLC0415 -- the SDK is optional.

        config = config_factory()
        if isinstance(config, Mapping):
            require_sdk(name, "DaytonaConfig")
            from daytona import DaytonaConfig  # noqa: PLC0415

            config = DaytonaConfig(**config)
        client = Daytona(config)
        bound_threads(client)
        hold_sandboxes(client)
        return client

    name = getattr(config_factory, "__qualname__", "daytona_singleton")
    build.__qualname__ = build.__name__ = name
    options.setdefault("key", (config_key, *_KEY))
    options.setdefault("close", close_daytona)
    options.setdefault("after_fork", _after_fork)
    options.setdefault("retire_on", is_transport_failure)
    singleton: ProcessSingleton[daytona.Daytona] = process_singleton(
        **options
    )(build)
    return singleton
