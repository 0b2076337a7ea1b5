"""Adapters' close and fork hooks, found through an entry point."""

from __future__ import annotations

import importlib.metadata
import logging
import os
import sys
import types

import pytest
from helpers import fork_and_check

from poolkeeper import _adapters, close_all, process_singleton


class Conn:
    """A client type of a pretend SDK: no close() of its own."""

    def __init__(self) -> None:
        self.closed = 0
        self.inert = False


Conn.__module__ = "fakesdk.client"


def _hooks_for(kind):
    if kind is not Conn:
        return None

    def close(client):
        client.closed += 1

    def after_fork(client):
        client.inert = True

    return types.SimpleNamespace(close=close, after_fork=after_fork)


@pytest.fixture(name="adapter")
def _adapter(monkeypatch):
    """Install a pretend adapter whose entry point is named fakesdk."""
    module = types.ModuleType("fakesdk_adapter")
    module.hooks = _hooks_for
    monkeypatch.setitem(sys.modules, "fakesdk_adapter", module)
    point = importlib.metadata.EntryPoint(
        name="fakesdk", value="fakesdk_adapter:hooks", group=_adapters.GROUP
    )
    monkeypatch.setattr(_adapters, "_points", {"fakesdk": point})
    monkeypatch.setattr(_adapters, "_hooks", {})
    monkeypatch.setattr(_adapters, "_said", set())


class TestAdapterHooks:
    """A singleton with no close= or after_fork= uses the adapter's."""

    def test_close_all_uses_the_adapters_close(self, adapter):
        """The client is closed by the hook, exactly once."""

        @process_singleton
        def conn():
            return Conn()

        client = conn()
        close_all()

        assert 1 == client.closed
        assert 1 == conn.statistics().closes

    def test_a_written_close_wins(self, adapter):
        """close= is used, never the adapter's close."""
        closed = []

        @process_singleton(close=closed.append)
        def conn():
            return Conn()

        client = conn()
        close_all()

        assert [client] == closed
        assert 0 == client.closed

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
    def test_forked_child_runs_the_adapters_fork_hook(self, adapter):
        """The inherited client gets the adapter's after_fork in the child."""

        @process_singleton
        def conn():
            return Conn()

        parent = conn()

        def child() -> bool:
            return parent.inert and conn() is not parent

        assert 0 == fork_and_check(child)
        assert not parent.inert

    def test_an_unknown_type_is_not_given_hooks(self, adapter):
        """Another type of the same package falls back to close()."""
        hooks = _adapters.learn(types.SimpleNamespace())

        assert (None, None) == (hooks.close, hooks.after_fork)


class Pooled:
    """Another type of the pretend SDK, with a close() of its own."""

    def __init__(self) -> None:
        self.closed = 0

    def close(self) -> None:
        self.closed += 1


Pooled.__module__ = "fakesdk.pool"


class Bare:
    """A type of the pretend SDK that neither it nor its adapter closes."""


Bare.__module__ = "fakesdk.bare"


class TestAdapterFailures:
    """An adapter's bug or silence is never the build's."""

    def test_an_adapter_that_raises_is_logged_and_passed_over(
        self, adapter, monkeypatch, caplog
    ):
        """Its clients are built, and closed by their own close()."""

        def broken(kind):
            msg = "adapter bug"
            raise RuntimeError(msg)

        monkeypatch.setattr(sys.modules["fakesdk_adapter"], "hooks", broken)

        @process_singleton
        def pooled():
            return Pooled()

        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            client = pooled()
        close_all()

        assert 1 == client.closed
        (said,) = [r for r in caplog.records if "failed" in r.getMessage()]
        assert "fakesdk_adapter:hooks" in said.getMessage()
        assert "fakesdk.pool.Pooled" in said.getMessage()
        assert "RuntimeError raised at" in said.getMessage()
        assert said.exc_info is None

    def test_an_adapter_with_no_hooks_for_a_type_is_named(
        self, adapter, caplog
    ):
        """A type its adapter has no close for: the warning says so."""

        @process_singleton
        def bare():
            return Bare()

        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            bare()
            bare.reset()

        (said,) = [r.getMessage() for r in caplog.records]
        assert "fakesdk.bare.Bare" in said
        assert "fakesdk_adapter:hooks (installed) has no close" in said

    def test_unreadable_metadata_means_no_adapters(self, monkeypatch, caplog):
        """Entry points that cannot be read: logged, and no adapter."""

        def unreadable(**kwargs):
            msg = "broken metadata"
            raise OSError(msg)

        monkeypatch.setattr(_adapters, "_points", None)
        monkeypatch.setattr(_adapters, "_hooks", {})
        monkeypatch.setattr(importlib.metadata, "entry_points", unreadable)

        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            hooks = _adapters.learn(Pooled())

        assert (None, None) == (hooks.close, hooks.after_fork)
        assert {} == _adapters._points
        said = next(
            r for r in caplog.records if "entry points" in r.getMessage()
        )
        assert "OSError raised at" in said.getMessage()
        assert "broken metadata" not in caplog.text


class TestNoCloseKnown:
    """A client type with no close at all is named once."""

    @pytest.fixture(autouse=True)
    def _fresh(self, monkeypatch):
        monkeypatch.setattr(_adapters, "_said", set())

    def test_said_once_naming_the_type(self, caplog):
        """Two closes of such clients log one WARNING that names the type."""

        class Bare:
            pass

        @process_singleton
        def bare():
            return Bare()

        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            bare()
            bare.reset()
            bare()
            bare.reset()

        said = [r.getMessage() for r in caplog.records]
        assert 1 == len(said), said
        assert "test_said_once_naming_the_type.<locals>.Bare" in said[0]
        assert "close=" in said[0]

    def test_names_the_adapter_that_would_close_it(self, caplog):
        """A type of an SDK poolkeeper knows names its adapter."""
        kind = type("Daytona", (), {"__module__": "daytona._sync.daytona"})
        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            _adapters.say_unclosed("make", kind())

        (said,) = [r.getMessage() for r in caplog.records]
        assert "daytona._sync.daytona.Daytona" in said
        assert "poolkeeper-daytona" in said
