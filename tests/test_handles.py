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

    def test_protocols_resolve_the_live_client_after_rotation(self):
        """truth, len, iter, in, [], str and call follow a rebuild."""

        class Box:
            def __init__(self, items: list[str]) -> None:
                self.items = items

            def __bool__(self) -> bool:
                return bool(self.items)

            def __len__(self) -> int:
                return len(self.items)

            def __iter__(self):
                return iter(self.items)

            def __contains__(self, item: object) -> bool:
                return item in self.items

            def __getitem__(self, index: int) -> str:
                return self.items[index]

            def __str__(self) -> str:
                return "+".join(self.items)

            def __call__(self, suffix: str) -> str:
                return self.items[0] + suffix

        contents = [["a"]]
        single = process_singleton(key=lambda: len(contents))(
            lambda: Box(contents[-1])
        )
        handle = single.proxy()
        assert (True, 1, ["a"], True, "a", "a", "a!") == (
            bool(handle),
            len(handle),
            list(handle),
            "a" in handle,
            handle[0],
            str(handle),
            handle("!"),
        )
        contents.append([])  # The key changes: the next use rebuilds.
        assert (False, 0, [], False, "") == (
            bool(handle),
            len(handle),
            list(handle),
            "a" in handle,
            str(handle),
        )
