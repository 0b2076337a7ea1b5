"""Healing's timers share one thread for the whole process.

200 idle singletons with ``max_age``, ``check=`` and ``check_every`` used to
add 400 threads (a ``threading.Timer`` per timer), visible on
``process.thread.count``, the metric the docs suggest charting for leaks.
Now every timer is an entry of one heap served by one thread, started by
the first timer (never by an import), ended once no timer is left, and
made anew in a forked child. Retirements a timer carries out still run off
that thread (a close can take seconds), so a slow close delays no other
timer.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time

from helpers import WAIT, Factory, fork_and_check, wait_until

from poolkeeper import _timers, process_singleton


def _threads() -> set[str]:
    return {t.name for t in threading.enumerate()}


def _run(code: str) -> None:
    """Run *code* in a fresh interpreter: no other test's timers there."""
    done = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=WAIT,
        check=False,
    )
    assert done.returncode == 0, done.stderr


def test_two_hundred_healing_singletons_add_one_thread():
    _run(
        "import threading, time, poolkeeper\n"
        "from poolkeeper import _timers, process_singleton\n"
        "singles = [process_singleton(max_age=3600, check=bool,"
        " check_every=3600)(object) for _ in range(200)]\n"
        "for single in singles:\n"
        "    single()\n"
        "assert len(_timers.alive()) == 400, len(_timers.alive())\n"
        "assert threading.active_count() == 2, threading.enumerate()\n"
        "poolkeeper.close_all()\n"
        # Their clients closed, their timers cancelled: the thread ends.
        "for _ in range(3000):\n"
        "    if threading.active_count() == 1:\n"
        "        break\n"
        "    time.sleep(0.01)\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "assert _timers.alive() == []\n"
    )


def test_importing_and_decorating_start_no_thread(tmp_path):
    """Timers, file keys, environment keys: nothing before the first build."""
    path = tmp_path / "api_key"
    path.write_text("one")
    _run(
        "import threading, poolkeeper\n"
        "from poolkeeper import keys, process_singleton\n"
        f"single = process_singleton(key=keys.file({str(path)!r}),"
        " max_age=60, check=bool, check_every=60)(object)\n"
        "env = process_singleton(key=keys.env('PK_TEST_KEY'))(object)\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "env()\n"
        "assert threading.active_count() == 1, threading.enumerate()\n"
        "single()\n"
        "names = {t.name for t in threading.enumerate()}\n"
        "assert names == {'MainThread', 'poolkeeper-timers',"
        " 'poolkeeper-filekeys'}, names\n"
    )


def test_a_slow_retirement_delays_no_other_timer():
    """A max_age close that blocks, and a probe made due meanwhile."""
    release = threading.Event()
    closed = threading.Event()

    def slow_close(client: object) -> None:
        closed.set()
        assert release.wait(WAIT)

    aged = process_singleton(max_age=0.05, close=slow_close)(Factory())
    probed = process_singleton(check=lambda c: True, check_every=0.1)(
        Factory()
    )
    try:
        aged()
        probed()
        assert closed.wait(WAIT)  # The expiry's close blocks its thread.
        slot = probed._self_slot
        # The probe timer still fires: the probe becomes due.
        assert wait_until(lambda: slot.probe is not None, WAIT)
    finally:
        release.set()


def test_a_forked_child_has_its_own_timer_thread():
    single = process_singleton(max_age=0.05)(Factory())
    parent = single()
    assert wait_until(lambda: single.current() is not parent, WAIT)

    def child() -> bool:
        if _timers.alive():  # The parent's timers are not the child's.
            return False
        first = single()
        started = time.monotonic()
        # Its max_age timer runs on the child's own thread.
        while single.current() is first and time.monotonic() - started < 10:
            time.sleep(0.01)
        return single.current() is not first and first.pid == os.getpid()

    assert 0 == fork_and_check(child)


def test_a_timer_raising_a_base_exception_leaves_the_others_running():
    def interrupt() -> None:
        raise KeyboardInterrupt

    ran = threading.Event()
    _timers.Timer(0.0, interrupt, inline=True)
    _timers.Timer(0.05, ran.set, inline=True)
    assert ran.wait(WAIT)
