"""Keys: rebuilding when the configuration changes, and hiding secrets."""

from __future__ import annotations

import logging
import os
import sys
import threading

import pytest
from helpers import WAIT, Factory, FakeClient, blocked_in

import poolkeeper
from poolkeeper import fingerprint, keys, process_singleton

SECRET = "sk-live-0123456789abcdef"


@pytest.fixture(name="env")
def _env(monkeypatch):
    """Start each test with the test variables set to known values."""
    monkeypatch.setenv("PK_TEST_KEY", SECRET)
    monkeypatch.setenv("PK_TEST_URL", "http://127.0.0.1:1")
    return monkeypatch


class TestEnvKey:
    def test_rotation_builds_once_and_closes_the_old_client(self, env):
        """Changing a keyed variable rebuilds once and closes the old one."""
        factory = Factory()
        single = process_singleton(key=keys.env("PK_TEST_KEY", "PK_TEST_URL"))(
            factory
        )
        old = single()
        assert old is single()

        env.setenv("PK_TEST_KEY", "sk-rotated")
        new = single()

        assert new is not old
        assert new is single()
        assert [os.getpid()] == old.closes
        assert not new.closed
        assert 2 == factory.calls
        assert 2 == single.statistics().generation

    @pytest.mark.parametrize(
        "change",
        [
            pytest.param(
                lambda: os.environ.update(PK_TEST_URL="u2"), id="update"
            ),
            pytest.param(lambda: os.environ.pop("PK_TEST_URL"), id="pop"),
            pytest.param(
                lambda: os.environ.__delitem__("PK_TEST_URL"), id="del"
            ),
            pytest.param(
                lambda: os.environ.__setitem__("PK_TEST_URL", "u3"), id="set"
            ),
        ],
    )
    def test_every_mapping_change_is_noticed(self, env, change):
        """Assignment, del, update() and pop() on os.environ all rebuild."""
        single = process_singleton(key=keys.env("PK_TEST_URL"))(Factory())
        old = single()

        change()

        assert single() is not old
        assert old.closed

    def test_setting_the_same_value_keeps_the_client(self, env):
        """Re-assigning an unchanged value does not rebuild."""
        factory = Factory()
        single = process_singleton(key=keys.env("PK_TEST_KEY"))(factory)
        old = single()

        os.environ["PK_TEST_KEY"] = SECRET

        assert old is single()
        assert 1 == factory.calls

    def test_same_value_write_keeps_the_hit_path_armed(self, env):
        """Writing the value already there invalidates nothing at all."""
        single = process_singleton(key=keys.env("PK_TEST_KEY"))(Factory())
        single()
        epoch = single._self_life.epoch

        os.environ["PK_TEST_KEY"] = SECRET
        os.environb[b"PK_TEST_KEY"] = SECRET.encode()

        assert epoch == single._self_life.epoch
        assert [] == _frames_of(single)

    def test_write_disarms_only_the_watchers_of_that_name(self, env):
        """A write to one name leaves singletons keyed on others armed."""
        by_key = process_singleton(key=keys.env("PK_TEST_KEY"))(Factory())
        by_url = process_singleton(key=keys.env("PK_TEST_URL"))(Factory())
        by_key()
        by_url()

        os.environ["PK_TEST_KEY"] = "rotated"

        assert [] == _frames_of(by_url)
        assert [] != _frames_of(by_key)

    def test_unrelated_variables_do_not_matter(self, env):
        """A change to a variable outside the key keeps the client."""
        factory = Factory()
        single = process_singleton(key=keys.env("PK_TEST_KEY"))(factory)
        old = single()

        env.setenv("PK_TEST_OTHER", "x")

        assert old is single()
        assert 1 == factory.calls

    def test_unset_variables_are_part_of_the_key(self, env):
        """Setting a variable that was unset rebuilds."""
        env.delenv("PK_TEST_LATE", raising=False)
        single = process_singleton(key=keys.env("PK_TEST_LATE"))(Factory())
        old = single()

        env.setenv("PK_TEST_LATE", "now")

        assert single() is not old

    def test_putenv_is_not_noticed(self, env):
        """os.putenv bypasses os.environ, so neither it nor the key sees it."""
        factory = Factory()
        single = process_singleton(key=keys.env("PK_TEST_KEY"))(factory)
        old = single()

        os.putenv("PK_TEST_KEY", "sk-invisible")

        assert old is single()
        assert SECRET == os.environ["PK_TEST_KEY"]

    def test_change_during_a_build_is_not_lost(self, env):
        """A rotation while a build is in progress causes one more build."""
        gate = threading.Event()
        factory = Factory(gate=gate)
        single = process_singleton(key=keys.env("PK_TEST_KEY"))(factory)
        first: list[FakeClient] = []
        thread = threading.Thread(target=lambda: first.append(single()))
        thread.start()
        assert factory.entered.wait(WAIT)
        env.setenv("PK_TEST_KEY", "sk-rotated-mid-build")
        gate.set()
        thread.join(WAIT)
        assert not thread.is_alive()

        latest = single()

        assert latest is not first[0]
        assert first[0].closed
        assert 2 == factory.calls

    def test_env_needs_names(self):
        """keys.env() without names is an error."""
        with pytest.raises(ValueError, match="at least one"):
            keys.env()

    def test_env_names_must_be_strings(self):
        """keys.env() names the wrong type."""
        with pytest.raises(TypeError, match="int"):
            keys.env("A", 3)  # type: ignore[arg-type]

    def test_repr_names_variables_not_values(self, env):
        """The key's repr shows variable names only."""
        key = keys.env("PK_TEST_KEY")

        assert "PK_TEST_KEY" in repr(key)
        assert SECRET not in repr(key)


