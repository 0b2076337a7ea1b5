"""A forked child builds its own client and never touches the parent's."""

from __future__ import annotations

import contextlib
import os
import time
from pathlib import Path

import pytest
from daytona import SandboxState
from daytona_test_helpers import wait_child, wait_for

from poolkeeper_daytona import daytona_client
from poolkeeper_daytona._close import _after_fork

pytestmark = pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")

_CHILD_TIMEOUT = 30.0


def _socket_count() -> int:
    """Return how many of this process's descriptors are sockets."""
    count = 0
    for fd in Path("/proc/self/fd").iterdir():
        with contextlib.suppress(OSError):  # The listing's own descriptor.
            count += fd.readlink().name.startswith("socket:")
    return count


def _run_in_child(body) -> int:
    pid = os.fork()
    if pid == 0:  # pragma: no cover - reported through the exit code.
        code = 99
        try:
            code = body()
        except BaseException:
            code = 98
        finally:
            os._exit(code)
    return wait_child(pid, _CHILD_TIMEOUT)


class TestForkedChild:
    """The child's first create works; the parent's session survives."""

    def test_child_builds_and_parent_survives(self, sdk_env, daytona_emulator):
        """Child creates on a fresh client; parent keeps its websocket."""
        sdk_env.setenv("DAYTONA_API_KEY", "forked")
        parent = daytona_client()
        parent.create()
        assert wait_for(lambda: daytona_emulator.socketio_sessions("forked"))
        (session,) = daytona_emulator.socketio_sessions("forked")
        parent_connections = {
            c.id for c in daytona_emulator.open_connections("forked")
        }

        def child() -> int:
            client = daytona_client()
            if client is parent:
                return 1
            return 0 if SandboxState.STARTED == client.create().state else 2

        assert 0 == _run_in_child(child)

        assert SandboxState.STARTED == parent.create().state
        (after,) = [
            s
            for s in daytona_emulator.socketio_sessions("forked")
            if s.sid == session.sid
        ]
        assert after.is_connected
        still_open = {
            c.id for c in daytona_emulator.open_connections("forked")
        }
        assert parent_connections <= still_open
        posts = daytona_emulator.requests("forked", method="POST")
        assert 3 == len(posts)
        # The child's create went over a connection of its own.
        assert posts[1].connection not in parent_connections

    def test_after_fork_sends_nothing(self, make_client, daytona_emulator):
        """_after_fork in a child leaves the parent's connections intact."""
        parent = make_client(api_key="inert")
        parent.create()
        assert wait_for(lambda: daytona_emulator.socketio_sessions("inert"))
        before = daytona_emulator.open_connections("inert")
        requests = len(daytona_emulator.requests("inert"))

        def child() -> int:
            sockets = _socket_count()
            _after_fork(parent)
            # The child's copies of the websocket and pooled socket are
            # released (poolkeeper.release_sockets: /dev/null over them).
            return 0 if _socket_count() <= sockets - 2 else 3

        assert 0 == _run_in_child(child)

        time.sleep(0.2)  # A close frame would arrive within this.
        assert before == daytona_emulator.open_connections("inert")
        assert requests == len(daytona_emulator.requests("inert"))
        assert all(
            s.is_connected for s in daytona_emulator.socketio_sessions("inert")
        )
        assert SandboxState.STARTED == parent.create().state


