"""Run the code blocks of README.md and docs/ as tests (``make doctest``).

Every ``python`` block runs, in order, one namespace per document (Sybil's
MyST parser; ``<!-- -->`` or ``%`` comments hold invisible set-up blocks).
On the pages a reader copies from first (README.md, the adapter's
README.md and the Daytona page), each visible block runs alone, in a
namespace of its own, as it does when copied: it must import and define
everything it uses. Their invisible blocks still share one namespace.

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
``toml`` blocks must parse. No page, nor a file it includes (the
changelogs), cites an issue of the project's tracker ("issue 21"): a
reader of the docs cannot open it.

A block that cannot run here is preceded by ``skip: next "reason"``;
pytest reports it as skipped, with the reason (``-ra``).
"""

from __future__ import annotations

import os
import re
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
    from collections.abc import Callable, Iterator

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


# The pages whose every visible block runs alone (see the docstring).
_ALONE = frozenset(
    ROOT / page
    for page in (
        "README.md",
        "adapters/daytona/README.md",
        "docs/adapters/daytona.md",
    )
)


def _run_alone(
    evaluator: Callable[[Example], Any],
) -> Callable[[Example], Any]:
    """Return *evaluator* run in a fresh namespace, as a copied block is."""

    def evaluate(example: Example) -> Any:
        shared = example.namespace
        example.namespace = {"__name__": "__docs__"}
        try:
            return evaluator(example)
        finally:
            example.namespace = shared

    return evaluate


class PythonBlockParser(PythonCodeBlockParser):
    """Sybil's parser, with each visible block of an _ALONE page alone."""

    def __call__(self, document: Document) -> Iterator[Region]:
        """Yield the regions, the visible ones of _ALONE pages wrapped."""
        alone = Path(document.path) in _ALONE
        for region in super().__call__(document):
            if alone and document.text.startswith("```", region.start):
                region.evaluator = _run_alone(region.evaluator)
            yield region


# How a page would cite the tracker: "issue 21", "issues 3 and 4",
# "issue #21". Another project's numbered pull request (why.md's public
# record) is a link a reader can follow, not a citation of ours.
_ISSUE = re.compile(r"\bissues? #?\d+", re.IGNORECASE)
_INCLUDE = re.compile(r"^```\{include\} (\S+)$", re.MULTILINE)


def _check_no_issue_numbers(example: Example) -> None:
    """Check that the page and the files it includes cite no issue."""
    page = Path(example.path)
    texts = {page: example.document.text}
    for included in _INCLUDE.findall(example.document.text):
        path = (page.parent / included).resolve()
        texts[path] = path.read_text(encoding="utf-8")
    found = [
        f"{path.relative_to(ROOT)}: {match.group()!r}"
        for path, text in texts.items()
        for match in _ISSUE.finditer(text)
    ]
    assert [] == found


def _no_issue_numbers(document: Document) -> list[Region]:
    """Return one empty region, at the end, that checks the whole page."""
    end = len(document.text)
    return [Region(end, end, None, _check_no_issue_numbers)]


def _parsers() -> list[Any]:
    return [
        _no_issue_numbers,
        PythonBlockParser(),
        SkipParser(),
        BlockParser("console", _check_console),
        BlockParser("toml", _check_toml),
    ]


# The Daytona pages run the real SDK (which imports the real httpx): no
# fakes there; their own invisible blocks start and stop the emulator. The
# observability page runs the Daytona demo in-process, for the same reason.
_DAYTONA_PAGE = "docs/adapters/daytona.md"
_REAL_PAGES = [
    _DAYTONA_PAGE,
    "adapters/daytona/README.md",
    "docs/observability.md",
]
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
