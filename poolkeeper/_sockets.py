"""Release a forked child's copies of an abandoned client's sockets.

A forked child abandons its parent's client without closing it, but its
copies of the client's socket descriptors keep the kernel sockets open.
While any child lives, the parent's ``close()`` sends no FIN: the server
never sees the connection end. :func:`release_sockets` drops the child's
references and sends nothing on the wire, only in a forked child, and
never those of a client the child keeps (``fork="keep"``) or of an event
loop.
"""

from __future__ import annotations

import asyncio
import collections
import itertools
import logging
import os
import selectors
import socket
import types
import warnings
import weakref
from typing import TYPE_CHECKING, Final, cast

from poolkeeper import _registry
from poolkeeper.exceptions import PoolkeeperWarning

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable, Iterator

__all__ = ["release_sockets"]

#: Objects examined per call, at most, every entry of a container counted:
#: a bound on the walk. Measured: an httpx, OpenAI, requests, redis-py or
#: urllib3 client reaches 11 to 54 objects; boto3's S3 client about 34,000
#: (its service models).
MAX_OBJECTS: Final = 200_000

# The process that imported poolkeeper: release_sockets() refuses to run
# there, where the sockets are in use, not inherited copies.
_ORIGIN_PID: Final = os.getpid()

# Never followed: code, namespaces and shared registries. A client's
# logger leads to every logger and handler of the process (a syslog
# handler's socket is not the client's), a class or module to everything,
# an event loop (or its selector) to its own wake-up sockets and to every
# connection on it.
_OPAQUE: Final = (
    asyncio.AbstractEventLoop,
    selectors.BaseSelector,
    type,
    types.ModuleType,
    types.FunctionType,
    types.BuiltinFunctionType,
    types.MethodType,
    types.CodeType,
    types.FrameType,
    types.GeneratorType,
    types.CoroutineType,
    weakref.ref,
    weakref.ProxyType,
    weakref.CallableProxyType,
    logging.Logger,
    logging.LoggerAdapter,
    logging.Handler,
    logging.Manager,
    logging.PlaceHolder,
    str,
    bytes,
    bytearray,
    int,
    float,
    complex,
    bool,
    memoryview,
)


def _raw(kind: type, name: str) -> Callable[[object], Iterable[object]]:
    # The C method itself: a container subclass's own __iter__ or values()
    # is user code (it may take a lock), never called here.
    return cast("Callable[[object], Iterable[object]]", vars(kind)[name])


_DICT_KEYS: Final = _raw(dict, "keys")
_DICT_VALUES: Final = _raw(dict, "values")
_SEQUENCES: Final = tuple(
    (kind, _raw(kind, "__iter__"))
    for kind in (list, tuple, set, frozenset, collections.deque)
)


