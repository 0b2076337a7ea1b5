"""What one function says about the clients it builds, by AST.

Whether it is a singleton factory (decorated, or wrapped by a call such as
``process_singleton(f)``), an entry point that runs once per process, or
retried by a decorator; and which of its calls build a client that is
closed in place or kept for reuse (in a global or on ``self``).
"""

from __future__ import annotations

import ast
import dataclasses
from typing import TYPE_CHECKING, Final

from poolkeeper._check._scope import last_name, own_nodes, resolve

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

    from poolkeeper._check._scope import Scopes

__all__ = [
    "FIXTURE_DECORATORS",
    "SINGLETON_DECORATORS",
    "Function",
    "entry_points",
    "exemptions",
    "is_retry",
    "wrapped_functions",
]

# Decorators that make a function build its result once (or once per
# object), matched on their last name so re-exports match too.
SINGLETON_DECORATORS: Final = frozenset(
    {"alru_cache", "cache", "cached", "cached_property", "lru_cache"}
    | {"async_process_singleton", "process_singleton"}
)
# Decorators of test fixtures (pytest's, pytest-asyncio's): the framework
# runs the function once per test or scope and owns what it returns.
FIXTURE_DECORATORS: Final = frozenset({"fixture"})
# Packages whose decorators re-run the function on failure.
_RETRY_PACKAGES: Final = frozenset(
    {"backoff", "retry", "retrying", "stamina", "tenacity", "aioretry"}
)
# Calls that hand a client to something that closes it.
_CLOSING_CALLS: Final = frozenset(
    {"aclosing", "closing", "enter_async_context", "enter_context"}
)
_CLOSE_METHODS: Final = frozenset({"aclose", "close", "shutdown"})


@dataclasses.dataclass
class Function:
    """What a function's own statements say about the clients it builds."""

    name: str
    is_module: bool = False
    method_of: str | None = None
    is_singleton: bool = False
    # Run once per process: main(), asyncio.run(f()), `if __name__ ...`.
    is_entry_point: bool = False
    # Calls whose client is closed here, or cached globally or on self.
    closed: set[int] = dataclasses.field(default_factory=set[int])
    kept: set[int] = dataclasses.field(default_factory=set[int])

    def local_key(self, node: ast.Call) -> tuple[str, str] | None:
        """Return the factory key of ``f()`` or ``self.f()`` called here."""
        func = node.func
        if isinstance(func, ast.Name):
            return "", func.id
        if (
            isinstance(func, ast.Attribute)
            and isinstance(func.value, ast.Name)
            and func.value.id in {"self", "cls"}
            and self.method_of is not None
        ):
            return self.method_of, func.attr
        return None


def wrapped_functions(tree: ast.Module) -> Iterator[str]:
    """Yield the names passed to ``process_singleton(...)`` and the like."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Call):
            func = func.func
        if last_name(func) in SINGLETON_DECORATORS:
            yield from (a.id for a in node.args if isinstance(a, ast.Name))


def entry_points(tree: ast.Module) -> set[str]:
    """Return the functions a module runs once: its entry points.

    ``main``, a function handed to ``asyncio.run()`` (or ``trio.run``,
    ``anyio.run``), and one called under ``if __name__ == "__main__":``.
    """
    names = {"main"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and last_name(node.func) == "run":
            for arg in node.args[:1]:
                name = last_name(arg)
                if name is not None:
                    names.add(name)
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ):
            for inner in own_nodes(node.body):
                if isinstance(inner, ast.Call):
                    name = last_name(inner.func)
                    if name is not None:
                        names.add(name)
    return names


def is_retry(decorator: ast.expr, scopes: Scopes) -> bool:
    """Say whether *decorator* re-runs the function it decorates."""
    target = decorator.func if isinstance(decorator, ast.Call) else decorator
    dotted = resolve(target, scopes)
    if dotted is None:
        return last_name(decorator) == "retry"
    return dotted.partition(".")[0] in _RETRY_PACKAGES or (
        dotted.rpartition(".")[2] == "retry"
    )


def _values(node: ast.expr) -> Iterator[ast.expr]:
    """Yield *node*, or its branches for ``a or b`` and ``a if c else b``."""
    if isinstance(node, ast.BoolOp):
        for value in node.values:
            yield from _values(value)
    elif isinstance(node, ast.IfExp):
        yield from _values(node.body)
        yield from _values(node.orelse)
    elif isinstance(node, ast.Await):
        yield from _values(node.value)
    else:
        yield node


def exemptions(  # noqa: C901 -- one pass, one branch per kind of node.
    body: Iterable[ast.AST], function: Function, global_names: set[str]
) -> None:
    """Find the calls whose clients are closed here or kept for reuse.

    Closed: a ``with`` item, an argument of ``closing()`` or
    ``enter_context()``, or assigned to a local name that is later closed
    or used in ``with``. Kept: assigned to a global or to ``self.x``, or
    to a local name that a later loop of the function uses (built once
    before the loop, as a thread's ``run()`` does).
    """
    _reused_by_a_loop(body, function)
    local: dict[int, str] = {}
    closed_names: set[str] = set()
    for node in own_nodes(body):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                closed_names.update(_names(item.context_expr))
                function.closed.update(map(id, _values(item.context_expr)))
        elif isinstance(node, ast.Call):
            if last_name(node.func) in _CLOSING_CALLS:
                function.closed.update(map(id, node.args))
            elif last_name(node.func) in _CLOSE_METHODS:
                closed_names.update(_names(node.func))
        elif isinstance(node, (ast.Assign, ast.AnnAssign)) and node.value:
            targets = (
                node.targets if isinstance(node, ast.Assign) else [node.target]
            )
            for target in targets:
                kept = _is_kept(target, global_names)
                for value in _values(node.value):
                    if kept:
                        function.kept.add(id(value))
                    elif isinstance(target, ast.Name):
                        local[id(value)] = target.id
    function.closed.update(
        call for call, name in local.items() if name in closed_names
    )


def _reused_by_a_loop(body: Iterable[ast.AST], function: Function) -> None:
    """Keep the clients assigned to a name that a later loop uses."""
    statements = list(body)
    for index, node in enumerate(statements):
        if not isinstance(node, (ast.Assign, ast.AnnAssign)) or not node.value:
            continue
        targets = (
            node.targets if isinstance(node, ast.Assign) else [node.target]
        )
        names = {t.id for t in targets if isinstance(t, ast.Name)}
        if names and any(
            names & _used_in_loops(later) for later in statements[index + 1 :]
        ):
            function.kept.update(map(id, _values(node.value)))


def _used_in_loops(statement: ast.AST) -> set[str]:
    """Return the names read inside the loops of *statement*."""
    used: set[str] = set()
    for node in own_nodes([statement]):
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            used.update(
                n.id
                for n in own_nodes([node])
                if isinstance(n, ast.Name) and isinstance(n.ctx, ast.Load)
            )
    return used


def _names(node: ast.expr) -> Iterator[str]:
    """Yield ``x`` for ``x``, and for the ``x.close`` of ``x.close()``."""
    if isinstance(node, ast.Attribute):
        node = node.value
    if isinstance(node, ast.Name):
        yield node.id


def _is_kept(target: ast.expr, global_names: set[str]) -> bool:
    """Say whether *target* is a global, or an attribute of self or cls."""
    if isinstance(target, ast.Name):
        return target.id in global_names
    return (
        isinstance(target, ast.Attribute)
        and isinstance(target.value, ast.Name)
        and target.value.id in {"self", "cls"}
    )
