"""Deterministic guards of the hit paths: Python frames a call runs.

Wall-clock ratios live in benchmarks/; here ``sys.setprofile`` counts the
Python frames one call of a built singleton starts. An armed hit is a C
call and starts none; a polled key runs a small, fixed number. An armed
async hit runs two: the armed ``__call__`` and the coroutine it returns.
"""

from __future__ import annotations

import asyncio
import gc
import os
import sys

import pytest
from helpers import GIL_PARAMS, Factory, made_as_free_threaded

from poolkeeper import keys, process_singleton

#: The stdlib's weakref modules: their callbacks (``WeakSet._remove``) run
#: wherever the interpreter frees an object, which on a free-threaded
#: build is any thread's next check of its queue of objects freed by
#: others (biased reference counting), not only a collection: they are
#: other tests' garbage, not the call's frames (seen on 3.14t, gc off).
_WEAKREF_FILES = ("_weakrefset.py", "weakref.py")


def profiler(seen: list[str]):
    """Return a profile function that records each Python call in *seen*."""

    def profile(frame, event, arg):
        if event == "call" and not frame.f_code.co_filename.endswith(
            _WEAKREF_FILES
        ):
            seen.append(frame.f_code.co_name)

    return profile


def frames_of(call) -> list[str]:
    """Return the names of the Python functions one *call()* runs.

    With the collector off: a collection that starts inside the call runs
    finalizers and weakref callbacks (``WeakSet._remove``) of other tests'
    garbage, which are not the call's frames (seen on 3.14t).
    """
    seen: list[str] = []
    enabled = gc.isenabled()
    gc.disable()
    sys.setprofile(profiler(seen))
    try:
        call()
    finally:
        sys.setprofile(None)
        if enabled:
            gc.enable()
    return seen


@pytest.fixture(name="key_file")
def _key_file(tmp_path, monkeypatch):
    """An API key file and one variable, both set."""
    monkeypatch.setenv("PK_TEST_KEY", "a")
    path = tmp_path / "api_key"
    path.write_text("one")
    return path


class TestArmedHitRunsNoPythonFrame:
    @pytest.mark.parametrize(
        "make_key",
        [
            pytest.param(lambda path: None, id="no key"),
            pytest.param(lambda path: keys.env("PK_TEST_KEY"), id="env"),
            pytest.param(keys.file, id="file"),
            pytest.param(
                lambda path: (keys.env("PK_TEST_KEY"), keys.file(path)),
                id="env+file tuple",
            ),
            pytest.param(
                lambda path: (keys.file(path), keys.file(path.parent / "x")),
                id="file+file tuple",
            ),
        ],
    )
    def test_hit_runs_no_python_frame(self, key_file, make_key):
        """Once built, a call of a pushed singleton starts no frame."""
        single = process_singleton(key=make_key(key_file))(Factory())
        client = single()
        single()  # The first hit after a build arms the hit path.
        result: list[object] = []

        frames = frames_of(lambda: result.append(single()))

        assert ["<lambda>"] == frames
        assert [client] == result


class TestPolledHit:
    def test_callable_key_runs_a_fixed_number_of_frames(self):
        """A polled key's hit runs one frame, the key and nothing else."""
        single = process_singleton(key=lambda: "config")(Factory())
        single()

        frames = frames_of(single)

        assert ["polled", "<lambda>"] == frames

    def test_polled_tuple_reads_no_pushed_part(self, key_file):
        """In a polled tuple, keys.env and keys.file parts are not re-read."""
        single = process_singleton(
            key=(keys.env("PK_TEST_KEY"), keys.file(key_file), lambda: 1)
        )(Factory())
        single()
        single()

        frames = frames_of(single)

        assert not {"get", "__getitem__", "_look", "_where"} & set(frames)
        assert 10 >= len(frames), frames


