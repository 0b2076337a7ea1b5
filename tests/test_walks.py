"""The walks docs/core-concepts.md states, checked against the code.

``benchmarks/walks.py`` measures, in a fresh interpreter, which poolkeeper
modules run Python code for a call of a built singleton, a rebuild after an
environment write, a fork, an async loop end, a healing retirement, a
max_age expiry and a check= probe. Each walk's bullet in
docs/core-concepts.md says the modules a reader opens, "(N)", and then
"Code that runs: M modules, these and ..." (or "none"). Here:

- the modules that bullet says run are exactly the measured ones, and M
  is their number;
- the reader's walk names N modules, each of which runs (a reader is
  never sent to code that does not), except on the hit path, where no
  poolkeeper code runs at all and the walk is the arming's.
"""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).parent.parent
DOC = ROOT / "docs" / "core-concepts.md"
WALKS = ROOT / "benchmarks" / "walks.py"

#: Each walk's bullet title in the doc, by the name walks.py gives it.
TITLES = {
    "call of a built singleton": "One call of a built singleton",
    "rebuild after an environment write": (
        "One rebuild after an environment write"
    ),
    "fork (the child's fork hook)": "One fork",
    "async loop end": "One async loop end",
    "healing retirement": "One healing retirement",
    "max_age expiry": "One max_age expiry",
    "check= probe": "One check= probe",
}

MODULE = re.compile(r"`((?:[\w]+/)*[\w]+\.py)`")


def _bullets() -> dict[str, str]:
    """Each walk's bullet in the doc, joined into one line, by title."""
    text = DOC.read_text(encoding="utf-8")
    bullets = {}
    for title in TITLES.values():
        found = re.search(
            rf"^- \*\*{re.escape(title)}\*\* .*?(?=^- |^\s*$)",
            text,
            re.MULTILINE | re.DOTALL,
        )
        assert found is not None, f"no bullet '{title}' in {DOC.name}"
        bullets[title] = " ".join(found.group(0).split())
    return bullets


def _stated(bullet: str) -> tuple[int, set[str], int | None, set[str]]:
    """(N, the reader's modules, M or None for "none", the running ones)."""
    by_hand, sep, runs = bullet.partition("Code that runs")
    assert sep, f"no 'Code that runs' in: {bullet}"
    count = re.search(r"\*\* \((\d+)\):", by_hand)
    assert count is not None, f"no '(N):' after the title in: {bullet}"
    read = set(MODULE.findall(by_hand))
    if re.match(r"[^:]*: none\.", runs):
        return int(count.group(1)), read, None, set()
    total = re.match(r": (\d+) modules(, these)?", runs)
    assert total is not None, f"no ': M modules' in: {runs}"
    running = set(MODULE.findall(runs))
    if total.group(2):
        running |= read
    return int(count.group(1)), read, int(total.group(1)), running


@pytest.fixture(scope="module")
def measured() -> dict[str, list[str]]:
    done = subprocess.run(
        [sys.executable, str(WALKS), "--json"],
        capture_output=True,
        text=True,
        check=False,
        timeout=120,
        cwd=ROOT,
    )
    assert done.returncode == 0, done.stderr
    found = json.loads(done.stdout)
    assert set(found) == set(TITLES)
    return found


@pytest.mark.parametrize("walk", sorted(TITLES))
def test_the_doc_states_the_measured_walk(walk, measured):
    title = TITLES[walk]
    count, read, total, running = _stated(_bullets()[title])
    modules = set(measured[walk])
    assert running == modules, (
        f"{title}: the doc says {sorted(running)} run, "
        f"walks.py measured {sorted(modules)}"
    )
    assert (total or 0) == len(modules), f"{title}: {total} != {len(modules)}"
    assert count == len(read), f"{title}: ({count}) but names {sorted(read)}"
    if modules:
        assert read <= modules, f"{title}: {sorted(read - modules)} never run"


def test_the_hit_runs_no_code_and_its_walk_stays_short(measured):
    # The targets the design keeps (STYLE): a hit 3, the others at most
    # 8/4/4, and each healing walk at most 4.
    assert [] == measured["call of a built singleton"]
    limits = {
        "One call of a built singleton": 3,
        "One rebuild after an environment write": 8,
        "One fork": 4,
        "One async loop end": 4,
        "One healing retirement": 4,
        "One max_age expiry": 4,
        "One check= probe": 4,
    }
    for title, bullet in _bullets().items():
        count = _stated(bullet)[0]
        assert count <= limits[title], f"{title}: {count} > {limits[title]}"
