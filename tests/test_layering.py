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


def _compared_names(path, names: set[str]) -> list[str]:
    """String constants from ``names`` used as an operand of ==, !=, in, not in in ``path``."""
    out = []
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Compare):
            for operand in [node.left, *node.comparators]:
                elts = operand.elts if isinstance(operand, (ast.Tuple, ast.List, ast.Set)) else [operand]
                out += [f"{path.relative_to(REPO)}:{node.lineno} {e.value!r}" for e in elts
                        if isinstance(e, ast.Constant) and e.value in names]
    return out


def test_no_module_compares_a_product_name_or_a_level_role():
    """Products are resolved once, by the declaration loader (pipeline/configuration/census.py), into objects
    that are passed along, and level roles are read from the spine (geo/spine.py: ROOT, STATE, BLOCK): no
    other module compares their names (issue 15, items 1 and 5; issue 29, item 4)."""
    from topdown.geo.spine import BLOCK, ROOT, STATE
    from topdown.pipeline.configuration.census import census_presets, load_census

    definitions = {REPO / "geo" / "spine.py", REPO / "pipeline" / "configuration" / "census.py"}
    names = {p.name for preset in census_presets() for p in load_census(preset).products} | {ROOT, STATE, BLOCK}
    assert {"persons", "units"} <= names
    files = [f for top in ("pipeline", "solvers", "geo", "vocab") for f in sorted((REPO / top).rglob("*.py"))
             if f not in definitions]
    found = [hit for f in files for hit in _compared_names(f, names)]
    assert not found, found
    assert not (REPO / "pipeline" / "products.py").exists()  # the product registry is gone
