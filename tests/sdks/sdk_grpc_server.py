"""A gRPC server on a given loopback port: health service and Whoami.

``/poolkeeper.Whoami/Peer`` answers the caller's peer address (raw bytes,
no code generation), which names the connection that carried the call.
Exits when its stdin closes, or after ``--lifetime`` seconds.
"""

from __future__ import annotations

import argparse
import os
import sys
import threading
from concurrent import futures

import grpc
from grpc_health.v1 import health, health_pb2, health_pb2_grpc


def _peer(request, context):
    return context.peer().encode()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--port", type=int, required=True)
    parser.add_argument("--lifetime", type=float, default=900.0)
    args = parser.parse_args()
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=64))
    servicer = health.HealthServicer()
    servicer.set("", health_pb2.HealthCheckResponse.SERVING)
    health_pb2_grpc.add_HealthServicer_to_server(servicer, server)
    whoami = grpc.method_handlers_generic_handler(
        "poolkeeper.Whoami",
        {"Peer": grpc.unary_unary_rpc_method_handler(_peer)},
    )
    server.add_generic_rpc_handlers((whoami,))
    if server.add_insecure_port(f"127.0.0.1:{args.port}") != args.port:
        sys.exit(f"cannot bind 127.0.0.1:{args.port}")
    server.start()
    print("ready", flush=True)
    done = threading.Event()
    threading.Thread(
        target=lambda: (sys.stdin.read(), done.set()), daemon=True
    ).start()
    done.wait(args.lifetime)
    server.stop(0)
    os._exit(0)


if __name__ == "__main__":
    main()
