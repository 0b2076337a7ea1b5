"""``poolkeeper check``: report SDK clients built per call or per retry.

Reads files and ``pyproject.toml``; never imports the code it checks.
Standard library only, and not imported by ``import poolkeeper``.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import fnmatch
import importlib
import io
import json
import os
import re
import sys
import tokenize
import warnings
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

from poolkeeper._check_ast import analyze_module
from poolkeeper._check_findings import (
    Finding,
    ModuleReport,
    client_table,
    imported_call_finding,
)
from poolkeeper._clients import CHECKED_CALLABLES

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator, Sequence

__all__ = ["main"]

_NOQA: Final = re.compile(
    r"#\s*noqa(?::\s*(?P<codes>[A-Z]+[0-9]+(?:[,\s]+[A-Z]+[0-9]+)*))?",
    re.IGNORECASE,
)
# Never walked into below a given directory (a given path is honoured).
_SKIPPED_DIRS: Final = frozenset({"__pycache__", "node_modules"})
_CONFIG_KEYS: Final = frozenset({"clients", "exclude"})


class UsageError(Exception):
    """A bad argument or configuration: exit status 2."""


def _toml_loader() -> Callable[[str], dict[str, Any]] | None:
    # tomllib is 3.11+; tomli is its backport, if installed.
    for name in ("tomllib", "tomli"):
        try:
            module = importlib.import_module(name)
        # The pragmas: only Python 3.10 can lack both modules.
        except ImportError:  # pragma: no cover -- 3.10 without tomli.
            continue
        loads: Callable[[str], dict[str, Any]] = module.loads
        return loads
    return None  # pragma: no cover -- 3.10 without tomli.


@dataclasses.dataclass(frozen=True)
class _Config:
    """``[tool.poolkeeper]`` of one ``pyproject.toml``."""

    root: Path | None = None
    clients: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def excludes(self, path: Path, extra: Sequence[str]) -> bool:
        """Say whether *path* matches an ``exclude`` pattern."""
        patterns = [(self.root, p) for p in self.exclude]
        patterns += [(Path.cwd(), p) for p in extra]
        for root, pattern in patterns:
            try:
                relative = path.resolve().relative_to(root or Path.cwd())
            except ValueError:
                continue
            parts = relative.parts
            for end in range(1, len(parts) + 1):
                if fnmatch.fnmatch("/".join(parts[:end]), pattern.rstrip("/")):
                    return True
        return False


class _Configs:
    """The nearest ``pyproject.toml`` with ``[tool.poolkeeper]``, by folder."""

    def __init__(self, stderr: TextIO) -> None:
        self.stderr = stderr
        self.loads = _toml_loader()
        self.by_dir: dict[Path, _Config] = {}

    def for_path(self, path: Path) -> _Config:
        folder = path.resolve()
        if not folder.is_dir():
            folder = folder.parent
        seen: list[Path] = []
        config = None
        for candidate in (folder, *folder.parents):
            config = self.by_dir.get(candidate)
            if config is not None:
                break
            seen.append(candidate)
            config = self.read(candidate / "pyproject.toml")
            if config is not None:
                break
        config = config or _Config()
        for candidate in seen:
            self.by_dir[candidate] = config
        return config

    def read(self, file: Path) -> _Config | None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError:
            return None
        if "[tool.poolkeeper]" not in text:
            return None
        if self.loads is None:  # pragma: no cover -- 3.10 without tomli.
            self.stderr.write(
                f"poolkeeper check: ignoring [tool.poolkeeper] in {file}: "
                "reading it needs Python 3.11+ or the tomli package.\n"
            )
            return _Config(file.parent)
        try:
            table = self.loads(text).get("tool", {}).get("poolkeeper", {})
        except ValueError as exc:
            msg = f"{file}: {exc}"
            raise UsageError(msg) from exc
        return _parse_config(file, table)


def _parse_config(file: Path, table: dict[str, Any]) -> _Config:
    unknown = sorted(set(table) - _CONFIG_KEYS)
    if unknown:
        msg = f"{file}: unknown [tool.poolkeeper] keys: {', '.join(unknown)}."
        raise UsageError(msg)
    lists: dict[str, tuple[str, ...]] = {}
    for key in sorted(_CONFIG_KEYS):
        value: object = table.get(key, [])
        if not isinstance(value, list) or not all(
            isinstance(item, str)
            for item in value  # pyright: ignore[reportUnknownVariableType]
        ):
            msg = f"{file}: [tool.poolkeeper] {key} must be a list of strings."
            raise UsageError(msg)
        lists[key] = tuple(value)  # pyright: ignore[reportUnknownArgumentType]
    _check_clients(lists["clients"], str(file))
    return _Config(file.parent, lists["clients"], lists["exclude"])


def _check_clients(names: Sequence[str], where: str) -> None:
    for name in names:
        module, _, attr = name.partition(":")
        if not module or not attr:
            msg = f"{where}: client {name!r} is not 'module:Name'."
            raise UsageError(msg)


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
class _Checked:
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


def _check_file(path: Path, clients: dict[tuple[str, str], str]) -> _Checked:
    source = path.read_bytes()
    # Old or odd code can warn while parsing (invalid escapes): not ours.
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        report = analyze_module(ast.parse(source, str(path)), clients)
    noqa = _suppressions(source) if b"noqa" in source else {}
    return _Checked(path, _module_name(path), report, noqa)


def _module_name(path: Path) -> str:
    """Return the dotted module name of *path*, from its packages."""
    path = path.resolve()
    parts = [] if path.stem == "__init__" else [path.stem]
    folder = path.parent
    while (folder / "__init__.py").is_file():
        parts.insert(0, folder.name)
        folder = folder.parent
    return ".".join(parts)


def _absolute(target: str, checked: _Checked) -> str:
    """Resolve a relative import target against the checked module."""
    name = target.lstrip(".")
    level = len(target) - len(name)
    if not level:
        return target
    package = checked.module.split(".")
    if checked.path.stem != "__init__":
        package = package[:-1]
    package = package[: len(package) - (level - 1)] if level > 1 else package
    return ".".join([*package, name])


def _link(files: list[_Checked]) -> dict[Path, list[Finding]]:
    """Return each file's findings, with calls of other files' factories.

    A factory defined in one module and called in a loop in another is
    found only here, once every file has been read.
    """
    factories = {
        f"{checked.module}.{name}": built
        for checked in files
        for name, built in checked.report.factories.items()
    }
    found: dict[Path, list[Finding]] = {}
    for checked in files:
        findings = list(checked.report.findings)
        for call in checked.report.calls:
            built = factories.get(_absolute(call.target, checked))
            if built is not None:
                findings.append(imported_call_finding(call, built))
        found[checked.path] = sorted(checked.kept(iter(findings)))
    return found


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="poolkeeper",
        description="Tools that keep SDK clients from leaking pools.",
    )
    commands = parser.add_subparsers(dest="command", required=True)
    check = commands.add_parser(
        "check",
        help="report clients built per call, per loop or per retry",
        description=(
            "Report pool-owning SDK clients built in a function that is "
            "not a singleton factory (PK001), or in a loop, an except "
            "block or a retried function (PK002). Exit status: 0 clean, "
            "1 findings, 2 usage error."
        ),
    )
    check.add_argument(
        "paths", nargs="*", type=Path, default=[Path()], metavar="PATH"
    )
    check.add_argument(
        "--client",
        action="append",
        default=[],
        metavar="MODULE:NAME",
        help="one more client to report (repeatable)",
    )
    check.add_argument(
        "--format",
        choices=["text", "json", "github"],
        default="text",
        help=(
            "text (default): path:line:col: CODE message; json: one list "
            "of objects; github: GitHub Actions annotations"
        ),
    )
    check.add_argument(
        "--exclude",
        action="append",
        default=[],
        metavar="PATTERN",
        help="skip paths matching PATTERN, relative to . (repeatable)",
    )
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    """Run ``poolkeeper check [PATHS]``; return the exit status.

    Args:
        argv: The arguments, without the program name; default
            ``sys.argv[1:]``.

    Returns:
        0 when nothing was found, 1 when something was, 2 on a usage
        error (a missing path, a bad option or configuration) or when a
        file could not be checked (a syntax error, an unreadable file).

    .. versionadded:: 0.1
    """
    parser = _parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as exc:
        return 0 if exc.code == 0 else 2
    try:
        return _run(args.paths, args.client, args.exclude, args.format)
    except UsageError as exc:
        sys.stderr.write(f"poolkeeper check: {exc}\n")
        return 2
    except BrokenPipeError:
        # The reader went away (`poolkeeper check | head`): stop quietly.
        # Python flushes stdout again at exit, so point it at devnull.
        devnull = os.open(os.devnull, os.O_WRONLY)
        os.dup2(devnull, sys.stdout.fileno())
        return 1


def _run(
    paths: list[Path], extra: list[str], exclude: list[str], form: str
) -> int:
    _check_clients(extra, "--client")
    for path in paths:
        if not path.exists():
            msg = f"{path}: no such file or directory."
            raise UsageError(msg)
    files, unchecked = _read(paths, extra, exclude)
    results = [
        (path, finding)
        for path, findings in _link(files).items()
        for finding in findings
    ]
    _write(sys.stdout, [*unchecked, *results], form)
    if results:
        sys.stderr.write(f"Found {len(results)} problem(s).\n")
    if unchecked:
        sys.stderr.write(f"Could not check {len(unchecked)} file(s).\n")
        return 2
    return 1 if results else 0


def _read(
    paths: list[Path], extra: list[str], exclude: list[str]
) -> tuple[list[_Checked], list[tuple[Path, Finding]]]:
    """Check each file alone; return them and those that cannot be read."""
    configs = _Configs(sys.stderr)
    tables: dict[_Config, dict[tuple[str, str], str]] = {}
    files: list[_Checked] = []
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
            except (ValueError, OSError) as exc:
                where = Finding(
                    1, 1, _UNCHECKED, f"cannot check this file: {exc}"
                )
                unchecked.append((path, where))
    return files, unchecked


def _write(
    out: TextIO, results: Sequence[tuple[Path, Finding]], form: str
) -> None:
    if form == "json":
        rows = [
            {"path": str(path), **dataclasses.asdict(finding)}
            for path, finding in results
        ]
        out.write(json.dumps(rows, indent=2) + "\n")
        return
    for path, f in results:
        if form == "github":
            # Workflow command syntax: properties and message escaped.
            out.write(
                f"::error file={_escape(str(path), prop=True)},"
                f"line={f.line},col={f.col},title={f.code}::"
                f"{_escape(f.message)}\n"
            )
        else:
            out.write(f"{path}:{f.line}:{f.col}: {f.code} {f.message}\n")


def _escape(text: str, *, prop: bool = False) -> str:
    text = text.replace("%", "%25").replace("\r", "%0D").replace("\n", "%0A")
    if prop:
        text = text.replace(":", "%3A").replace(",", "%2C")
    return text
