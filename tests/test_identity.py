"""What sync and async singletons share: identity, and the give-up errors."""

from __future__ import annotations

import copy
import pickle

import pytest

from poolkeeper import PoolkeeperError
from poolkeeper._identity import too_many_rounds
from poolkeeper._lifecycle import MAX_ROUNDS


class TestGiveUpErrors:
    @pytest.mark.parametrize(
        ("what", "advice"),
        [
            ("build", "make the key function return a value"),
            ("lease", "stop resetting it in a loop"),
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


class TestIdentity:
    def test_a_copy_and_a_pickle_are_the_singleton_itself(self):
        """copy, deepcopy and pickle all give back the very singleton."""
        import forkhelpers

        single = forkhelpers.SINGLE
        assert single is copy.copy(single)
        assert single is copy.deepcopy(single)
        assert single is pickle.loads(pickle.dumps(single))
        assert hash(single) == object.__hash__(single)
