"""Sphinx configuration for the poolkeeper documentation.

Build it strictly, from the repository root::

    .venv/bin/sphinx-build -W --keep-going -n -b html docs docs/_build/html

The packages are documented as installed in the virtualenv (``make venv``
installs both ``poolkeeper`` and ``poolkeeper-daytona``), so autodoc shows
what a wheel ships.
"""

from __future__ import annotations

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
    ("py:class", "os.PathLike"),
    ("py:class", "socket.socket"),
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
    ("py:class", "poolkeeper._singleton.T"),
    ("py:class", "poolkeeper._async.T"),
    # The private classes typing what process_singleton(...) returns when
    # called with options (a decorator); they are not public API, and the
    # hooked one exists only for type checkers.
    ("py:class", "poolkeeper._decorator._Decorator"),
    ("py:class", "_Decorator"),
    ("py:class", "_HookedDecorator"),
    ("py:class", "KeyOption"),
]

# -- HTML ---------------------------------------------------------------------

html_theme = "furo"
html_title = f"poolkeeper {release}"
html_static_path = ["_static"]
