"""Sphinx configuration of the documentation site: ``sphinx-build -E -W -q -b html docs site`` (warnings are errors;
.ci/run builds it). Pages are Markdown (MyST); a page's ``<!-- generate: NAME -->`` markers are replaced by
reference text generated from the code at every build (``docs/generate.py``).
"""
from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from generate import generate  # noqa: E402  (docs/generate.py)

project = "census-topdown"
author = "census-topdown contributors"
extensions = ["myst_parser"]
source_suffix = {".md": "markdown"}
exclude_patterns = ["_build"]
myst_enable_extensions = ["colon_fence"]
myst_heading_anchors = 3
# The included results files and design notes number their headings as they read best on their own.
suppress_warnings = ["myst.header"]
html_theme = "furo"
html_title = "census-topdown"
html_show_sourcelink = False


def _generate(app, docname: str, source: list[str]) -> None:
    source[0] = generate(source[0])


def setup(app):
    app.connect("source-read", _generate)
