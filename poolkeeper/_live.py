"""What every singleton records about a built client, sync or async."""

from __future__ import annotations

from typing import TYPE_CHECKING, Generic, TypeVar

from poolkeeper import _registry

if TYPE_CHECKING:
    from collections.abc import Callable

T = TypeVar("T")

# How many builds for other keys a caller waits out before giving up.
MAX_ROUNDS = 100

# Clients a forked child inherited: kept referenced so that no finalizer
# ever runs on them in the child, because their sockets are the parent's.
abandoned: list[object] = []


class Live(Generic[T]):
    """A built client and what the slot knows about it."""

    __slots__ = (
        "client",
        "fingerprint",
        "generation",
        "key_hash",
        "leases",
        "sequence",
        "state",
    )

    def __init__(
        self, client: T, key_hash: int, fp: str | None, gen: int
    ) -> None:
        self.client = client
        self.key_hash = key_hash
        self.fingerprint = fp
        self.generation = gen
        self.sequence = next(_registry.build_sequence)
        self.leases = 0
        # "live" -> "retired" (waits for leases) -> "closed"; "abandoned"
        # in a forked child, where it is never closed.
        self.state = "live"


def abandon(
    inherited: list[Live[T]],
    after_fork: Callable[[T], object] | None,
    errors: list[Exception],
) -> None:
    """Abandon a forked child's inherited clients: never close them.

    They stay referenced (no finalizer runs on the parent's sockets), and
    *after_fork* runs on each. Called from the at-fork hook, so failures
    are kept in *errors* for the first call in the child to log.
    """
    for live in inherited:
        live.state = "abandoned"
        abandoned.append(live.client)
        if after_fork is not None:
            try:
                after_fork(live.client)
            except Exception as exc:  # noqa: BLE001 -- logged on first use.
                errors.append(exc)


class Identity:
    """Identity semantics for a singleton built on a wrapt proxy.

    wrapt forwards hashing, equality and pickling to the wrapped factory;
    identity is what a singleton means (the registry's WeakSet relies on
    it), and a pickle names the singleton so each process unpickles its own.
    """

    _self_name: str

    def __hash__(self) -> int:
        """Hash by identity."""
        return object.__hash__(self)

    def __eq__(self, other: object) -> bool:
        """Compare by identity."""
        return self is other

    def __reduce_ex__(self, protocol: object) -> str:
        """Pickle by reference: each process unpickles its own singleton."""
        return self._self_name


def evaluate_key(
    key: Callable[[], object] | None, name: str
) -> tuple[int, object]:
    """Return ``(hash, value)`` of *key*'s current value; ``(0, None)``.

    Runs with no lock held: a key may read files or the environment. Only
    the hash is compared and only a fingerprint is kept; the raw value is
    dropped once the build that needs it is done.

    Raises:
        TypeError: If the value is unhashable, naming the factory.
    """
    if key is None:
        return 0, None
    value = key()
    try:
        return hash(value), value
    except TypeError:
        msg = (
            f"The key of {name} returned an unhashable "
            f"{type(value).__name__}; make the key function return a "
            "tuple of strings or other hashable values."
        )
        raise TypeError(msg) from None
