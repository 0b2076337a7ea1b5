"""The hit path in instructions: a deterministic guard, run under callgrind.

``benchmarks/callgrind_hits.py`` counts the instructions of one call of a
row (two runs of a child Python under ``valgrind --tool=callgrind``, the
difference divided by the calls); counts do not move with the machine's
load, so they can be asserted where wall-clock times cannot. Guarded here:

- ``max_age=`` and ``check=`` (issue 21) cost a call of a built singleton
  nothing between deadlines and probes: the same instructions as no key;
- an OpenTelemetry SDK meter provider set (issue 24) costs it nothing;
- the no-key hit and a lease stay within their measured cost of a
  ``functools.cache`` hit (1.49x and 25.1x on CPython 3.11.7), with room
  for a small change, not for a regression.

The toggle functions the benchmark collects in are CPython 3.11's, so this
runs on a CPython 3.11 with the GIL. ``.ci/run`` installs valgrind and sets
``POOLKEEPER_REQUIRE_VALGRIND=1``: there a missing valgrind fails.
"""

from __future__ import annotations

import importlib.util
import os
import shutil
import sys
import tempfile
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

BENCH = Path(__file__).parent.parent / "benchmarks" / "callgrind_hits.py"

pytestmark = [
    pytest.mark.skipif(
        sys.implementation.name != "cpython"
        or sys.version_info[:2] != (3, 11),
        reason="callgrind_hits.py collects in CPython 3.11's C functions",
    ),
    pytest.mark.timeout(1200),
]


def _bench():
    spec = importlib.util.spec_from_file_location("callgrind_hits", BENCH)
    assert spec is not None
    assert spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


@pytest.fixture(scope="module")
def costs() -> dict[str, float]:
    if shutil.which("valgrind") is None:
        if os.environ.get("POOLKEEPER_REQUIRE_VALGRIND"):
            pytest.fail("valgrind is required here (.ci/run installs it)")
        pytest.skip("valgrind is not installed (Debian: apt install valgrind)")
    pytest.importorskip("opentelemetry.sdk.metrics")
    bench = _bench()
    rows = (
        "functools.cache hit",
        "no key",
        "no key, max_age + check",
        "no key, OpenTelemetry provider set",
        "with single.lease()",
    )
    # Ten valgrind runs, each mostly the child's start-up under callgrind:
    # run side by side (counts do not depend on the machine's load).
    with (
        tempfile.TemporaryDirectory() as tmp,
        ThreadPoolExecutor(max_workers=max(2, os.cpu_count() or 1)) as pool,
    ):
        scratch = Path(tmp)
        # A row's cost per call: its count at 2,000 calls less its count at
        # 1,000, over 1,000 (as bench._per_call computes it).
        futures = {
            (row, n): pool.submit(bench._count, row, n, scratch)
            for row in rows
            for n in (1_000, 2_000)
        }
        counts = {at: future.result() for at, future in futures.items()}
    measured = {
        row: None
        if None in (counts[row, 1_000], counts[row, 2_000])
        else (counts[row, 2_000] - counts[row, 1_000]) / 1_000
        for row in rows
    }
    assert all(cost is not None for cost in measured.values()), measured
    return measured


def test_max_age_and_check_cost_a_call_nothing(costs):
    assert costs["no key, max_age + check"] == pytest.approx(
        costs["no key"], abs=2
    ), costs


def test_a_meter_provider_costs_a_call_nothing(costs):
    assert costs["no key, OpenTelemetry provider set"] == pytest.approx(
        costs["no key"], abs=2
    ), costs


def test_the_hit_and_the_lease_against_functools_cache(costs):
    cache = costs["functools.cache hit"]
    assert costs["no key"] <= 1.6 * cache, costs
    assert costs["with single.lease()"] <= 27 * cache, costs
