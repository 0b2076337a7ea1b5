"""OpenAI: one ``OpenAI`` per process, one ``AsyncOpenAI`` per loop."""

from __future__ import annotations

import os

import httpx
import openai

from poolkeeper import keys, process_singleton, release_sockets

# Read by the OpenAI() constructor, plus what its httpx client reads.
OPENAI_ENV = (
    *("OPENAI_API_KEY", "OPENAI_BASE_URL", "OPENAI_ORG_ID"),
    *("OPENAI_PROJECT_ID", "OPENAI_WEBHOOK_SECRET", "OPENAI_CUSTOM_HEADERS"),
    *("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"),
    *("http_proxy", "https_proxy", "all_proxy", "no_proxy"),
    *("SSL_CERT_FILE", "SSL_CERT_DIR"),
)

# How many threads of this process use the client at once; the pool is
# sized for them (docs/sdk-recipes.md, "Sizing the pool for the threads").
THREADS = int(os.environ.get("APP_THREADS", "128"))


@process_singleton(key=keys.env(*OPENAI_ENV), after_fork=release_sockets)
def llm() -> openai.OpenAI:
    """Build the client; OpenAI() reads its OPENAI_* variables."""
    # OpenAI's own httpx client keeps 100 connections alive: beyond 100
    # busy threads it closes and reopens them, and those idle 5 s too (kept
    # 60 s here). DefaultHttpxClient keeps OpenAI's other defaults;
    # OpenAI.close() closes it.
    limits = httpx.Limits(
        max_connections=THREADS,
        max_keepalive_connections=THREADS,
        keepalive_expiry=60.0,
    )
    return openai.OpenAI(
        max_retries=0,
        timeout=10.0,
        http_client=openai.DefaultHttpxClient(limits=limits),
    )


@process_singleton(key=keys.env(*OPENAI_ENV), after_fork=release_sockets)
async def async_llm() -> openai.AsyncOpenAI:
    """Build the client of the running event loop."""
    return openai.AsyncOpenAI(max_retries=0, timeout=10.0)
