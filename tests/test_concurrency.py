"""A Hypothesis state machine over calls, keys, resets, leases and forks.

Two singletons run side by side against one plain model: one keyed on an
environment variable (changes pushed, C hit path) and one on a polled
function. Every rule runs on real threads or in a real forked child.
"""

from __future__ import annotations

import contextlib
import os

import pytest
from helpers import fork_and_check, run_threads
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

from poolkeeper import ProcessSingleton, close_all, keys, process_singleton

ENV = "PK_STATE_MACHINE_KEY"
KEYS = st.sampled_from(["k0", "k1", "k2"])


class Client:
    """A client that knows its key and records its closes."""

    def __init__(self, key: str | None) -> None:
        self.key = key
        self.pid = os.getpid()
        self.closes: list[int] = []

    def close(self) -> None:
        self.closes.append(os.getpid())


class Lifecycle(RuleBasedStateMachine):
    """Drive two singletons and check them against a model after each step."""

    def __init__(self) -> None:
        super().__init__()
        os.environ[ENV] = "k0"
        self.key = "k0"
        self.fail = False
        self.built: list[Client] = []
        self.singles: dict[str, ProcessSingleton[Client]] = {
            "pushed": process_singleton(key=keys.env(ENV))(self._factory),
            "polled": process_singleton(key=lambda: self.key)(self._factory),
        }
        # The model: the live client of each singleton, and leases.
        self.live: dict[str, Client | None] = dict.fromkeys(self.singles)
        self.leases: list[tuple[str, Client, contextlib.ExitStack]] = []
        self.retired: set[int] = set()

    def _factory(self) -> Client:
        if self.fail:
            raise ConnectionError("injected build failure")
        client = Client(os.environ.get(ENV))
        self.built.append(client)
        return client

    def _retire(self, client: Client | None) -> None:
        if client is not None:
            self.retired.add(id(client))

    # -- rules --------------------------------------------------------------

    @rule(name=st.sampled_from(["pushed", "polled"]), n=st.integers(1, 4))
    def call(self, name: str, n: int) -> None:
        """N threads call at once: all get the one client for the key."""
        single = self.singles[name]
        results = run_threads(single, n)
        live = self.live[name]
        if self.fail and (live is None or live.key != self.key):
            assert all(isinstance(r, ConnectionError) for r in results)
            return
        first = results[0]
        assert isinstance(first, Client)
        assert all(r is first for r in results)
        assert self.key == first.key
        assert [] == first.closes
        if live is not None and live.key == self.key:
            assert live is first
        elif live is not first:
            self._retire(live)
        self.live[name] = first

    @rule(key=KEYS)
    def set_key(self, key: str) -> None:
        """Rotate the key (environment and polled function together)."""
        self.key = key
        os.environ[ENV] = key

    @rule(fail=st.booleans())
    def set_failing(self, fail: bool) -> None:
        """Make the following builds fail, or succeed again."""
        self.fail = fail

    @rule(name=st.sampled_from(["pushed", "polled"]))
    def reset(self, name: str) -> None:
        """reset() retires the live client, if any."""
        retired = self.singles[name].reset()
        assert (self.live[name] is not None) == retired
        self._retire(self.live[name])
        self.live[name] = None

    @precondition(lambda self: len(self.leases) < 3 and not self.fail)
    @rule(name=st.sampled_from(["pushed", "polled"]))
    def take_lease(self, name: str) -> None:
        """Lease the current client."""
        stack = contextlib.ExitStack()
        client = stack.enter_context(self.singles[name].lease())
        live = self.live[name]
        if live is not None and live is not client:
            self._retire(live)
        self.live[name] = client
        self.leases.append((name, client, stack))

    @precondition(lambda self: bool(self.leases))
    @rule(data=st.data())
    def drop_lease(self, data: st.DataObject) -> None:
        """Exit one lease."""
        index = data.draw(st.integers(0, len(self.leases) - 1))
        _, _, stack = self.leases.pop(index)
        stack.close()

    @rule()
    def close_everything(self) -> None:
        """close_all() retires every live client."""
        close_all()
        for name, client in self.live.items():
            self._retire(client)
            self.live[name] = None

    @precondition(lambda self: not self.fail)
    @rule()
    def fork(self) -> None:
        """A forked child builds its own clients and closes none of ours."""
        parents = list(self.built)
        closes = [list(c.closes) for c in parents]
        singles = self.singles

        def child() -> bool:
            fresh = [single() for single in singles.values()]
            close_all()
            return all(
                c.pid == os.getpid() and c not in parents for c in fresh
            ) and closes == [c.closes for c in parents]

        assert 0 == fork_and_check(child)

    # -- invariants ---------------------------------------------------------

    @invariant()
    def at_most_one_live_client(self) -> None:
        """current() is the model's live client, never a closed one."""
        for name, single in self.singles.items():
            current = single.current()
            assert self.live[name] is current
            assert current is None or [] == current.closes

    @invariant()
    def retired_clients_close_exactly_once(self) -> None:
        """Retired clients close once, after their last lease, in this pid."""
        leased = {id(client) for _, client, _ in self.leases}
        for client in self.built:
            retired = id(client) in self.retired
            expected = 1 if retired and id(client) not in leased else 0
            assert expected == len(client.closes), client
            assert set(client.closes) <= {os.getpid()}

    def teardown(self) -> None:
        """Release leases and close everything."""
        for _, _, stack in self.leases:
            stack.close()
        close_all()
        for client in self.built:
            assert len(client.closes) <= 1


TestLifecycle = Lifecycle.TestCase
TestLifecycle.settings = settings(
    stateful_step_count=12,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# 2,000 examples (20,000 under the soak profile) of up to 12 steps, with
# real threads and forks, outlast the suite's default per-test timeout.
pytestmark = pytest.mark.timeout(3600)
