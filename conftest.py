"""Run the code blocks of README.md and docs/ as tests (``make doctest``).

Every ``python`` block runs, in order, one namespace per document (Sybil's
MyST parser; ``<!-- -->`` or ``%`` comments hold invisible set-up blocks).

Tests talk only to loopback, so while a document runs, ``sys.modules``
holds small recording fakes under the names of the network SDKs the
examples show (``httpx``, ``urllib3``) and of the user's own modules they
import (``myapp``, ``myapp.clients``, ``acme``): the poolkeeper calls are
real, the SDK is not. The Daytona examples use the real SDK against the
:class:`~poolkeeper_daytona.testing.DaytonaEmulator` on 127.0.0.1, started
by an invisible block at the top of the page.

``console`` blocks are not run (they install, build or run for minutes).
What they name is checked instead: a ``make`` target must exist (``make
-n``), and a path such as ``benchmarks/bench_build.py`` must exist.
``toml`` blocks must parse.

A block that cannot run here is preceded by ``skip: next "reason"``;
pytest reports it as skipped, with the reason (``-ra``).
"""

from __future__ import annotations

import os
import shlex
import subprocess
import sys
import types
from pathlib import Path
from typing import TYPE_CHECKING, Any

from sybil import Document, Example, Region, Sybil
from sybil.parsers.markdown.lexers import FencedCodeBlockLexer
from sybil.parsers.myst import PythonCodeBlockParser, SkipParser

if TYPE_CHECKING:
    from collections.abc import Callable

    from typing_extensions import Self

ROOT = Path(__file__).parent
FAKE_ENVIRON = {
    "API_URL": "http://127.0.0.1:9/",
    "API_TOKEN": "doc-token",
    "API_KEY": "doc-key",
}


class FakeResponse:
    """What a fake client's request returns."""

    status_code = 200

    def json(self) -> dict[str, Any]:
        """Return a job as an API would."""
        return {"id": 1, "status": "ok"}


class FakeHttpClient:
    """Stands in for ``httpx.Client``: records requests, sends nothing."""

    def __init__(self, **options: Any) -> None:
        self.options = options
        self.requests: list[tuple[str, str]] = []
        self.closed = False

    @property
    def is_closed(self) -> bool:
        """Whether ``close()`` was called, as on the real client."""
        return self.closed

    def __enter__(self) -> Self:
        """Return the client, as the real one does."""
        return self

    def __exit__(self, *exc_info: object) -> None:
        """Close it, as the real one does."""
        self.close()

    def _request(self, method: str, url: str) -> FakeResponse:
        if self.closed:
            msg = "Cannot send a request, as the client has been closed."
            raise RuntimeError(msg)
        self.requests.append((method, url))
        return FakeResponse()

    def get(self, url: str, **_: Any) -> FakeResponse:
        """Record a GET."""
        return self._request("GET", url)

    def post(self, url: str, **_: Any) -> FakeResponse:
        """Record a POST."""
        return self._request("POST", url)

    def close(self) -> None:
        """Mark closed, as the real client's ``close()`` would."""
        self.closed = True


class FakePoolManager(FakeHttpClient):
    """Stands in for ``urllib3.PoolManager``."""

    def request(self, method: str, url: str, **_: Any) -> FakeResponse:
        """Record a request."""
        return self._request(method, url)

    def clear(self) -> None:
        """PoolManager's close is ``clear()``."""
        self.close()


class FakeAcmeClient(FakeHttpClient):
    """The invented ``acme`` SDK of the write-your-own page."""

    def __init__(self) -> None:
        super().__init__()
        self._pool = FakePoolManager()
        self._idle_sockets: list[object] = []

    def shutdown(self) -> None:
        """The SDK's public close."""
        self.close()


