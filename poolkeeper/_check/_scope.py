"""Names and scopes: resolve a name through a module's own imports.

Nothing is imported from the code under check: a scope maps each name its
statements import (or alias by assignment) to a dotted name, and a name is
looked up from the innermost scope out.
"""

from __future__ import annotations

import ast
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

__all__ = [
    "FUNCTIONS",
    "Scopes",
    "bindings",
    "declared_global",
    "last_name",
    "own_nodes",
    "resolve",
    "without",
]

FUNCTIONS: Final = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_SCOPES: Final = (*FUNCTIONS, ast.ClassDef)

Scopes = tuple[dict[str, str | None], ...]


def resolve(node: ast.expr, scopes: Scopes) -> str | None:
    """Return the dotted name *node* refers to through imports, if any."""
    if isinstance(node, ast.Attribute):
        base = resolve(node.value, scopes)
        return None if base is None else f"{base}.{node.attr}"
    if isinstance(node, ast.Name):
        for scope in reversed(scopes):
            if node.id in scope:
                return scope[node.id]
    return None


def last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def own_nodes(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Yield the nodes of *body*, not descending into nested scopes."""
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def without(node: ast.AST, skipped: ast.AST) -> Iterator[ast.AST]:
    """Yield the descendants of *node* but *skipped*, one level down."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.comprehension):
            yield from (
                n for n in ast.iter_child_nodes(child) if n is not skipped
            )
        else:
            yield child


def bindings(
    body: Iterable[ast.AST], scope: dict[str, str | None]
) -> dict[str, str | None]:
    """Add the names *body* imports, or aliases by assignment, to *scope*."""
    nodes = sorted(
        (n for n in own_nodes(body) if isinstance(n, (ast.stmt))),
        key=lambda n: (n.lineno, n.col_offset),
    )
    for node in nodes:
        if isinstance(node, ast.Import):
            for alias in node.names:
                if alias.asname is None:
                    top = alias.name.partition(".")[0]
                    scope[top] = top
                else:
                    scope[alias.asname] = alias.name
        elif isinstance(node, ast.ImportFrom):
            # A relative import never names an SDK: its leading dots keep
            # it unmatched ("from . import x" is ".x", from .m is ".m.x").
            base = "." * node.level
            if node.module:
                base += node.module + "."
            for alias in node.names:
                scope[alias.asname or alias.name] = f"{base}{alias.name}"
        elif (
            isinstance(node, ast.Assign)
            and len(node.targets) == 1
            and isinstance(node.targets[0], ast.Name)
            and isinstance(node.value, (ast.Name, ast.Attribute))
        ):
            scope[node.targets[0].id] = resolve(node.value, (scope,))
    return scope


def declared_global(body: Iterable[ast.AST]) -> set[str]:
    names: set[str] = set()
    for node in own_nodes(body):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return names
