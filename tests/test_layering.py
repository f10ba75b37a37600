"""Package layering and import cycles, as DESIGN.md's map states them.

Checked on the source with ``ast`` (every import statement, also those inside functions and under
``TYPE_CHECKING``), so a lazy import cannot hide a dependency.
"""
from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest
from conftest import REPO


def _import_statements(rel: str, source: str) -> list[tuple[int, set[str]]]:
    """Per import statement of a file (``rel``: its path in the repository), its line and the absolute names
    of the modules it imports (relative imports resolved against the file's package; a ``from`` import also
    names ``module.name`` for each name, which is a module when the name is a submodule)."""
    package = ["topdown", *Path(rel).parent.parts]
    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            out.append((node.lineno, {a.name for a in node.names}))
        elif isinstance(node, ast.ImportFrom):
            base = package[: len(package) - max(node.level - 1, 0)] if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            out.append((node.lineno, {mod} | {f"{mod}.{a.name}" for a in node.names}))
    return out


def _imported_modules(path) -> set[str]:
    """Absolute names of the modules a file imports (relative imports resolved against its package)."""
    return {m for _, mods in _import_statements(str(path.relative_to(REPO)), path.read_text()) for m in mods}


#: DESIGN.md, "Layering": the top-level packages each one may import (besides the standard library and
#: third-party packages). ``pipeline`` may import every one of them.
LAYERS = {"vocab": {"vocab"}, "geo": {"geo", "vocab"}, "solvers": {"solvers", "vocab"}, "conf": {"conf"},
          "pipeline": {"pipeline", "geo", "solvers", "vocab", "conf"}}

#: DESIGN.md, "Layering": ``pipeline``'s folders, bottom first. A module may import its own folder and the
#: folders before it; ``pipeline``'s top-level modules (cli.py, jobs.py, __init__.py) sit above them all.
FOLDERS = ("configuration", "runtime", "privacy", "inputs", "outputs", "execution", "evaluation")


def _module_files() -> dict[str, object]:
    """``topdown.*`` module name -> its file, for every module of the package's folders."""
    out = {}
    for top in LAYERS:
        for f in sorted((REPO / top).rglob("*.py")):
            parts = f.relative_to(REPO).with_suffix("").parts
            out[".".join(("topdown",) + (parts[:-1] if parts[-1] == "__init__" else parts))] = f
    return out


def _import_graph() -> dict[str, set[str]]:
    """Module -> the ``topdown`` modules it imports (a ``from package import name`` of a submodule counts as
    importing the submodule; importing a package's ``__init__`` implicitly is not an edge)."""
    files = _module_files()
    return {m: {x for x in _imported_modules(f) if x in files and x != m} for m, f in files.items()}


def _cycles(graph: dict[str, set[str]]) -> list[list[str]]:
    """Strongly connected components of more than one module (Tarjan, iterative), each sorted."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on_stack: set[str] = set()
    found = []
    for root in sorted(graph):
        if root in index:
            continue
        work = [(root, iter(sorted(graph[root])))]
        index[root] = low[root] = len(index)
        stack.append(root)
        on_stack.add(root)
        while work:
            v, edges = work[-1]
            w = next(edges, None)
            if w is not None:
                if w not in index:
                    index[w] = low[w] = len(index)
                    stack.append(w)
                    on_stack.add(w)
                    work.append((w, iter(sorted(graph.get(w, ())))))
                elif w in on_stack:
                    low[v] = min(low[v], index[w])
                continue
            work.pop()
            if work:
                low[work[-1][0]] = min(low[work[-1][0]], low[v])
            if low[v] == index[v]:
                component = []
                while True:
                    w = stack.pop()
                    on_stack.discard(w)
                    component.append(w)
                    if w == v:
                        break
                if len(component) > 1:
                    found.append(sorted(component))
    return found


def _loop(graph: dict[str, set[str]], members: list[str]) -> str:
    """One closed import path through a cycle's first member, for the failure message."""
    start, inside = members[0], set(members)
    paths = {start: [start]}
    todo = [start]
    while todo:
        v = todo.pop(0)
        for w in sorted(graph[v] & inside):
            if w == start:
                return " -> ".join(paths[v] + [start])
            if w not in paths:
                paths[w] = paths[v] + [w]
                todo.append(w)
    return ", ".join(members)


