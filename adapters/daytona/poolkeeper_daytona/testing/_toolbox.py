"""The emulator's toolbox: a sandbox's commands, answered, never run.

The SDK sends a sandbox's toolbox calls (``sandbox.process.exec(...)``)
to ``<toolboxProxyUrl>/<sandbox id><path>``; the emulator's proxy URL is
its own origin plus :data:`TOOLBOX_PREFIX`. Nothing is run on the host:
a command is answered by a shell that knows four commands, enough for a
test to see that the command it sent is the one answered.
"""

from __future__ import annotations

import shlex
from typing import Final

__all__ = ["TOOLBOX_PREFIX", "answer"]

TOOLBOX_PREFIX: Final = "/toolbox"

# What sh answers for a command it cannot find, and for bad syntax.
_NOT_FOUND: Final = 127
_SYNTAX: Final = 2


def answer(command: str) -> tuple[int, str]:
    """Return the exit code and output a shell would give for *command*.

    ``echo WORDS`` prints its words, ``true`` and ``false`` exit 0 and 1,
    ``exit N`` exits N; any other command is not found (127), as in a
    shell without that program.
    """
    try:
        words = shlex.split(command)
    except ValueError:
        return _SYNTAX, f"sh: syntax error: {command}\n"
    if not words:
        return 0, ""
    name, args = words[0], words[1:]
    if name == "echo":
        return 0, " ".join(args) + "\n"
    if name in {"true", "false"}:
        return int(name == "false"), ""
    if name == "exit" and len(args) <= 1:
        code = args[0] if args else "0"
        if code.isdigit():
            return int(code) % 256, ""
    return _NOT_FOUND, f"sh: {name}: not found\n"
