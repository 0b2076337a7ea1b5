"""Validating process_singleton()'s arguments, with errors naming the fix.

For callers without a type checker: a bad option, key or factory fails at
decoration time with a message naming it and the fix.
"""

from __future__ import annotations

import inspect
from typing import TYPE_CHECKING, cast

from poolkeeper._filekeys import FileKey
from poolkeeper.keys import EnvKey, KeyTuple

if TYPE_CHECKING:
    from collections.abc import Callable


def validate_options(
    close: object, after_fork: object, fork: object, interval: object
) -> None:
    """Validate the hooks, *fork* and the rebuild interval."""
    # Typed as object: this validation is for callers without a type checker.
    for option, hook in (("close", close), ("after_fork", after_fork)):
        if hook is not None and not callable(hook):
            msg = (
                f"process_singleton({option}=...) must be a callable taking "
                f"the client, got {type(hook).__name__}."
            )
            raise TypeError(msg)
    if fork not in ("rebuild", "keep"):
        msg = (
            f"process_singleton(fork=...) must be 'rebuild' or 'keep', "
            f"got {fork!r}."
        )
        raise ValueError(msg)
    if (
        isinstance(interval, bool)
        or not isinstance(interval, (int, float))
        or not interval >= 0
    ):
        msg = (
            "process_singleton(min_rebuild_interval=...) must be a number "
            f"of seconds >= 0, got {interval!r}."
        )
        raise ValueError(msg)


def validate_positional(factory: object) -> None:
    """Refuse a key passed where the factory goes: options are keywords."""
    parts = cast(
        "tuple[object, ...]",
        factory if isinstance(factory, tuple) else (factory,),
    )
    if parts and all(
        isinstance(p, (EnvKey, FileKey, KeyTuple)) for p in parts
    ):
        msg = (
            f"process_singleton() got the key {factory!r} as its factory: "
            "its options are keyword-only, write "
            f"@process_singleton(key={factory!r})."
        )
        raise TypeError(msg)


def validate_key(key: object) -> Callable[[], object] | None:
    """Validate *key*; return it as one function (a tuple combined) or None."""
    if key is None:
        return None
    parts = cast(
        "tuple[object, ...]", key if isinstance(key, tuple) else (key,)
    )
    if not parts:
        msg = "process_singleton(key=()) needs at least one key function."
        raise TypeError(msg)
    for part in parts:
        if not callable(part):
            msg = (
                "process_singleton(key=...) takes a function returning the "
                "configuration's key, or a tuple of such functions, got "
                f"{type(part).__name__}; for environment variables use "
                "poolkeeper.keys.env('NAME', ...)."
            )
            raise TypeError(msg)
    if len(parts) == 1:
        return cast("Callable[[], object]", parts[0])
    return _combine(cast("tuple[Callable[[], object], ...]", parts))


def validate_factory(factory: object) -> bool:
    """Validate *factory*; return whether it is an ``async def`` one."""
    if not callable(factory):
        msg = (
            "@process_singleton decorates a function that builds the "
            f"client, got a {type(factory).__name__}."
        )
        raise TypeError(msg)
    name = getattr(factory, "__qualname__", repr(factory))
    if inspect.isasyncgenfunction(factory):
        msg = (
            f"{name} is an async generator; a singleton factory returns "
            "the client: use `async def` with `return`."
        )
        raise TypeError(msg)
    if inspect.isgeneratorfunction(factory):
        msg = (
            f"{name} is a generator function; a singleton factory returns "
            "the client: use `return`, not `yield`, and pass close= to "
            "say how a retired client is closed."
        )
        raise TypeError(msg)
    is_async = inspect.iscoroutinefunction(factory)
    try:
        signature = inspect.signature(factory)
    except (TypeError, ValueError):
        return is_async  # Builtins without a signature: trust the caller.
    required = [
        p.name
        for p in signature.parameters.values()
        if p.default is p.empty
        and p.kind not in (p.VAR_POSITIONAL, p.VAR_KEYWORD)
    ]
    if required:
        msg = (
            f"{name} takes required parameters ({', '.join(required)}), but "
            "a singleton factory is called with none; read the "
            "configuration inside it (and key on it), or bind it with "
            "functools.partial."
        )
        raise TypeError(msg)
    return is_async


def _combine(
    parts: tuple[Callable[[], object], ...],
) -> Callable[[], object]:
    """Combine key functions into one returning a tuple of their values.

    Environment keys alone merge into one ``keys.env`` key; any other mix
    is a :class:`~poolkeeper.keys.KeyTuple`, pushed when every part is.
    """
    env_parts = [p for p in parts if isinstance(p, EnvKey)]
    if len(env_parts) == len(parts):
        return EnvKey(
            tuple(dict.fromkeys(n for p in env_parts for n in p.names))
        )
    return KeyTuple(parts)
