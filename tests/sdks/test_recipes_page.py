"""docs/sdk-recipes.md shows only recipe modules that this suite runs."""

from __future__ import annotations

import re
from pathlib import Path

from sdk_drivers import SYNC, Requests

DOCS = Path(__file__).resolve().parents[2] / "docs"
FENCE = re.compile(r"^```(.*)$", re.MULTILINE)
INCLUDE = re.compile(r"^```\{literalinclude\} (\S+)$", re.MULTILINE)


class TestRecipesPage:
    def test_every_code_block_includes_a_tested_recipe(self):
        """Each block is a literalinclude of a recipe the drivers load."""
        page = (DOCS / "sdk-recipes.md").read_text(encoding="utf-8")
        openers = FENCE.findall(page)[::2]
        included = INCLUDE.findall(page)
        assert len(openers) == len(included)
        files = {p.name for p in (DOCS / "recipes").glob("*.py")}
        assert files == {Path(name).name for name in included}
        assert files == {f"{cls.recipe}.py" for cls in SYNC}

    def test_requests_helper(self, recipe, http_server, monkeypatch):
        """The requests recipe's get() sends the token over the session."""
        driver = Requests(recipe("sdk_requests"), http_server, monkeypatch)
        reply = driver.module.get("/ping").json()
        assert "Bearer token-1" == reply["auth"]
        assert int(reply["conn"]) in driver.process_ports()
        assert 1 == driver.singleton.statistics().builds
