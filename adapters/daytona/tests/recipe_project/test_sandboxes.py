"""The user's regression test for the incident, on the fake SDK."""

from __future__ import annotations

import sys

import pytest
from sandboxes import create_sandbox, daytona_client


def test_one_client_for_every_create(fake_daytona):
    """Five creates build one client (counted by poolkeeper and the fake)."""
    before = daytona_client.statistics().builds

    sandboxes = {create_sandbox() for _ in range(5)}

    assert 1 == daytona_client.statistics().builds - before
    assert 1 == len(fake_daytona.Daytona.built)
    assert 1 == len(sandboxes)


def test_a_reset_builds_a_new_client(fake_daytona):
    """After reset() the next create builds one more client."""
    before = daytona_client.statistics().builds
    first = daytona_client()

    daytona_client.reset()

    assert first is not daytona_client()
    assert 2 == daytona_client.statistics().builds - before


def test_zz_nothing_leaks_into_later_tests():
    """Without the fixture here: no fake module, no fake client."""
    assert "daytona" not in sys.modules
    assert daytona_client.current() is None
    with pytest.raises(ModuleNotFoundError):
        daytona_client()
