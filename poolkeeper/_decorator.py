"""process_singleton(): its typed signatures, its checks, the singleton made.

For callers without a type checker, a bad option, key or factory fails at
decoration time with a message naming it and the fix (``validate_*``).

Each singleton is an instance of a subclass of its own, so that its hit
path can be switched by one class-attribute store (the sync driver arms a
singleton's class, ``_loops`` an async one's). Both drivers are wired the
same way around their lifecycle (``make``, ``make_async``): a close path,
an entry in the registry (the fork hook, ``close_all()``) and, for a key
whose changes are pushed (``keys.env``, ``keys.file``), a subscription.
"""

from __future__ import annotations

import dataclasses
import difflib
import functools
import inspect
import weakref
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

from poolkeeper import _loops, _registry, _threads, keys
from poolkeeper._async import NOT_SEEN, AsyncProcessSingleton
from poolkeeper._close import Closer
from poolkeeper._filekeys import FileKey
from poolkeeper._healing import CHECK_EVERY, matcher
from poolkeeper._lease import lease_class
from poolkeeper._lifecycle import Lifecycle
from poolkeeper._sync import ProcessSingleton, _slow_call, arm
from poolkeeper.keys import EnvKey, KeyTuple

T = TypeVar("T")
# The client type a close= or after_fork= hook accepts: a hook for a wider
# type (``object``) fits any factory, so decorators vary contravariantly.
C_contra = TypeVar("C_contra", contravariant=True)
S = TypeVar("S", ProcessSingleton[Any], AsyncProcessSingleton[Any])

_OPTIONS = (
    "after_fork",
    "check",
    "check_every",
    "close",
    "fork",
    "key",
    "max_age",
    "min_rebuild_interval",
    "name",
    "retire_on",
    "scope",
)

