"""Fail unless the core's sdist holds the core's files, and only those.

With ``--adapter-wheel``: fail unless the Daytona adapter's wheel holds the
library alone (no demo, no console script) and declares its hooks' entry
point.
"""

from __future__ import annotations

import sys
import tarfile
import zipfile

# Top-level entries of the sdist, below its poolkeeper-<version>/ folder.
EXPECTED = {
    ".gitignore",
    "CHANGELOG.md",
    "LICENSE",
    "PKG-INFO",
    "README.md",
    "poolkeeper",
    "poolkeeper-watch.pth",
    "pyproject.toml",
    "tests",
    "typing_tests",
}


def main(path: str) -> int:
    """Print the sdist's top-level entries; return 1 if they are wrong."""
    with tarfile.open(path) as sdist:
        names = sdist.getnames()
    tops = {name.split("/")[1] for name in names if name.count("/") >= 1}
    sys.stdout.write(f"{path}: {len(names)} files in {sorted(tops)}\n")
    extra, missing = tops - EXPECTED, EXPECTED - tops
    if extra or missing:
        sys.stdout.write(f"unexpected: {sorted(extra)}\n")
        sys.stdout.write(f"missing: {sorted(missing)}\n")
        return 1
    return 0


# Modules of the demo, which lives in adapters/daytona/demo instead.
DEMO_MODULES = {"_cli", "_demo", "_chart", "_report", "_results", "_workload"}


def check_adapter_wheel(path: str) -> int:
    """Print the wheel's packages; return 1 if it ships the demo."""
    with zipfile.ZipFile(path) as wheel:
        names = wheel.namelist()
        points = next(
            wheel.read(n).decode()
            for n in names
            if n.endswith(".dist-info/entry_points.txt")
        )
    tops = {name.split("/")[0] for name in names}
    modules = {n.rpartition("/")[2].removesuffix(".py") for n in names}
    sys.stdout.write(f"{path}: {len(names)} files in {sorted(tops)}\n")
    problems = []
    if {t for t in tops if not t.endswith(".dist-info")} != {
        "poolkeeper_daytona"
    }:
        problems.append(f"unexpected top-level entries: {sorted(tops)}")
    if modules & DEMO_MODULES or "__main__" in modules:
        problems.append(f"demo modules: {sorted(modules & DEMO_MODULES)}")
    if "[console_scripts]" in points:
        problems.append("a console script")
    if "[poolkeeper.adapters]" not in points:
        problems.append("no poolkeeper.adapters entry point")
    for problem in problems:
        sys.stdout.write(f"{problem}\n")
    return 1 if problems else 0


if __name__ == "__main__":
    if sys.argv[1] == "--adapter-wheel":
        sys.exit(check_adapter_wheel(sys.argv[2]))
    sys.exit(main(sys.argv[1]))
