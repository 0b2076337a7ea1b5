"""WSGI apps the SDK tests serve with gunicorn (gthread: keep-alive).

Every response carries ``X-Conn-Id``: the client's port as the server
sees it, which names the TCP connection that carried the request.
``/login?user=U`` sets a session cookie for U; ``/whoami`` answers the
user of the session cookie it got (or null), and sets none.
"""

from __future__ import annotations

import json
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


def http_app(environ, start_response):
    """Echo the connection id; answer two OpenAI routes and a login."""
    path = environ.get("PATH_INFO", "/")
    size = int(environ.get("CONTENT_LENGTH") or 0)
    if size:
        environ["wsgi.input"].read(size)
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
