"""``[tool.poolkeeper]`` of ``pyproject.toml``, for ``poolkeeper check``.

Each checked file follows the nearest ``pyproject.toml`` that has the
table: its ``clients`` (more ``module:Name`` to report) and its
``exclude`` patterns, relative to that file's folder.
"""

from __future__ import annotations

import dataclasses
import fnmatch
import importlib
from pathlib import Path
from typing import TYPE_CHECKING, Any, Final, TextIO

if TYPE_CHECKING:
    from collections.abc import Callable, Sequence

__all__ = ["Config", "Configs", "UsageError", "check_clients"]

_CONFIG_KEYS: Final = frozenset({"clients", "exclude"})


class UsageError(Exception):
    """A bad argument or configuration: exit status 2."""


def _toml_loader() -> Callable[[str], dict[str, Any]] | None:
    # tomllib is 3.11+; tomli is its backport, if installed.
    for name in ("tomllib", "tomli"):
        try:
            module = importlib.import_module(name)
        # The pragmas: only Python 3.10 can lack both modules.
        except ImportError:  # pragma: no cover -- 3.10 without tomli.
            continue
        loads: Callable[[str], dict[str, Any]] = module.loads
        return loads
    return None  # pragma: no cover -- 3.10 without tomli.


@dataclasses.dataclass(frozen=True)
class Config:
    """``[tool.poolkeeper]`` of one ``pyproject.toml``."""

    root: Path | None = None
    clients: tuple[str, ...] = ()
    exclude: tuple[str, ...] = ()

    def excludes(self, path: Path, extra: Sequence[str]) -> bool:
        """Say whether *path* matches an ``exclude`` pattern."""
        patterns = [(self.root, p) for p in self.exclude]
        patterns += [(Path.cwd(), p) for p in extra]
        for root, pattern in patterns:
            try:
                relative = path.resolve().relative_to(root or Path.cwd())
            except ValueError:
                continue
            parts = relative.parts
            for end in range(1, len(parts) + 1):
                if fnmatch.fnmatch("/".join(parts[:end]), pattern.rstrip("/")):
                    return True
        return False


class Configs:
    """The nearest ``pyproject.toml`` with ``[tool.poolkeeper]``, by folder."""

    def __init__(self, stderr: TextIO) -> None:
        self.stderr = stderr
        self.loads = _toml_loader()
        self.by_dir: dict[Path, Config] = {}

    def for_path(self, path: Path) -> Config:
        folder = path.resolve()
        if not folder.is_dir():
            folder = folder.parent
        seen: list[Path] = []
        config = None
        for candidate in (folder, *folder.parents):
            config = self.by_dir.get(candidate)
            if config is not None:
                break
            seen.append(candidate)
            config = self.read(candidate / "pyproject.toml")
            if config is not None:
                break
        config = config or Config()
        for candidate in seen:
            self.by_dir[candidate] = config
        return config

    def read(self, file: Path) -> Config | None:
        try:
            text = file.read_text(encoding="utf-8")
        except OSError:
            return None
        if "[tool.poolkeeper]" not in text:
            return None
        if self.loads is None:  # pragma: no cover -- 3.10 without tomli.
            self.stderr.write(
                f"poolkeeper check: ignoring [tool.poolkeeper] in {file}: "
                "reading it needs Python 3.11+ or the tomli package.\n"
            )
            return Config(file.parent)
        try:
            table = self.loads(text).get("tool", {}).get("poolkeeper", {})
        except ValueError as exc:
            msg = f"{file}: {exc}"
            raise UsageError(msg) from exc
        return _parse_config(file, table)


def _parse_config(file: Path, table: dict[str, Any]) -> Config:
    unknown = sorted(set(table) - _CONFIG_KEYS)
    if unknown:
        msg = f"{file}: unknown [tool.poolkeeper] keys: {', '.join(unknown)}."
        raise UsageError(msg)
    lists: dict[str, tuple[str, ...]] = {}
    for key in sorted(_CONFIG_KEYS):
        value: object = table.get(key, [])
        if not isinstance(value, list) or not all(
            isinstance(item, str)
            for item in value  # pyright: ignore[reportUnknownVariableType]
        ):
            msg = f"{file}: [tool.poolkeeper] {key} must be a list of strings."
            raise UsageError(msg)
        lists[key] = tuple(value)  # pyright: ignore[reportUnknownArgumentType]
    check_clients(lists["clients"], str(file))
    return Config(file.parent, lists["clients"], lists["exclude"])


def check_clients(names: Sequence[str], where: str) -> None:
    for name in names:
        module, _, attr = name.partition(":")
        if not module or not attr:
            msg = f"{where}: client {name!r} is not 'module:Name'."
            raise UsageError(msg)
