"""Which kind of test a test is, read from its code: ``unit``, ``system`` or ``cli`` (conftest.py marks each
collected test with its kind, so ``pytest -m unit`` runs the quick inner loop).

* ``cli``: the test (or a fixture it uses, or a helper of its module it calls) runs the ``topdown`` command in
  a subprocess through ``cli_subprocess.topdown``. A ``cli`` test is a ``system`` test too.
* ``system``: it uses the session's Dask cluster (the ``dask_client`` fixture, or one built on it: ``demo_run``,
  ``planted_run``...), imports ``distributed``, starts a process (``subprocess``), or calls an entry point
  that starts or joins a cluster: ``cli.main``, a pipeline function taking a ``client`` or ``scheduler``
  (``run``, ``evaluate``, ``audit``...), ``submit``, a ``Job`` or a ``Batch``.
* ``unit``: everything else: functions called in process on small inputs.

Every ``system`` test is also marked ``slow`` (outside the default selection; CI runs it) unless it is marked
``smoke`` by hand: the default runs the unit tests and that small sample of system tests.

The reading follows the test's bytecode: the global names and module attributes it loads, the modules it
imports inside the function, and, transitively, the functions of the test folder (and of the repository's
scripts: notebooks/, benchmarks/) it calls. A test marked
``unit``, ``system`` or ``cli`` by hand keeps its marks.
"""
from __future__ import annotations

import dis
import functools
import importlib
import inspect
import types
from pathlib import Path
from typing import Any, Callable, Iterable

REPO = Path(__file__).resolve().parents[1]

KINDS = ("unit", "system", "cli")

#: Modules whose use makes a test a system test (they start processes or a cluster).
SYSTEM_MODULES = ("distributed", "subprocess", "multiprocessing", "concurrent.futures.process", "nbclient",
                  "jupyter_client")

#: Entry points of the package that start (or join) a Dask cluster, by qualified name, beside any package
#: callable that takes a ``client``, ``dclient`` or ``scheduler`` argument.
SYSTEM_ENTRY_POINTS = frozenset({
    "topdown.pipeline.cli.main",
    "topdown.pipeline.jobs.submit", "topdown.pipeline.jobs.submit_reprocess",
    "topdown.pipeline.jobs.submit_uncertainty", "topdown.pipeline.jobs.submit_replicates",
    "topdown.pipeline.jobs.Job", "topdown.pipeline.execution.batch.Batch",
})
CLUSTER_ARGUMENTS = frozenset({"client", "dclient", "scheduler"})

#: The fixture that is the session's Dask cluster; every fixture built on it is in a test's fixture closure.
CLUSTER_FIXTURE = "dask_client"


def _qualname(obj: Any) -> str:
    return f"{getattr(obj, '__module__', '')}.{getattr(obj, '__qualname__', '')}"


@functools.lru_cache(maxsize=None)
def _file_in_repository(filename: str) -> bool:
    """A file of the repository's own code, not of an installed package: a virtual environment made inside the
    clone (``python -m venv .venv``) holds its packages below the repository too."""
    path = Path(filename).resolve()
    return REPO in path.parents and not {"site-packages", "dist-packages"} & set(path.parts)


def _in_repository(func: Any) -> bool:
    """A function of the test folder or of the repository's scripts (notebooks/, benchmarks/), not of the package
    (a class, such as ``types.FunctionType``, has a ``__code__`` descriptor, not code)."""
    code = getattr(func, "__code__", None)
    return (isinstance(code, types.CodeType) and not (getattr(func, "__module__", None) or "").startswith("topdown")
            and _file_in_repository(code.co_filename))


def _is_cli_helper(obj: Any) -> bool:
    return getattr(obj, "__module__", None) == "cli_subprocess" and getattr(obj, "__name__", None) == "topdown"


def _starts_a_cluster(obj: Any) -> bool:
    module = getattr(obj, "__module__", None) or ""
    if isinstance(obj, types.ModuleType):
        module = obj.__name__
    if _system_module(module):
        return True
    if not module.startswith("topdown.") or not callable(obj) or isinstance(obj, types.ModuleType):
        return False
    if _qualname(obj) in SYSTEM_ENTRY_POINTS:
        return True
    try:
        params = inspect.signature(obj).parameters
    except (TypeError, ValueError):
        return False
    return bool(CLUSTER_ARGUMENTS & set(params))


def _codes(code: types.CodeType) -> Iterable[types.CodeType]:
    yield code
    for const in code.co_consts:
        if isinstance(const, types.CodeType):
            yield from _codes(const)


def _system_module(name: str) -> bool:
    return any(name == m or name.startswith(m + ".") for m in SYSTEM_MODULES)


