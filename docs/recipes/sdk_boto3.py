"""boto3: one S3 client per process, from a session of its own."""

from __future__ import annotations

import os
from typing import TYPE_CHECKING

import boto3
from botocore.config import Config

from poolkeeper import keys, process_singleton, release_sockets

if TYPE_CHECKING:
    from botocore.client import BaseClient

# Read by botocore when it builds a client (files are named by them too).
AWS_ENV = (
    *("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_SESSION_TOKEN"),
    *("AWS_PROFILE", "AWS_DEFAULT_REGION", "AWS_REGION"),
    *("AWS_ENDPOINT_URL", "AWS_ENDPOINT_URL_S3", "AWS_CA_BUNDLE"),
    *("AWS_CONFIG_FILE", "AWS_SHARED_CREDENTIALS_FILE"),
    *("AWS_MAX_ATTEMPTS", "AWS_RETRY_MODE"),
    *("HTTP_PROXY", "HTTPS_PROXY", "NO_PROXY"),
    *("http_proxy", "https_proxy", "no_proxy"),
)

# How many threads of this process use the client at once; the pool is
# sized for them (docs/sdk-recipes.md, "Sizing the pool for the threads").
THREADS = int(os.environ.get("APP_THREADS", "128"))


def release_s3(client: BaseClient) -> None:
    """Release a forked child's copies of the client's pooled sockets."""
    # The whole client reaches botocore's service models (some 34,000
    # objects to walk); its HTTP session alone holds every connection.
    release_sockets(client._endpoint.http_session)


# boto3.client() shares a default session between threads; a session of
# its own per build is the documented thread-safe way.
@process_singleton(key=keys.env(*AWS_ENV), after_fork=release_s3)
def s3() -> BaseClient:
    """Build an S3 client; botocore reads AWS_* variables and files."""
    # botocore's pool keeps 10 connections: the 11th busy thread's is
    # thrown away after its request ("Connection pool is full").
    config = Config(max_pool_connections=THREADS)
    return boto3.session.Session().client("s3", config=config)
