"""Retirement: closing exactly once, outside the lock, after leases."""

from __future__ import annotations

import logging
import subprocess
import sys
import textwrap
import threading

import pytest
from helpers import WAIT, Factory, FakeClient, NoCloseClient

import poolkeeper
from poolkeeper import UnclosedClientWarning, close_all, process_singleton


class TestCloseHook:
    def test_client_close_is_the_default(self):
        """Without close=, a retired client's own close() runs once."""
        single = process_singleton(Factory())
        client = single()

        assert single.reset()
        assert 1 == len(client.closes)
        assert not single.reset()
        assert 1 == len(client.closes)
        assert 1 == single.statistics().closes

    def test_close_option_wins(self):
        """close= is called with the client instead of its close()."""
        closed: list[object] = []
        single = process_singleton(close=closed.append)(Factory())
        client = single()

        single.reset()

        assert [client] == closed
        assert [] == client.closes

    def test_client_without_close_is_dropped_with_a_debug_log(self, caplog):
        """A client with nothing to close is dropped; a debug log says so."""
        caplog.set_level(logging.DEBUG, logger="poolkeeper")

        @process_singleton
        def make_plain() -> NoCloseClient:
            return NoCloseClient()

        make_plain()
        assert make_plain.reset()

        assert "no close()" in caplog.text
        assert "make_plain" in caplog.text
        stats = make_plain.statistics()
        assert (0, 0) == (stats.closes, stats.close_failures)

    def test_failing_close_is_logged_and_counted_not_raised(self, caplog):
        """A close that raises is a WARNING naming the error's type and
        where it was raised, never its message; never an error."""

        def explode(client):
            raise OSError("DELETE https://api/x?token=s3cr3t failed")

        single = process_singleton(close=explode)(Factory())
        single()

        with caplog.at_level(logging.WARNING, logger="poolkeeper"):
            assert single.reset()

        records = [r for r in caplog.records if r.name == "poolkeeper"]
        assert 1 == len(records)
        assert logging.WARNING == records[0].levelno
        assert records[0].exc_info is None
        said = caplog.text
        assert "OSError raised at test_close.py:" in said
        assert "in explode" in said
        assert "s3cr3t" not in said
        assert 1 == single.statistics().close_failures
        assert single() is not None

    def test_the_error_itself_is_logged_only_at_debug(self, caplog):
        """Asked for (DEBUG on the logger): a record with the traceback."""

        def explode(client):
            raise OSError("DELETE https://api/x?token=s3cr3t failed")

        single = process_singleton(close=explode)(Factory())
        single()
        with caplog.at_level(logging.DEBUG, logger="poolkeeper"):
            assert single.reset()
        (detail,) = [r for r in caplog.records if r.exc_info]
        assert logging.DEBUG == detail.levelno
        assert isinstance(detail.exc_info[1], OSError)
        assert "s3cr3t" in caplog.text

    def test_async_close_is_warned_about_not_dropped(self):
        """A close hook returning a coroutine warns instead of leaking it."""

        async def aclose(client):
            client.close()  # pragma: no cover -- never awaited, by design.

        single = process_singleton(close=aclose)(Factory())
        client = single()

        with pytest.warns(UnclosedClientWarning, match="awaitable"):
            single.reset()

        assert not client.closed
        assert 1 == single.statistics().close_failures

    def test_close_runs_outside_the_lock(self):
        """While a retired client closes, the singleton serves new calls."""
        closing = threading.Event()
        release = threading.Event()

        def slow_close(client):
            closing.set()
            assert release.wait(WAIT)

        factory = Factory()
        single = process_singleton(close=slow_close)(factory)
        old = single()
        resetter = threading.Thread(target=single.reset)
        resetter.start()
        try:
            assert closing.wait(WAIT)
            new = single()
            assert new is not old
            assert 0 == single.statistics().closes
        finally:
            release.set()
            resetter.join(WAIT)
        assert not resetter.is_alive()
        assert 1 == single.statistics().closes


