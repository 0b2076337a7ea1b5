"""process_singleton(): its typed signatures, then a sync or async singleton.

The validation of its arguments is in ``_options``.
"""

from __future__ import annotations

import difflib
from collections.abc import Callable, Coroutine
from typing import (
    TYPE_CHECKING,
    Any,
    Generic,
    Literal,
    Protocol,
    TypeAlias,
    TypeVar,
    Union,
    cast,
    overload,
)

from poolkeeper._make import make, make_async
from poolkeeper._options import (
    validate_factory,
    validate_key,
    validate_options,
    validate_positional,
)

if TYPE_CHECKING:
    from poolkeeper._async import AsyncProcessSingleton
    from poolkeeper._singleton import ProcessSingleton

T = TypeVar("T")
# The client type a close= or after_fork= hook accepts: a hook for a wider
# type (``object``) fits any factory, so decorators vary contravariantly.
C_contra = TypeVar("C_contra", contravariant=True)

_OPTIONS = ("after_fork", "close", "fork", "key", "min_rebuild_interval")

KeyOption: TypeAlias = Union[  # noqa: UP007 -- evaluated on Python 3.10.
    Callable[[], object], tuple[Callable[[], object], ...], None
]


class _Decorator(Protocol):
    """What ``process_singleton(...)`` with options returns."""

    @overload
    def __call__(  # pyright: ignore[reportOverlappingOverload]
        self, factory: Callable[[], Coroutine[Any, Any, T]], /
    ) -> AsyncProcessSingleton[T]: ...
    @overload
    def __call__(self, factory: Callable[[], T], /) -> ProcessSingleton[T]: ...


if TYPE_CHECKING:

    class _HookedDecorator(Generic[C_contra]):
        """What ``process_singleton(close=hook, ...)`` returns.

        The factory's client type must be one the hooks accept: a hook
        written for another client type is an error. Only type checkers
        see this class; at run time the decorator is a plain function.
        """

        @overload
        def __call__(
            self: _HookedDecorator[T],
            factory: Callable[[], Coroutine[Any, Any, T]],
            /,
        ) -> AsyncProcessSingleton[T]: ...
        @overload
        def __call__(
            self: _HookedDecorator[T], factory: Callable[[], T], /
        ) -> ProcessSingleton[T]: ...
        def __call__(self, factory: Any, /) -> Any: ...


# An async factory also matches Callable[[], T]; the first overload wins,
# as intended, so the overlap is deliberate.
@overload
def process_singleton(  # pyright: ignore[reportOverlappingOverload]
    factory: Callable[[], Coroutine[Any, Any, T]], /
) -> AsyncProcessSingleton[T]: ...


@overload
def process_singleton(factory: Callable[[], T], /) -> ProcessSingleton[T]: ...


# Hooks taking any object (or none) keep the factory's own client type.
@overload
def process_singleton(
    factory: None = None,
    /,
    *,
    key: KeyOption = None,
    close: Callable[[object], object] | None = None,
    after_fork: Callable[[object], object] | None = None,
    fork: Literal["rebuild", "keep"] = "rebuild",
    min_rebuild_interval: float = 0.0,
) -> _Decorator: ...


@overload
def process_singleton(
    factory: None = None,
    /,
    *,
    key: KeyOption = None,
    close: Callable[[C_contra], object],
    after_fork: Callable[[C_contra], object] | None = None,
    fork: Literal["rebuild", "keep"] = "rebuild",
    min_rebuild_interval: float = 0.0,
) -> _HookedDecorator[C_contra]: ...


@overload
def process_singleton(
    factory: None = None,
    /,
    *,
    key: KeyOption = None,
    close: None = None,
    after_fork: Callable[[C_contra], object],
    fork: Literal["rebuild", "keep"] = "rebuild",
    min_rebuild_interval: float = 0.0,
) -> _HookedDecorator[C_contra]: ...


def process_singleton(  # noqa: PLR0913 -- every option is keyword-only.
    factory: Callable[[], Any] | None = None,
    /,
    *,
    key: KeyOption = None,
    close: Callable[[Any], object] | None = None,
    after_fork: Callable[[Any], object] | None = None,
    fork: Literal["rebuild", "keep"] = "rebuild",
    min_rebuild_interval: float = 0.0,
    **unknown: object,
) -> (
    ProcessSingleton[Any]
    | AsyncProcessSingleton[Any]
    | _Decorator
    | _HookedDecorator[Any]
):
    """Make a zero-argument client factory a process-wide singleton.

    Use it bare (``@process_singleton``) or with options
    (``@process_singleton(key=..., close=...)``). On an ``async def``
    factory it makes an :class:`AsyncProcessSingleton`: one client per
    process and event loop, closed on its own loop.

    Args:
        factory: The function that builds the client; takes no arguments.
        key: A function (or tuple of functions) returning a hashable value
            that identifies the configuration, evaluated on every call with
            no lock held; when its value changes the client is rebuilt and
            the old one retired. See :mod:`poolkeeper.keys`.
        close: Called with a retired client to close it. Default: the
            close an installed adapter declares for the client's type
            (the ``poolkeeper.adapters`` entry points), else the client's
            own ``close()`` if it has one (for async singletons
            ``aclose()`` first; awaitables are awaited), else nothing
            (said once per type, at WARNING).
        after_fork: Called in a forked child with each client inherited
            from the parent, which the child then abandons without closing.
            It must not use the client's connections (they are the
            parent's); release only the child's copies of OS resources.
            Default: the fork hook an installed adapter declares for the
            client's type, else nothing.
        fork: ``"rebuild"`` (default): a forked child builds its own client.
            ``"keep"``: the child keeps using the parent's, for clients
            documented as fork-safe.
        min_rebuild_interval: Seconds after a build during which
            ``reset()`` retires nothing and returns ``False``.
        **unknown: Rejected with a clear error; every option is named.

    Type checkers check both hooks against the factory's client type: a
    hook written for another client fails ``mypy --strict`` and pyright.
    Pass a method (``close=Client.shutdown``) or a typed function; an
    unannotated ``lambda`` cannot be checked and is rejected there.

    Returns:
        The singleton, or a decorator making one.

    Raises:
        TypeError: If the factory is not callable, takes required
            parameters, or is a generator or async generator function;
            if an option is unknown, or a hook is not callable.
        ValueError: If *fork* or *min_rebuild_interval* is out of range.

    .. versionadded:: 0.1
    """
    if unknown:
        name = next(iter(unknown))
        hint = difflib.get_close_matches(name, _OPTIONS, n=1)
        maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
        msg = (
            f"process_singleton() got an unknown option {name!r}{maybe}; "
            f"the options are {', '.join(_OPTIONS)}."
        )
        raise TypeError(msg)
    validate_positional(factory)
    combined_key = validate_key(key)
    validate_options(close, after_fork, fork, min_rebuild_interval)

    def decorate(
        factory: Callable[[], Any],
    ) -> ProcessSingleton[Any] | AsyncProcessSingleton[Any]:
        # A class of its own for each: its __call__ is the armed hit path.
        made = make_async if validate_factory(factory) else make
        return made(
            factory,
            key=combined_key,
            close=close,
            after_fork=after_fork,
            fork=fork,
            min_rebuild_interval=float(min_rebuild_interval),
        )

    if factory is None:
        return cast("_Decorator", decorate)
    return decorate(factory)
