"""requests: one ``Session`` per process."""

from __future__ import annotations

import os

import requests
from requests.adapters import HTTPAdapter

from poolkeeper import keys, process_singleton, release_sockets

# requests reads these on every request (trust_env=True, the default).
REQUESTS_ENV = (
    *("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NETRC"),
    *("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"),
    *("http_proxy", "https_proxy", "all_proxy", "no_proxy"),
)

# How many threads of this process use the client at once; the pool is
# sized for them (docs/sdk-recipes.md, "Sizing the pool for the threads").
THREADS = int(os.environ.get("APP_THREADS", "128"))


@process_singleton(
    key=keys.env("API_URL", "API_TOKEN", *REQUESTS_ENV),
    after_fork=release_sockets,
)
def session() -> requests.Session:
    """Build the session, with the API token in its headers."""
    s = requests.Session()  # Session.close() clears its pools.
    s.headers["Authorization"] = f"Bearer {os.environ['API_TOKEN']}"
    # pool_maxsize is per host: the default 10 makes the 11th busy thread
    # open a connection that is thrown away after its request ("Connection
    # pool is full, discarding connection"). pool_connections (10) is how
    # many hosts' pools the session keeps.
    adapter = HTTPAdapter(pool_maxsize=THREADS)
    s.mount("https://", adapter)
    s.mount("http://", adapter)
    return s


def get(path: str) -> requests.Response:
    """GET *path* of the API with the process's session."""
    return session().get(os.environ["API_URL"] + path, timeout=10.0)