class TestLease:
    def test_leased_client_closes_when_the_last_lease_exits(self):
        """A retired client stays open until every lease on it exits."""
        single = process_singleton(Factory())
        with single.lease() as outer:
            with single.lease() as inner:
                assert outer is inner
                assert 2 == single.statistics().leases
                single.reset()
                assert not outer.closed
                assert 1 == single.statistics().pending_close
            assert not outer.closed
        assert outer.closed
        stats = single.statistics()
        assert (0, 0, 1) == (stats.leases, stats.pending_close, stats.closes)

    def test_lease_across_key_rotation(self):
        """A lease taken before a rotation keeps its client usable."""
        value = ["a"]
        single = process_singleton(key=lambda: value[0])(Factory())
        with single.lease() as old:
            value[0] = "b"
            new = single()
            assert new is not old
            assert not old.closed
        assert old.closed
        assert not new.closed

    def test_lease_builds_when_nothing_is_live(self):
        """Leasing an unbuilt singleton builds it."""
        factory = Factory()
        single = process_singleton(factory)
        with single.lease() as client:
            assert client is single.current()
        assert 1 == factory.calls
        assert not client.closed

    def test_lease_exit_on_error_still_releases(self):
        """An exception inside the block releases the lease."""
        single = process_singleton(Factory())
        with pytest.raises(KeyError), single.lease():
            raise KeyError
        assert 0 == single.statistics().leases


class TestReset:
    def test_reset_without_client_returns_false(self):
        """Nothing live, nothing retired."""
        assert not process_singleton(Factory()).reset()

    def test_min_rebuild_interval_refuses_early_resets(self, monkeypatch):
        """reset() within the interval of a build retires nothing."""
        now = [1000.0]
        monkeypatch.setattr("poolkeeper._sync.time.monotonic", lambda: now[0])
        factory = Factory()
        single = process_singleton(min_rebuild_interval=30)(factory)
        client = single()

        refused = [single.reset() for _ in range(50)]

        assert [False] * 50 == refused
        assert client is single()
        assert not client.closed
        assert 50 == single.statistics().resets_refused
        now[0] += 30.5
        assert single.reset()
        assert client.closed
        assert 2 == len({id(single()), id(client)})
        assert 2 == factory.calls


class TestCloseAll:
    def test_closes_in_reverse_build_order(self):
        """The last client built is the first closed."""
        order: list[str] = []
        first = process_singleton(close=lambda c: order.append("first"))(
            Factory()
        )
        second = process_singleton(close=lambda c: order.append("second"))(
            Factory()
        )
        second()
        first()

        close_all()

        assert ["first", "second"] == order
        assert first.current() is None
        assert second.current() is None

    def test_singletons_build_again_after_close_all(self):
        """close_all() is a reset of everything, not a tombstone."""
        single = process_singleton(Factory())
        old = single()
        close_all()
        assert single() is not old

    def test_close_all_ignores_the_rate_limit(self):
        """Shutdown closes even a client built a moment ago."""
        single = process_singleton(min_rebuild_interval=3600)(Factory())
        client = single()
        close_all()
        assert client.closed

    def test_close_all_runs_at_interpreter_exit(self):
        """A process that exits normally closes its live clients."""
        program = textwrap.dedent(
            """
            import poolkeeper

            class Client:
                def close(self):
                    print("closed", flush=True)

            @poolkeeper.process_singleton
            def make():
                return Client()

            make()
            print("exiting", flush=True)
            """
        )
        done = subprocess.run(
            [sys.executable, "-c", program],
            capture_output=True,
            text=True,
            timeout=WAIT * 3,
            check=True,
        )
        assert ["exiting", "closed"] == done.stdout.split()


class TestOverride:
    def test_override_returns_the_object_and_never_closes_it(self):
        """Inside override() every call returns obj; nothing closes it."""
        factory = Factory()
        single = process_singleton(factory)
        live = single()
        fake = FakeClient("fake")

        with single.override(fake) as got:
            assert got is fake
            assert fake is single()
            assert fake is single.current()
            assert single.statistics().is_overridden
            single.reset()
            assert fake is single()
        assert not fake.closed
        assert live.closed
        assert single() is not live
        assert 2 == factory.calls

    def test_override_restores_the_live_client(self):
        """After the block the previous client is served again."""
        single = process_singleton(Factory())
        live = single()
        with single.override(FakeClient()):
            pass
        assert live is single()

    def test_overrides_nest(self):
        """The innermost override wins and unwinds in order."""
        single = process_singleton(Factory())
        a, b = FakeClient("a"), FakeClient("b")
        with single.override(a):
            with single.override(b):
                assert b is single()
            assert a is single()

    def test_override_of_a_keyed_singleton(self):
        """Overrides win over polled keys too."""
        single = process_singleton(key=lambda: 1)(Factory())
        fake = FakeClient()
        with single.override(fake), single.lease() as leased:
            assert fake is single()
            assert fake is leased


def test_statistics_is_frozen():
    """Statistics snapshots cannot be modified."""
    stats = process_singleton(Factory()).statistics()
    with pytest.raises(AttributeError):
        stats.builds = 3  # type: ignore[misc]
    assert isinstance(stats, poolkeeper.Statistics)
