"""Bound the threads a sync ``daytona.Daytona``'s event dispatcher starts.

Two kinds of thread pile up on a client that many threads share (measured:
633 extra threads after 90 s of 128 workers):

- python-engineio starts a thread for *every* message it receives
  (``Client._trigger_event("message", ..., run_async=True)``), which runs
  python-socketio's ``_handle_eio_message`` and the SDK's handler. Every
  sandbox state event of the organisation is a message, and the SDK's
  handler takes the dispatcher's lock, which the threads creating and
  deleting sandboxes take too (and hold while they start a timer thread).
  When handlers run slower than events arrive, the threads waiting for
  that lock pile up: nothing bounds them.
- The SDK's dispatcher starts a 30 s ``threading.Timer`` (the idle
  disconnect) whenever an unsubscribe finds no listener left, and stores
  it over the previous one without cancelling it. With threads creating
  and deleting sandboxes all the time, a timer thread is left sleeping
  per such moment: about the rate of those moments times 30 s.

The client's dispatcher is given a subclass of its own class (once, at
build) that bounds both: each ``socketio.Client`` it makes runs its
messages one at a time, in the order received, on at most one thread at
once; and a timer stored over another cancels the one it replaces, so
the idle disconnect comes 30 s after the *last* listener left, as the SDK
means it to. A handler that waits for a later message (a Socket.IO
``call()`` inside a handler) would wait for ever: the SDK's handlers do
not.
"""

from __future__ import annotations

import collections
import functools
import threading
from typing import Any

from poolkeeper_daytona._close import log_failure

__all__ = ["bound_threads"]


def bound_threads(client: object) -> None:
    """Bound the event dispatcher's threads of a just-built *client*.

    Does nothing for a client without a dispatcher (polling mode) or one
    whose dispatcher lacks what is replaced (another SDK release): its
    threads are then as the SDK makes them.

    Args:
        client: A ``daytona.Daytona``.
    """
    dispatcher: Any = getattr(client, "_event_dispatcher", None)
    fields = getattr(dispatcher, "__dict__", {})
    if "_sio" not in fields or "_disconnect_timer" not in fields:
        return
    # The connect thread may have stored a Socket.IO client already: it
    # is serialised here, and every later one by the property.
    dispatcher.__class__ = _bounded(dispatcher.__class__)
    _serialise(fields.get("_sio"))


@functools.cache
def _bounded(base: Any) -> type:  # noqa: ANN401 -- the SDK's class.
    """Return the subclass of dispatcher class *base* that bounds threads."""

    def get_sio(self: object) -> Any:  # noqa: ANN401 -- the SDK's type.
        return self.__dict__.get("_sio")

    def set_sio(self: object, sio: object) -> None:
        _serialise(sio)
        self.__dict__["_sio"] = sio

    def get_timer(self: object) -> Any:  # noqa: ANN401 -- the SDK's type.
        return self.__dict__.get("_disconnect_timer")

    def set_timer(self: object, timer: object) -> None:
        # The SDK stores timers under its lock: the replaced one, whose
        # generation is the same or older, is cancelled before it ever
        # fires (an older one's firing would do nothing anyway).
        old = self.__dict__.get("_disconnect_timer")
        cancel = getattr(old, "cancel", None)
        if old is not timer and callable(cancel):
            cancel()
        self.__dict__["_disconnect_timer"] = timer

    return type(
        base.__name__,
        (base,),
        {
            "__module__": base.__module__,
            "__qualname__": base.__qualname__,
            "_sio": property(get_sio, set_sio),
            "_disconnect_timer": property(get_timer, set_timer),
        },
    )


def _serialise(sio: object) -> None:
    """Run *sio*'s engine.io messages on at most one thread at once."""
    eio = getattr(sio, "eio", None)
    fields = getattr(eio, "__dict__", {})
    start = getattr(eio, "start_background_task", None)
    if not callable(start) or isinstance(
        fields.get("start_background_task"), _SerialMessages
    ):
        return
    eio.start_background_task = _SerialMessages(eio, start)  # type: ignore[union-attr]


class _SerialMessages:
    """An engine.io client's ``start_background_task``, messages serialised.

    engine.io calls it with its ``message`` handler for every message
    received: the message is queued, and one thread at most drains the
    queue. Any other task (its read and write loops, python-socketio's
    reconnect loop) starts a thread as before.
    """

    def __init__(self, eio: Any, start: Any) -> None:  # noqa: ANN401
        self._eio = eio
        self._start = start
        self._lock = threading.Lock()
        self._queue: collections.deque[tuple[Any, tuple[Any, ...]]] = (
            collections.deque()
        )
        self._draining = False

    def __call__(self, target: Any, *args: Any, **kwargs: Any) -> Any:  # noqa: ANN401
        """Start *target*, or queue it if it is the message handler."""
        if kwargs or target != getattr(self._eio, "handlers", {}).get(
            "message"
        ):
            return self._start(target, *args, **kwargs)
        with self._lock:
            self._queue.append((target, args))
            if self._draining:
                return None
            self._draining = True
        try:
            return self._start(self._handle_messages)
        except BaseException:
            # No thread to drain: the next message tries again.
            with self._lock:
                self._draining = False
            raise

    def _handle_messages(self) -> None:
        while True:
            with self._lock:
                if not self._queue:
                    self._draining = False
                    return
                handler, args = self._queue.popleft()
            try:
                handler(*args)
            except Exception as exc:  # noqa: BLE001 -- as its own thread did.
                log_failure(
                    "A Socket.IO message handler of a Daytona client failed.",
                    exc,
                )
