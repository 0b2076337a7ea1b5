"""WSGI apps the SDK tests serve with gunicorn (gthread: keep-alive).

Every response carries ``X-Conn-Id``: the client's port as the server
sees it, which names the TCP connection that carried the request.
``/login?user=U`` sets a session cookie for U; ``/whoami`` answers the
user of the session cookie it got (or null), and sets none.
"""

from __future__ import annotations

import json
import threading
import time
from http.cookies import SimpleCookie
from urllib.parse import parse_qs


def _conn_id(environ):
    return str(environ.get("REMOTE_PORT", ""))


def _json(start_response, environ, body, status="200 OK", headers=()):
    data = json.dumps(body).encode()
    start_response(
        status,
        [
            ("Content-Type", "application/json"),
            ("Content-Length", str(len(data))),
            ("X-Conn-Id", _conn_id(environ)),
            *headers,
        ],
    )
    return [data]


def _session_user(environ):
    cookie = SimpleCookie(environ.get("HTTP_COOKIE", ""))
    morsel = cookie.get("session")
    return None if morsel is None else morsel.value


#: /gather's gates, by id: how many requests have arrived, and whether
#: the first n of them are released.
_gates: dict[str, list[int]] = {}
_gates_changed = threading.Condition()
#: The longest a request waits at a gate, in seconds.
GATE_SECONDS = 20.0


def _gather(query):
    """Hold the first *n* requests of gate *id* until all *n* arrived.

    Then *n* requests are in flight at once, on *n* connections, whatever
    the machine's load; the requests after them pass at once. A gate
    that never fills releases its requests after GATE_SECONDS.
    """
    params = parse_qs(query)
    gate, count = params["id"][0], int(params["n"][0])
    with _gates_changed:
        arrived = _gates.setdefault(gate, [0])
        arrived[0] += 1
        if arrived[0] > count:
            return
        _gates_changed.notify_all()
        _gates_changed.wait_for(lambda: arrived[0] >= count, GATE_SECONDS)


def http_app(environ, start_response):
    """Echo the connection id; answer two OpenAI routes and a login."""
    path = environ.get("PATH_INFO", "/")
    size = int(environ.get("CONTENT_LENGTH") or 0)
    if size:
        environ["wsgi.input"].read(size)
    if path == "/gather":
        _gather(environ.get("QUERY_STRING", ""))
    if path == "/login":
        user = parse_qs(environ.get("QUERY_STRING", ""))["user"][0]
        cookie = ("Set-Cookie", f"session={user}; Path=/")
        return _json(start_response, environ, {"user": user}, headers=[cookie])
    if path == "/whoami":
        return _json(start_response, environ, {"user": _session_user(environ)})
    if path == "/v1/models":
        body = {
            "object": "list",
            "data": [
                {
                    "id": "local-model",
                    "object": "model",
                    "created": 0,
                    "owned_by": "poolkeeper-tests",
                }
            ],
        }
    elif path == "/v1/chat/completions":
        body = {
            "id": "chatcmpl-local",
            "object": "chat.completion",
            "created": int(time.time()),
            "model": "local-model",
            "choices": [
                {
                    "index": 0,
                    "finish_reason": "stop",
                    "message": {"role": "assistant", "content": "pong"},
                }
            ],
            "usage": {
                "prompt_tokens": 1,
                "completion_tokens": 1,
                "total_tokens": 2,
            },
        }
    else:
        body = {
            "conn": _conn_id(environ),
            "path": path,
            "auth": environ.get("HTTP_AUTHORIZATION"),
        }
    return _json(start_response, environ, body)


def _make_s3_app():
    from moto.moto_server.werkzeug_app import (
        DomainDispatcherApplication,
        create_backend_app,
    )

    # No Host: header names S3 here; moto reads the service from the
    # request's signature instead, as its stand-alone server does.
    moto_app = DomainDispatcherApplication(create_backend_app)

    def s3_app(environ, start_response):
        def start(status, headers, exc_info=None):
            headers = [*headers, ("X-Conn-Id", _conn_id(environ))]
            return start_response(status, headers, exc_info)

        return moto_app(environ, start)

    return s3_app


class _LazyS3:
    """Import moto in the worker only when gunicorn loads ``s3_app``."""

    app = None

    def __call__(self, environ, start_response):
        if self.app is None:
            self.app = _make_s3_app()
        return self.app(environ, start_response)


s3_app = _LazyS3()
