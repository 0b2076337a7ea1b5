"""Forced interleavings: pause a thread, or raise in it, at a chosen line.

These drive poolkeeper the way a hostile reviewer does: a ``sys.settrace``
tracer installed in one thread stops it at a line of poolkeeper's code (to
force a thread switch there) or raises an exception at the n-th line it
runs (to cut a transition short at every possible point).
"""

from __future__ import annotations

import contextlib
import dis
import gc
import itertools
import linecache
import sys
import threading
from pathlib import Path
from typing import TYPE_CHECKING

from helpers import WAIT

if TYPE_CHECKING:
    from collections.abc import Callable, Iterator

import poolkeeper

PACKAGE = str(Path(poolkeeper.__file__).parent)


def _ours(frame) -> bool:
    return frame.f_code.co_filename.startswith(PACKAGE)


class Pause:
    """Stops the traced thread the first time it reaches a matching line."""

    def __init__(self, function: str, text: str) -> None:
        self.function = function
        self.text = text
        self.reached = threading.Event()
        self.release = threading.Event()
        self._done = False

    def tracer(self, frame, event, arg):
        if event != "call" or frame.f_code.co_name != self.function:
            return None
        return self._line

    def _line(self, frame, event, arg):
        if event == "line" and not self._done:
            source = linecache.getline(
                frame.f_code.co_filename, frame.f_lineno
            )
            if self.text in source:
                self._done = True
                self.reached.set()
                assert self.release.wait(WAIT), "pause never released"
        return self._line

    def run(self, target: Callable[[], object]) -> Callable[[], object]:
        """Wrap *target* so that it runs under this tracer."""

        def traced() -> object:
            sys.settrace(self.tracer)
            try:
                return target()
            finally:
                sys.settrace(None)

        return traced


class Inject:
    """Raises *exc* at the *n*-th line poolkeeper runs once armed.

    With *after*, lines count only once a line containing that text ran:
    n=1 is the line that follows it.
    """

    def __init__(
        self, n: int, exc: type[BaseException], after: str | None = None
    ) -> None:
        self.n = n
        self.exc = exc
        self.after = after
        self.armed = False
        self.seen = 0
        self.fired: str | None = None

    def tracer(self, frame, event, arg):
        if event != "call" or not _ours(frame):
            return None
        return self._line

    def _line(self, frame, event, arg):
        if event == "line" and self.armed and self.fired is None:
            if self.after is not None:
                source = linecache.getline(
                    frame.f_code.co_filename, frame.f_lineno
                )
                if self.after in source:
                    self.after = None
                return self._line
            self.seen += 1
            if self.seen == self.n:
                self.fired = f"{_where(frame)}:{frame.f_lineno}"
                raise self.exc
        return self._line


def _where(frame) -> str:
    """The function a line belongs to, for the reports of a sweep.

    The lifecycle's ``stores()`` makes the stores of the transition that
    calls it: a line there is that transition's, named ``caller/stores``.
    """
    name = frame.f_code.co_name
    if name == "stores" and frame.f_back is not None:
        return f"{frame.f_back.f_code.co_name}/{name}"
    return name


class AfterCall:
    """Raises *exc* right after the *n*-th call that *code* makes returns.

    CPython runs signal handlers (a ``KeyboardInterrupt``) when a call
    returns and on backward jumps, not between any two instructions: this
    raises where a signal can, before the instruction that follows a call
    in *code*'s own frame (not in the functions it calls).
    """

    def __init__(self, code, n: int, exc: type[BaseException]) -> None:
        self.code = code
        self.n = n
        self.exc = exc
        self.seen = 0
        self.fired: str | None = None
        instructions = list(dis.get_instructions(code))
        # A signal's exception is raised by the call's own instruction, so
        # the handlers around the call take it. Raising at the instruction
        # after a call stands for that only where the same handler covers
        # both: not after the call in ``return f()`` inside a ``try``
        # (3.11+ ends the protected range before the return).
        handler = _handlers(code)
        self.points = {
            after.offset
            for call, after in itertools.pairwise(instructions)
            if call.opname.startswith("CALL")
            and not call.opname.startswith("CALL_INTRINSIC")  # Not a call.
            and handler(call.offset) == handler(after.offset)
        }

    def tracer(self, frame, event, arg):
        if event != "call" or frame.f_code is not self.code:
            return None
        frame.f_trace = self._opcode
        frame.f_trace_opcodes = True
        # 3.12 applies f_trace_opcodes set here only once the tracer is set
        # again.
        sys.settrace(self.tracer)
        return self._opcode

    def _opcode(self, frame, event, arg):
        if (
            event == "opcode"
            and self.fired is None
            and frame.f_lasti in self.points
        ):
            self.seen += 1
            if self.seen == self.n:
                source = linecache.getline(
                    frame.f_code.co_filename, frame.f_lineno
                )
                self.fired = f"{frame.f_lineno}: {source.strip()}"
                raise self.exc
        return self._opcode


def _handlers(code) -> Callable[[int], int | None]:
    """Map an offset of *code* to the target of the handler covering it."""
    entries = getattr(dis.Bytecode(code), "exception_entries", ())

    def handler(offset: int) -> int | None:
        for entry in entries:
            if entry.start <= offset < entry.end:
                return entry.target
        return None  # No handler, or 3.10: its block stack covers both.

    return handler


def run(target: Callable[[], object]) -> tuple[threading.Thread, list[object]]:
    """Run *target* in a thread; return (thread, result box)."""
    box: list[object] = []

    def main() -> None:
        try:
            box.append(target())
        except BaseException as exc:
            box.append(exc)

    thread = threading.Thread(target=main)
    thread.start()
    return thread, box


def join(*threads: threading.Thread) -> None:
    """Join each thread, failing (not hanging) if one does not end."""
    for thread in threads:
        thread.join(WAIT)
        assert not thread.is_alive(), "thread hung"


@contextlib.contextmanager
def no_collector() -> Iterator[None]:
    """Keep the collector from running finalizers under an injector.

    A singleton dropped by an earlier test (or an earlier cut) is closed by
    a finalizer; run under the tracer, it would take the exception meant
    for the code under attack. Collections run outside.
    """
    gc.disable()
    try:
        yield
    finally:
        gc.enable()
