"""What ``poolkeeper check`` reports, and what a module tells the linker.

A :class:`Finding` is one problem at one place. A :class:`ModuleReport`
is what the analysis of one module returns: its findings, the factories it
defines, and its calls in a loop or retry of names imported from elsewhere
(:class:`ImportedCall`), which the CLI links to other modules' factories.
:func:`client_table` turns ``module:callable`` names into what the analysis
matches calls against.
"""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = [
    "FIX",
    "Finding",
    "ImportedCall",
    "ModuleReport",
    "client_table",
    "imported_call_finding",
]

FIX: Final = "build it once, e.g. with @poolkeeper.process_singleton"


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One problem at one place of a checked file.

    Args:
        line: The 1-based line of the call.
        col: The 1-based column of the call.
        code: ``PK001`` or ``PK002``.
        message: One sentence saying what is wrong and what to do.

    .. versionadded:: 0.1
    """

    line: int
    col: int
    code: str
    message: str


def client_table(names: Iterable[str]) -> dict[tuple[str, str], str]:
    """Index ``module:callable`` names by (top-level package, last name).

    A call matches when its resolved dotted name starts with the package
    and ends with the name, so ``daytona._sync.daytona.Daytona`` matches
    ``daytona:Daytona``.

    .. versionadded:: 0.1
    """
    table: dict[tuple[str, str], str] = {}
    for name in names:
        module, _, attr = name.partition(":")
        table[module.partition(".")[0], attr.rpartition(".")[2]] = (
            f"{module}.{attr}"
        )
    return table


@dataclasses.dataclass(frozen=True)
class ImportedCall:
    """A call, in a loop or retry, of a name imported from another module.

    Args:
        line: The 1-based line of the call.
        col: The 1-based column of the call.
        target: The dotted name the call resolves to through imports; it
            starts with dots for a relative import (``..pkg.make``).
        reason: Why the call repeats, e.g. ``"inside a loop"``.
    """

    line: int
    col: int
    target: str
    reason: str


@dataclasses.dataclass
class ModuleReport:
    """What one module says, for linking factories across modules.

    Args:
        findings: The problems found in the module alone.
        factories: Top-level function name -> the client it builds on
            every call.
        calls: Calls in a loop or retry of names imported from elsewhere.
    """

    findings: list[Finding]
    factories: dict[str, str]
    calls: list[ImportedCall]


def imported_call_finding(call: ImportedCall, built: str) -> Finding:
    """Return the PK002 for *call* of a factory that builds *built*."""
    name = call.target.rpartition(".")[2]
    return Finding(
        call.line,
        call.col,
        "PK002",
        f"{name}() builds a {built} on every call and is called "
        f"{call.reason}: each call opens a connection pool that is never "
        f"closed; {FIX}",
    )
