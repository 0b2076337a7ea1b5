"""Sync singletons at the edges: a lease on a failing build, handles."""

from __future__ import annotations

import pytest
from helpers import FakeClient

from poolkeeper import process_singleton


class TestSyncLease:
    def test_lease_whose_build_fails_propagates_and_pins_nothing(self):
        """A failing factory's error leaves a sync lease() pinning nothing."""

        def build() -> FakeClient:
            raise ConnectionError("refused")

        single = process_singleton(build)
        with pytest.raises(ConnectionError), single.lease():
            pass  # pragma: no cover -- the build raised.
        stats = single.statistics()
        assert (0, 1, 0) == (stats.builds, stats.build_failures, stats.leases)


class TestProxy:
    def test_repr_names_the_singleton_and_builds_nothing(self):
        """A handle's repr() says what it follows and builds no client."""
        single = process_singleton(FakeClient)
        handle = single.proxy()
        assert repr(handle) == f"<poolkeeper proxy of {single!r}>"
        assert None is single.current()

    def test_operator_on_a_fresh_handle_builds_the_client(self):
        """len() on a never-used handle builds the client and uses it."""

        class Sized:
            def __len__(self) -> int:
                return 7

        single = process_singleton(Sized)
        handle = single.proxy()
        assert 7 == len(handle)
        assert isinstance(single.current(), Sized)