class TestFileKey:
    def test_rewrite_is_noticed_after_recheck(self, tmp_path):
        """Rewriting the key file rebuilds on the next call after recheck."""
        path = tmp_path / "api_key"
        path.write_text("key-one")
        factory = Factory()
        single = process_singleton(key=keys.file(path, recheck_seconds=0))(
            factory
        )
        old = single()
        assert old is single()

        path.write_text("key-two, longer")
        new = single()

        assert new is not old
        assert old.closed
        assert 2 == factory.calls

    def test_rename_over_is_noticed(self, tmp_path):
        """Replacing the file by rename (new inode) rebuilds."""
        path = tmp_path / "api_key"
        path.write_text("key-one")
        single = process_singleton(key=keys.file(path, recheck_seconds=0))(
            Factory()
        )
        old = single()
        staged = tmp_path / "staged"
        staged.write_text("key-two")
        staged.replace(path)

        assert single() is not old

    def test_unchanged_file_is_not_reread(self, tmp_path, monkeypatch):
        """Within recheck_seconds the file is not even stat-ed."""
        path = tmp_path / "api_key"
        path.write_text("key-one")
        key = keys.file(path, recheck_seconds=3600)
        first = key()
        stats: list[object] = []
        real_stat = os.stat
        monkeypatch.setattr(
            os, "stat", lambda p, *a, **k: stats.append(p) or real_stat(p)
        )
        path.write_text("key-two")

        assert first == key()
        assert [] == stats

    def test_missing_file_is_a_key_value(self, tmp_path):
        """A missing file gives a value of its own; creating it rebuilds."""
        path = tmp_path / "api_key"
        key = keys.file(path, recheck_seconds=0)
        single = process_singleton(key=key)(Factory())
        old = single()

        assert (str(path), None) == key()
        path.write_text("now here")
        assert single() is not old

    def test_content_is_never_kept(self, tmp_path):
        """The key holds a fingerprint of the content, not the content."""
        path = tmp_path / "api_key"
        path.write_text(SECRET)
        key = keys.file(path)

        value = key()

        assert SECRET not in repr(value)
        assert SECRET not in repr(key)
        assert fingerprint(SECRET.encode()) == value[1]

    def test_a_named_pipe_is_refused_not_waited_on(self, tmp_path):
        """A FIFO as the key file fails the call at once, building nothing."""
        path = tmp_path / "api_key"
        os.mkfifo(path)
        factory = Factory()
        single = process_singleton(key=keys.file(path, recheck_seconds=0))(
            factory
        )
        outcome: list[BaseException | None] = []

        def call():
            try:
                single()
            except BaseException as exc:
                outcome.append(exc)
            else:
                outcome.append(None)

        caller = threading.Thread(target=call, daemon=True)
        caller.start()
        caller.join(WAIT)
        blocked = caller.is_alive()
        if blocked:  # Let the blocked open() return: a writer comes, goes.
            os.close(os.open(path, os.O_WRONLY | os.O_NONBLOCK))
            caller.join(WAIT)
        assert not blocked, "keys.file blocked on a named pipe"
        [error] = outcome
        assert isinstance(error, OSError)
        assert f"keys.file({str(path)!r}) names a named pipe" in str(error)
        assert 0 == factory.calls

    def test_negative_recheck_is_rejected(self, tmp_path):
        """recheck_seconds must not be negative."""
        with pytest.raises(ValueError, match="recheck_seconds"):
            keys.file(tmp_path / "k", recheck_seconds=-1)