def release_sockets(client: object, /) -> int:
    """Release this forked child's copies of the sockets *client* reaches.

    Meant as ``after_fork=release_sockets``: in a forked child, it makes
    the parent's ``close()`` of the abandoned client really close its
    connections, even while the child lives. Each connected
    :class:`socket.socket` reachable from *client* through instance
    attributes (``__dict__`` and ``__slots__``) and built-in containers
    gets a read-only ``/dev/null`` duplicated over its descriptor with
    :func:`os.dup2`. Nothing is sent: no ``shutdown()``, no TLS
    close-notify, no protocol goodbye. The descriptor number stays
    allocated, so no later socket of the child reuses it while the
    abandoned client still names it. A child that uses the client anyway
    never reaches the parent's peer: a write fails with :class:`OSError`
    (``ENOTSOCK``; on a TLS socket ``ssl.SSLEOFError`` or ``EBADF``, because
    OpenSSL writes with ``write(2)`` and the descriptor is read-only) and
    a read fails with ``ENOTSOCK`` or, on a TLS socket, sees end of file.

    Only the client's own sockets are released: the walk never follows
    event loops or selectors (their wake-up sockets), classes, modules,
    functions, methods, weak references or loggers, and never releases a
    socket that a singleton with ``fork="keep"`` reaches (the child goes on
    using that client). It skips listening and unconnected sockets, takes
    no lock, and examines at most 200,000 objects, each entry of a
    container counted.

    When it releases nothing (the client has no open connection, or keeps
    its sockets below Python, as uvloop's transports and C extensions do),
    or stops at the bound, it says so with a
    :class:`~poolkeeper.PoolkeeperWarning`. As an ``after_fork`` hook it
    runs where logging could deadlock, so the warning is logged (at
    WARNING, on the ``poolkeeper`` logger) by the singleton's first call in
    the child instead.

    Args:
        client: The abandoned client (any object).

    Returns:
        How many descriptors were released.

    Raises:
        RuntimeError: If called in the process that imported poolkeeper
            (not a forked child): there the sockets are in use.
        OSError: If ``/dev/null`` cannot be opened or duplicated.

    .. versionadded:: 0.2
    """
    if os.getpid() == _ORIGIN_PID:
        msg = (
            "release_sockets() releases a forked child's copies of its "
            "parent's sockets; this process is no forked child, so it would "
            "break connections in use here. Pass it as "
            "process_singleton(after_fork=release_sockets)."
        )
        raise RuntimeError(msg)
    # The child goes on using the clients it keeps: none of their sockets.
    others = _registry.kept_clients()
    kept: set[int] = set()
    for other in others:
        kept.update(_connected_sockets(other, set())[0])
    skip = {id(other) for other in others}
    found, complete = _connected_sockets(client, skip)
    found = [fd for fd in found if fd not in kept]
    if not complete:
        _say(
            f"release_sockets() stopped after {MAX_OBJECTS:,} objects "
            f"reachable from {_describe(client)}; sockets past them stay "
            "open in this child."
        )
    if not found:
        _say(
            f"release_sockets() found no connected socket of its own in "
            f"{_describe(client)}: it had no open connection, or it keeps "
            "its sockets below Python (uvloop, a C extension), where only "
            "an after_fork hook of your own can close them."
        )
        return 0
    null = os.open(os.devnull, os.O_RDONLY | os.O_CLOEXEC)
    try:
        for fd in found:
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
    return len(found)


def _describe(client: object) -> str:
    kind = type(client)
    return f"a {kind.__module__}.{kind.__qualname__}"


def _say(message: str) -> None:
    # In the at-fork hook the registry collects it, to be logged on first
    # use; called directly, it is an ordinary warning.
    notes = _registry.fork_notes
    if notes is not None:
        notes.append(message)
    else:
        warnings.warn(message, PoolkeeperWarning, stacklevel=3)


def _connected_sockets(root: object, seen: set[int]) -> tuple[list[int], bool]:
    """Return the connected sockets' descriptors *root* reaches.

    Objects whose ids are in *seen* are not followed. Also returns whether
    the walk was complete (False: it stopped at :data:`MAX_OBJECTS`).
    """
    fds: dict[int, None] = {}
    stack = [root]
    budget = MAX_OBJECTS - 1
    while stack:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        if isinstance(obj, socket.socket):
            fd = obj.fileno()
            if fd >= 0 and _is_connected(obj):
                fds[fd] = None
            continue
        children = _children(obj, budget + 1)
        if len(children) > budget:
            return list(fds), False
        budget -= len(children)
        stack.extend(children)
    return list(fds), True


def _is_connected(sock: socket.socket) -> bool:
    # getpeername() sends nothing; a listening or unbound socket has no
    # peer, so an inherited server socket is never released.
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


def _children(obj: object, limit: int) -> list[object]:
    # Raw access only: no properties, no __getattr__, no __iter__ of user
    # classes, which could take locks or do I/O in the at-fork hook. At
    # most *limit* of them: a container's entries are never all copied.
    # issubclass, not isinstance: *obj* stays typed as a plain object.
    cls = type(obj)
    if issubclass(cls, dict):
        entries = itertools.chain(_DICT_KEYS(obj), _DICT_VALUES(obj))
        return list(itertools.islice(entries, limit))
    for kind, items in _SEQUENCES:
        if issubclass(cls, kind):
            return list(itertools.islice(items(obj), limit))
    return list(itertools.islice(_members(obj), limit))


def _members(obj: object) -> Iterator[object]:
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        attrs = None
    if attrs is not None and issubclass(type(attrs), dict):
        yield from _DICT_VALUES(attrs)
    for cls in type(obj).__mro__:
        names: object = cls.__dict__.get("__slots__", ())
        if isinstance(names, str):
            names = (names,)
        for name in cast("Iterable[str]", names):
            slot = cls.__dict__.get(name)
            if isinstance(slot, types.MemberDescriptorType):
                try:
                    yield slot.__get__(obj, cls)
                except AttributeError:  # An unset slot.
                    continue
