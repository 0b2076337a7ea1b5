"""One driver per SDK: the recipe to load, its key, and one request.

``use(client)`` makes a real request and returns the client's port of
the connection that carried it, as the server reported it.
"""

from __future__ import annotations

import os
import threading
from pathlib import Path
from typing import ClassVar

import sdk_net

from poolkeeper import keys, process_singleton


class Made:
    """A factory noting the thread that built and closed each client.

    It wraps a recipe's factory; the client's own close() still runs.
    """

    def __init__(self, factory):
        self.factory = factory
        self.lock = threading.Lock()
        self.built = []  # (client, ident of the thread that built it)
        self.closes = {}  # id(client) -> idents of the threads closing it

    def __call__(self):
        client = self.factory()
        close = client.close

        def recorded_close():
            with self.lock:
                self.closes.setdefault(id(client), []).append(
                    threading.get_ident()
                )
            close()

        client.close = recorded_close
        with self.lock:
            self.built.append((client, threading.get_ident()))
        return client

    def closed_on_own_thread(self):
        """Whether each client was closed once, on the thread that built it."""
        return all(
            [ident] == self.closes.get(id(client))
            for client, ident in self.built
        )


class Driver:
    """What the generic tests need to know about one SDK."""

    recipe = ""
    single = ""
    # The threads page's table: what the recipe shares, its pool setting.
    shared = ""
    setting = ""
    server = "http_server"
    # Whether the client's sockets are Python objects a child inherits.
    python_sockets = True
    # Whether its close() calls shutdown(), which ends the connection even
    # while a forked child holds copies of the socket.
    shuts_down = False

    def __init__(self, module, server, monkeypatch):
        self.module = module
        self.server = server
        self.monkeypatch = monkeypatch
        self.setup()

    def __repr__(self):
        return type(self).__name__

    @property
    def singleton(self):
        """Return the recipe's singleton."""
        return getattr(self.module, self.single)

    def plain(self):
        """Return the recipe's factory as a singleton without after_fork."""
        return process_singleton(key=keys.env(*self.key_names))(
            self.singleton.__wrapped__
        )

    key_names: tuple[str, ...] = ()

    def setenv(self, name, value):
        """Set a variable of the key through os.environ."""
        self.monkeypatch.setenv(name, value)

    def setup(self):
        """Point the SDK at the test server."""

    def only_env(self, names, **values):
        """Unset every variable in *names*, then set *values*."""
        for name in names:
            self.monkeypatch.delenv(name, raising=False)
        for name, value in values.items():
            self.setenv(name, value)

    def rotate(self, single=None):
        """Change the key, so that the next call builds a new client."""
        raise NotImplementedError

    def use(self, client):
        """Make one request; return the connection's client port."""
        raise NotImplementedError

    @property
    def pool_size(self):
        """Return the most connections the recipe's client keeps open."""
        return self.module.THREADS

    def server_open(self, port):
        """Return whether the server still has the connection open."""
        return sdk_net.server_sees_open(self.server.port, port)

    def process_ports(self, pid="self"):
        """Return the client ports of a process's sockets to the server."""
        return sdk_net.process_ports(self.server.port, pid)


class Httpx(Driver):
    shared = "`httpx.Client`"
    setting = (
        "`httpx.Limits(max_connections=THREADS, "
        "max_keepalive_connections=THREADS)`"
    )
    recipe = "sdk_httpx"
    single = "api"
    key_names = ("API_URL", "API_TOKEN")

    def setup(self):
        self.setenv("API_URL", self.server.url)
        self.setenv("API_TOKEN", "token-1")

    def rotate(self, single=None):
        self.setenv("API_TOKEN", "token-2")

    def use(self, client):
        response = client.get("/ping")
        response.raise_for_status()
        return int(response.headers["x-conn-id"])

    async def ause(self, client):
        response = await client.get("/ping")
        response.raise_for_status()
        return int(response.headers["x-conn-id"])


class Requests(Httpx):
    shared = "`requests.Session`"
    setting = "`HTTPAdapter(pool_maxsize=THREADS)`"
    recipe = "sdk_requests"
    single = "session"

    def use(self, client):
        response = client.get(self.server.url + "/ping", timeout=10)
        response.raise_for_status()
        return int(response.headers["x-conn-id"])


class Urllib3(Driver):
    shared = "`urllib3.PoolManager`"
    setting = "`PoolManager(maxsize=THREADS)`"
    recipe = "sdk_urllib3"
    single = "http"
    key_names = ("UPSTREAM_CA_BUNDLE",)

    def setup(self):
        self.monkeypatch.delenv("UPSTREAM_CA_BUNDLE", raising=False)

    def rotate(self, single=None):
        self.setenv("UPSTREAM_CA_BUNDLE", os.devnull)

    def use(self, client):
        response = client.request("GET", self.server.url + "/ping")
        assert 200 == response.status
        return int(response.headers["X-Conn-Id"])

    def plain(self):
        return process_singleton(
            key=keys.env(*self.key_names), close=type(self.singleton()).clear
        )(self.singleton.__wrapped__)


class Urllib3Partial(Urllib3):
    """The functools.partial form: no key, so rotation is a reset()."""

    shared = "`urllib3.PoolManager` (`functools.partial`)"

    single = "pooled"

    def rotate(self, single=None):
        assert (single or self.singleton).reset()

    def plain(self):
        return process_singleton(close=type(self.singleton()).clear)(
            self.singleton.__wrapped__
        )