class TestForkDuringALazyImport:
    """A fork while another thread imports what a build imports lazily.

    The module's import lock would be held in the child by a thread that
    does not exist there, and the child's first build would wait on it for
    ever (seen: a child hung in ``from daytona import Daytona``). The
    adapter's before-fork hook lets a begun import finish first.
    """

    def test_the_child_imports_what_a_parent_thread_was_importing(
        self, tmp_path, monkeypatch
    ):
        import sys
        import threading
        import types

        from poolkeeper_daytona import _client

        name = "pk_lazily_imported"
        (tmp_path / f"{name}.py").write_text(
            "import pk_import_gate\n"
            "pk_import_gate.entered.set()\n"
            "assert pk_import_gate.release.wait(30)\n"
            "VALUE = 1\n"
        )
        gate = types.ModuleType("pk_import_gate")
        gate.entered, gate.release = threading.Event(), threading.Event()
        monkeypatch.setitem(sys.modules, "pk_import_gate", gate)
        monkeypatch.syspath_prepend(str(tmp_path))
        monkeypatch.setattr(_client, "_LAZY_IMPORTS", (name,))
        importer = threading.Thread(target=__import__, args=(name,))
        importer.start()
        try:
            assert gate.entered.wait(_CHILD_TIMEOUT)
            # The hook waits for the import, which ends once released.
            threading.Timer(0.3, gate.release.set).start()

            def child() -> int:
                module = __import__(name)
                return 0 if module.VALUE == 1 else 3

            assert 0 == _run_in_child(child)
        finally:
            gate.release.set()
            importer.join(_CHILD_TIMEOUT)
            sys.modules.pop(name, None)

    def test_the_child_imports_what_a_parent_thread_was_searching_for(
        self, monkeypatch
    ):
        """A fork while the module is still being searched for, not yet run.

        It is not in ``sys.modules``, so the hook does not wait; CPython does:
        a finder searches under the import lock, which ``os.fork()`` takes,
        and the module's own lock, held by a thread that is gone in the
        child, is freed there with that thread's frames (3.10 to 3.14).
        """
        import importlib.machinery
        import sys
        import threading
        import types

        from poolkeeper_daytona import _client

        name = "pk_slowly_found"
        entered, release = threading.Event(), threading.Event()

        class SlowFinder:
            """Finds *name* only once released, as a slow filesystem."""

            @staticmethod
            def find_spec(fullname, path=None, target=None):
                if fullname != name:
                    return None
                entered.set()
                assert release.wait(_CHILD_TIMEOUT)
                return importlib.machinery.ModuleSpec(fullname, Loader())

        class Loader:
            def create_module(self, spec):
                return None

            def exec_module(self, module):
                module.VALUE = 1

        monkeypatch.setattr(sys, "meta_path", [SlowFinder, *sys.meta_path])
        monkeypatch.setattr(_client, "_LAZY_IMPORTS", (name,))
        importer = threading.Thread(target=__import__, args=(name,))
        importer.start()
        try:
            assert entered.wait(_CHILD_TIMEOUT)
            assert name not in sys.modules
            # The fork waits for the search, which ends once released.
            threading.Timer(0.3, release.set).start()

            def child() -> int:
                module = __import__(name)
                return 0 if module.VALUE == 1 else 3

            assert 0 == _run_in_child(child)
            release.set()
            importer.join(_CHILD_TIMEOUT)
            assert isinstance(sys.modules[name], types.ModuleType)
        finally:
            release.set()
            importer.join(_CHILD_TIMEOUT)
            sys.modules.pop(name, None)

    def test_an_absent_module_is_left_absent(self, monkeypatch, tmp_path):
        """python-dotenv blocked beside a stand-in SDK: a fork still works.

        The hook imports neither a blocked module (``None`` in
        ``sys.modules``) nor one never imported, and the child builds
        from the stand-in ``daytona`` module without python-dotenv.
        """
        import sys
        import types

        from poolkeeper_daytona import _client

        monkeypatch.setitem(sys.modules, "dotenv", None)
        monkeypatch.setattr(
            _client, "_LAZY_IMPORTS", ("dotenv", "pk_never_imported")
        )
        monkeypatch.chdir(tmp_path)
        monkeypatch.setenv("DAYTONA_API_KEY", "stand-in-key")

        _client._finish_imports()

        assert sys.modules["dotenv"] is None
        assert "pk_never_imported" not in sys.modules

        def child() -> int:
            stand_in = types.ModuleType("daytona")
            stand_in.Daytona = type("Daytona", (), {})
            sys.modules["daytona"] = stand_in
            return 0 if type(daytona_client()) is stand_in.Daytona else 3

        assert 0 == _run_in_child(child)
