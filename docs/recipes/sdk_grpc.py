"""gRPC: one channel per process, one ``grpc.aio`` channel per loop."""

from __future__ import annotations

import os

# gRPC supports fork only when this is set before grpc is first imported
# (in the environment of the process, or first thing in its main module).
os.environ.setdefault("GRPC_ENABLE_FORK_SUPPORT", "1")

import grpc
import grpc.aio

from poolkeeper import keys, process_singleton

# GRPC_TARGET is the application's; gRPC reads its proxy variables itself.
GRPC_ENV = ("GRPC_TARGET", "grpc_proxy", "https_proxy", "no_grpc_proxy")


# No after_fork=: gRPC's fork support makes the child let go of the
# parent's connections (its sockets are not Python objects anyway).
# No pool to size for the threads: a channel carries every thread's calls
# as streams of one HTTP/2 connection.
@process_singleton(key=keys.env(*GRPC_ENV))
def channel() -> grpc.Channel:
    """Open a channel; it connects on first use."""
    return grpc.insecure_channel(os.environ["GRPC_TARGET"])


# grpc.aio does not support fork at all: build it after forking. Channels
# with equal arguments share connections process-wide; a local subchannel
# pool gives each loop's channel its own, closed with it on that loop.
@process_singleton(key=keys.env(*GRPC_ENV))
async def async_channel() -> grpc.aio.Channel:
    """Open a grpc.aio channel for the running event loop."""
    return grpc.aio.insecure_channel(
        os.environ["GRPC_TARGET"],
        options=[("grpc.use_local_subchannel_pool", 1)],
    )
