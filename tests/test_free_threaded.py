"""What a singleton relies on is decided by the build, not by the moment.

On a free-threaded build (python3.14t) every extension module's import
runs its init with the GIL on, on every thread, and turns it off after:
``sys._is_gil_enabled()`` read at such a moment says the GIL is on. A
singleton made then must still take the lock where the GIL's lock-free
steps would rely on a GIL it will not have. On a build with the GIL, every
singleton takes the lock-free steps.
"""

from __future__ import annotations

import importlib
import sys
import threading

from helpers import FREE_THREADED, WAIT

from poolkeeper import _lifecycle, process_singleton

# Standard-library extension modules that can be imported again once
# removed from sys.modules (multi-phase init), and that nothing here uses.
EXTENSIONS = ("_bisect", "_heapq", "_csv", "_statistics", "cmath")
SINGLETONS = 3000


def _import_until(stop: threading.Event, imports: list[int]) -> None:
    """Import EXTENSIONS again and again until *stop*, counting imports."""
    for _ in range(1_000_000):
        if stop.is_set():
            return
        for name in EXTENSIONS:
            sys.modules.pop(name, None)
            importlib.import_module(name)
            imports[0] += 1


class TestLockFreeDecidedByTheBuild:
    def test_singletons_made_during_extension_imports(self):
        """Made while another thread imports extensions: as the build says.

        Decided from sys._is_gil_enabled() at the time, about half the
        singletons made on 3.14t got the GIL's lock-free steps and then
        ran without a GIL.
        """
        saved = {name: importlib.import_module(name) for name in EXTENSIONS}
        stop = threading.Event()
        imports = [0]
        importer = threading.Thread(target=_import_until, args=(stop, imports))
        importer.start()
        try:
            made = [
                process_singleton(object)._self_life.lock_free
                for _ in range(SINGLETONS)
            ]
        finally:
            stop.set()
            importer.join(WAIT)
            sys.modules.update(saved)
        assert not importer.is_alive()
        assert imports[0] > 0
        assert {not FREE_THREADED} == set(made), made.count(True)
        if FREE_THREADED:  # And the imports left the GIL off.
            assert not sys._is_gil_enabled()

    def test_the_build_is_read_from_its_abi_flags_or_sysconfig(
        self, monkeypatch
    ):
        """Both ways agree with sysconfig's Py_GIL_DISABLED.

        The ABI flags ("t") where the build has them; sysconfig where it
        has none (Windows before 3.14).
        """
        assert FREE_THREADED is _lifecycle.FREE_THREADED
        assert FREE_THREADED is _lifecycle._free_threaded()
        monkeypatch.delattr(sys, "abiflags", raising=False)
        assert FREE_THREADED is _lifecycle._free_threaded()
