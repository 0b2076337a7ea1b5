"""What sync and async singletons share outside the lifecycle.

Identity semantics (hash, equality, copying, pickling by reference), the
argument validation, key evaluation and the after-fork error report.
"""

from __future__ import annotations

import contextlib
import inspect
import logging
import os
import pickle
import sys
import warnings
from typing import TYPE_CHECKING, Any, Generic, TypeVar

from poolkeeper._events import failure
from poolkeeper._fingerprint import fingerprint
from poolkeeper._lifecycle import MAX_ROUNDS
from poolkeeper.exceptions import PoolkeeperError

if TYPE_CHECKING:
    from collections.abc import Callable, Generator

    from poolkeeper._lifecycle import Lifecycle

T = TypeVar("T")

log = logging.getLogger("poolkeeper")


class Identity(Generic[T]):
    """Identity semantics for a singleton built on a wrapt proxy.

    wrapt forwards hashing, equality, copying and pickling to the wrapped
    factory; but a singleton *is* an identity (the registry relies on it),
    a copy of it is itself, and a pickle names it so that each process
    unpickles its own.
    """

    _self_name: str
    _self_life: Lifecycle[Any]

    # wrapt's C proxy defines __getattr__, so every attribute read on a
    # subclass goes through CPython's generic hook, which calls wrapt's
    # __getattribute__ as a method (a bound wrapper made per read, about
    # 1,000 instructions). That __getattribute__ does what object's does,
    # then falls back to __getattr__, as the hook does itself: with
    # object's here, the hook reads the attribute directly. (Hidden from
    # type checkers: to them it changes nothing, and is an override of
    # wrapt's without annotations.)
    if not TYPE_CHECKING:
        __getattribute__ = object.__getattribute__

    def __hash__(self) -> int:
        """Hash by identity."""
        return object.__hash__(self)

    def __eq__(self, other: object) -> bool:
        """Compare by identity."""
        return self is other

    def __copy__(self) -> Identity[T]:
        """A singleton's copy is itself."""
        return self

    def __deepcopy__(self, memo: object) -> Identity[T]:
        """A singleton's deep copy is itself."""
        return self

    def __reduce_ex__(self, protocol: object) -> str:
        """Pickle by reference: each process unpickles its own singleton.

        The reference is the name the singleton is reachable under in its
        factory's module: the factory's own name when decorated with ``@``,
        else the module attribute holding it (``api =
        process_singleton(_make_api)``).

        Raises:
            pickle.PicklingError: If no module attribute holds it.
        """
        return reachable_name(self, self._self_name)

    def override(self, obj: T) -> contextlib.AbstractContextManager[T]:
        """Make every call return *obj* inside a ``with`` block; for tests.

        poolkeeper never closes *obj*. The live client, if any, is left
        alone and served again after the block. Overrides nest, and each
        block removes its own override (by identity), even when blocks end
        out of order. For an async singleton, every ``await single()`` on
        every loop returns *obj*. Called without ``with`` it overrides
        nothing, and says so with a :class:`RuntimeWarning` (pointing at
        the call) when the unentered override is collected.

        Args:
            obj: What calls return inside the block.

        Returns:
            A context manager whose ``with`` block returns *obj*.
        """
        block = _Override(_overriding, (self._self_life, obj), {})
        caller = sys._getframe(1)
        block.site = (
            self._self_name,
            caller.f_code.co_filename,
            caller.f_lineno,
        )
        return block


def _overriding(life: Lifecycle[Any], obj: T) -> Generator[T, None, None]:
    token = object()
    # Pushed inside the try: a push cut short after it committed (a
    # KeyboardInterrupt while it arms the hit path) is still popped.
    # Two layers: a pop cut short, or an exception at the inner
    # finally's first line, is finished by the outer one (popping is
    # idempotent).
    try:
        try:
            life.push_override(token, obj)
            yield obj
        finally:
            life.pop_override(token)
    finally:
        if life.holds_override(token):
            life.pop_override(token)


class _Override(contextlib._GeneratorContextManager[T]):
    """An override block that warns if it is collected never entered.

    Its ``__enter__`` and ``__exit__`` are contextlib's own: only the
    generator's lines run between the push and the pop, whose layers an
    exception at any line cannot defeat.
    """

    site: tuple[str, str, int] = ("?", "?", 0)
    # Used as a decorator: each call enters a fresh copy, never this one.
    decorated = False

    def _recreate_cm(self) -> _Override[T]:
        self.decorated = True
        fresh = _Override(self.func, self.args, self.kwds)
        fresh.site = self.site
        return fresh

    def __del__(self) -> None:
        gen = getattr(self, "gen", None)
        if gen is None or self.decorated:
            return
        if inspect.getgeneratorstate(gen) != inspect.GEN_CREATED:
            return
        name, filename, lineno = self.site
        warnings.warn_explicit(
            f"{name}.override(...) was never entered, so it overrode "
            f"nothing: use it as a block, `with {name}.override(obj):`.",
            RuntimeWarning,
            filename,
            lineno,
        )


