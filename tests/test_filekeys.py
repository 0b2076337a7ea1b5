"""The file-key thread: file keys pushed, not polled, on real files."""

from __future__ import annotations

import gc
import os
import threading
import time
import weakref

import pytest
from helpers import WAIT, Factory, fork_and_check

from poolkeeper import _filekeys, keys, process_singleton

# Small, so that a change is noticed quickly; waits allow many of them.
RECHECK = 0.05
DEADLINE = 40 * RECHECK


def eventually(predicate, timeout: float = DEADLINE) -> bool:
    """Poll *predicate* until it holds or *timeout* seconds pass."""
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if predicate():
            return True
        time.sleep(RECHECK / 5)
    return bool(predicate())


def pushed(path, factory=None, recheck: float = RECHECK):
    """Return a singleton keyed on the file at *path*, checked often."""
    key = keys.file(path, recheck_seconds=recheck)
    return process_singleton(key=key)(factory or Factory())


def rebuilt(single, old) -> bool:
    """Whether a call now returns another client than *old*."""
    return single() is not old


class TestFileKeyPushed:
    def test_hit_path_is_armed(self, tmp_path):
        """A keys.file singleton is pushed: its hit path is armed."""
        path = tmp_path / "api_key"
        path.write_text("one")
        single = process_singleton(key=keys.file(path, recheck_seconds=60))(
            Factory()
        )

        assert single() is single()
        assert single._self_life.pushed
        assert isinstance(type(single).__dict__["__call__"], staticmethod)

    def test_rewrite_is_noticed_within_recheck(self, tmp_path):
        """Rewriting the file in place rebuilds once the thread looked."""
        path = tmp_path / "api_key"
        path.write_text("one")
        factory = Factory()
        single = pushed(path, factory)
        old = single()

        path.write_text("two, longer")

        assert eventually(lambda: rebuilt(single, old))
        assert old.closed
        assert 2 == factory.calls

    def test_rename_over_is_noticed(self, tmp_path):
        """Replacing the file by rename (new inode) rebuilds."""
        path = tmp_path / "api_key"
        path.write_text("one")
        single = pushed(path)
        old = single()
        staged = tmp_path / "staged"
        staged.write_text("two")

        staged.replace(path)

        assert eventually(lambda: rebuilt(single, old))

    def test_missing_present_missing(self, tmp_path):
        """Creating and deleting the file are both changes of the key."""
        path = tmp_path / "api_key"
        key = keys.file(path, recheck_seconds=RECHECK)
        single = process_singleton(key=key)(Factory())
        first = single()
        assert (str(path), None) == key()

        path.write_text("here")
        assert eventually(lambda: rebuilt(single, first))
        second = single()
        path.unlink()

        assert eventually(lambda: rebuilt(single, second))
        assert (str(path), None) == key()

    def test_unchanged_file_keeps_the_client(self, tmp_path):
        """Several rechecks of an unchanged file rebuild nothing."""
        path = tmp_path / "api_key"
        path.write_text("one")
        factory = Factory()
        single = pushed(path, factory)
        client = single()

        time.sleep(5 * RECHECK)

        assert client is single()
        assert 1 == factory.calls

    def test_env_and_file_tuple_stays_pushed(self, tmp_path, monkeypatch):
        """A tuple of keys.env and keys.file is pushed; both parts count."""
        monkeypatch.setenv("PK_TEST_KEY", "a")
        path = tmp_path / "api_key"
        path.write_text("one")
        key = (
            keys.env("PK_TEST_KEY"),
            keys.file(path, recheck_seconds=RECHECK),
        )
        single = process_singleton(key=key)(Factory())
        first = single()
        assert single._self_life.pushed
        assert ("a",) == single._self_key()[0]

        monkeypatch.setenv("PK_TEST_KEY", "b")
        second = single()
        assert second is not first
        path.write_text("two")

        assert eventually(lambda: rebuilt(single, second))

    def test_tuple_with_a_callable_is_polled(self, tmp_path):
        """A plain function in the tuple makes the whole key polled."""
        path = tmp_path / "api_key"
        single = process_singleton(
            key=(keys.file(path, recheck_seconds=60), lambda: 1)
        )(Factory())
        single()

        assert not single._self_life.pushed

    def test_zero_recheck_is_polled(self, tmp_path):
        """recheck_seconds=0 looks on every call instead of pushing."""
        single = process_singleton(
            key=keys.file(tmp_path / "k", recheck_seconds=0)
        )(Factory())
        single()

        assert not single._self_life.pushed

    def test_path_function_is_followed(self, tmp_path, monkeypatch):
        """A path given as a function is resolved again on the slow path."""
        monkeypatch.setenv("PK_TEST_FILE", str(tmp_path / "a"))
        (tmp_path / "a").write_text("a")
        (tmp_path / "b").write_text("b")
        key = keys.file(lambda: os.environ["PK_TEST_FILE"], recheck_seconds=60)
        single = process_singleton(key=(keys.env("PK_TEST_FILE"), key))(
            Factory()
        )
        first = single()

        monkeypatch.setenv("PK_TEST_FILE", str(tmp_path / "b"))

        assert single() is not first
        assert str(tmp_path / "b") == key()[0]

    def test_shortened_recheck_applies_at_once(self, tmp_path):
        """Lowering recheck_seconds wakes the thread with the new value."""
        path = tmp_path / "api_key"
        path.write_text("one")
        key = keys.file(path, recheck_seconds=3600)
        single = process_singleton(key=key)(Factory())
        old = single()
        path.write_text("two, longer")

        key.recheck_seconds = RECHECK

        assert eventually(lambda: rebuilt(single, old))

    def test_negative_recheck_assignment_is_rejected(self, tmp_path):
        """The recheck_seconds setter validates like keys.file()."""
        key = keys.file(tmp_path / "k")
        with pytest.raises(ValueError, match="recheck_seconds"):
            key.recheck_seconds = -1


