"""Link factories across modules: the last step of ``poolkeeper check``.

A factory defined in one module and called in a loop or retry in another
is found only once every file has been read.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from poolkeeper._check._findings import imported_call_finding

if TYPE_CHECKING:
    from pathlib import Path

    from poolkeeper._check._files import Checked
    from poolkeeper._check._findings import Finding

__all__ = ["link"]


def _absolute(target: str, checked: Checked) -> str:
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


def link(files: list[Checked]) -> dict[Path, list[Finding]]:
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