def _fake_modules() -> dict[str, types.ModuleType]:
    # Imported here: the core's tests load this conftest too.
    from poolkeeper import keys, process_singleton  # noqa: PLC0415

    httpx = types.ModuleType("httpx")
    httpx.Client = FakeHttpClient  # type: ignore[attr-defined]
    httpx.TransportError = type("TransportError", (Exception,), {})  # type: ignore[attr-defined]
    urllib3 = types.ModuleType("urllib3")
    urllib3.PoolManager = FakePoolManager  # type: ignore[attr-defined]
    acme = types.ModuleType("acme")
    acme.Client = FakeAcmeClient  # type: ignore[attr-defined]
    myapp = types.ModuleType("myapp")
    myapp.settings = types.SimpleNamespace(  # type: ignore[attr-defined]
        api_url=FAKE_ENVIRON["API_URL"], api_token=FAKE_ENVIRON["API_TOKEN"]
    )
    clients = types.ModuleType("myapp.clients")

    @process_singleton(key=keys.env("API_URL", "API_TOKEN"))
    def api() -> FakeHttpClient:
        return FakeHttpClient(base_url=os.environ["API_URL"])

    clients.api = clients.make_client = api  # type: ignore[attr-defined]
    myapp.clients = clients  # type: ignore[attr-defined]
    return {
        "httpx": httpx,
        "urllib3": urllib3,
        "acme": acme,
        "myapp": myapp,
        "myapp.clients": clients,
    }


_saved: list[tuple[dict[str, Any], dict[str, Any]]] = []


def _setup(namespace: dict[str, Any]) -> None:
    fakes = _fake_modules()
    saved_modules = {name: sys.modules.get(name) for name in fakes}
    saved_environ = {name: os.environ.get(name) for name in FAKE_ENVIRON}
    _saved.append((saved_modules, saved_environ))
    sys.modules.update(fakes)
    os.environ.update(FAKE_ENVIRON)
    namespace["__name__"] = "__docs__"


def _teardown(namespace: dict[str, Any]) -> None:
    import poolkeeper  # noqa: PLC0415

    poolkeeper.unwatch()
    poolkeeper.close_all()
    saved_modules, saved_environ = _saved.pop()
    for name, module in saved_modules.items():
        if module is None:
            sys.modules.pop(name, None)
        else:
            sys.modules[name] = module
    for name, value in saved_environ.items():
        if value is None:
            os.environ.pop(name, None)
        else:
            os.environ[name] = value
    namespace.clear()


def _check_console(example: Example) -> None:
    """Check that a console block's make targets and paths exist."""
    for line in str(example.parsed).splitlines():
        command = line.partition(" #")[0].strip().removeprefix("$ ")
        if not command or command.startswith("#"):
            continue
        words = shlex.split(command)
        if words[0] == "make":
            done = subprocess.run(
                ["make", "-n", "-C", str(ROOT), *words[1:]],
                capture_output=True,
                text=True,
                check=False,
                timeout=60,
            )
            assert 0 == done.returncode, f"{command!r}: {done.stderr}"
        for word in words[1:]:
            if "/" in word and not word.startswith(("-", "http")):
                path = word.split("=", 1)[-1].strip("[]")
                if path.endswith((".py", ".toml", ".md")):
                    assert (ROOT / path).exists(), f"{command!r}: no {path}"


def _check_toml(example: Example) -> None:
    """Check that a ``toml`` block parses."""
    import tomllib  # noqa: PLC0415 -- 3.11+; the doc tests run on 3.11.

    tomllib.loads(str(example.parsed))


class BlockParser:
    """Find the blocks of one *language*; *check* checks each one."""

    def __init__(
        self, language: str, check: Callable[[Example], None]
    ) -> None:
        self.lexer = FencedCodeBlockLexer(language)
        self.check = check

    def __call__(self, document: Document) -> list[Region]:
        """Return one region per block of *document*."""
        return [
            Region(lexed.start, lexed.end, lexed.lexemes["source"], self.check)
            for lexed in self.lexer(document)
        ]


def _parsers() -> list[Any]:
    return [
        PythonCodeBlockParser(),
        SkipParser(),
        BlockParser("console", _check_console),
        BlockParser("toml", _check_toml),
    ]


# The Daytona page runs the real SDK (which imports the real httpx): no
# fakes there; its own invisible blocks start and stop the emulator. The
# observability page runs the Daytona demo in-process, for the same reason.
_DAYTONA_PAGE = "docs/adapters/daytona.md"
_REAL_PAGES = [_DAYTONA_PAGE, "docs/observability.md"]
pytest_collect_file = (
    Sybil(
        parsers=_parsers(),
        patterns=["README.md", "docs/*.md", "docs/adapters/*.md"],
        excludes=_REAL_PAGES,
        path=str(ROOT),
        setup=_setup,
        teardown=_teardown,
        name="docs",
    )
    + Sybil(
        parsers=_parsers(),
        patterns=_REAL_PAGES,
        path=str(ROOT),
        name="daytona",
    )
).pytest()
