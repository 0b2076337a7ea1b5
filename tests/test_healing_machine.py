"""A Hypothesis state machine over healing, through the public API.

One real ``process_singleton`` keyed by ``keys.env``, with ``retire_on``:
calls, ``retire(c)`` of the live client or a stale one, leases raising a
``retire_on`` exception, leases held across steps, ``reset()``,
environment rotation, ``close_all()``, time passing (the backoff's
timers fire on their own threads) and real ``os.fork()``. The backoff is
patched tiny (5 ms doubling to 20 ms), so deferred retirements are
carried out between steps.

Invariants: never a closed client served; never a client that was
retired (and said so) served to a new call; every client closed at most
once, in this process, never while leased or live; and at the end, once
the timers are done, every client closed exactly once.

New healing rules (``check``, ``max_age``) join as rules here: each one
retires through the same lifecycle, and the invariants stay as they are.
"""

from __future__ import annotations

import contextlib
import os
import threading
import time

import pytest
from helpers import fork_and_check, wait_until
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import (
    RuleBasedStateMachine,
    invariant,
    precondition,
    rule,
)

import poolkeeper
from poolkeeper import _builds, _lifecycle, keys, process_singleton

ENV = "PK_HEALING_MACHINE_KEY"
KEYS = st.sampled_from(["k0", "k1", "k2"])
#: The backoff, patched: first spacing and cap, in seconds.
FIRST, CAP = 0.005, 0.02
#: Forks per test run: each costs a process; a few cover the rule.
MAX_FORKS = 12


class BrokenError(Exception):
    """What a broken client raises: retire_on matches it."""


class Client:
    """A client that knows its key and records its closes (by pid)."""

    def __init__(self, key: str | None) -> None:
        self.key = key
        self.pid = os.getpid()
        self.closes: list[int] = []

    def close(self) -> None:
        self.closes.append(os.getpid())


def _timers() -> list[threading.Thread]:
    return [
        t
        for t in threading.enumerate()
        if t.name == _builds.TIMER_NAME and t.is_alive()
    ]


