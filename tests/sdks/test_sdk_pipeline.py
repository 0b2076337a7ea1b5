"""128 threads on redis ``Pipeline``s: one shared, or one per thread.

A ``Pipeline`` queues commands in a list of its own and ``execute()``
sends the whole list, returns every answer and empties it: state of one
user's, like a cookie jar. Each thread queues ``SET`` and ``GET`` of a
key of its own, then (once every thread has queued: a barrier) executes
and checks that it got its own answers, ``[True, value]``. One thread,
the barrier's first, executes before the others, which then execute at
once: an order that makes the shared pipeline's outcome certain.

Shared (the default scope), the first thread's ``execute()`` sends every
thread's commands and returns all their answers; the others find the list
empty and get ``[]``: no thread gets its own answers, and the first gets
THREADS - 1 threads' values. With ``scope="thread"`` each thread has a
pipeline of its own, on the redis recipe's shared client: every thread
gets its own answers, and its end closes its pipeline (handing any
connection back to the pool), on that thread.
"""

from __future__ import annotations

import threading
import uuid

import pytest
import sdk_net
from sdk_drivers import Made, Redis
from sdk_outcomes import record

from poolkeeper import keys, process_singleton

#: The issue's job: 128 threads on one client.
THREADS = 128
JOIN = 120.0


@pytest.fixture(name="cache")
def _cache(recipe, redis_server, monkeypatch):
    """The redis recipe's process-wide client, on the test server."""
    return Redis(recipe("sdk_redis"), redis_server, monkeypatch).singleton


def _queue_then_execute(single, prefix):
    """Each thread queues its SET and GET, then executes (first one alone).

    Return ({thread: answers}, errors, {thread: value}).
    """
    queued = threading.Barrier(THREADS, timeout=JOIN)
    first_done = threading.Event()
    answers = {}
    errors = []
    values = {i: f"{prefix}-value-{i}".encode() for i in range(THREADS)}

    def run(i):
        first = False
        try:
            try:
                pipe = single()
                pipe.set(f"{prefix}-key-{i}", values[i])
                pipe.get(f"{prefix}-key-{i}")
            finally:
                first = 0 == queued.wait()
            if not first:
                assert first_done.wait(JOIN)
            answers[i] = single().execute()
        except Exception as exc:
            errors.append(exc)
        finally:
            if first:
                first_done.set()

    sdk_net.each(THREADS, run, JOIN)
    return answers, errors, values


def _wrong(answers, values):
    """The threads whose answers are not [True, their value]."""
    return sum(got != [True, values[i]] for i, got in answers.items())


def _foreign(answers, values):
    """Answers that are another thread's value."""
    owner = {value: i for i, value in values.items()}
    return sum(
        owner.get(answer, i) != i
        for i, got in answers.items()
        for answer in got
        if isinstance(answer, bytes)
    )


def _record(scope, answers, errors, values, builds):
    """Record the run's row of the threads page's table."""
    record(
        f"Redis pipeline, scope {scope}",
        object="redis `Pipeline`, each thread its own keys",
        scope=scope,
        setting="`cache().pipeline(transaction=False)` on the recipe's client",
        threads=THREADS,
        errors=len(errors),
        wrong=_wrong(answers, values),
        wrong_means="got answers not their own",
        builds=builds,
    )


@pytest.fixture(name="prefix")
def _prefix(redis_server):
    prefix = f"pipeline-{uuid.uuid4().hex}"
    yield prefix
    for key in redis_server.admin.scan_iter(f"{prefix}-*"):
        redis_server.admin.delete(key)


class TestPipelinePerThread:
    def test_a_shared_pipeline_answers_threads_with_each_others(
        self, cache, prefix
    ):
        """The default scope: one command list for every thread."""

        @process_singleton(key=keys.env("REDIS_URL"))
        def pipeline():
            return cache().pipeline(transaction=False)

        answers, errors, values = _queue_then_execute(pipeline, prefix)
        builds = pipeline.statistics().builds
        _record("process", answers, errors, values, builds)
        assert [] == errors
        assert 1 == builds
        assert THREADS == len(answers)
        assert THREADS == _wrong(answers, values)
        # The first thread's execute() answered everyone's commands.
        assert THREADS - 1 == _foreign(answers, values)
        assert 2 * THREADS == sum(len(got) for got in answers.values())

    def test_a_pipeline_per_thread_answers_each_thread_its_own(
        self, cache, prefix
    ):
        """scope="thread": each thread's own list, closed on its thread."""
        made = Made(lambda: cache().pipeline(transaction=False))
        pipeline = process_singleton(
            key=keys.env("REDIS_URL"), scope="thread"
        )(made)
        answers, errors, values = _queue_then_execute(pipeline, prefix)
        stats = pipeline.statistics()
        _record("thread", answers, errors, values, stats.builds)
        assert [] == errors
        assert THREADS == len(answers)
        assert 0 == _wrong(answers, values)
        assert 0 == _foreign(answers, values)
        assert THREADS == stats.builds
        assert THREADS == len({ident for _, ident in made.built})
        # Each thread's end closed its pipeline, there, before join().
        assert THREADS == stats.closes
        assert made.closed_on_own_thread()
        # The shared client under the pipelines: one, for every thread.
        assert 1 == cache.statistics().builds
