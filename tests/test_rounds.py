"""A call's rounds with the lifecycle end: served, or given up, never spun.

Both drivers ask through ``_builds.Rounds``. When every answer is "ask
again" (the live record changed meanwhile, as under a storm of other
threads' rotations), a call gives up after ``MAX_ROUNDS`` requests with an
error naming the factory, reading the key anew between requests, and
leaves nothing half done: the live client stays live, no build is left in
progress and the next call is served.
"""

from __future__ import annotations

import asyncio

import pytest

from poolkeeper import PoolkeeperError, process_singleton
from poolkeeper._lifecycle import MAX_ROUNDS


class _Client:
    def close(self) -> None:
        """Nothing to release."""


def _always_ask_again(life, monkeypatch):
    """Make every request answer "the live record changed: ask again"."""
    requests = []

    def request(*args, **kwargs):
        requests.append(args)

    monkeypatch.setattr(life, "request", request)
    assert "request" in vars(life)
    return requests, lambda: monkeypatch.delattr(life, "request")


class TestGivingUp:
    def test_a_thread_call_gives_up_after_max_rounds(self, monkeypatch):
        """A sync call asks MAX_ROUNDS times, then raises naming it."""
        values = ["a"]
        reads = []

        def key():
            reads.append(values[0])
            return values[0]

        @process_singleton(key=key)
        def make_spinning_client():
            return _Client()

        first = make_spinning_client()
        life = make_spinning_client._self_life
        requests, restore = _always_ask_again(life, monkeypatch)
        values[0] = "b"
        del reads[:]
        with pytest.raises(PoolkeeperError) as raised:
            make_spinning_client()
        assert MAX_ROUNDS == len(requests)
        # The hit path's read, then one after each answer.
        assert MAX_ROUNDS + 1 == len(reads)
        message = str(raised.value)
        assert "make_spinning_client" in message
        assert f"{MAX_ROUNDS} " in message
        assert first is make_spinning_client.current()
        assert make_spinning_client._self_slot.build is None
        restore()
        second = make_spinning_client()
        assert second is not first
        assert second is make_spinning_client()

    def test_a_task_gives_up_after_max_rounds(self, monkeypatch):
        """An async call asks MAX_ROUNDS times, then raises naming it."""
        values = ["a"]

        @process_singleton(key=lambda: values[0])
        async def make_spinning_aclient():
            return _Client()

        async def main():
            first = await make_spinning_aclient()
            life = make_spinning_aclient._self_life
            requests, restore = _always_ask_again(life, monkeypatch)
            values[0] = "b"
            with pytest.raises(PoolkeeperError) as raised:
                await make_spinning_aclient()
            assert MAX_ROUNDS == len(requests)
            assert "make_spinning_aclient" in str(raised.value)
            assert first is make_spinning_aclient.current()
            restore()
            second = await make_spinning_aclient()
            assert second is not first
            assert second is await make_spinning_aclient()

        asyncio.run(main())