KeyOption: TypeAlias = Union[  # noqa: UP007 -- evaluated on Python 3.10.
    Callable[[], object], tuple[Callable[[], object], ...], None
]
#: What *retire_on* takes: exception types, or a predicate on the error.
RetireOn: TypeAlias = Union[  # noqa: UP007 -- evaluated on Python 3.10.
    type[BaseException],
    tuple[type[BaseException], ...],
    Callable[[BaseException], bool],
    None,
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
    retire_on: RetireOn = None,
    name: str | None = None,
    max_age: float | None = None,
    check: Callable[[Any], object] | None = None,
    check_every: float | None = None,
    scope: Literal["process", "thread"] = "process",
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
    retire_on: RetireOn = None,
    name: str | None = None,
    max_age: float | None = None,
    check: Callable[[Any], object] | None = None,
    check_every: float | None = None,
    scope: Literal["process", "thread"] = "process",
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
    retire_on: RetireOn = None,
    name: str | None = None,
    max_age: float | None = None,
    check: Callable[[Any], object] | None = None,
    check_every: float | None = None,
    scope: Literal["process", "thread"] = "process",
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
    retire_on: RetireOn = None,
    name: str | None = None,
    max_age: float | None = None,
    check: Callable[[Any], object] | None = None,
    check_every: float | None = None,
    scope: Literal["process", "thread"] = "process",
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
            ``reset()`` retires nothing and returns ``False``; the reset
            is deferred, and a timer carries it out when they end.
        retire_on: What means "this client is broken": an exception type,
            a tuple of them, or a predicate ``exc -> bool`` (one that
            raises is logged and means no). A matching exception escaping
            a ``with single.lease()`` block, an ``async with`` lease, or
            a method called through ``single.proxy()`` retires that
            client (as ``retire()`` does, with its backoff) and then
            propagates unchanged: never swallowed, never retried.
        name: The singleton's name in logs, events and metrics (the
            ``poolkeeper_singleton`` log field, the ``poolkeeper.singleton``
            metric attribute) and in errors. Default: the factory's
            ``__qualname__``.
        max_age: Seconds a client lives (a positive number; None, the
            default: for ever). Each client's deadline is spread by a
            random jitter of up to 10 % (it lives between *max_age* and
            1.1 x *max_age* seconds), so that a fleet of workers does not
            rebuild in the same second; a timer started at its build then
            retires it (reason ``"max_age"``, a healing retirement: the
            backoff applies), and the next call builds a new one. The hit
            path reads no clock. A lease holding the old client keeps it
            until it exits; then it is closed.
        check: A health probe ``client -> bool``: false, or raising an
            ``Exception``, means the client is broken, and it is retired
            (reason ``"check"``, a healing retirement). It runs at most
            once per *check_every* seconds per client, with no lock held,
            by the first call or lease that finds it due; other callers
            are served the current client meanwhile. Counted in
            ``statistics().probes`` and ``probe_failures``. An async
            singleton's check may be an ``async def`` (``await
            redis.ping()``): the task that probes awaits it while the
            loop's other tasks are served. A thread singleton's check is a
            plain function (an ``async def`` is rejected here).
        check_every: Seconds between probes of a client (a positive
            number); default 30 when *check* is given. An error without
            *check*.
        scope: ``"process"`` (default): one client for the process,
            shared by its threads. ``"thread"``: one client per thread,
            for clients with per-client state or a "one per thread" rule
            (a cookie or auth session, a redis ``Pipeline`` or ``PubSub``,
            a boto3 ``Session`` or resource). A call returns the calling
            thread's client, built once for that thread (a new thread
            given a dead thread's ident gets a new one); keys, ``retire()``,
            *retire_on*, *check*, *max_age*, ``lease()`` and ``proxy()``
            work per thread. ``reset()`` retires every thread's client, and
            each retired client is closed on its own thread, at that
            thread's next call or its end (never under one of its calls);
            a thread's end closes its client there, and ``close_all()``
            closes them all. ``override()`` is process-wide. A forked child
            closes none of its parent's clients and builds its own; with
            ``fork="keep"``, its thread keeps the forking thread's client
            (with its timers), and the other threads' are abandoned there.
            ``statistics()`` sums the counters over threads (``live``: the
            threads' live clients); its live fields (``generation``,
            ``key_fingerprint``, ``backoff``, ``deferred``) are the calling
            thread's. Not with an ``async def`` factory (async singletons
            already keep one client per event loop), nor with
            *min_rebuild_interval*. Shared thread-safe clients stay
            ``"process"``, with pools sized for the threads.
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
            if an option is unknown, a hook is not callable, *check*
            is an async function, *retire_on* is neither exception types
            nor a predicate, or *name* is not a string.
        TypeError: If *scope* is ``"thread"`` for an ``async def``
            factory.
        ValueError: If *fork*, *min_rebuild_interval*, *max_age* or
            *check_every* is out of range, *check_every* is given without
            *check*, *name* is empty, *scope* is neither ``"process"`` nor
            ``"thread"``, or *min_rebuild_interval* is given with
            ``scope="thread"``.

    .. versionadded:: 0.1
    """
    if unknown:
        option = next(iter(unknown))
        hint = difflib.get_close_matches(option, _OPTIONS, n=1)
        maybe = f" (did you mean {hint[0]!r}?)" if hint else ""
        msg = (
            f"process_singleton() got an unknown option {option!r}{maybe}; "
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
        is_async = validate_factory(factory)
        made: Callable[
            [Any, Options], ProcessSingleton[Any] | AsyncProcessSingleton[Any]
        ] = make_async if is_async else make
        if validate_scope(
            _name(factory), scope, is_async, min_rebuild_interval
        ):
            made = make_thread
        validate_retire_on(_name(factory), retire_on)
        validate_name(_name(factory), name)
        every = validate_healing(
            _name(factory), max_age, check, check_every, is_async
        )
        options = Options(
            name=name or _name(factory),
            key=combined_key,
            close=close,
            after_fork=after_fork,
            keep=fork == "keep",
            min_rebuild_interval=float(min_rebuild_interval),
            retire_on=retire_on,
            max_age=None if max_age is None else float(max_age),
            check=check,
            check_every=every,
        )
        return made(factory, options)

    if factory is None:
        return cast("_Decorator", decorate)
    return decorate(factory)


# -- checks --------------------------------------------------------------


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


def validate_scope(
    name: str,
    scope: object,
    is_async: bool,  # noqa: FBT001 -- the factory's kind.
    interval: object,
) -> bool:
    """Validate *scope*; return whether it is ``"thread"``."""
    if scope not in ("process", "thread"):
        msg = (
            f"process_singleton(scope=...) for {name} must be 'process' (one "
            f"client for the process, the default) or 'thread' (one client "
            f"per thread), got {scope!r}."
        )
        raise ValueError(msg)
    if scope == "process":
        return False
    if is_async:
        msg = (
            f"process_singleton(scope='thread') for {name}: {name} is an "
            "async def factory, and async singletons already keep one "
            "client per event loop; leave scope out."
        )
        raise TypeError(msg)
    if interval:
        msg = (
            f"process_singleton(min_rebuild_interval=...) for {name} cannot "
            "go with scope='thread': a thread singleton's reset() is carried "
            "out on each thread at its next call, never deferred; leave "
            "min_rebuild_interval out."
        )
        raise ValueError(msg)
    return True


def validate_name(factory: str, name: object) -> None:
    """Validate *name*: a non-empty string, or None."""
    if name is None:
        return
    if not isinstance(name, str):
        msg = (
            f"process_singleton(name=...) for {factory} must be a string "
            f"naming the singleton in logs and metrics, got "
            f"{type(name).__name__}."
        )
        raise TypeError(msg)
    if not name.strip():
        msg = (
            f"process_singleton(name=...) for {factory} must be a non-empty "
            "string; leave it out to use the factory's qualified name."
        )
        raise ValueError(msg)


def _seconds(name: str, option: str, value: object) -> float | None:
    """*value* as positive seconds, None for None; else a clear error."""
    if value is None:
        return None
    if (
        isinstance(value, bool)
        or not isinstance(value, (int, float))
        or not 0 < value < float("inf")
    ):
        msg = (
            f"process_singleton({option}=...) for {name} must be a "
            f"positive number of seconds (or None), got {value!r}."
        )
        raise ValueError(msg)
    return float(value)


def validate_healing(
    name: str,
    max_age: object,
    check: object,
    check_every: object,
    is_async: bool,  # noqa: FBT001 -- the singleton's kind.
) -> float | None:
    """Validate *max_age*, *check* and *check_every*; return check_every.

    *check_every* defaults to ``CHECK_EVERY`` seconds with *check*. An
    ``async def`` check is awaited by an async singleton's probe; a thread
    singleton's probe must answer at once.
    """
    _seconds(name, "max_age", max_age)
    every = _seconds(name, "check_every", check_every)
    if check is None:
        if every is not None:
            msg = (
                f"process_singleton(check_every=...) for {name} needs a "
                "check: pass check=<a function client -> bool> too, or "
                "drop check_every."
            )
            raise ValueError(msg)
        return None
    if not callable(check):
        msg = (
            f"process_singleton(check=...) for {name} must be a callable "
            f"taking the client and returning a bool, got "
            f"{type(check).__name__}."
        )
        raise TypeError(msg)
    if not is_async and inspect.iscoroutinefunction(check):
        msg = (
            f"process_singleton(check=...) for {name} is an async function, "
            f"but {name} is a thread singleton (its factory is a plain "
            "function): its probe cannot await. Pass a plain function "
            "client -> bool, or make the factory async def."
        )
        raise TypeError(msg)
    return CHECK_EVERY if every is None else every


def validate_retire_on(name: str, retire_on: object) -> None:
    """Validate *retire_on*: exception types, or a predicate; or None."""
    if retire_on is None:
        return
    parts = cast(
        "tuple[object, ...]",
        retire_on if isinstance(retire_on, tuple) else (retire_on,),
    )
    if isinstance(retire_on, tuple) and not parts:
        msg = (
            f"process_singleton(retire_on=()) for {name} names no exception "
            "type: pass the types that mean the client is broken, a "
            "predicate, or leave it out."
        )
        raise TypeError(msg)
    types = [p for p in parts if isinstance(p, type)]
    for part in types:
        if not issubclass(part, BaseException):
            msg = (
                f"process_singleton(retire_on=...) for {name} takes "
                "exception types, a tuple of them, or a predicate "
                f"exc -> bool; {part.__name__} is not an exception type."
            )
            raise TypeError(msg)
    if len(types) == len(parts):
        return
    if isinstance(retire_on, tuple) or not callable(retire_on):
        bad = next(p for p in parts if not isinstance(p, type))
        msg = (
            f"process_singleton(retire_on=...) for {name} takes exception "
            "types, a tuple of them, or a predicate exc -> bool, got "
            f"{type(bad).__name__}."
        )
        raise TypeError(msg)


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


# -- the singleton made --------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Options:
    """A singleton's options, checked: what both drivers are made from.

    A new healing-type option (as *max_age* and *check*) touches four
    modules and no driver:

    1. here: its parameter of ``process_singleton``, its check above, its
       field, and ``_wire`` setting it on the lifecycle;
    2. ``_lifecycle``: its rule, in the healing section (and
       ``has_timers``, if each build starts a timer for it);
    3. ``_records``: the state it keeps in a slot (a frozen record, replaced
       whole) and its ``Statistics`` fields;
    4. ``_healing``: what a driver does with it (its timer in
       ``start_timers``, the callback that timer runs), reading it from the
       lifecycle.

    The drivers (``_sync``, ``_async``) reach healing only through
    ``_healing``'s functions and the lifecycle's answers.
    """

    name: str
    key: Callable[[], object] | None
    close: Callable[[Any], object] | None
    after_fork: Callable[[Any], object] | None
    keep: bool  # fork="keep"
    min_rebuild_interval: float
    retire_on: object
    max_age: float | None
    check: Callable[[Any], object] | None
    check_every: float | None


def make(
    factory: Callable[[], T],
    options: Options,
    slow: Callable[..., Any] = _slow_call,
    closing: type[Closer] = Closer,
) -> ProcessSingleton[T]:
    """Return a new process singleton for *factory*.

    *slow* is its class's call while its hit path is disarmed, *closing*
    its closer's class (a thread singleton's, and each of its threads',
    have their own: see _threads).
    """
    single: ProcessSingleton[T] = _own(ProcessSingleton, factory)
    own = type(single)
    if slow is not _slow_call:
        type.__setattr__(own, "__call__", slow)
    # Where the polled hit path finds the key (see _sync.arm).
    type.__setattr__(own, "_poolkeeper_key", options.key)
    # The lifecycle outlives a dropped singleton (the registry holds it),
    # so it holds the singleton's class weakly: the class's polled
    # __call__ holds the key, and a key may reach the singleton.
    cls: weakref.ReferenceType[type] = weakref.ref(own)
    life, closer = _wire(
        single,
        options,
        functools.partial(arm, cls, options.name, slow),
        is_async=False,
        closing=closing,
    )
    slot = single._self_slot = life.open_slot(None, None)[0]
    # Making a lease runs no Python code: lease() is replaced by this
    # singleton's own lease class.
    heals = options.retire_on is not None
    leases = lease_class(single, life, slot, closer, options.name, heals=heals)
    type.__setattr__(own, "lease", leases)
    _register(
        single,
        options,
        _registry.Entry(life, closer, options.after_fork, keep=options.keep),
    )
    return single


def make_thread(
    factory: Callable[[], T], options: Options
) -> ProcessSingleton[T]:
    """Return a new thread singleton (``scope="thread"``) for *factory*.

    Its own lifecycle never builds: it keeps the overrides (its class's
    call is armed with the stand-in) and its registry entry. Each thread
    gets an inner singleton made from the same factory and options, with
    the slow path and the closer of _threads.
    """
    scope = _threads.Scope(
        options.name, factory, functools.partial(make, options=options)
    )
    hit = cast("Callable[..., Any]", scope.hit())
    single = make(factory, dataclasses.replace(options, key=None), hit)
    own = type(single)
    scope.life = life = single._self_life
    scope.cls = weakref.ref(own)
    life.arm = scope.arm
    single._self_scope = scope
    for method, function in _threads.METHODS.items():
        type.__setattr__(own, method, function)
    return single


def make_async(
    factory: Callable[[], Coroutine[Any, Any, T]], options: Options
) -> AsyncProcessSingleton[T]:
    """Return a new per-loop singleton for the ``async def`` *factory*."""
    single: AsyncProcessSingleton[T] = _own(AsyncProcessSingleton, factory)
    # Held weakly, as for a thread singleton.
    cls: weakref.ReferenceType[type] = weakref.ref(type(single))
    arming = functools.partial(
        _loops.arm, cls, weakref.ref(single), options.name
    )
    life, closer = _wire(single, options, arming, is_async=True)
    single._self_seen = NOT_SEEN
    entry = _registry.Entry(
        life,
        closer,
        options.after_fork,
        keep=options.keep,
        prune=functools.partial(_loops.prune, life),
    )
    _register(single, options, entry)
    return single


def _own(cls: type[S], factory: object) -> S:
    """Wrap *factory* in an instance of a subclass of *cls* of its own."""
    own = type(cls.__name__, (cls,), {"__module__": cls.__module__})
    return cast("S", own(factory))


def _name(factory: object) -> str:
    return getattr(factory, "__qualname__", repr(factory))


def _wire(
    single: ProcessSingleton[T] | AsyncProcessSingleton[T],
    options: Options,
    arm: Callable[..., bool],
    *,
    is_async: bool,
    closing: type[Closer] = Closer,
) -> tuple[Lifecycle[T], Closer]:
    """Make *single*'s lifecycle and closer; keep its options on it."""
    life: Lifecycle[T] = Lifecycle(
        options.name,
        pushed=options.key is None,
        min_interval=options.min_rebuild_interval,
        arm=arm,
    )
    life.max_age, life.check_every = options.max_age, options.check_every
    if options.check is not None:
        life.check = options.check
    closer = closing(life, options.close, is_async=is_async)
    # wrapt keeps attributes named _self_* on the proxy itself.
    single._self_name = options.name
    single._self_key = options.key
    single._self_life = life
    single._self_closer = closer
    single._self_retire_on = matcher(options.name, options.retire_on)
    return life, closer


def _register(
    single: ProcessSingleton[T] | AsyncProcessSingleton[T],
    options: Options,
    entry: _registry.Entry,
) -> None:
    _registry.register(single, entry)
    # Changes of keys.env and keys.file keys (and tuples of them) are
    # pushed, not polled: the hit path stays armed until one changes.
    key = options.key
    if key is not None and keys.subscribe(key, entry.life):
        entry.life.subscribed()
