"""Read the files ``poolkeeper check`` is given, each alone.

Walk the given paths for ``.py`` files (skipping hidden folders and
virtualenvs), apply each file's configuration, parse and analyze it, and
keep its ``# noqa`` comments; a file that cannot be read or parsed, and
anything that is not a regular file (a named pipe called ``*.py``), is
reported as unchecked (``PK000``).
"""

from __future__ import annotations

import ast
import dataclasses
import io
import re
import sys
import tokenize
import warnings
from typing import TYPE_CHECKING, Final

from poolkeeper._check._ast import analyze_module
from poolkeeper._check._config import Config, Configs
from poolkeeper._check._findings import Finding, ModuleReport, client_table
from poolkeeper._clients import CHECKED_CALLABLES
from poolkeeper._filekeys import read_regular

if TYPE_CHECKING:
    from collections.abc import Iterator
    from pathlib import Path

__all__ = ["Checked", "read"]

_NOQA: Final = re.compile(
    r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?",
    re.IGNORECASE,
)
# Never walked into below a given directory (a given path is honoured).
_SKIPPED_DIRS: Final = frozenset({"__pycache__", "node_modules"})


def _files(path: Path) -> Iterator[Path]:
    if not path.is_dir():
        yield path
        return
    for child in sorted(path.iterdir()):
        if child.is_dir():
            hidden = child.name.startswith(".")
            # A virtualenv has a pyvenv.cfg; its packages are not yours.
            if hidden or child.name in _SKIPPED_DIRS:
                continue
            if (child / "pyvenv.cfg").exists():
                continue
            yield from _files(child)
        elif child.suffix == ".py":
            yield child


def _suppressions(source: bytes) -> dict[int, frozenset[str] | None]:
    """Map line numbers to the codes a ``# noqa`` silences (None: all)."""
    lines: dict[int, frozenset[str] | None] = {}
    tokens = tokenize.tokenize(io.BytesIO(source).readline)
    try:
        for token in tokens:
            if token.type != tokenize.COMMENT:
                continue
            match = _NOQA.search(token.string)
            if match is None:
                continue
            codes = match.group("codes")
            lines[token.start[0]] = (
                None
                if codes is None
                else frozenset(re.split(r"[,\s]+", codes.upper()))
            )
    except (tokenize.TokenError, SyntaxError):
        pass
    return lines


# Not a finding: a file that could not be checked (exit status 2).
_UNCHECKED: Final = "PK000"


@dataclasses.dataclass
class Checked:
    """One file: its module name, what it says, and its ``# noqa``s."""

    path: Path
    module: str
    report: ModuleReport
    noqa: dict[int, frozenset[str] | None]

    def kept(self, findings: Iterator[Finding]) -> list[Finding]:
        """Return the *findings* that no ``# noqa`` silences."""
        return [
            finding
            for finding in findings
            if finding.line not in self.noqa
            or (
                (codes := self.noqa[finding.line]) is not None
                and finding.code not in codes
            )
        ]


def _check_file(path: Path, clients: dict[tuple[str, str], str]) -> Checked:
    # Never path.read_bytes(): a named pipe called *.py would block it.
    source = read_regular(path)
    # Old or odd code can warn while parsing (invalid escapes): not ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze_module(ast.parse(source, str(path)), clients)
    noqa = _suppressions(source) if b"noqa" in source else {}
    return Checked(path, _module_name(path), report, noqa)


def _module_name(path: Path) -> str:
    """Return the dotted module name of *path*, from its packages."""
    path = path.resolve()
    parts = [] if path.stem == "__init__" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def read(
    paths: list[Path], extra: list[str], exclude: list[str]
) -> tuple[list[Checked], list[tuple[Path, Finding]]]:
    """Check each file alone; return them and those that cannot be read."""
    configs = Configs(sys.stderr)
    tables: dict[Config, dict[tuple[str, str], str]] = {}
    files: list[Checked] = []
    unchecked: list[tuple[Path, Finding]] = []
    for root in paths:
        for path in _files(root):
            config = configs.for_path(path)
            if config.excludes(path, exclude):
                continue
            table = tables.get(config)
            if table is None:
                names = (*CHECKED_CALLABLES, *config.clients, *extra)
                table = tables[config] = client_table(names)
            try:
                files.append(_check_file(path, table))
            except SyntaxError as exc:
                where = Finding(
                    exc.lineno or 1,
                    exc.offset or 1,
                    _UNCHECKED,
                    f"cannot check this file: SyntaxError: {exc.msg}",
                )
                unchecked.append((path, where))
            except (RecursionError, MemoryError) as exc:
                # The parser's own limits (MemoryError: "too complex"), or
                # a walk deeper than Python's stack: skip this file only.
                kind = type(exc).__name__
                where = Finding(
                    1,
                    1,
                    _UNCHECKED,
                    "cannot check this file: nested too deeply to parse or "
                    f"walk ({kind})",
                )
                unchecked.append((path, where))
            except (ValueError, OSError) as exc:
                where = Finding(
                    1, 1, _UNCHECKED, f"cannot check this file: {exc}"
                )
                unchecked.append((path, where))
    return files, unchecked