class OpenAI(Driver):
    shared = "`openai.OpenAI`"
    setting = "httpx's, as above, through `DefaultHttpxClient`"
    recipe = "sdk_openai"
    single = "llm"
    key_names = ("OPENAI_API_KEY", "OPENAI_BASE_URL")

    def setup(self):
        self.only_env(
            self.module.OPENAI_ENV,
            OPENAI_API_KEY="sk-test-1",
            OPENAI_BASE_URL=self.server.url + "/v1",
        )

    def rotate(self, single=None):
        self.setenv("OPENAI_API_KEY", "sk-test-2")

    CHAT: ClassVar = {
        "model": "local-model",
        "messages": [{"role": "user", "content": "ping"}],
    }

    @staticmethod
    def _port(raw):
        assert "pong" == raw.parse().choices[0].message.content
        return int(raw.headers["x-conn-id"])

    def use(self, client):
        create = client.chat.completions.with_raw_response.create
        return self._port(create(**self.CHAT))

    async def ause(self, client):
        create = client.chat.completions.with_raw_response.create
        return self._port(await create(**self.CHAT))


class Boto3(Driver):
    shared = "boto3 S3 client"
    setting = "`Config(max_pool_connections=THREADS)`"
    recipe = "sdk_boto3"
    single = "s3"
    server = "s3_server"
    key_names = ("AWS_SECRET_ACCESS_KEY", "AWS_ENDPOINT_URL")

    def setup(self):
        missing = str(Path(os.devnull) / "missing")
        self.only_env(
            self.module.AWS_ENV,
            AWS_ACCESS_KEY_ID="testing",
            AWS_SECRET_ACCESS_KEY="testing-1",  # noqa: S106 -- moto's.
            AWS_DEFAULT_REGION="us-east-1",
            AWS_ENDPOINT_URL=self.server.url,
            AWS_CONFIG_FILE=missing,
            AWS_SHARED_CREDENTIALS_FILE=missing,
            AWS_EC2_METADATA_DISABLED="true",
        )

    def rotate(self, single=None):
        self.setenv("AWS_SECRET_ACCESS_KEY", "testing-2")

    def use(self, client):
        reply = client.list_buckets()
        return int(reply["ResponseMetadata"]["HTTPHeaders"]["x-conn-id"])


class Redis(Driver):
    shared = "`redis.Redis`"
    setting = "`BlockingConnectionPool(max_connections=THREADS)`"
    recipe = "sdk_redis"
    single = "cache"
    server = "redis_server"
    key_names = ("REDIS_URL",)
    shuts_down = True

    def setup(self):
        self.setenv("REDIS_URL", self.server.url + "/0")

    def rotate(self, single=None):
        self.setenv("REDIS_URL", self.server.url + "/1")

    @staticmethod
    def _port(info, client_id):
        # CLIENT INFO describes the connection that carried the command;
        # CLIENT ID must name the same connection.
        assert int(info["id"]) == client_id
        return int(str(info["addr"]).rsplit(":", 1)[1])

    def use(self, client):
        # One pipeline: both commands on the same pooled connection.
        with client.pipeline(transaction=False) as pipe:
            pipe.client_id()
            pipe.client_info()
            client_id, info = pipe.execute()
        return self._port(info, client_id)

    async def ause(self, client):
        async with client.pipeline(transaction=False) as pipe:
            pipe.client_id()
            pipe.client_info()
            client_id, info = await pipe.execute()
        return self._port(info, client_id)

    def server_open(self, port):
        listed = self.server.admin.client_list()
        return any(c["addr"].endswith(f":{port}") for c in listed)


class Grpc(Driver):
    shared = "`grpc.Channel`"
    setting = "none: one HTTP/2 connection"
    recipe = "sdk_grpc"
    single = "channel"
    server = "grpc_server"
    key_names = ("GRPC_TARGET",)
    python_sockets = False
    # A channel multiplexes every call over one HTTP/2 connection.
    pool_size = 1

    def setup(self):
        self.setenv("GRPC_TARGET", self.server.url)

    def rotate(self, single=None):
        self.setenv("GRPC_TARGET", "ipv4:" + self.server.url)

    @staticmethod
    def _health(channel):
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        return health_pb2_grpc.HealthStub(channel).Check(
            health_pb2.HealthCheckRequest(), timeout=10
        )

    def use(self, client):
        from grpc_health.v1 import health_pb2

        reply = self._health(client)
        assert health_pb2.HealthCheckResponse.SERVING == reply.status
        peer = client.unary_unary("/poolkeeper.Whoami/Peer")(b"", timeout=10)
        return int(peer.decode().rsplit(":", 1)[1])

    async def ause(self, client):
        from grpc_health.v1 import health_pb2, health_pb2_grpc

        stub = health_pb2_grpc.HealthStub(client)
        reply = await stub.Check(health_pb2.HealthCheckRequest(), timeout=10)
        assert health_pb2.HealthCheckResponse.SERVING == reply.status
        call = client.unary_unary("/poolkeeper.Whoami/Peer")
        peer = await call(b"", timeout=10)
        return int(peer.decode().rsplit(":", 1)[1])


SYNC = [Httpx, Requests, Urllib3, Urllib3Partial, OpenAI, Boto3, Redis, Grpc]
ASYNC = {
    Httpx: "async_api",
    OpenAI: "async_llm",
    Redis: "async_cache",
    Grpc: "async_channel",
}
