"""requests: one ``Session`` per process."""

from __future__ import annotations

import os

import requests

from poolkeeper import keys, process_singleton, release_sockets

# requests reads these on every request (trust_env=True, the default).
REQUESTS_ENV = (
    *("REQUESTS_CA_BUNDLE", "CURL_CA_BUNDLE", "NETRC"),
    *("HTTP_PROXY", "HTTPS_PROXY", "ALL_PROXY", "NO_PROXY"),
    *("http_proxy", "https_proxy", "all_proxy", "no_proxy"),
)


@process_singleton(
    key=keys.env("API_URL", "API_TOKEN", *REQUESTS_ENV),
    after_fork=release_sockets,
)
def session() -> requests.Session:
    """Build the session, with the API token in its headers."""
    s = requests.Session()  # Session.close() clears its pools.
    s.headers["Authorization"] = f"Bearer {os.environ['API_TOKEN']}"
    return s


def get(path: str) -> requests.Response:
    """GET *path* of the API with the process's session."""
    return session().get(os.environ["API_URL"] + path, timeout=10.0)
