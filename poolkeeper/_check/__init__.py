"""``poolkeeper check``: report SDK clients built per call or per retry.

Reads files and ``pyproject.toml``; never imports the code it checks.
Standard library only, and not imported by ``import poolkeeper``. Here
are the arguments, the run and its exit status; the run reads the files
(:mod:`._files`, configured by :mod:`._config`), links them
(:mod:`._link`) and writes what it found (:mod:`._output`).
"""

from __future__ import annotations

import argparse
import os
import sys
from pathlib import Path
from typing import TYPE_CHECKING

from poolkeeper._check._config import UsageError, check_clients
from poolkeeper._check._files import read
from poolkeeper._check._link import link
from poolkeeper._check._output import write

if TYPE_CHECKING:
    from collections.abc import Sequence

__all__ = ["main"]


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
    check_clients(extra, "--client")
    for path in paths:
        if not path.exists():
            msg = f"{path}: no such file or directory."
            raise UsageError(msg)
    files, unchecked = read(paths, extra, exclude)
    results = [
        (path, finding)
        for path, findings in link(files).items()
        for finding in findings
    ]
    write(sys.stdout, [*unchecked, *results], form)
    if results:
        sys.stderr.write(f"Found {len(results)} problem(s).\n")
    if unchecked:
        sys.stderr.write(f"Could not check {len(unchecked)} file(s).\n")
        return 2
    return 1 if results else 0
