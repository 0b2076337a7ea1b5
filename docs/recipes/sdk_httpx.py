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
