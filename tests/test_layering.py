"""Package layering (issue 15, item 4): the solvers and the shared vocabulary import nothing from the pipeline.

Checked on the source with ``ast`` (every import statement, also those inside functions), so a lazy import
cannot hide a dependency.
"""
from __future__ import annotations

import ast

import pytest
from conftest import REPO


def _imported_modules(path) -> set[str]:
    """Absolute names of the modules a file imports (relative imports resolved against its package)."""
    package = "topdown." + ".".join(path.relative_to(REPO).parent.parts)
    out = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = package.split(".")[: len(package.split(".")) - max(node.level - 1, 0)] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.add(mod)
            out |= {f"{mod}.{a.name}" for a in node.names}
    return out


@pytest.mark.parametrize("folder, forbidden", [("solvers", ("topdown.pipeline",)),
                                               ("vocab", ("topdown.pipeline", "topdown.solvers"))])
def test_lower_layers_import_nothing_from_upper_ones(folder, forbidden):
    files = sorted((REPO / folder).rglob("*.py"))
    assert files
    bad = {f"{f.relative_to(REPO)}: {m}" for f in files for m in _imported_modules(f)
           if any(m == p or m.startswith(p + ".") for p in forbidden)}
    assert not bad, f"{folder}/ imports from {forbidden}: {sorted(bad)}"


def test_the_checker_sees_relative_and_lazy_imports():
    """The scan resolves relative imports and sees imports inside functions (so the test above can fail)."""
    assert "topdown.solvers.failsafe" in _imported_modules(REPO / "solvers" / "solve.py")  # from .failsafe import
    assert "topdown.solvers.failsafe" in _imported_modules(REPO / "pipeline" / "cli.py")  # inside cmd_run
