"""What sync and async singletons share: identity, and the give-up errors."""

from __future__ import annotations

import copy
import pickle
import subprocess
import sys
import textwrap

import pytest

from poolkeeper import PoolkeeperError
from poolkeeper._identity import too_many_rounds
from poolkeeper._lifecycle import MAX_ROUNDS


class TestGiveUpErrors:
    @pytest.mark.parametrize(
        ("what", "advice"),
        [
            ("build", "make the key function return a value"),
            ("build", "stop resetting or retiring it in a loop"),
            ("retired", "stop resetting or retiring it in a loop"),
            ("lease", "stop resetting or retiring it in a loop"),
        ],
    )
    def test_message_names_the_factory_the_bound_and_what_to_do(
        self, what, advice
    ):
        """The error says who gave up, after how many rounds, and why."""
        error = too_many_rounds("make_client", what)
        message = str(error)
        assert isinstance(error, PoolkeeperError)
        assert "make_client" in message
        assert f"{MAX_ROUNDS} " in message
        assert advice in message
        assert message.endswith(".")

    def test_a_singleton_without_a_key_blames_retirements_not_a_key(self):
        """No key, no key change: the message names what did happen."""
        message = str(too_many_rounds("make_client", "retired"))
        assert "key" not in message
        assert "retired" in message
        assert "reset()" in message


class TestIdentity:
    def test_a_copy_and_a_pickle_are_the_singleton_itself(self):
        """copy, deepcopy and pickle all give back the very singleton."""
        import forkhelpers

        single = forkhelpers.SINGLE
        assert single is copy.copy(single)
        assert single is copy.deepcopy(single)
        assert single is pickle.loads(pickle.dumps(single))
        assert hash(single) == object.__hash__(single)


MODULE = """
    import pickle

    from poolkeeper import process_singleton


    class Client:
        pass


    def _make_api():
        return Client()


    async def _make_async_api():
        return Client()


    api = process_singleton(_make_api)
    async_api = process_singleton(_make_async_api)


    def unnamed():
        return process_singleton(_make_api)
"""


@pytest.fixture(name="made")
def _made(tmp_path, monkeypatch):
    """Import a module that makes singletons by calling process_singleton."""
    (tmp_path / "made_by_call.py").write_text(textwrap.dedent(MODULE))
    monkeypatch.syspath_prepend(str(tmp_path))
    monkeypatch.delitem(sys.modules, "made_by_call", raising=False)
    import made_by_call  # Written by this fixture.

    return made_by_call


class TestPickleByName:
    @pytest.mark.parametrize("protocol", range(pickle.HIGHEST_PROTOCOL + 1))
    def test_a_singleton_made_by_a_call_pickles_by_its_module_name(
        self, made, protocol
    ):
        """api = process_singleton(_make_api) pickles as made_by_call.api."""
        for single in (made.api, made.async_api):
            assert single is pickle.loads(pickle.dumps(single, protocol))
        handle = pickle.loads(pickle.dumps(made.api.proxy(), protocol))
        assert made.api is handle._self_single
        assert b"_make_api" not in pickle.dumps(made.api, protocol)

    def test_another_process_unpickles_its_own(self, made, tmp_path):
        """The pickle names the module attribute: a new process finds it."""
        code = (
            "import pickle, sys, made_by_call; "
            "single = pickle.loads(sys.stdin.buffer.read()); "
            "print(single is made_by_call.api)"
        )
        done = subprocess.run(
            [sys.executable, "-c", code],
            input=pickle.dumps(made.api),
            capture_output=True,
            check=True,
            timeout=60,
            cwd=tmp_path,
        )
        assert b"True" == done.stdout.strip()

    def test_an_unnamed_singleton_fails_with_the_fix(self, made):
        """A singleton no module attribute holds: PicklingError, with a fix."""
        single = made.unnamed()
        with pytest.raises(pickle.PicklingError) as caught:
            pickle.dumps(single)
        assert (
            "Cannot pickle the singleton of _make_api: no attribute of its "
            "module 'made_by_call' holds it, so another process could not "
            "find it. Assign it to a module-level name (api = "
            "process_singleton(_make_api)) or decorate the factory with "
            "@process_singleton."
        ) == str(caught.value)