class TestCustomKeys:
    def test_callable_key_is_evaluated_on_every_call(self):
        """A plain function key is polled on each call."""
        value = ["a"]
        calls = []

        def key():
            calls.append(1)
            return value[0]

        factory = Factory()
        single = process_singleton(key=key)(factory)
        old = single()
        single()
        value[0] = "b"

        assert single() is not old
        assert 3 == len(calls)
        assert 2 == factory.calls

    def test_polled_hit_runs_one_frame_besides_the_key(self):
        """A built singleton's polled hit runs its key and one frame."""

        def key():
            return ("https://api.example", "key-id")

        single = process_singleton(key=key)(Factory())
        single()

        assert ["polled", "key"] == _frames_of(single)

    def test_polled_hit_follows_a_change_of_key(self):
        """The armed polled hit notices a new key value on the next call."""
        value = ["a"]
        single = process_singleton(key=lambda: value[0])(Factory())
        old = single()
        assert old is single()

        value[0] = "b"
        new = single()

        assert new is not old
        assert old.closed
        assert new is single()
        assert ["polled", "<lambda>"] == _frames_of(single)

    def test_armed_polled_hit_rejects_arguments_like_the_slow_path(self):
        """Arguments to an armed polled singleton: the same TypeError."""
        single = process_singleton(key=lambda: "k")(Factory())
        with pytest.raises(TypeError, match=r"takes no arguments") as cold:
            single(1)
        single()
        single()  # Armed now.
        with pytest.raises(TypeError, match=r"takes no arguments") as armed:
            single(1)
        assert str(cold.value) == str(armed.value)

    def test_tuple_key_repr_shows_parts_not_values(self, env):
        """A mixed tuple's repr names its parts, never their values."""
        single = process_singleton(
            key=(keys.env("PK_TEST_KEY"), lambda: SECRET)
        )(Factory())
        single()
        shown = repr(single._self_key)
        assert "PK_TEST_KEY" in shown
        assert SECRET not in shown

    def test_override_wins_over_an_armed_polled_hit(self):
        """An override pushed while the polled hit is armed is served."""
        single = process_singleton(key=lambda: "k")(Factory())
        live = single()
        single()
        stand_in = FakeClient("stand-in")

        with single.override(stand_in):
            assert stand_in is single()
        assert live is single()

    def test_tuple_of_keys_is_combined(self, env):
        """A tuple of key functions rebuilds when any of them changes."""
        extra = ["x"]
        single = process_singleton(
            key=(keys.env("PK_TEST_KEY"), lambda: extra[0])
        )(Factory())
        first = single()
        extra[0] = "y"
        second = single()
        env.setenv("PK_TEST_KEY", "sk-2")
        third = single()

        assert first is not second
        assert second is not third
        assert first.closed
        assert second.closed

    def test_tuple_of_env_keys_stays_pushed(self, env):
        """Several keys.env() in a tuple are merged into one pushed key."""
        factory = Factory()
        single = process_singleton(
            key=(keys.env("PK_TEST_KEY"), keys.env("PK_TEST_URL"))
        )(factory)
        old = single()

        assert (
            type(single).__call__ is not poolkeeper.ProcessSingleton.__call__
        )
        env.setenv("PK_TEST_URL", "http://127.0.0.1:2")
        assert single() is not old

    def test_key_read_again_after_a_wait_raises_unchanged(self):
        """A key's StopIteration, read after waiting out a build, is kept."""
        gate = threading.Event()
        factory = Factory(gate=gate)
        state = {"fail": False}

        def key():
            if state["fail"]:
                raise StopIteration("exhausted")
            return 1

        single = process_singleton(key=key)(factory)
        box: list[BaseException | None] = []

        def catch() -> None:
            try:
                single()
            except BaseException as exc:
                box.append(exc)

        builder = threading.Thread(target=single)
        waiter = threading.Thread(target=catch)
        builder.start()
        assert factory.entered.wait(WAIT)
        waiter.start()
        assert blocked_in("_acquire", 1)
        state["fail"] = True  # Read again once the build ends.
        gate.set()
        builder.join(WAIT)
        waiter.join(WAIT)
        assert not builder.is_alive()
        assert not waiter.is_alive()
        assert [StopIteration] == [type(exc) for exc in box]

    def test_key_error_propagates_and_keeps_the_client(self):
        """A key that raises propagates its error and retires nothing."""
        state = {"fail": False}

        def key():
            if state["fail"]:
                raise LookupError("vault down")
            return 1

        single = process_singleton(key=key)(Factory())
        old = single()
        state["fail"] = True

        with pytest.raises(LookupError, match="vault down"):
            single()
        assert old is single.current()
        assert not old.closed

    def test_unhashable_key_names_the_factory(self):
        """An unhashable key value is a TypeError naming the factory."""

        def make_unhashable_client():
            return FakeClient()

        single = process_singleton(key=lambda: ["a", "list"])(
            make_unhashable_client
        )

        with pytest.raises(TypeError, match=r"make_unhashable_client.*list"):
            single()
        assert single.current() is None


