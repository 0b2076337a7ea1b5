"""Release a forked child's copies of an abandoned client's sockets.

A forked child abandons its parent's client without closing it, but its
copies of the client's socket descriptors keep the kernel sockets open.
While any child lives, the parent's ``close()`` sends no FIN: the server
never sees the connection end. :func:`release_sockets` drops the child's
references and sends nothing on the wire.
"""

from __future__ import annotations

import collections
import logging
import os
import socket
import types
import weakref
from typing import TYPE_CHECKING, Final, cast

if TYPE_CHECKING:
    from collections.abc import Callable, Iterable

__all__ = ["release_sockets"]

#: Objects examined per call, at most: a bound on the walk. Measured: an
#: httpx, OpenAI, requests, redis-py or urllib3 client reaches 11 to 54
#: objects; boto3's S3 client about 34,000 (its service models).
MAX_OBJECTS: Final = 200_000

# Never followed: code, namespaces and shared registries. A client's
# logger leads to every logger and handler of the process (a syslog
# handler's socket is not the client's), a class or module to everything.
_OPAQUE: Final = (
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
    """Release this process's copies of the sockets *client* reaches.

    Meant as ``after_fork=release_sockets``: in a forked child, it makes
    the parent's ``close()`` of the abandoned client really close its
    connections, even while the child lives. Each connected
    :class:`socket.socket` reachable from *client* through instance
    attributes (``__dict__`` and ``__slots__``) and built-in containers
    gets ``/dev/null`` duplicated over its descriptor with
    :func:`os.dup2`. Nothing is sent: no ``shutdown()``, no TLS
    close-notify, no protocol goodbye. The descriptor number stays
    allocated, so no later socket of the child reuses it while the
    abandoned client still names it; a child that uses the client anyway
    gets ``ENOTSOCK`` or an empty read, never the parent's bytes.

    The walk never follows classes, modules, functions, methods, weak
    references or loggers, skips listening and unconnected sockets,
    takes no lock and examines at most 200,000 objects.

    Args:
        client: The abandoned client (any object).

    Returns:
        How many descriptors were released.

    Raises:
        OSError: If ``/dev/null`` cannot be opened or duplicated.

    .. versionadded:: 0.2
    """
    found = _connected_sockets(client)
    if not found:
        return 0
    null = os.open(os.devnull, os.O_RDWR | os.O_CLOEXEC)
    try:
        for fd in found:
            os.dup2(null, fd, inheritable=False)
    finally:
        os.close(null)
    return len(found)


def _connected_sockets(root: object) -> list[int]:
    """Return the descriptors of connected sockets reachable from *root*."""
    seen: set[int] = set()
    fds: dict[int, None] = {}
    stack = [root]
    while stack and len(seen) < MAX_OBJECTS:
        obj = stack.pop()
        if id(obj) in seen or isinstance(obj, _OPAQUE):
            continue
        seen.add(id(obj))
        if isinstance(obj, socket.socket):
            fd = obj.fileno()
            if fd >= 0 and _is_connected(obj):
                fds[fd] = None
            continue
        stack.extend(_children(obj))
    return list(fds)


def _is_connected(sock: socket.socket) -> bool:
    # getpeername() sends nothing; a listening or unbound socket has no
    # peer, so an inherited server socket is never released.
    try:
        sock.getpeername()
    except OSError:
        return False
    return True


def _children(obj: object) -> list[object]:
    # Raw access only: no properties, no __getattr__, no __iter__ of user
    # classes, which could take locks or do I/O in the at-fork hook.
    # issubclass, not isinstance: *obj* stays typed as a plain object.
    cls = type(obj)
    if issubclass(cls, dict):
        return [*_DICT_KEYS(obj), *_DICT_VALUES(obj)]
    for kind, items in _SEQUENCES:
        if issubclass(cls, kind):
            return list(items(obj))
    return [*_attributes(obj), *_slots(obj)]


def _attributes(obj: object) -> list[object]:
    try:
        attrs = object.__getattribute__(obj, "__dict__")
    except AttributeError:
        return []
    if not issubclass(type(attrs), dict):
        return []
    return list(_DICT_VALUES(attrs))


def _slots(obj: object) -> list[object]:
    values: list[object] = []
    for cls in type(obj).__mro__:
        names: object = cls.__dict__.get("__slots__", ())
        if isinstance(names, str):
            names = (names,)
        for name in cast("Iterable[str]", names):
            slot = cls.__dict__.get(name)
            if isinstance(slot, types.MemberDescriptorType):
                try:
                    values.append(slot.__get__(obj, cls))
                except AttributeError:  # An unset slot.
                    continue
    return values
