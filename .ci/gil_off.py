"""On a free-threaded CPython: the GIL stays off through these imports.

An extension module not built for a free-threaded interpreter turns its
GIL on for good when it is imported (with a RuntimeWarning), and every
test after that would run with a GIL. Imports the packages, the Daytona
SDK the adapter wraps, and the test dependencies one at a time, and
names the first import that turned the GIL on.
"""

from __future__ import annotations

import importlib
import sys
import sysconfig

MODULES = (
    "poolkeeper",
    "poolkeeper_daytona",
    "daytona",  # What poolkeeper_daytona imports when first used.
    "wrapt",
    "pytest",
    "pytest_timeout",
    "hypothesis",
    "hypothesis.stateful",
    "coverage",
    "sybil",
    "gunicorn",
)


def main() -> int:
    if not sysconfig.get_config_var("Py_GIL_DISABLED"):
        print(f"gil_off: {sys.executable} is not a free-threaded build")
        return 1
    if sys._is_gil_enabled():
        print("gil_off: the GIL is on at start (PYTHON_GIL=1 or -X gil=1?)")
        return 1
    for name in MODULES:
        importlib.import_module(name)
        if sys._is_gil_enabled():
            print(f"gil_off: importing {name} turned the GIL on")
            return 1
    print(f"gil_off: the GIL stayed off importing {', '.join(MODULES)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
