"""Fail unless the core's sdist holds the core's files, and only those."""

from __future__ import annotations

import sys
import tarfile

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


if __name__ == "__main__":
    sys.exit(main(sys.argv[1]))