class TestCheckerThread:
    def test_survives_a_failing_refresh(self, tmp_path, caplog):
        """A key whose check raises is logged; other keys still work."""
        path = tmp_path / "api_key"
        path.write_text("one")
        failing = threading.Event()

        def broken() -> str:
            if failing.is_set():
                msg = "no path today"
                raise OSError(msg)
            return str(tmp_path / "other")

        bad = pushed(broken)
        good = process_singleton(key=keys.file(path, recheck_seconds=RECHECK))(
            Factory()
        )
        bad()
        old = good()
        failing.set()

        assert eventually(lambda: "OSError raised at" in caplog.text)
        assert "no path today" not in caplog.text  # Its type, not message.
        path.write_text("two, longer")

        assert eventually(lambda: rebuilt(good, old))
        assert 1 == caplog.text.count("OSError raised at")  # Said once.
        with pytest.raises(OSError, match="no path today"):
            bad()

    def test_dropped_singleton_is_not_kept_alive(self, tmp_path):
        """The thread holds subscribers weakly: a dropped singleton dies."""
        path = tmp_path / "api_key"
        path.write_text("one")
        single = pushed(path)
        single()
        ref = weakref.ref(single)

        del single
        gc.collect()

        assert ref() is None

    def test_dropped_subscriber_is_forgotten(self, tmp_path):
        """The thread forgets a key once its last subscriber is collected."""
        path = tmp_path / "api_key"
        single = pushed(path)
        single()
        assert _filekeys._thread is not None
        key = single._self_key
        del single
        gc.collect()
        # The registry lets go of a dropped singleton's lifecycle at the
        # next registration.
        process_singleton(Factory())

        def idle() -> bool:
            gc.collect()
            entry = _filekeys._entries.get(key)
            return entry is None or not entry.subscribers

        assert eventually(idle, WAIT)

    @pytest.mark.skipif(not hasattr(os, "fork"), reason="needs os.fork()")
    def test_forked_child_gets_a_working_file_key_thread(self, tmp_path):
        """In a forked child a new file-key thread notices a rotated file."""
        path = tmp_path / "api_key"
        path.write_text("one")
        single = pushed(path)
        single()
        parent = _filekeys._thread

        def child() -> bool:
            first = single()
            thread = _filekeys._thread
            if thread is None or thread is parent or not thread.is_alive():
                return False
            path.write_text(f"rotated in {os.getpid()}")
            return eventually(lambda: rebuilt(single, first))

        assert 0 == fork_and_check(child)
        assert parent is None or parent.is_alive()

    def test_concurrent_registration_starts_one_thread(self, tmp_path):
        """Keys first read on many threads share one file-key thread."""
        barrier = threading.Barrier(8)
        made: list[object] = []

        def register(i: int) -> None:
            barrier.wait(WAIT)
            single = process_singleton(
                key=keys.file(tmp_path / f"k{i}", recheck_seconds=RECHECK)
            )(Factory())
            made.append(single())  # The first build starts the thread.

        threads = [
            threading.Thread(target=register, args=(i,)) for i in range(8)
        ]
        for t in threads:
            t.start()
        for t in threads:
            t.join(WAIT)
            assert not t.is_alive()
        threads_seen = [
            t for t in threading.enumerate() if t.name == "poolkeeper-filekeys"
        ]

        assert 1 == len(threads_seen)


class TestForkWithAKeyLockHeld:
    def test_a_child_reads_a_key_whose_lock_a_parent_thread_held(
        self, tmp_path
    ):
        """A thread was looking at the file at the fork: its key's lock is
        held in the child, where that thread does not exist. The child
        looks at the file all the same (the fork hook made a fresh lock).
        """
        path = tmp_path / "api_key"
        path.write_text("one")
        key = keys.file(path, recheck_seconds=0)
        single = process_singleton(key=key)(Factory())
        single()
        held, release = threading.Event(), threading.Event()

        def look_forever() -> None:
            with key._lock:  # As _look holds it while it reads the file.
                held.set()
                release.wait(WAIT)

        looker = threading.Thread(target=look_forever)
        looker.start()
        try:
            assert held.wait(WAIT)
            path.write_text("two, in the child")

            def child() -> bool:
                return single() is not None and key()[1] is not None

            assert 0 == fork_and_check(child)
        finally:
            release.set()
            looker.join(WAIT)
