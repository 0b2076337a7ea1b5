"""The threads page's table is what the suite's own runs measured.

``docs/threads/table.inc`` must be ``docs/threads/outcomes.json``
rendered, and each row of that file is checked against this run by the
test that measures it (``sdk_outcomes.record``). Here: the rendering, and
that every committed row is one a test of this suite records.
"""

from __future__ import annotations

import json

import sdk_outcomes
from sdk_drivers import SYNC

#: The rows the 128-thread tests record (test_sdk_threads.py,
#: test_sdk_cookies.py, test_sdk_pipeline.py).
RECORDED = {
    *(cls.__name__ for cls in SYNC),
    "Requests default pool",
    *(
        f"{sdk} cookies, scope {scope}"
        for sdk in ("Requests", "Httpx")
        for scope in ("process", "thread")
    ),
    "Redis pipeline, scope process",
    "Redis pipeline, scope thread",
}


def _committed():
    return json.loads(sdk_outcomes.OUTCOMES.read_text(encoding="utf-8"))


def test_the_table_is_the_committed_outcomes_rendered():
    render = sdk_outcomes.render_module()
    table = render.TABLE.read_text(encoding="utf-8")
    assert render.render(_committed()) == table
    assert 0 == render.main(["--check"])


def test_every_committed_row_is_measured_by_a_test():
    assert RECORDED == set(_committed()["rows"])


def test_a_row_that_disagrees_in_a_category_is_caught():
    render = sdk_outcomes.render_module()
    row = dict(_committed()["rows"]["Redis pipeline, scope thread"])
    assert "safe" == render.outcome(row)
    worse = {**row, "wrong": 1}
    assert render.categories(worse) != render.categories(row)
    assert "**wrong answers**" == render.outcome(worse)
    # Another count of the same category agrees: numbers vary per run.
    shared = _committed()["rows"]["Redis"]
    other = {**shared, "connections": 3, "requests": 7}
    assert render.categories(other) == render.categories(shared)
    beyond = {**shared, "connections": shared["pool"] + 1}
    assert render.categories(beyond) != render.categories(shared)