def reachable_name(single: object, name: str) -> str:
    """Return the name of *single* in its module, for pickling by reference.

    *name* (the factory's qualified name) is tried first, then every
    attribute of the module; a singleton nothing names cannot be unpickled
    in another process, so it fails here with what to do.
    """
    module_name = getattr(single, "__module__", None)
    module = sys.modules.get(module_name) if module_name else None
    if module is not None:
        found: object = module
        for part in name.split("."):
            found = getattr(found, part, None)
        if found is single:
            return name
        for attr, value in list(vars(module).items()):
            if value is single:
                return attr
    msg = (
        f"Cannot pickle the singleton of {name}: no attribute of its module "
        f"{module_name!r} holds it, so another process could not find it. "
        f"Assign it to a module-level name (api = process_singleton({name})) "
        "or decorate the factory with @process_singleton."
    )
    raise pickle.PicklingError(msg)


def no_arguments(name: str, args: tuple[object, ...], kwargs: object) -> str:
    """Return the error message for a singleton called with arguments."""
    given = len(args) + len(kwargs)  # type: ignore[arg-type]
    message = (
        f"{name}() takes no arguments ({given} given); a singleton is "
        "called with none: read the configuration inside its factory."
    )
    if len(args) == 1 and not kwargs and callable(args[0]):
        # Applied as a decorator: @process_singleton(some_key) made the key
        # the factory, and this singleton is applied to the real factory.
        message += (
            f" If it decorates a function, @process_singleton({name}) made "
            f"{name} the factory: the options of process_singleton are "
            f"keyword-only, write @process_singleton(key={name}) (or "
            "close=..., after_fork=...)."
        )
    return message


def too_many_rounds(name: str, what: str) -> PoolkeeperError:
    """Return the error for a call that gave up after ``MAX_ROUNDS``.

    *what* is ``"lease"``, ``"build"`` (a keyed singleton: its key changed
    or its client was retired before each build could be served) or
    ``"retired"`` (a singleton without a key: only a retirement can send
    a build back).
    """
    stop = (
        "stop resetting or retiring it in a loop (retire(client) retires "
        "only the client it is given, once)."
    )
    if what == "lease":
        msg = f"{name} was retired during each of {MAX_ROUNDS} attempts to "
        msg += f"lease it; {stop}"
    elif what == "retired":
        msg = (
            f"{name} was retired (reset(), retire(), close_all() or "
            f"healing) before each of {MAX_ROUNDS} builds could be served; "
            f"{stop}"
        )
    else:
        msg = (
            f"The key of {name} changed, or its client was retired, before "
            f"each of {MAX_ROUNDS} builds could be served; make the key "
            "function return a value that only changes with the "
            f"configuration, and {stop}"
        )
    return PoolkeeperError(msg)


def evaluate_key(
    key: Callable[[], object] | None, name: str
) -> tuple[int, object]:
    """Return ``(hash, value)`` of *key*'s current value; ``(0, None)``.

    Runs with no lock held: a key may read files or the environment.

    Raises:
        TypeError: If the value is unhashable, naming the factory.
    """
    if key is None:
        return 0, None
    return hash_key(key(), name)


def hash_key(value: object, name: str) -> tuple[int, object]:
    """Return ``(hash, value)`` of a key's *value*.

    Raises:
        TypeError: If the value is unhashable, naming the factory.
    """
    try:
        return hash(value), value
    except TypeError:
        msg = (
            f"The key of {name} returned an unhashable "
            f"{type(value).__name__}; make the key function return a "
            "tuple of strings or other hashable values."
        )
        raise TypeError(msg) from None


def key_fingerprint(has_key: bool, value: object) -> str | None:  # noqa: FBT001
    """Fingerprint a key value for reprs, logs and statistics.

    A value whose ``repr()`` raises gets a fingerprint of its type alone:
    showing the key must never stop the build that needs it.
    """
    if not has_key:
        return None
    try:
        return fingerprint(value)
    except Exception:  # noqa: BLE001 -- a display value, never fatal.
        return fingerprint(f"<unrepresentable {type(value).__qualname__}>")


def report_fork_errors(name: str, errors: list[BaseException]) -> None:
    """Log, once, the after_fork failures (and warnings) kept quiet.

    Empties *errors*: the hook runs in a forked child where logging could
    deadlock, so the first call in the child reports them instead.
    """
    while errors:
        exc = errors.pop(0)
        if isinstance(exc, Warning):  # Said by the hook, not raised.
            log.warning(
                "%s (the after_fork hook of %s, in process %d)",
                exc,
                name,
                os.getpid(),
                extra={"poolkeeper_factory": name},
            )
            continue
        failure(
            log,
            f"The after_fork hook of {name} failed in process {os.getpid()}.",
            exc,
            {"poolkeeper_factory": name},
        )