class TestLeaseFrames:
    @pytest.mark.parametrize(
        "make_key",
        [
            pytest.param(lambda path: None, id="no key"),
            pytest.param(lambda path: keys.env("PK_TEST_KEY"), id="env"),
        ],
    )
    @pytest.mark.parametrize("gil", GIL_PARAMS)
    def test_lease_runs_its_enter_and_exit_only(
        self, key_file, make_key, gil, monkeypatch
    ):
        """Making, entering and exiting a built lease: two Python frames.

        no-gil: made as on a free-threaded build, the lease pins and
        unpins under the lock (``under``, see I1), in four frames each way.
        """
        if not gil:
            made_as_free_threaded(monkeypatch)
        single = process_singleton(key=make_key(key_file))(Factory())
        assert gil is single._self_life.lock_free
        client = single()
        single()
        result: list[object] = []

        def use():
            with single.lease() as leased:
                result.append(leased)

        frames = frames_of(use)

        if gil:
            assert ["use", "__enter__", "__exit__"] == frames
        else:
            enter = ["__enter__", "_enter", "under", "pin"]
            exit_ = ["__exit__", "_finish", "under", "unpin"]
            assert ["use", *enter, *exit_] == frames
        assert [client] == result
        assert 0 == single.statistics().leases


class TestProxyFrames:
    def test_attribute_of_a_stored_proxy_runs_one_frame(self):
        """``proxy().attr`` while the client is the one seen last: one frame.

        The proxy's ``__getattribute__``, and the armed hit it calls (no
        Python frame); a rotation takes ``_self_live`` once more.
        """
        single = process_singleton(Factory())
        handle = single.proxy()
        client = single()
        assert client.closes is handle.closes  # Seen once: recorded.
        frames = frames_of(lambda: handle.closes)
        assert ["<lambda>", "__getattribute__"] == frames
        single.reset()
        single()
        single()  # Rebuilt and armed: the proxy has not seen it yet.
        frames = frames_of(lambda: handle.closes)
        assert ["<lambda>", "__getattribute__", "_self_live"] == frames[:3]
        assert handle.closes is single().closes
        assert handle.closes is not client.closes


async def frames_of_await(single) -> tuple[list[str], object]:
    """Return the Python functions ``await single()`` runs, and its result."""
    seen: list[str] = []
    enabled = gc.isenabled()
    gc.disable()  # As frames_of.
    sys.setprofile(profiler(seen))
    try:
        result = await single()
    finally:
        sys.setprofile(None)
        if enabled:
            gc.enable()
    return seen, result


async def plain():
    """The baseline: a plain coroutine."""


class TestArmedAsyncHit:
    @pytest.mark.parametrize(
        "make_key",
        [
            pytest.param(lambda path: None, id="no key"),
            pytest.param(lambda path: keys.env("PK_TEST_KEY"), id="env"),
            pytest.param(keys.file, id="file"),
        ],
    )
    def test_await_runs_two_frames(self, key_file, make_key):
        """Once built, ``await single()`` runs the armed call and its hit."""

        @process_singleton(key=make_key(key_file))
        async def single():
            return object()

        async def main():
            client = await single()
            await single()  # Armed by now: the build's own round arms it.
            frames, result = await frames_of_await(single)
            baseline, _ = await frames_of_await(plain)
            return client, frames, result, baseline

        client, frames, result, baseline = asyncio.run(main())
        assert ["armed_call", "hit"] == frames
        assert client is result
        assert ["plain"] == baseline

    def test_miss_after_a_change_takes_the_slow_path_then_rearms(
        self, key_file
    ):
        """A watched change disarms; the next await rebuilds and re-arms."""

        @process_singleton(key=keys.env("PK_TEST_KEY"))
        async def single():
            return object()

        async def main():
            old = await single()
            os.environ["PK_TEST_KEY"] = "b"
            missed, new = await frames_of_await(single)
            armed, again = await frames_of_await(single)
            return old, missed, new, armed, again

        old, missed, new, armed, again = asyncio.run(main())
        assert new is not old
        assert again is new
        assert "_acquire" in missed
        assert ["armed_call", "hit"] == armed

    def test_polled_key_is_not_armed(self):
        """A polled key is evaluated on every await: no armed hit."""
        values = ["a"]

        @process_singleton(key=lambda: values[0])
        async def single():
            return object()

        async def main():
            await single()
            await single()
            frames, _ = await frames_of_await(single)
            return frames

        frames = asyncio.run(main())
        assert "armed_call" not in frames
        # The slow path's first round answers it: no lock, no request.
        expected = [
            "__call__",
            "_get",
            "_acquire",
            "_slot",
            "read_key",
            "evaluate_key",
            "<lambda>",
            "hash_key",
            "matches",
        ]
        assert expected == frames
