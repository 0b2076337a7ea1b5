"""Render the threads page's table from what the SDK suite measured.

``outcomes.json`` beside this file is written by a run of the SDK suite
with ``RECORD_THREAD_OUTCOMES=1`` (``tests/sdks/sdk_outcomes.py``): one
row per 128-thread test. This script renders ``table.inc``, which
``docs/threads.md`` includes::

    .venv/bin/python docs/threads/render.py

``--check`` renders nothing and exits 1 if ``table.inc`` is not what the
file renders to. The suite checks each row's categories (:func:`categories`)
against what it measures in every run, so the table cannot drift.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).resolve().parent
OUTCOMES = HERE / "outcomes.json"
TABLE = HERE / "table.inc"
#: Counts that are either zero (fine) or not.
COUNTS = ("errors", "warnings", "wrong")
LABELS = ("object", "scope", "setting", "threads")


def categories(row: dict[str, Any]) -> dict[str, object]:
    """What a run must agree on: labels, each count zero or not, the pool.

    The counts themselves vary from run to run; these do not.
    """
    found: dict[str, object] = {name: row.get(name) for name in LABELS}
    for name in COUNTS:
        if name in row:
            found[name] = row[name] > 0
    if "connections" in row:
        found["within pool"] = row["connections"] <= row["pool"]
    found["one client per thread"] = row["builds"] == row["threads"]
    return found


def outcome(row: dict[str, Any]) -> str:
    """The row's verdict: safe, or what went wrong first."""
    found = categories(row)
    if found.get("wrong"):
        return "**wrong answers**"
    if found["errors"]:
        return "**errors**"
    if found.get("warnings") or found.get("within pool") is False:
        return "**churns**: pool too small"
    return "safe"


def _n(value: int, what: str) -> str:
    return f"{value:,} {what}" if value == 1 else f"{value:,} {what}s"


def measured(row: dict[str, Any]) -> str:
    """The row's numbers, as words."""
    parts = [_n(row["errors"], "error")]
    if "wrong" in row:
        parts.append(f"{_n(row['wrong'], 'thread')} {row['wrong_means']}")
    if "warnings" in row:
        parts.append(_n(row["warnings"], '"pool is full" warning'))
    if "connections" in row:
        parts.append(
            f"{_n(row['connections'], 'connection')} opened for "
            f"{_n(row['requests'], 'request')} (pool {row['pool']:,})"
        )
    parts.append(f"{_n(row['builds'], 'client')} built")
    return "; ".join(parts)


def render(data: dict[str, Any]) -> str:
    """The Markdown table of *data*'s rows, and the run that measured them."""
    header = "| shared object | `scope` | pool setting | measured | outcome |"
    lines = [header, "|---|---|---|---|---|"]
    rows = sorted(
        data["rows"].values(),
        key=lambda row: (
            row["object"].strip("`").lower(),
            row["scope"],
            row["setting"],
        ),
    )
    lines.extend(
        f"| {row['object']} | `{row['scope']}` | {row['setting']} "
        f"| {measured(row)} | {outcome(row)} |"
        for row in rows
    )
    run = data["run"]
    sdks = ", ".join(f"{name} {v}" for name, v in sorted(run["sdks"].items()))
    lines += [
        "",
        (
            f"Measured by the SDK suite on Python {run['python']} "
            f"({run['platform']}), against servers on 127.0.0.1: {sdks}."
        ),
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str]) -> int:
    """Write table.inc, or with ``--check`` say whether it is up to date."""
    data = json.loads(OUTCOMES.read_text(encoding="utf-8"))
    table = render(data)
    if "--check" in argv:
        if TABLE.read_text(encoding="utf-8") != table:
            sys.stderr.write(f"{TABLE} is not {OUTCOMES.name} rendered.\n")
            return 1
        return 0
    TABLE.write_text(table, encoding="utf-8")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
