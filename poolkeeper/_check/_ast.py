"""Find pool-owning clients built per call, per loop or per retry, by AST.

Nothing is imported from the code under check: names are resolved through
the module's own ``import`` statements, scope by scope. Here is the walk
over a module, carrying why a call repeats (a loop, a comprehension, an
except block, a retry); name resolution is in :mod:`._scope`, what a
function says about its builds in :mod:`._function`, and what is
reported in :mod:`._findings`.
"""

from __future__ import annotations

import ast
import dataclasses
from typing import TYPE_CHECKING, Final

from poolkeeper._check._findings import (
    FIX,
    Finding,
    ImportedCall,
    ModuleReport,
)
from poolkeeper._check._function import (
    FIXTURE_DECORATORS,
    SINGLETON_DECORATORS,
    Function,
    entry_points,
    exemptions,
    is_retry,
    wrapped_functions,
)
from poolkeeper._check._scope import (
    FUNCTIONS,
    bindings,
    declared_global,
    last_name,
    resolve,
    without,
)

if TYPE_CHECKING:
    from collections.abc import Iterable

__all__ = ["analyze_module"]

_COMPREHENSIONS: Final = (ast.ListComp, ast.SetComp, ast.DictComp)
_IN_LOOP: Final = "inside a loop"
_IN_COMPREHENSION: Final = "inside a comprehension"
_IN_EXCEPT: Final = "inside an except block"


@dataclasses.dataclass(frozen=True)
class _Context:
    scopes: tuple[dict[str, str | None], ...]
    function: Function
    reason: str | None = None
    cls: str | None = None


# A node to visit, and the context it is visited in.
_Visit = tuple[ast.AST, _Context]


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
        self.wrapped.update(wrapped_functions(tree))
        self.entry_points = entry_points(tree)
        module = Function("<module>", is_module=True)
        scope = bindings(tree.body, {})
        exemptions(tree.body, module, set())
        self.visit_body(tree.body, _Context((scope,), module))
        for call, key, reason in self.calls:
            built = self.factories.get(key)
            if built is not None:
                self.report(
                    call,
                    "PK002",
                    f"{key[1]}() builds a {built} on every call and is "
                    f"called {reason}: each call opens a connection pool "
                    f"that is never closed; {FIX}",
                )
        return self.findings

    def report(self, node: ast.expr, code: str, message: str) -> None:
        finding = Finding(node.lineno, node.col_offset + 1, code, message)
        self.findings.append(finding)

    def visit_body(self, body: Iterable[ast.AST], ctx: _Context) -> None:
        # Depth first in source order, on a stack of its own rather than
        # Python's: generated code nests expressions thousands deep (a
        # chain of `+`, say), past the interpreter's recursion limit.
        stack = [(node, ctx) for node in reversed(list(body))]
        while stack:
            node, where = stack.pop()
            stack.extend(reversed(self.visit(node, where)))

    def visit(self, node: ast.AST, ctx: _Context) -> list[_Visit]:
        """Note what *node* builds; return its children, in order."""
        if isinstance(node, FUNCTIONS):
            return self.visit_function(node, ctx)
        if isinstance(node, ast.ClassDef):
            inner = dataclasses.replace(ctx, cls=node.name)
            return [
                *_each(node.decorator_list, ctx),
                *_each(node.bases, ctx),
                *_each(node.body, inner),
            ]
        if isinstance(node, (ast.For, ast.AsyncFor, ast.While)):
            head = node.test if isinstance(node, ast.While) else node.iter
            loop = dataclasses.replace(ctx, reason=_IN_LOOP)
            return [
                (head, ctx),
                *_each(node.body, loop),
                *_each(node.orelse, ctx),
            ]
        if isinstance(node, ast.ExceptHandler):
            inner = dataclasses.replace(ctx, reason=_IN_EXCEPT)
            return _each(node.body, inner)
        if isinstance(node, (*_COMPREHENSIONS, ast.GeneratorExp)):
            first = node.generators[0].iter
            inner = dataclasses.replace(ctx, reason=_IN_COMPREHENSION)
            return [(first, ctx), *_each(without(node, first), inner)]
        if isinstance(node, ast.Call):
            self.visit_call(node, ctx)
        return _each(ast.iter_child_nodes(node), ctx)

    def visit_function(
        self,
        node: ast.FunctionDef | ast.AsyncFunctionDef | ast.Lambda,
        ctx: _Context,
    ) -> list[_Visit]:
        args = node.args
        defaults = [d for d in args.kw_defaults if d is not None]
        outer = _each([*args.defaults, *defaults], ctx)
        body: list[ast.stmt] | list[ast.expr]
        decorators: list[ast.expr] = []
        if isinstance(node, ast.Lambda):
            name, body = "<lambda>", [node.body]
        else:
            name, body, decorators = node.name, node.body, node.decorator_list
            outer += _each(decorators, ctx)
        params = [*args.posonlyargs, *args.args, *args.kwonlyargs]
        params += [a for a in (args.vararg, args.kwarg) if a is not None]
        shadowed: dict[str, str | None] = {a.arg: None for a in params}
        scope = bindings(body, shadowed)
        function = Function(
            name,
            method_of=ctx.cls,
            is_singleton=name in self.wrapped
            or any(last_name(d) in SINGLETON_DECORATORS for d in decorators),
            # A test fixture is run by its framework, once per test or
            # scope, like an entry point once per process.
            is_entry_point=(
                ctx.function.is_module
                and ctx.cls is None
                and name in self.entry_points
            )
            or any(last_name(d) in FIXTURE_DECORATORS for d in decorators),
        )
        exemptions(body, function, declared_global(body))
        retry = next((d for d in decorators if is_retry(d, ctx.scopes)), None)
        reason = None
        if retry is not None:
            reason = f"in a function retried by @{last_name(retry)}"
        inner = _Context((*ctx.scopes, scope), function, reason)
        return [*outer, *_each(body, inner)]

    def visit_call(self, node: ast.Call, ctx: _Context) -> None:
        function = ctx.function
        dotted = resolve(node.func, ctx.scopes)
        built = None
        if dotted is not None:
            key = (dotted.partition(".")[0], dotted.rpartition(".")[2])
            built = self.clients.get(key)
        if built is None:
            if ctx.reason is None:
                return
            local = ctx.function.local_key(node)
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
                f"connection pool that is never closed; {FIX}",
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
                f"{FIX}",
            )
        if not (function.is_module or function.is_entry_point):
            self.factories[function.method_of or "", function.name] = built


def _each(nodes: Iterable[ast.AST], ctx: _Context) -> list[_Visit]:
    return [(node, ctx) for node in nodes]
