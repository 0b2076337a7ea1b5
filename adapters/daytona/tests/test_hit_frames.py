"""Deterministic guards of the adapter's hit paths: Python frames a call runs.

``sys.setprofile`` counts the Python frames one call of a built singleton
starts: ``daytona_client()`` is armed (a C call, no frame at all), and a
``make_daytona_singleton`` call runs the user's config factory and a fixed,
small number of frames, reading neither the environment nor a file.
"""

from __future__ import annotations

import sys

import daytona

from poolkeeper_daytona import daytona_client, make_daytona_singleton


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


class TestDaytonaClientHit:
    def test_hit_runs_no_python_frame(self, sdk_env):
        """Once built, daytona_client() is a C call: no frame runs."""
        sdk_env.setenv("DAYTONA_API_KEY", "frames")
        client = daytona_client()
        daytona_client()  # The first hit after a build arms the hit path.
        result: list[object] = []

        frames = frames_of(lambda: result.append(daytona_client()))

        assert ["<lambda>"] == frames
        assert [client] == result


class TestMadeSingletonHit:
    def test_hit_runs_the_config_factory_and_a_few_frames(
        self, sdk_env, daytona_emulator
    ):
        """A call runs the config factory, its key and no env/file reads."""
        config = daytona.DaytonaConfig(
            api_key="frames", api_url=daytona_emulator.api_url, target="us"
        )

        def my_config() -> daytona.DaytonaConfig:
            return config

        single = make_daytona_singleton(my_config)
        client = single()
        single()  # Reading the files on the build outdated the kept values.

        frames = frames_of(single)

        assert client is single()
        assert "my_config" in frames
        assert not {"get", "__getitem__", "stat", "_look", "_where"} & set(
            frames
        )
        assert 13 >= len(frames), frames
