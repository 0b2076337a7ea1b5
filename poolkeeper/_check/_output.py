"""Write ``poolkeeper check``'s results: text, JSON or GitHub annotations."""

from __future__ import annotations

import dataclasses
import json
from typing import TYPE_CHECKING, TextIO

if TYPE_CHECKING:
    from collections.abc import Sequence
    from pathlib import Path

    from poolkeeper._check._findings import Finding

__all__ = ["write"]


def write(
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