def test_packages_import_only_the_layers_below():
    graph = _import_graph()
    assert len(graph) > 50
    bad = sorted(f"{m} imports {x}" for m, imported in graph.items() for x in imported
                 if x.split(".")[1] not in LAYERS[m.split(".")[1]])
    assert not bad, bad


def _rank(module: str) -> int:
    """A ``topdown.pipeline`` module's layer: its folder's place in :data:`FOLDERS`, or above them all for the
    package itself and its top-level modules."""
    parts = module.split(".")
    return FOLDERS.index(parts[2]) if len(parts) > 2 and parts[2] in FOLDERS else len(FOLDERS)


def _upward_imports(rel: str, source: str) -> list[str]:
    """The import statements of a module of a ``pipeline`` folder that name a module of a folder above it (or
    of the package's top), as ``file:line imports module`` (the module, not each name imported from it)."""
    own = _rank("topdown." + ".".join(Path(rel).with_suffix("").parts))
    out = []
    for line, mods in _import_statements(rel, source):
        above = {m for m in mods if m.split(".")[:2] == ["topdown", "pipeline"] and _rank(m) > own}
        above = above - {"topdown.pipeline"} or above  # ``from .. import jobs``: name the module, jobs
        out += [f"{rel}:{line} imports {m}" for m in sorted(above) if not any(m.startswith(f"{n}.") for n in above)]
    return out


def test_every_pipeline_folder_has_its_layer():
    folders = {f.parent.name for f in (REPO / "pipeline").glob("*/*.py") if f.name != "__init__.py"}
    assert folders == set(FOLDERS), sorted(folders ^ set(FOLDERS))


def test_pipeline_folders_import_only_the_folders_below():
    """Every import statement of every module in a ``pipeline`` folder (inside functions and under
    ``TYPE_CHECKING`` too) names only its own folder or folders before it in :data:`FOLDERS`."""
    files = [f for folder in FOLDERS for f in sorted((REPO / "pipeline" / folder).rglob("*.py"))]
    assert len(files) > 50
    bad = [hit for f in files for hit in _upward_imports(str(f.relative_to(REPO)), f.read_text())]
    assert not bad, "imports of a folder above:\n" + "\n".join(bad)


def test_the_folder_check_sees_upward_imports():
    source = ("from ..configuration.config import Config\nfrom .budget import Rho\n"
              "def f():\n    from ..execution.engine import make_chunks\n    from .. import jobs\n")
    assert _upward_imports("pipeline/privacy/x.py", source) == [
        "pipeline/privacy/x.py:4 imports topdown.pipeline.execution.engine",
        "pipeline/privacy/x.py:5 imports topdown.pipeline.jobs"]
    assert _upward_imports("pipeline/evaluation/x.py", source) == ["pipeline/evaluation/x.py:5 imports topdown.pipeline.jobs"]
    assert _upward_imports("pipeline/inputs/x.py", "from topdown.pipeline import run\n") == [
        "pipeline/inputs/x.py:1 imports topdown.pipeline.run"]
    assert _upward_imports("pipeline/configuration/x.py", "import topdown.pipeline.runtime.rundir\n") == [
        "pipeline/configuration/x.py:1 imports topdown.pipeline.runtime.rundir"]


def test_design_states_the_folder_order():
    assert " < ".join(f"`{f}`" for f in FOLDERS) in " ".join((REPO / "DESIGN.md").read_text().split())


def test_nothing_imports_the_command_line():
    graph = _import_graph()
    assert "topdown.pipeline.cli" in graph
    assert not sorted(m for m, imported in graph.items() if "topdown.pipeline.cli" in imported)


def test_no_import_cycles():
    graph = _import_graph()
    cycles = _cycles(graph)
    assert not cycles, "import cycles:\n" + "\n".join(f"{len(c)} modules: {_loop(graph, c)}" for c in cycles)


