"""Deterministic guards of the hit paths: Python frames a call runs.

Wall-clock ratios live in benchmarks/; here ``sys.setprofile`` counts the
Python frames one call of a built singleton starts. An armed hit is a C
call and starts none; a polled key runs a small, fixed number.
"""

from __future__ import annotations

import sys

import pytest
from helpers import Factory

from poolkeeper import keys, process_singleton


def frames_of(call) -> list[str]:
    """Return the names of the Python functions one *call()* runs."""
    seen: list[str] = []

    def profile(frame, event, arg):
        if event == "call":
            seen.append(frame.f_code.co_name)

    sys.setprofile(profile)
    try:
        call()
    finally:
        sys.setprofile(None)
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
    def test_lease_runs_its_enter_and_exit_only(self, key_file, make_key):
        """Making, entering and exiting a built lease: two Python frames."""
        single = process_singleton(key=make_key(key_file))(Factory())
        client = single()
        single()
        result: list[object] = []

        def use():
            with single.lease() as leased:
                result.append(leased)

        frames = frames_of(use)

        assert ["use", "__enter__", "__exit__"] == frames
        assert [client] == result
        assert 0 == single.statistics().leases
