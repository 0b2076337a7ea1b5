"""httpx: one ``Client`` per process, one ``AsyncClient`` per event loop."""

from __future__ import annotations

import os

import httpx

from poolkeeper import keys, process_singleton, release_sockets

# httpx reads these itself (trust_env=True, the default): key on them too.
HTTPX_ENV = (
    *("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"),
    *("http_proxy", "https_proxy", "all_proxy", "no_proxy"),
    *("SSL_CERT_FILE", "SSL_CERT_DIR"),
)

# How many threads of this process use the client at once; the pool is
# sized for them (docs/sdk-recipes.md, "Sizing the pool for the threads").
THREADS = int(os.environ.get("APP_THREADS", "128"))


@process_singleton(
    key=keys.env("API_URL", "API_TOKEN", *HTTPX_ENV),
    after_fork=release_sockets,  # a forked child lets go of its copies
)
def api() -> httpx.Client:
    """Build the API client."""
    return httpx.Client(
        base_url=os.environ["API_URL"],
        headers={"Authorization": f"Bearer {os.environ['API_TOKEN']}"},
        timeout=10.0,
        # One connection per thread, all kept alive: httpx's defaults (100
        # connections, 20 kept alive) close and reopen connections beyond
        # 20 busy threads, and make threads beyond 100 wait. A connection
        # idle 5 s is closed too: kept 60 s here (one the server closed
        # sooner is seen before reuse), so threads that pause do not churn.
        limits=httpx.Limits(
            max_connections=THREADS,
            max_keepalive_connections=THREADS,
            keepalive_expiry=60.0,
        ),
    )


@process_singleton(
    key=keys.env("API_URL", "API_TOKEN", *HTTPX_ENV),
    after_fork=release_sockets,
)
async def async_api() -> httpx.AsyncClient:
    """Build the API client of the running event loop."""
    return httpx.AsyncClient(
        base_url=os.environ["API_URL"],
        headers={"Authorization": f"Bearer {os.environ['API_TOKEN']}"},
        timeout=10.0,
    )
