"""The recipe: a fake SDK in sys.modules, every singleton reset per test."""

from __future__ import annotations

import importlib.abc
import sys
import types
from typing import ClassVar

import poolkeeper
import pytest


class _NoSdk(importlib.abc.MetaPathFinder):
    """Make this run look like a CI without the SDK installed."""

    def find_spec(self, name, path=None, target=None):
        if name.partition(".")[0] == "daytona":
            raise ModuleNotFoundError(name, name=name)


sys.meta_path.insert(0, _NoSdk())


@pytest.fixture(autouse=True)
def _fresh_singletons():
    """No client built in one test is seen by another."""
    poolkeeper.close_all()
    yield
    poolkeeper.close_all()


@pytest.fixture(name="fake_daytona")
def _fake_daytona(monkeypatch):
    """Put a fake ``daytona`` module into sys.modules for one test."""
    module = types.ModuleType("daytona")

    class Daytona:
        built: ClassVar[list[Daytona]] = []

        def __init__(self):
            Daytona.built.append(self)

        def create(self):
            return f"sandbox of {id(self)}"

    module.Daytona = Daytona
    # monkeypatch removes it again after the test: nothing leaks.
    monkeypatch.setitem(sys.modules, "daytona", module)
    return module