def _import(name: str) -> Any:
    if _system_module(name):  # judged by its name, not imported here
        return types.ModuleType(name)
    try:
        return importlib.import_module(name)
    except Exception:  # a module this interpreter cannot import is judged by its name alone
        return types.ModuleType(name)


def _imported(module: Any, name: str) -> Any:
    """``from module import name``: an attribute, or a submodule not imported yet."""
    found = getattr(module, name, None)
    if found is None and isinstance(module, types.ModuleType) and getattr(module, "__path__", None):
        found = _import(f"{module.__name__}.{name}")
    return found


def _referenced(func: Callable) -> Iterable[Any]:
    """The objects ``func``'s code loads: globals, attributes of loaded modules, imported modules and names,
    and locals bound to any of these."""
    namespace = getattr(func, "__globals__", {})
    bound: dict[str, Any] = {}
    for code in _codes(func.__code__):
        current: Any = None
        importing: Any = None
        for ins in dis.get_instructions(code):
            op = ins.opname
            if op in ("LOAD_GLOBAL", "LOAD_NAME"):
                current = namespace.get(ins.argval, getattr(namespace.get("__builtins__"), ins.argval, None))
            elif op in ("LOAD_FAST", "LOAD_DEREF", "LOAD_CLOSURE"):
                current = bound.get(ins.argval)
            elif op == "IMPORT_NAME":
                importing = current = _import(ins.argval)
            elif op == "IMPORT_FROM":  # ``import a.b as c`` walks a, b on the leaf module: keep it then
                current = _imported(importing, ins.argval) or importing
            elif op in ("LOAD_ATTR", "LOAD_METHOD") and isinstance(current, types.ModuleType):
                current = getattr(current, ins.argval, None)
            elif op in ("STORE_FAST", "STORE_NAME", "STORE_DEREF", "STORE_GLOBAL") and current is not None:
                bound[ins.argval] = current
                current = None
                continue
            else:
                current = None
                continue
            if current is not None:
                yield current


def _unwrap(func: Any) -> Any:
    inner = getattr(getattr(func, "hypothesis", None), "inner_test", None)  # a @given test
    func = inner or func
    try:
        return inspect.unwrap(func)
    except ValueError:
        return func


_RANK = {kind: rank for rank, kind in enumerate(KINDS)}


def _kind_of_function(func: Callable, cache: dict, active: set) -> str:
    """The kind of one function: of what it loads, and of the test folder's functions it calls (memoised)."""
    code = getattr(func, "__code__", None)
    if code is None or code in active:
        return "unit"
    if code in cache:
        return cache[code]
    active.add(code)
    found = "unit"
    for obj in _referenced(func):
        if _is_cli_helper(obj):
            here = "cli"
        elif _starts_a_cluster(obj):
            here = "system"
        elif _in_repository(obj):
            here = _kind_of_function(_unwrap(obj), cache, active)
        else:
            continue
        found = max(found, here, key=_RANK.__getitem__)
        if found == "cli":
            break
    active.discard(code)
    cache[code] = found
    return found


def kind_of_code(funcs: Iterable[Callable], cache: dict | None = None) -> str:
    """The kind (``unit``, ``system`` or ``cli``) of code made of ``funcs`` (a test and its fixtures)."""
    cache = {} if cache is None else cache
    return max((_kind_of_function(_unwrap(f), cache, set()) for f in funcs), key=_RANK.__getitem__, default="unit")


def kind_of_item(item, cache: dict | None = None) -> str:
    """The kind of one collected pytest test: its own marks if it has one, else read from its code and from
    the code of the fixtures it uses (those of the test folder)."""
    for kind in reversed(KINDS):
        if item.get_closest_marker(kind):
            return kind
    names = getattr(item, "fixturenames", ())
    defs = getattr(getattr(item, "_fixtureinfo", None), "name2fixturedefs", {})
    fixtures = [d.func for name in names for d in defs.get(name, ()) if _in_repository(d.func)]
    found = kind_of_code([f for f in (getattr(item, "function", None), *fixtures) if f is not None], cache)
    return "system" if found == "unit" and CLUSTER_FIXTURE in names else found


def mark_items(items: list) -> None:
    """Mark each test with its kind (a ``cli`` test is ``system`` too), and every ``system`` test ``slow``
    unless it is marked ``smoke`` (the few the default selection keeps: the demo run against its pins, the
    in-process refusals). The default selection, ``-m "not slow"``, is then the unit tests and the smoke tests;
    ``-m slow`` is the rest of the suite (CI runs both)."""
    import pytest

    cache: dict = {}
    for item in items:
        kind = kind_of_item(item, cache)
        item.add_marker(kind)
        if kind == "cli":
            item.add_marker("system")
        if kind != "unit" and not item.get_closest_marker("smoke") and not item.get_closest_marker("slow"):
            item.add_marker(pytest.mark.slow)
