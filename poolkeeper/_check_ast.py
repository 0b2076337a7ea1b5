"""Find pool-owning clients built per call, per loop or per retry, by AST.

Nothing is imported from the code under check: names are resolved through
the module's own ``import`` statements, scope by scope.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import TYPE_CHECKING, Final

if TYPE_CHECKING:
    from collections.abc import Iterable, Iterator

__all__ = [
    "Finding",
    "ImportedCall",
    "ModuleReport",
    "analyze",
    "analyze_module",
    "client_table",
    "imported_call_finding",
]

# Decorators that make a function build its result once (or once per
# object), matched on their last name so re-exports match too.
_SINGLETON_DECORATORS: Final = frozenset(
    {"alru_cache", "cache", "cached", "cached_property", "lru_cache"}
    | {"async_process_singleton", "process_singleton"}
)
# Packages whose decorators re-run the function on failure.
_RETRY_PACKAGES: Final = frozenset(
    {"backoff", "retry", "retrying", "stamina", "tenacity", "aioretry"}
)
# Calls that hand a client to something that closes it.
_CLOSING_CALLS: Final = frozenset(
    {"aclosing", "closing", "enter_async_context", "enter_context"}
)
_CLOSE_METHODS: Final = frozenset({"aclose", "close", "shutdown"})
_FUNCTIONS: Final = (ast.FunctionDef, ast.AsyncFunctionDef, ast.Lambda)
_SCOPES: Final = (*_FUNCTIONS, ast.ClassDef)
_COMPREHENSIONS: Final = (ast.ListComp, ast.SetComp, ast.DictComp)
_IN_LOOP: Final = "inside a loop"
_IN_COMPREHENSION: Final = "inside a comprehension"
_IN_EXCEPT: Final = "inside an except block"
_FIX: Final = "build it once, e.g. with @poolkeeper.process_singleton"


@dataclasses.dataclass(frozen=True, order=True)
class Finding:
    """One problem at one place of a checked file.

    Args:
        line: The 1-based line of the call.
        col: The 1-based column of the call.
        code: ``PK001`` or ``PK002``.
        message: One sentence saying what is wrong and what to do.

    .. versionadded:: 0.1
    """

    line: int
    col: int
    code: str
    message: str


def client_table(names: Iterable[str]) -> dict[tuple[str, str], str]:
    """Index ``module:callable`` names by (top-level package, last name).

    A call matches when its resolved dotted name starts with the package
    and ends with the name, so ``daytona._sync.daytona.Daytona`` matches
    ``daytona:Daytona``.

    .. versionadded:: 0.1
    """
    table: dict[tuple[str, str], str] = {}
    for name in names:
        module, _, attr = name.partition(":")
        table[module.partition(".")[0], attr.rpartition(".")[2]] = (
            f"{module}.{attr}"
        )
    return table


@dataclasses.dataclass(frozen=True)
class ImportedCall:
    """A call, in a loop or retry, of a name imported from another module.

    Args:
        line: The 1-based line of the call.
        col: The 1-based column of the call.
        target: The dotted name the call resolves to through imports; it
            starts with dots for a relative import (``..pkg.make``).
        reason: Why the call repeats, e.g. ``"inside a loop"``.
    """

    line: int
    col: int
    target: str
    reason: str


@dataclasses.dataclass
class ModuleReport:
    """What one module says, for linking factories across modules.

    Args:
        findings: The problems found in the module alone.
        factories: Top-level function name -> the client it builds on
            every call.
        calls: Calls in a loop or retry of names imported from elsewhere.
    """

    findings: list[Finding]
    factories: dict[str, str]
    calls: list[ImportedCall]


def imported_call_finding(call: ImportedCall, built: str) -> Finding:
    """Return the PK002 for *call* of a factory that builds *built*."""
    name = call.target.rpartition(".")[2]
    return Finding(
        call.line,
        call.col,
        "PK002",
        f"{name}() builds a {built} on every call and is called "
        f"{call.reason}: each call opens a connection pool that is never "
        f"closed; {_FIX}",
    )


@dataclasses.dataclass
class _Function:
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


@dataclasses.dataclass(frozen=True)
class _Context:
    scopes: tuple[dict[str, str | None], ...]
    function: _Function
    reason: str | None = None
    cls: str | None = None


def analyze(
    source: str | bytes, clients: dict[tuple[str, str], str]
) -> list[Finding]:
    """Return the findings in *source*, in no particular order.

    Args:
        source: A module's source code.
        clients: From :func:`client_table`.

    Raises:
        SyntaxError: If *source* does not parse.

    .. versionadded:: 0.1
    """
    text = source.decode("latin-1") if isinstance(source, bytes) else source
    # A module that never names a client's package cannot build one; most
    # do not, and parsing is most of the cost.
    if not any(package in text for package, _ in clients):
        return []
    return analyze_module(ast.parse(source), clients).findings


def analyze_module(
    tree: ast.Module, clients: dict[tuple[str, str], str]
) -> ModuleReport:
    """Return the findings, factories and imported calls of *tree*.

    Args:
        tree: A parsed module.
        clients: From :func:`client_table`.
    """
    analyzer = _Analyzer(clients)
    findings = analyzer.run(tree)
    factories = {
        function: built
        for (cls, function), built in analyzer.factories.items()
        if not cls
    }
    return ModuleReport(findings, factories, analyzer.imported_calls)


class _Analyzer:
    def __init__(self, clients: dict[tuple[str, str], str]) -> None:
        self.clients = clients
        self.findings: list[Finding] = []
        # (class or "", function) -> the client it builds on every call.
        self.factories: dict[tuple[str, str], str] = {}
        self.calls: list[tuple[ast.Call, tuple[str, str], str]] = []
        self.imported_calls: list[ImportedCall] = []
        self.entry_points: set[str] = set()
        # Functions made singletons by a call: process_singleton(f).
        self.wrapped: set[str] = set()

    def run(self, tree: ast.Module) -> list[Finding]:
        self.wrapped.update(_wrapped_functions(tree))
        self.entry_points = _entry_points(tree)
        module = _Function("<module>", is_module=True)
        scope = _bindings(tree.body, {})
        _exemptions(tree.body, module, set())
        self.visit_body(tree.body, _Context((scope,), module))
        for call, key, reason in self.calls:
            built = self.factories.get(key)
            if built is not None:
                self.report(
                    call,
                    "PK002",
                    f"{key[1]}() builds a {built} on every call and is "
                    f"called {reason}: each call opens a connection pool "
                    f"that is never closed; {_FIX}",
                )
        return self.findings

    def report(self, node: ast.expr, code: str, message: str) -> None:
        finding = Finding(node.lineno, node.col_offset + 1, code, message)
        self.findings.append(finding)

    def visit_body(self, body: Iterable[ast.AST], ctx: _Context) -> None:
        for node in body:
            self.visit(node, ctx)

    def visit(self, node: ast.AST, ctx: _Context) -> None:
        if isinstance(node, _FUNCTIONS):
            self.visit_function(node, ctx)
        elif isinstance(node, ast.ClassDef):
            self.visit_body(node.decorator_list, ctx)
            self.visit_body(node.bases, ctx)
            self.visit_body(node.body, dataclasses.replace(ctx, cls=node.name))
        elif isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            head = [node.test] if isinstance(node, ast.While) else [node.iter]
            self.visit_body(head, ctx)
            self.visit_body(
                node.body, dataclasses.replace(ctx, reason=_IN_LOOP)
            )
            self.visit_body(node.orelse, ctx)
        elif isinstance(node, ast.ExceptHandler):
            inner = dataclasses.replace(ctx, reason=_IN_EXCEPT)
            self.visit_body(node.body, inner)
        elif isinstance(node, (*_COMPREHENSIONS, ast.GeneratorExp)):
            self.visit(node.generators[0].iter, ctx)
            inner = dataclasses.replace(ctx, reason=_IN_COMPREHENSION)
            self.visit_body(_without(node, node.generators[0].iter), inner)
        else:
            if isinstance(node, ast.Call):
                self.visit_call(node, ctx)
            self.visit_body(ast.iter_child_nodes(node), ctx)

    def visit_function(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
        ctx: _Context,
    ) -> None:
        args = node.args
        defaults = [d for d in args.kw_defaults if d is not None]
        self.visit_body([*args.defaults, *defaults], ctx)
        body: list[ast.stmt] | list[ast.expr]
        decorators: list[ast.expr] = []
        if isinstance(node, ast.Lambda):
            name, body = "<lambda>", [node.body]
        else:
            name, body, decorators = node.name, node.body, node.decorator_list
            self.visit_body(decorators, ctx)
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        params += [a for a in (args.vararg, args.kwarg) if a is not None]
        shadowed: dict[str, str | None] = {a.arg: None for a in params}
        scope = _bindings(body, shadowed)
        function = _Function(
            name,
            method_of=ctx.cls,
            is_singleton=name in self.wrapped
            or any(_last_name(d) in _SINGLETON_DECORATORS for d in decorators),
            is_entry_point=ctx.function.is_module
            and ctx.cls is None
            and name in self.entry_points,
        )
        _exemptions(body, function, _declared_global(body))
        retry = next(
            (d for d in decorators if self.is_retry(d, ctx.scopes)), None
        )
        reason = None
        if retry is not None:
            reason = f"in a function retried by @{_last_name(retry)}"
        inner = _Context((*ctx.scopes, scope), function, reason)
        self.visit_body(body, inner)

    def is_retry(self, decorator: ast.expr, scopes: _Scopes) -> bool:
        target = (
            decorator.func if isinstance(decorator, ast.Call) else decorator
        )
        dotted = _resolve(target, scopes)
        if dotted is None:
            return _last_name(decorator) == "retry"
        return dotted.partition(".")[0] in _RETRY_PACKAGES or (
            dotted.rpartition(".")[2] == "retry"
        )

    def visit_call(self, node: ast.Call, ctx: _Context) -> None:
        function = ctx.function
        dotted = _resolve(node.func, ctx.scopes)
        built = None
        if dotted is not None:
            key = (dotted.partition(".")[0], dotted.rpartition(".")[2])
            built = self.clients.get(key)
        if built is None:
            if ctx.reason is None:
                return
            local = _local_call(node, ctx)
            if local is not None and (dotted is None or "." not in dotted):
                self.calls.append((node, local, ctx.reason))
            elif dotted is not None:
                self.imported_calls.append(
                    ImportedCall(
                        node.lineno, node.col_offset + 1, dotted, ctx.reason
                    )
                )
            return
        # A cached factory builds once per key, even in a loop or except.
        if id(node) in function.closed or function.is_singleton:
            return
        if ctx.reason is not None:
            self.report(
                node,
                "PK002",
                f"{built}() built {ctx.reason}: each pass opens a "
                f"connection pool that is never closed; {_FIX}",
            )
        elif (
            function.is_module
            or function.is_entry_point
            or id(node) in function.kept
        ):
            # An entry point runs once per process: its client is built
            # once, like a module global's.
            return
        else:
            self.report(
                node,
                "PK001",
                f"{built}() built in {function.name}(), which is not a "
                f"singleton factory: each call opens a connection pool; "
                f"{_FIX}",
            )
        if not (function.is_module or function.is_entry_point):
            self.factories[function.method_of or "", function.name] = built


_Scopes = tuple[dict[str, str | None], ...]


def _wrapped_functions(tree: ast.Module) -> Iterator[str]:
    """Yield the names passed to ``process_singleton(...)`` and the like."""
    for node in ast.walk(tree):
        if not isinstance(node, ast.Call):
            continue
        func = node.func
        if isinstance(func, ast.Call):
            func = func.func
        if _last_name(func) in _SINGLETON_DECORATORS:
            yield from (a.id for a in node.args if isinstance(a, ast.Name))


def _entry_points(tree: ast.Module) -> set[str]:
    """Return the functions a module runs once: its entry points.

    ``main``, a function handed to ``asyncio.run()`` (or ``trio.run``,
    ``anyio.run``), and one called under ``if __name__ == "__main__":``.
    """
    names = {"main"}
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and _last_name(node.func) == "run":
            for arg in node.args[:1]:
                name = _last_name(arg)
                if name is not None:
                    names.add(name)
    for node in tree.body:
        if (
            isinstance(node, ast.If)
            and isinstance(node.test, ast.Compare)
            and isinstance(node.test.left, ast.Name)
            and node.test.left.id == "__name__"
        ):
            for inner in _own_nodes(node.body):
                if isinstance(inner, ast.Call):
                    name = _last_name(inner.func)
                    if name is not None:
                        names.add(name)
    return names


def _local_call(node: ast.Call, ctx: _Context) -> tuple[str, str] | None:
    """Return the factory key of ``f()`` or ``self.f()``, if it is one."""
    func = node.func
    if isinstance(func, ast.Name):
        return "", func.id
    if (
        isinstance(func, ast.Attribute)
        and isinstance(func.value, ast.Name)
        and func.value.id in {"self", "cls"}
        and ctx.function.method_of is not None
    ):
        return ctx.function.method_of, func.attr
    return None


def _resolve(node: ast.expr, scopes: _Scopes) -> str | None:
    """Return the dotted name *node* refers to through imports, if any."""
    if isinstance(node, ast.Attribute):
        base = _resolve(node.value, scopes)
        return None if base is None else f"{base}.{node.attr}"
    if isinstance(node, ast.Name):
        for scope in reversed(scopes):
            if node.id in scope:
                return scope[node.id]
    return None


def _last_name(node: ast.expr) -> str | None:
    if isinstance(node, ast.Call):
        node = node.func
    if isinstance(node, ast.Attribute):
        return node.attr
    if isinstance(node, ast.Name):
        return node.id
    return None


def _own_nodes(body: Iterable[ast.AST]) -> Iterator[ast.AST]:
    """Yield the nodes of *body*, not descending into nested scopes."""
    stack = list(body)
    while stack:
        node = stack.pop()
        yield node
        if not isinstance(node, _SCOPES):
            stack.extend(ast.iter_child_nodes(node))


def _without(node: ast.AST, skipped: ast.AST) -> Iterator[ast.AST]:
    """Yield the descendants of *node* but *skipped*, one level down."""
    for child in ast.iter_child_nodes(node):
        if isinstance(child, ast.comprehension):
            yield from (
                n for n in ast.iter_child_nodes(child) if n is not skipped
            )
        else:
            yield child


def _bindings(
    body: Iterable[ast.AST], scope: dict[str, str | None]
) -> dict[str, str | None]:
    """Add the names *body* imports, or aliases by assignment, to *scope*."""
    nodes = sorted(
        (n for n in _own_nodes(body) if isinstance(n, (ast.stmt))),
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
            scope[node.targets[0].id] = _resolve(node.value, (scope,))
    return scope


def _declared_global(body: Iterable[ast.AST]) -> set[str]:
    names: set[str] = set()
    for node in _own_nodes(body):
        if isinstance(node, (ast.Global, ast.Nonlocal)):
            names.update(node.names)
    return names


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


def _exemptions(  # noqa: C901 -- one pass, one branch per kind of node.
    body: Iterable[ast.AST], function: _Function, global_names: set[str]
) -> None:
    """Find the calls whose clients are closed here or kept for reuse.

    Closed: a ``with`` item, an argument of ``closing()`` or
    ``enter_context()``, or assigned to a local name that is later closed
    or used in ``with``. Kept: assigned to a global or to ``self.x``.
    """
    local: dict[int, str] = {}
    closed_names: set[str] = set()
    for node in _own_nodes(body):
        if isinstance(node, (ast.With, ast.AsyncWith)):
            for item in node.items:
                closed_names.update(_names(item.context_expr))
                function.closed.update(map(id, _values(item.context_expr)))
        elif isinstance(node, ast.Call):
            if _last_name(node.func) in _CLOSING_CALLS:
                function.closed.update(map(id, node.args))
            elif _last_name(node.func) in _CLOSE_METHODS:
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
