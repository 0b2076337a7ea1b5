"""A real os.fork() child: run a function, report, wait to be let go."""

from __future__ import annotations

import json
import os
import select
import signal
import threading
import time
import traceback

WAIT = 30.0


class Forked:
    """Fork now; the child runs *fn* and stays alive until ``finish()``."""

    def __init__(self, fn):
        result_r, result_w = os.pipe()
        go_r, go_w = os.pipe()
        pid = os.fork()
        if pid == 0:  # The child: never returns.
            code = 1
            try:
                os.close(result_r)
                os.close(go_w)
                try:
                    payload = {"ok": True, "result": fn()}
                except BaseException:
                    payload = {"ok": False, "error": traceback.format_exc()}
                os.write(result_w, json.dumps(payload).encode())
                os.close(result_w)
                select.select([go_r], [], [], WAIT)
                code = 0 if payload["ok"] else 1
            finally:
                os._exit(code)
        os.close(result_w)
        os.close(go_r)
        self.pid = pid
        self._result = result_r
        self._go = go_w

    def result(self):
        """Return what *fn* returned in the child; fail with its traceback."""
        chunks = []
        deadline = time.monotonic() + WAIT
        while True:
            left = deadline - time.monotonic()
            assert left > 0, "the forked child did not report in time"
            ready, _, _ = select.select([self._result], [], [], left)
            if not ready:
                continue
            chunk = os.read(self._result, 65536)
            if not chunk:
                break
            chunks.append(chunk)
        os.close(self._result)
        payload = json.loads(b"".join(chunks))
        assert payload["ok"], payload["error"]
        return payload["result"]

    def finish(self):
        """Let the child exit; return its exit code (killed if stuck)."""
        os.close(self._go)
        pause = threading.Event()
        deadline = time.monotonic() + WAIT
        while time.monotonic() < deadline:
            pid, status = os.waitpid(self.pid, os.WNOHANG)
            if pid:
                return os.waitstatus_to_exitcode(status)
            pause.wait(0.01)
        os.kill(self.pid, signal.SIGKILL)
        _, status = os.waitpid(self.pid, 0)
        return os.waitstatus_to_exitcode(status)
