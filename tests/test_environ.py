"""keys.env when os.environ cannot be watched: it reads on every call."""

from __future__ import annotations

import os

from helpers import FakeClient

from poolkeeper import keys, process_singleton


class TestUnwatchableEnviron:
    def test_plain_dict_environ_is_polled(self, monkeypatch):
        """A mapping whose class cannot be swapped is read on every call."""
        environ = {"PK_POLLED": "1"}
        monkeypatch.setattr(os, "environ", environ)
        single = process_singleton(key=keys.env("PK_POLLED"))(FakeClient)
        first = single()
        assert first is single()
        environ["PK_POLLED"] = "2"
        second = single()
        assert second is not first
        assert first.closed
        assert 2 == single.statistics().generation
