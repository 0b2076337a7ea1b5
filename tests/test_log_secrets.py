"""No error's message in any log line by default; the error itself at DEBUG.

An SDK's error can carry a secret (``DELETE https://api/x?token=...
failed``). Each failure poolkeeper logs at WARNING (a close, a build, a
probe, a ``retire_on`` match, a collected singleton's close, an
``after_fork`` hook) says the error's type and where it was raised; its
message and traceback appear only in a DEBUG record, for whoever enables
DEBUG on the ``poolkeeper`` logger.
"""

from __future__ import annotations

import asyncio
import gc
import logging

import pytest
from helpers import Factory, fork_and_check

import poolkeeper
from poolkeeper import process_singleton

SECRET = "token=s3cr3t-0123"


class SecretError(Exception):
    """What an SDK raises: its message holds a secret."""

    def __init__(self) -> None:
        super().__init__(f"DELETE https://api.example/x?{SECRET} failed")


def _raise(*_: object) -> bool:
    raise SecretError


def _failures() -> None:
    """Every failure path a WARNING is logged for, once each."""
    closing = process_singleton(close=_raise)(Factory())
    closing()
    closing.reset()

    def failing_build() -> object:
        raise SecretError

    building = process_singleton(failing_build)
    with pytest.raises(SecretError):
        building()

    probed = process_singleton(check=_raise, check_every=3600)(Factory())
    probed()
    slot = probed._self_slot
    assert probed._self_life.due(slot, slot.live.sequence, slot.live.probes)
    probed()

    matched = process_singleton(retire_on=SecretError)(Factory())
    with pytest.raises(SecretError), matched.lease():
        raise SecretError

    async def make() -> object:
        return Factory()()

    async def aclose(client: object) -> None:
        raise SecretError

    async def on_a_loop() -> None:
        single = process_singleton(close=aclose)(make)
        await single()
        await single.reset()

    asyncio.run(on_a_loop())

    collected = process_singleton(close=_raise)(Factory())
    collected()
    del collected
    gc.collect()


def test_no_warning_says_an_error_message(caplog):
    with caplog.at_level(logging.INFO, logger="poolkeeper"):
        _failures()
    warnings = [r for r in caplog.records if r.levelno >= logging.WARNING]
    kinds = {getattr(r, "poolkeeper_event", None) for r in warnings}
    # Every path above said something: a close, a build, a probe, retire_on.
    assert {"close_failed", "build_failed", "retired"} <= kinds, kinds
    assert len(warnings) >= 6, [r.getMessage() for r in warnings]
    assert SECRET not in caplog.text
    assert all(r.exc_info is None for r in caplog.records)
    assert "SecretError" in caplog.text


def test_debug_carries_the_errors_themselves(caplog):
    with caplog.at_level(logging.DEBUG, logger="poolkeeper"):
        _failures()
    details = [r for r in caplog.records if r.exc_info]
    assert details, "no DEBUG record with the error"
    assert all(r.levelno == logging.DEBUG for r in details)
    assert all(isinstance(r.exc_info[1], SecretError) for r in details)
    assert SECRET in caplog.text


def test_an_after_fork_hook_error_is_said_without_its_message():
    single = process_singleton(after_fork=_raise)(Factory())
    single()

    def child() -> bool:
        records: list[logging.LogRecord] = []
        handler = logging.Handler()
        handler.emit = records.append  # type: ignore[method-assign]
        logger = logging.getLogger("poolkeeper")
        logger.addHandler(handler)
        try:
            single()
        finally:
            logger.removeHandler(handler)
        said = [r.getMessage() for r in records]
        return (
            any("after_fork" in s and "SecretError" in s for s in said)
            and not any(SECRET in s for s in said)
            and not any(r.exc_info for r in records)
        )

    assert 0 == fork_and_check(child)
    poolkeeper.close_all()
