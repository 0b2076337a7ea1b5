"""Sphinx configuration for the poolkeeper documentation.

Build it strictly, from the repository root::

    .venv/bin/sphinx-build -W --keep-going -n -b html docs docs/_build/html

The packages are documented as installed in the virtualenv (``make venv``
installs both ``poolkeeper`` and ``poolkeeper-daytona``), so autodoc shows
what a wheel ships.
"""

from __future__ import annotations

import re
from typing import Any

import poolkeeper

project = "poolkeeper"
author = "poolkeeper developers"
copyright = "2026, poolkeeper developers"
release = poolkeeper.__version__
version = ".".join(release.split(".")[:2])

extensions = [
    "myst_parser",
    "sphinx.ext.autodoc",
    "sphinx.ext.napoleon",
]

source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
root_doc = "index"

# -- MyST ---------------------------------------------------------------------

myst_enable_extensions = ["colon_fence", "deflist"]
myst_heading_anchors = 3

# -- autodoc and napoleon -----------------------------------------------------

autodoc_member_order = "bysource"
autodoc_typehints = "signature"
autodoc_preserve_defaults = True
autodoc_default_options = {"exclude-members": "__weakref__"}

napoleon_google_docstring = True
napoleon_numpy_docstring = False
napoleon_include_init_with_doc = False
napoleon_attr_annotations = True

# -- nitpicky references ------------------------------------------------------

# No intersphinx: the build must not fetch anything, so references to
# objects documented elsewhere have no target here. Each one that appears
# is ignored explicitly below, with the reason; anything else still fails
# the build.
nitpick_ignore = [
    # Standard library, documented at docs.python.org (not linkable
    # offline): named in docstrings and in signatures.
    ("py:func", "inspect.signature"),
    ("py:mod", "atexit"),
    ("py:class", "collections.abc.Callable"),
    ("py:class", "contextlib.AbstractContextManager"),
    ("py:class", "contextlib.AbstractAsyncContextManager"),
    ("py:class", "os.PathLike"),
    ("py:class", "pathlib.Path"),
    ("py:class", "socket.socket"),
    ("py:class", "AbstractContextManager"),
    ("py:class", "contextlib.AbstractContextManager"),
    ("py:func", "os.dup2"),
    # The Daytona SDK's classes, documented by Daytona, not here.
    ("py:class", "daytona.Daytona"),
    ("py:class", "daytona.DaytonaConfig"),
    ("py:class", "daytona.AsyncDaytona"),
    ("py:class", "daytona._async.daytona.AsyncDaytona"),
    # The type variable of the generic API ("the factory's return type"),
    # as autodoc renders it from the private modules that define it; it has
    # no page of its own.
    ("py:class", "T"),
    ("py:class", "poolkeeper._decorator.T"),
    ("py:class", "poolkeeper._sync.T"),
    ("py:class", "poolkeeper._async.T"),
    ("py:class", "poolkeeper._identity.T"),
    ("py:class", "poolkeeper._registry.T"),
    # The private classes typing what process_singleton(...) returns when
    # called with options (a decorator); they are not public API, and the
    # hooked one exists only for type checkers.
    ("py:class", "poolkeeper._decorator._Decorator"),
    ("py:class", "_Decorator"),
    ("py:class", "_HookedDecorator"),
    ("py:class", "KeyOption"),
    # What retire_on= takes (issue 21): exception types or a predicate.
    ("py:class", "RetireOn"),
]

# -- HTML ---------------------------------------------------------------------

html_theme = "furo"
html_title = f"poolkeeper {release}"
html_static_path = ["_static"]

# -- signatures as callers see them ------------------------------------------

# lease() and override() are @contextmanager generators: callers get a
# context manager, which is what the reference should say. Matches
# Generator[T], Generator[T, None, None] and AsyncGenerator[T, None].
_GENERATOR = re.compile(r"^(?:~?[\w.]*\.)?(Async)?Generator\[([^,\]]+)")


def _context_manager(annotation: str | None) -> str | None:
    match = _GENERATOR.match(annotation or "")
    if match is None:
        return annotation
    kind = (
        "AbstractAsyncContextManager" if match[1] else "AbstractContextManager"
    )
    return f"~contextlib.{kind}[{match[2]}]"


# process_singleton's implementation signature has **unknown (to reject a
# misspelt option with a suggestion) and returns a private Protocol; its
# callers see the overloads, summed up here.
_SINGLETON = "ProcessSingleton[T] | AsyncProcessSingleton[T]"
_PROCESS_SINGLETON_RETURNS = (
    f"{_SINGLETON} | "
    f"~collections.abc.Callable[[~collections.abc.Callable[[], T]], "
    f"{_SINGLETON}]"
)


# Sphinx's event signature: seven positional arguments.
def _public_signature(
    _app: object,
    _what: str,
    name: str,
    _obj: object,
    _options: object,
    signature: str | None,
    return_annotation: str | None,
) -> tuple[str | None, str | None]:
    if name.rpartition(".")[2] in {"lease", "override"}:
        return signature, _context_manager(return_annotation)
    if name == "poolkeeper.process_singleton" and signature is not None:
        signature = signature.replace(", **unknown: object", "")
        signature = signature.replace(
            "Callable[[], ~typing.Any] | None", "Callable[[], T] | None"
        )
        return signature, _PROCESS_SINGLETON_RETURNS
    return signature, return_annotation


def setup(app: Any) -> None:  # noqa: ANN401 -- sphinx.application.Sphinx.
    """Register the signature fix-ups."""
    app.connect("autodoc-process-signature", _public_signature)
