"""Shapes of the incident's project: two false positives, two real leaks."""

from __future__ import annotations

import threading

import httpx
import pytest
import requests
from daytona import Daytona


class StatusPoller(threading.Thread):
    """Polls a status page for the life of the process."""

    def __init__(self, url: str) -> None:
        super().__init__(daemon=True)
        self.url = url
        self.stopped = threading.Event()

    def run(self) -> None:
        # Built once at the top of run(), before the loop that reuses it.
        session = requests.Session()
        while not self.stopped.wait(5.0):
            session.get(self.url, timeout=5.0)


@pytest.fixture
async def http():
    """A test's client: the fixture runs once per test."""
    return httpx.AsyncClient(base_url="http://127.0.0.1:8000")


def run_episode(task):
    """A client per episode: a real leak (PK001)."""
    daytona = Daytona()
    return daytona.create(task)


def fetch_all(urls):
    """A session per URL: a real leak (PK002)."""
    return [requests.Session().get(url) for url in urls]


def poll_twice(url):
    """Built before a loop that never uses it: still one per call (PK001)."""
    session = requests.Session()
    for _ in range(2):
        threading.Event().wait(0.1)
    return session.get(url)
