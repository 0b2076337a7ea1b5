"""128 threads log in, each as its own user: whose session does each get?

An HTTP client keeps the cookies its responses set in one jar. Each
thread logs in (``/login?user=U`` sets a session cookie for U) through the
client its singleton returns; once every thread has logged in (a barrier),
each asks ``/whoami``, which answers the user of the cookie it got.

Shared by the threads (the default scope), the client holds one session
cookie, the last login's: every other thread is answered with that user.
The barrier makes this certain, not likely: exactly THREADS - 1 threads
see another thread's user. With ``scope="thread"`` each thread has a
client, so a jar, of its own: no thread sees another's user. There the
singleton built one client per thread, and each thread's end closed its
client, on that thread.
"""

from __future__ import annotations

import threading

import pytest
import sdk_net
from sdk_drivers import Httpx, Made, Requests
from sdk_outcomes import record

from poolkeeper import keys, process_singleton

#: The issue's job: 128 threads on one client.
THREADS = 128
JOIN = 120.0


def _login(sdk, client, user):
    if isinstance(sdk, Requests):
        response = client.get(
            sdk.server.url + "/login", params={"user": user}, timeout=10
        )
    else:
        response = client.get("/login", params={"user": user})
    response.raise_for_status()


def _whoami(sdk, client):
    if isinstance(sdk, Requests):
        response = client.get(sdk.server.url + "/whoami", timeout=10)
    else:
        response = client.get("/whoami")
    response.raise_for_status()
    return response.json()["user"]


def _logins(sdk, single):
    """Every thread logs in, then (all logged in) asks who it is.

    Return ({user: answer}, errors). A thread that failed still waits at
    the barrier, so the others are never left waiting.
    """
    barrier = threading.Barrier(THREADS, timeout=JOIN)
    answers = {}
    errors = []

    def run(i):
        user = f"user-{i}"
        try:
            try:
                _login(sdk, single(), user)
            finally:
                barrier.wait()
            answers[user] = _whoami(sdk, single())
        except Exception as exc:
            errors.append(exc)

    sdk_net.each(THREADS, run, JOIN)
    return answers, errors


def _crossed(answers):
    """The threads answered with another thread's user."""
    return sum(answer != user for user, answer in answers.items())


def _record(web, scope, answers, errors, builds):
    """Record the run's row of the threads page's table."""
    record(
        f"{web!r} cookies, scope {scope}",
        object=f"{web.shared}, logged in per thread",
        scope=scope,
        setting=web.setting,
        threads=THREADS,
        errors=len(errors),
        wrong=_crossed(answers),
        wrong_means="saw another thread's session",
        builds=builds,
    )


@pytest.fixture(
    name="web", params=[Requests, Httpx], ids=["requests", "httpx"]
)
def _web(request, recipe, http_server, monkeypatch):
    cls = request.param
    return cls(recipe(cls.recipe), http_server, monkeypatch)


class TestCookieCrossTalk:
    def test_a_shared_client_gives_threads_each_others_session(self, web):
        """The default scope: one jar, the last login's cookie for all."""
        answers, errors = _logins(web, web.singleton)
        builds = web.singleton.statistics().builds
        _record(web, "process", answers, errors, builds)
        assert [] == errors
        assert 1 == builds
        assert THREADS == len(answers)
        # Every answer names one user: the jar's only session cookie.
        assert 1 == len(set(answers.values()))
        assert THREADS - 1 == _crossed(answers)

    def test_a_client_per_thread_keeps_each_threads_session(self, web):
        """scope="thread": one client per thread, closed on its thread."""
        made = Made(web.singleton.__wrapped__)
        single = process_singleton(
            key=keys.env(*web.key_names), scope="thread"
        )(made)
        try:
            answers, errors = _logins(web, single)
            stats = single.statistics()
            _record(web, "thread", answers, errors, stats.builds)
            assert [] == errors
            assert THREADS == len(answers)
            assert 0 == _crossed(answers)
            assert THREADS == stats.builds
            assert THREADS == len(made.built)
            # The threads ran at once: THREADS distinct threads built.
            assert THREADS == len({ident for _, ident in made.built})
            # Each thread's end closed its client, there, before join().
            assert THREADS == stats.closes
            assert made.closed_on_own_thread()
            assert 0 == stats.live
        finally:
            single.reset()