class TestSecrets:
    def test_fingerprint_is_short_stable_and_hides_the_value(self):
        """Equal values share a fingerprint; it reveals nothing."""
        fp = fingerprint(SECRET)

        assert fp == fingerprint(SECRET)
        assert fp != fingerprint(SECRET + "x")
        assert 12 == len(fp)
        assert all(c in "0123456789abcdef" for c in fp)
        assert SECRET[:6] not in fp

    def test_secret_is_not_in_repr_stats_or_logs(self, env, caplog):
        """The raw key appears nowhere: repr, statistics, logs, attributes."""
        caplog.set_level(logging.DEBUG, logger="poolkeeper")

        def fail_close(client):
            raise RuntimeError("close failed")

        single = process_singleton(
            key=keys.env("PK_TEST_KEY"), close=fail_close
        )(Factory())
        single()
        env.setenv("PK_TEST_KEY", SECRET + "-rotated")
        single()

        stats = single.statistics()
        assert stats.key_fingerprint == fingerprint((SECRET + "-rotated",))
        fields = [
            getattr(single, name)
            for name in poolkeeper.ProcessSingleton.__annotations__
            if name.startswith("_self_")
        ]
        live = single._self_slot.live
        everything = [
            repr(single),
            repr(stats),
            caplog.text,
            repr(fields),
            repr([getattr(live, slot) for slot in type(live).__slots__]),
        ]
        assert not any(SECRET in text for text in everything)
        assert "close failed" in caplog.text


class TestHitPath:
    def test_hit_takes_no_lock(self):
        """A hit returns while another thread holds the singleton's lock."""
        single = process_singleton(Factory())
        client = single()
        held = threading.Event()
        release = threading.Event()

        def hold():
            with single._self_life.lock:
                held.set()
                release.wait(WAIT)

        holder = threading.Thread(target=hold)
        holder.start()
        assert held.wait(WAIT)
        try:
            result: list[FakeClient] = []
            caller = threading.Thread(target=lambda: result.append(single()))
            caller.start()
            caller.join(WAIT / 2)
            assert not caller.is_alive()
            assert [client] == result
        finally:
            release.set()
            holder.join(WAIT)


def _frames_of(single: object) -> list[str]:
    """The Python functions one call of *single* runs (none when armed)."""
    frames: list[str] = []

    def profile(frame, event, arg):
        if event == "call" and frame.f_code.co_name != "setprofile":
            frames.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        single()
    finally:
        sys.setprofile(None)
    return frames


def test_fingerprint_is_exported():
    """poolkeeper.fingerprint is the documented function."""
    assert poolkeeper.fingerprint is fingerprint