def test_the_cycle_finder_finds_cycles():
    graph = {"a": {"b"}, "b": {"c"}, "c": {"a", "d"}, "d": set(), "e": {"e2"}, "e2": {"e"}, "f": {"a"}}
    assert sorted(_cycles(graph)) == [["a", "b", "c"], ["e", "e2"]]
    assert _loop(graph, ["a", "b", "c"]) == "a -> b -> c -> a"
    assert _cycles({"x": {"y"}, "y": set()}) == []


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
    other module compares their names."""
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


def test_every_package_folder_is_in_the_wheel():
    """``pip install .`` (the README's first command) installs the packages pyproject.toml lists: a folder of
    modules left out of the list works in an editable install and fails in a built one."""
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text())["tool"]["setuptools"]
    roots = {package: REPO / folder for package, folder in setuptools["package-dir"].items()}
    listed = set(setuptools["packages"])
    folders = set()
    for package, root in roots.items():
        for init in root.rglob("__init__.py"):
            folders.add(".".join((package, *init.parent.relative_to(root).parts)))
    assert folders <= listed, sorted(folders - listed)


#: The modules that may name the P.L. 94-171 products' attributes, constants and Census file layouts: the
#: loader of the Bureau's files and the U.S. spine, each for its reason. Every other module reads a census from
#: its declaration (``Product`` objects passed along).
US_SPINE = {
    "geo/spine.py": "the U.S. hierarchy: its level names and GEOID prefix widths",
    "pipeline/configuration/census.py": "the declaration loader: the default census (conf/census/pl94.toml) and "
                                        "the names of the Census MDF layouts a product may declare",
    "pipeline/inputs/ingest.py": "the loader: the Bureau's P.L. 94-171 summary files and block CSVs into input "
                                 "records (and the writer of those records)",
    "pipeline/inputs/us_synth.py": "synthetic U.S. input of the P.L. 94-171 shape (`topdown synth` without --census)",
    "pipeline/inputs/synth_households.py": "synthetic input of the 2020 DHC layout (households of U.S. persons)",
    "pipeline/outputs/us_mdf.py": "the Census MDF layouts pl94_persons and pl94_units",
}
#: Modules outside :data:`US_SPINE` that still name some of them, with the names: this list only shrinks (it is
#: empty: the fast person reader's checks are read from the declaration too).
US_NAMES_LEFT: dict[str, set[str]] = {}

#: Spellings of P.L. 94-171 things in identifiers: the Census MDF's columns, the loader's race tables.
_US_SPELLING = re.compile(r"CENRACE|CENHISP|HISPANIC|VOTING_?AGE|TABBLK|GQTYPE|PL94")
#: A string constant that is a name or a query (``a * b``), not prose (help, messages and descriptions may cite
#: the Bureau's products).
_NAME_LIKE = re.compile(r"\w+(\s*[*.]\s*\w+)*")


def _us_names() -> set[str]:
    """The P.L. 94-171 declaration's attribute names and MDF layouts, and the loader's default-census objects."""
    from topdown.pipeline.configuration.census import GENERIC_MDF, load_census

    pl94 = load_census("pl94")
    return ({a.name for p in pl94.products for a in p.attributes} | {p.mdf for p in pl94.products} - {GENERIC_MDF}
            | {"PL94", "PERSONS", "UNITS", "PERSONS_PRODUCT", "N_UNIT_TYPES"})


def _named(path, names: set[str]) -> list[tuple[int, str]]:
    """(line, name) for every identifier of ``path`` (names, attributes, imports, definitions, arguments,
    keywords) and every name-like string constant but docstrings that is in ``names`` or has a U.S. spelling."""
    tree = ast.parse(path.read_text())
    docs = {id(n.body[0].value) for n in ast.walk(tree)
            if isinstance(n, (ast.Module, ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)) and n.body
            and isinstance(n.body[0], ast.Expr) and isinstance(n.body[0].value, ast.Constant)}
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Name):
            words = [node.id]
        elif isinstance(node, ast.Attribute):
            words = [node.attr]
        elif isinstance(node, ast.alias):
            words = [node.name.rsplit(".", 1)[-1], node.asname or ""]
        elif isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
            words = [node.name]
        elif isinstance(node, ast.arg):
            words = [node.arg]
        elif isinstance(node, ast.keyword):
            words = [node.arg or ""]
        elif (isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in docs
              and _NAME_LIKE.fullmatch(node.value.strip())):
            words = re.findall(r"\w+", node.value)
        else:
            continue
        out += [(getattr(node, "lineno", 0), w) for w in words if w in names or _US_SPELLING.search(w)]
    return out


def test_only_the_loader_and_the_us_spine_name_pl94_things():
    """No module outside :data:`US_SPINE` names a P.L. 94-171 attribute, MDF layout or constant in its code
    (beyond what :data:`US_NAMES_LEFT` still allows it)."""
    names = _us_names()
    assert {"hhgq", "votingage", "hispanic", "cenrace", "pl94_persons", "PERSONS"} <= names
    for rel in [*US_SPINE, *US_NAMES_LEFT]:
        assert (REPO / rel).exists(), rel
    found = []
    for top in ("pipeline", "solvers", "geo", "vocab"):
        for f in sorted((REPO / top).rglob("*.py")):
            rel = f.relative_to(REPO).as_posix()
            if rel not in US_SPINE:
                left = US_NAMES_LEFT.get(rel, set())
                found += [f"{rel}:{line} {word}" for line, word in _named(f, names) if word not in left]
    assert not found, "P.L. 94-171 names outside the loader and the U.S. spine:\n" + "\n".join(found)
    used = {rel: {w for _, w in _named(REPO / rel, names)} for rel in US_NAMES_LEFT}
    assert all(US_NAMES_LEFT[rel] <= used[rel] for rel in used), f"names no longer used: shrink US_NAMES_LEFT {used}"


def test_the_us_name_scan_sees_code_not_prose(tmp_path):
    src = tmp_path / "x.py"
    src.write_text('"""hhgq in a docstring."""\nfrom m import PERSONS as P\nx = d["votingage"]\n'
                   'q = "hispanic * cenrace"\nmsg = "a person under 18 (votingage 0), see pl94_persons."\ndef f(cenrace): return TABBLKST\n')
    assert sorted(_named(src, _us_names())) == [(2, "PERSONS"), (3, "votingage"), (4, "cenrace"), (4, "hispanic"),
                                                 (6, "TABBLKST"), (6, "cenrace")]


#: The packages whose signatures carry products.
_CODE = ("pipeline", "geo", "solvers", "vocab")


def _str_products(rel: str, source: str) -> list[str]:
    """Every function parameter and class field (a dataclass's) named ``product`` and annotated ``str`` (or
    ``str | None``), as ``file:line``: a product is passed as its :class:`Product` (a name, at the edges, is
    ``product_name``)."""
    def is_str(annotation) -> bool:
        text = ast.unparse(annotation).strip("'\"") if annotation is not None else ""
        return text.replace(" ", "") in {"str", "str|None", "None|str", "Optional[str]"}

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            a = node.args
            out += [f"{rel}:{arg.lineno}" for arg in [*a.posonlyargs, *a.args, *a.kwonlyargs, a.vararg, a.kwarg]
                    if arg is not None and arg.arg == "product" and is_str(arg.annotation)]
        elif isinstance(node, ast.ClassDef):
            out += [f"{rel}:{f.lineno}" for f in node.body if isinstance(f, ast.AnnAssign)
                    and isinstance(f.target, ast.Name) and f.target.id == "product" and is_str(f.annotation)]
    return out


def test_a_product_is_passed_as_a_product():
    """No parameter or field named ``product`` is a string anywhere in the code (names only at the edges: a path
    of the run directory, a label, a noise stream key, each ``product_name``)."""
    files = [f for top in _CODE for f in sorted((REPO / top).rglob("*.py"))]
    found = [hit for f in files for hit in _str_products(f.relative_to(REPO).as_posix(), f.read_text())]
    assert not found, "product annotated str (pass the Product):\n" + "\n".join(found)


def test_the_product_check_sees_parameters_and_fields():
    source = ("def f(a, product: str, b: int): ...\ndef g(*, product: 'str | None' = None): ...\n"
              "def h(product: Product, product_name: str): ...\nclass C:\n    product: str\n    other: str\n"
              "class D:\n    product: Product\n")
    assert _str_products("x.py", source) == ["x.py:1", "x.py:2", "x.py:5"]