class Healing(RuleBasedStateMachine):
    """Healing interleaved with rotation, leases, resets, forks, close_all."""

    forks = 0

    def __init__(self) -> None:
        super().__init__()
        self.saved = (_lifecycle.BACKOFF_FIRST, _lifecycle.BACKOFF_CAP)
        _lifecycle.BACKOFF_FIRST, _lifecycle.BACKOFF_CAP = FIRST, CAP
        os.environ[ENV] = "k0"
        self.key = "k0"
        self.built: list[Client] = []
        self.single = process_singleton(
            key=keys.env(ENV), retire_on=BrokenError
        )(self._factory)
        # Clients retired for sure (a retirement that said True, a
        # rotation, close_all): never served to a new call again.
        self.retired: set[int] = set()
        self.leases: list[tuple[Client, contextlib.ExitStack]] = []

    def _factory(self) -> Client:
        client = Client(os.environ.get(ENV))
        self.built.append(client)
        return client

    def _served(self, client: Client) -> None:
        assert isinstance(client, Client)
        assert [] == client.closes, "a closed client was served"
        assert id(client) not in self.retired, "a retired client served"
        assert self.key == client.key

    # -- rules ----------------------------------------------------------------

    @rule()
    def call(self) -> None:
        """A call gets an open client for the current key."""
        self._served(self.single())

    @rule()
    def retire_live(self) -> None:
        """retire(c) of the live client: now, or deferred by the backoff."""
        client = self.single.current()
        if client is None:
            client = self.single()
            self._served(client)
        if self.single.retire(client):
            self.retired.add(id(client))
            assert self.single.current() is None
        else:
            # Deferred: still live and served meanwhile (or its timer
            # has just carried it out).
            deferred = self.single.statistics().deferred
            assert deferred in {"retire", "retire_on", "reset", None}

    @rule(at=st.integers(0, 7))
    def retire_stale(self, at: int) -> None:
        """retire(c) of a client that is no longer live: nothing happens.

        Draws do not depend on the timers (which clients exist does).
        """
        current = self.single.current()
        stale = [c for c in self.built if c is not current]
        if not stale:
            return
        client = stale[at % len(stale)]
        assert not self.single.retire(client)
        assert self.single.current() is current

    @rule()
    def lease_raises(self) -> None:
        """A lease's body raises the retire_on exception; it propagates."""
        error = BrokenError("transport")
        leased: list[Client] = []

        def fail() -> None:
            with self.single.lease() as c:
                self._served(c)
                leased.append(c)
                raise error

        with pytest.raises(BrokenError) as raised:
            fail()
        assert raised.value is error
        if self.single.current() is None:
            # Retired now (not deferred): never served again.
            self.retired.add(id(leased[0]))

    @precondition(lambda self: len(self.leases) < 2)
    @rule()
    def take_lease(self) -> None:
        """Hold a lease across the next steps."""
        stack = contextlib.ExitStack()
        client = stack.enter_context(self.single.lease())
        self._served(client)
        self.leases.append((client, stack))

    @precondition(lambda self: self.leases)
    @rule(data=st.data())
    def drop_lease(self, data: st.DataObject) -> None:
        """Exit one lease."""
        index = data.draw(st.integers(0, len(self.leases) - 1))
        _, stack = self.leases.pop(index)
        stack.close()

    @rule()
    def reset(self) -> None:
        """reset(): retires the live client (no min_rebuild_interval)."""
        current = self.single.current()
        retired = self.single.reset()
        assert (current is not None) == retired
        if current is not None:
            self.retired.add(id(current))

    @rule(key=KEYS)
    def rotate(self, key: str) -> None:
        """The environment variable changes (maybe to the same value)."""
        # The next call retires the live client (or serves it again, if
        # the key came back): the key check in _served covers it.
        os.environ[ENV] = key
        self.key = key

    @rule()
    def close_everything(self) -> None:
        """close_all() retires the live client."""
        current = self.single.current()
        poolkeeper.close_all()
        assert self.single.current() is None
        if current is not None:
            self.retired.add(id(current))

    @rule(ms=st.sampled_from([1, 5, 25]))
    def wait(self, ms: int) -> None:
        """Time passes: deferred retirements' timers fire meanwhile."""
        time.sleep(ms / 1000)

    @rule()
    def fork(self) -> None:
        """A forked child builds its own client and closes none of ours.

        Bounded per run (no precondition: Hypothesis wants those to
        depend on the example alone).
        """
        if Healing.forks >= MAX_FORKS:
            return
        Healing.forks += 1
        parents = list(self.built)
        closes = [list(c.closes) for c in parents]
        single, key = self.single, self.key

        def child() -> bool:
            fresh = single()
            fine = (
                fresh.pid == os.getpid()
                and fresh not in parents
                and fresh.key == key
                and single.retire(fresh)  # No backoff carried over.
                and single() is not fresh
            )
            poolkeeper.close_all()
            return fine and closes == [c.closes for c in parents]

        assert 0 == fork_and_check(child)

    # -- invariants -----------------------------------------------------------

    @invariant()
    def live_and_leased_clients_are_open(self) -> None:
        """current() and leased clients are never closed."""
        current = self.single.current()
        assert current is None or [] == current.closes
        for client, _ in self.leases:
            assert [] == client.closes

    @invariant()
    def closed_at_most_once_here(self) -> None:
        """No client is closed twice, nor by another process."""
        for client in self.built:
            assert len(client.closes) <= 1
            assert set(client.closes) <= {os.getpid()}

    @invariant()
    def backoff_within_bounds(self) -> None:
        """The backoff statistic stays in [0, cap]."""
        assert 0.0 <= self.single.statistics().backoff <= CAP

    def teardown(self) -> None:
        """Leases end, close_all(), timers finish: each closed exactly once."""
        try:
            for _, stack in self.leases:
                stack.close()
            poolkeeper.close_all()
            assert wait_until(
                lambda: all(1 == len(c.closes) for c in self.built), 5.0
            ), [c.closes for c in self.built]
            # This singleton's timers: after close_all they find nothing.
            wait_until(lambda: not _timers(), 1.0)
            assert all([os.getpid()] == c.closes for c in self.built)
            counts = self.single.statistics().retirements
            assert sum(counts.values()) == len(self.built)
        finally:
            _lifecycle.BACKOFF_FIRST, _lifecycle.BACKOFF_CAP = self.saved
            os.environ.pop(ENV, None)


TestHealing = Healing.TestCase
TestHealing.settings = settings(
    max_examples=min(settings.default.max_examples, 300),
    stateful_step_count=20,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow],
)

# Real timers and forks: more than the suite's default per-test timeout.
pytestmark = pytest.mark.timeout(1800)
