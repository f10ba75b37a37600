"""The Pyomo path (``compiler = "pyomo"``) beside the direct path, parent by parent: CPU, where the Pyomo
path's time goes, and how far its estimates are from the direct path's.

``capture CONFIG --input DIR --out DIR [--paths N]``: runs CONFIG in this process (one Dask thread) and pickles
every parent problem it solves to ``DIR/problems.pkl`` with each problem's level (``--paths N``: only the parents
on the paths of a sample of leaves, :func:`capture_paths`). The problems hold noisy
measurements and the true parent histograms of the level above (confidential input): keep DIR private;
nothing of them is printed.

``compare DIR [--solver highs] [--qp-solver NAME] [--every N] [--levels L,..] [--without X,..] [--no-check]
[--shard K/N]``:
solves each captured problem (every N-th
Block-level one with ``--every``) on both paths in this process and prints one JSON object per level and
one for the whole: parents and children solved, CPU seconds of each path and per child (per block at the
Block level), the Pyomo path's CPU by where it goes (``parent_model``: the parent's Pyomo model built and
compiled; ``pass_models``: each pass's model built; ``transfer``: Pyomo handing the model to the solver and
loading the solution back; ``solver``: HiGHS's own run; ``read``: values read back), and the comparisons
(:func:`compare_parent`): the largest difference of the L2 estimates in persons, the largest relative
difference of an L2 pass's objective, and, with both paths' rounders given the direct path's L2 estimate,
how many parents round identically, how many differently at the same objective (an optimum that is not
unique), and how many at a different objective (must be 0). Only solves at the exact failsafe level are
compared pass by pass. ``--without pause_gc,bulk_columns,reuse`` switches off the Pyomo path's speed-ups
(:func:`switch_off`) to measure each. ``--shard K/N`` takes every N-th parent from the K-th, for N processes
side by side; ``--parents I,J`` takes only those indices of problems.pkl; ``--option KEY=VALUE`` (repeated) gives
every Pyomo solve a solver option (the configuration's ``solver_options``); ``--direct-tol TOL`` makes the
pass-by-pass comparison's direct side PIQP at tolerance TOL (the direct path's is 1e-11, then 1e-9). ``merge FILE..`` combines the
outputs of ``--shard`` runs as one ``compare`` prints them.

``profile DIR --parent I [--solver ..] [--qp-solver ..] [--option KEY=VALUE]``: parent I alone: the direct
path's CPU, then one JSON line per Pyomo solve as it ends (:class:`Tracing`: the pass's class, rows, columns,
status, CPU by where it goes, HiGHS's iterations), then the Pyomo path's total, the failsafe level reached and
whether both paths gave the same integers. Sizes, statuses and times only: no count is printed.

Usage (Rhode Island, persons):
  topdown ingest blocks data/ri2010/ri_2010_block_demographics.csv.gz --out ri2010-input
  OPENBLAS_NUM_THREADS=1 python benchmarks/pyomo_path.py capture conf/ri2010.toml --input ri2010-input --out /tmp/ri
  OPENBLAS_NUM_THREADS=1 python benchmarks/pyomo_path.py compare /tmp/ri --solver appsi_highs --qp-solver highs
"""
from __future__ import annotations

import argparse
import json
import pickle
import sys
import time
from collections import defaultdict
from contextlib import contextmanager
from pathlib import Path

import numpy as np


def capture(config: str, input_dir: Path, out: Path, products: list[str] | None = None) -> int:
    """Run ``config`` in this process and pickle every parent problem it solves (with its level)."""
    from distributed import Client

    from topdown.pipeline import load_config, run

    out.mkdir(parents=True, exist_ok=True)
    seen: list = []
    cfg = load_config(config)
    if products:
        cfg = cfg.with_overrides(products=products)
    with _recording(seen), Client(processes=False, n_workers=1, threads_per_worker=1,
                                  dashboard_address=":0") as client:  # any free port: no warning beside another
        run(cfg, out / "run", input_dir=input_dir, client=client)
    (out / "problems.pkl").write_bytes(pickle.dumps(seen))
    return len(seen)


def capture_paths(config: str, input_dir: Path, out: Path, per_level: int = 12) -> int:
    """:func:`capture` of the parents on the paths of a sample of leaves only, through ``topdown audit``'s
    path-restricted run (which gives those parents exactly a full run's problems: tests/test_audit.py): a leaf
    under each of ``per_level`` evenly spaced parents of the leaf level, and one under every node of the second
    level below the root, so that every parent above that level is solved too. Every product of the run."""
    import pandas as pd

    from topdown.geo.spine import build_spine
    from topdown.pipeline import load_config
    from topdown.pipeline.evaluation import audit
    from topdown.pipeline.execution.dataplane import counts_units, find_input
    from topdown.pipeline.execution.levels import build_levels
    from topdown.pipeline.inputs.tabulate import block_units, sparse_counts
    from topdown.pipeline.inputs.validate import check_records

    cfg = load_config(config)
    census, person = cfg.census, next(p for p in cfg.run_products if not counts_units(cfg.census, p))
    records = audit.read_records(cfg, Path(input_dir), person)
    spine = build_spine(cfg.run.spine, records.geography, baf_dir=cfg.run.baf, units=records.units,
                        hierarchy=census.hierarchy)
    units = block_units(records.units).set_index("geoid")
    files = find_input(Path(input_dir), census)
    seen: list = []
    with _recording(seen) as level:
        for product in cfg.run_products:
            if counts_units(census, product):
                read = [check_records(path, product, census.hierarchy) for path in files.units]
                leaf = np.concatenate([r[0].to_numpy().astype(str) for r in read])
                cells = np.concatenate([r[1] for r in read])
            else:
                leaf, cells = records.leaf, records.cells
            hist = sparse_counts(pd.Series(leaf, name="geoid"), cells, product.schema.ncells)
            levels = build_levels(product, cfg.product(product.name), spine, hist, units)
            plan = audit.make_plan(product, cfg, levels, _path_leaves(levels, per_level), 0, ("total",), False)
            level.product = product.name
            audit.run_plan(plan, cfg.run.seed)
    out.mkdir(parents=True, exist_ok=True)
    (out / "problems.pkl").write_bytes(pickle.dumps(seen))
    return len(seen)


def _path_leaves(levels: list, per_level: int) -> list[str]:
    """Leaf geocodes: the first leaf under each of ``per_level`` evenly spaced parents of the leaf level, and
    under every node of the second level below the root."""
    leaf = levels[-1]
    ancestor = np.arange(len(leaf))
    for lv in levels[:2:-1]:  # the leaves' node row at the second level below the root
        ancestor = lv.parent[ancestor]
    under_parent = np.unique(leaf.parent, return_index=True)[1]
    under_second = np.unique(ancestor, return_index=True)[1]
    picked = set(under_parent[::max(1, -(-len(under_parent) // per_level))]) | set(under_second)
    return [str(leaf.nodes[i]) for i in sorted(picked)]


class _Level:
    """The level of the chunk running (for :func:`_recording`'s records)."""

    product = ""
    name = ""


@contextmanager
def _recording(seen: list):
    """Every parent problem solved in this process while it runs, appended to ``seen`` with its level."""
    import topdown.solvers as solvers
    from topdown.pipeline.execution import tasks

    level = _Level()
    solve, run_chunk = solvers.solve_parent, tasks._run_chunk

    def recording(problem, *args, **kwargs):
        seen.append((f"{level.product}.{level.name}", problem))
        return solve(problem, *args, **kwargs)

    def chunk_level(chunk):
        level.product, level.name = chunk.product.name, chunk.level
        return run_chunk(chunk)

    solvers.solve_parent, tasks._run_chunk = recording, chunk_level  # one thread: the level of the chunk running
    try:
        yield level
    finally:
        solvers.solve_parent, tasks._run_chunk = solve, run_chunk


class Recording:
    """A back end that passes every call on and keeps each result (for pass-by-pass comparisons)."""

    def __init__(self, inner) -> None:
        self.inner, self.results = inner, []

    def qp(self, *args):
        res = self.inner.qp(*args)
        self.results.append(("qp", res))
        return res

    def lp(self, *args, **kwargs):
        res = self.inner.lp(*args, **kwargs)
        self.results.append(("lp", res))
        return res


def _objectives(rec: Recording, kind: str) -> list[float]:
    return [r.objective for k, r in rec.results if k == kind]


def compare_parent(problem, pyomo_backend, direct=None) -> dict:
    """One parent on both paths at the exact failsafe level: the L2 estimates' largest difference (persons),
    the L2 passes' objectives' largest relative difference, and the rounders on the same L2 estimate (the
    direct path's): ``rounding`` is "identical", "tie" (different integers, every pass's objective equal
    within 1e-6) or "different". Empty when the exact level fails on either path; ``{"failsafe": ...}`` (the
    failsafe's actions in the L2 passes on each path) when one path's L2 passes needed the failsafe and the
    other's did not, or other steps. ``direct``: the direct path's back end (default: production's,
    ``DEFAULT_BACKEND``)."""
    return compare_directs(problem, pyomo_backend, [direct])[0]


def compare_directs(problem, pyomo_backend, directs: list) -> list[dict]:
    """:func:`compare_parent` against each of ``directs`` (None: production's), the Pyomo path's L2 passes
    solved once."""
    from topdown.solvers.backends import DEFAULT_BACKEND
    from topdown.solvers.direct import compile_direct
    from topdown.solvers.l2 import SolveFailure, run_l2
    from topdown.solvers.layout import build_layout
    from topdown.solvers.model import compile_pyomo
    from topdown.solvers.rounder import run_rounder

    layout = build_layout(problem)
    if layout.infeasible or layout.n_x == 0:
        return [{} for _ in directs]
    form_d, form_p = compile_direct(layout), compile_pyomo(layout)
    p = Recording(pyomo_backend)
    try:
        l2_p = run_l2(layout, form_p, p)
    except SolveFailure:
        return [{} for _ in directs]
    out = []
    for direct in directs:
        d = Recording(DEFAULT_BACKEND if direct is None else direct)
        try:
            l2_d = run_l2(layout, form_d, d)
            rd, rp = Recording(d.inner), Recording(pyomo_backend)
            hist_d, _ = run_rounder(layout, form_d, l2_d.z, rd)
            hist_p, _ = run_rounder(layout, form_p, l2_d.z, rp)
        except SolveFailure:
            out.append({})
            continue
        out.append(_compared(layout, l2_d, l2_p, d, p, rd, rp, hist_d, hist_p))
    return out


def _compared(layout, l2_d, l2_p, d: Recording, p: Recording, rd: Recording, rp: Recording, hist_d, hist_p) -> dict:
    steps = {"direct": [st.action for st in l2_d.steps], "pyomo": [st.action for st in l2_p.steps]}
    if steps["direct"] != steps["pyomo"]:
        return {"failsafe": steps}
    x = layout.xcol >= 0
    obj_d, obj_p = np.array(_objectives(d, "qp")), np.array(_objectives(p, "qp"))
    l2_rel = float(np.max(np.abs(obj_p - obj_d) / np.maximum(1.0, np.abs(obj_d)))) if obj_d.size else 0.0
    if np.array_equal(hist_d, hist_p):
        rounding = "identical"
    else:
        lp_d, lp_p = np.array(_objectives(rd, "lp")), np.array(_objectives(rp, "lp"))
        same = lp_d.size == lp_p.size and np.allclose(lp_p, lp_d, rtol=1e-9, atol=1e-6)
        rounding = "tie" if same else "different"
    return {"l2_max_abs": float(np.abs(l2_p.z[layout.xcol[x]] - l2_d.z[layout.xcol[x]]).max()),
            "l2_objective_rel": l2_rel, "rounding": rounding}


class HighsClock:
    """CPU seconds inside ``highspy.Highs.run`` (the solver's own share of a Pyomo solve) and HiGHS's
    iterations there (active-set QP, simplex)."""

    def __init__(self) -> None:
        import highspy

        self.seconds, self.qp_iterations, self.simplex_iterations = 0.0, 0, 0
        run = highspy.Highs.run

        def timed(h, *a, **k):
            c0 = time.thread_time()
            try:
                return run(h, *a, **k)
            finally:
                self.seconds += time.thread_time() - c0
                info = h.getInfo()
                self.qp_iterations += max(info.qp_iteration_count, 0)
                self.simplex_iterations += max(info.simplex_iteration_count, 0)

        highspy.Highs.run = timed


class Tracing:
    """A Pyomo back end that prints one JSON line per solve as it ends: the pass's class and size, its status,
    its CPU seconds by where they go (``compare``'s columns) and HiGHS's iterations."""

    def __init__(self, inner, highs: HighsClock, out=sys.stdout) -> None:
        self.inner, self.highs, self.out, self.calls, self.parent = inner, highs, out, 0, None

    def qp(self, *args):
        return self._traced("qp", args[2], lambda: self.inner.qp(*args))

    def lp(self, *args, **kwargs):
        kind = "milp" if kwargs.get("integer") is not None else "lp"
        return self._traced(kind, args[1], lambda: self.inner.lp(*args, **kwargs))

    def _traced(self, kind: str, a, call):
        clock, highs = self.inner.clock, self.highs
        before = (dict(clock), highs.seconds, highs.qp_iterations, highs.simplex_iterations)
        c0 = time.thread_time()
        res = call()
        cpu = time.thread_time() - c0
        spent = {k: clock[k] - before[0].get(k, 0.0) for k in ("build", "solve", "read")}
        solver = highs.seconds - before[1]
        print(json.dumps({"parent": self.parent, "call": self.calls, "kind": kind, "rows": a.shape[0],
                          "columns": a.shape[1], "nnz": int(a.nnz), "status": res.status, "cpu_s": round(cpu, 3),
                          "pass_model": round(spent["build"], 3), "transfer": round(spent["solve"] - solver, 3),
                          "solver": round(solver, 3), "read": round(spent["read"], 3),
                          "qp_iterations": highs.qp_iterations - before[2],
                          "simplex_iterations": highs.simplex_iterations - before[3]}), file=self.out, flush=True)
        self.calls += 1
        return res


def profile(folder: Path, index: int, solver: str, qp_solver: str | None, options: dict) -> None:
    """Parent ``index`` of ``problems.pkl`` alone: the direct path's CPU, then the Pyomo path's solves one by
    one as they end (:class:`Tracing`), then where the Pyomo path's time went and the failsafe level reached."""
    from topdown.solvers import solve_parent
    from topdown.solvers import model as model_module
    from topdown.solvers.pyomo_path import PyomoBackend

    items = pickle.loads((folder / "problems.pkl").read_bytes())
    level, problem = items[index]
    del items
    c0 = time.thread_time()
    direct = solve_parent(problem)
    print(json.dumps({"parent": index, "level": level, "children": problem.n_children,
                      "direct_cpu_s": round(time.thread_time() - c0, 3), "direct_level": direct.stats.level}),
          flush=True)
    highs = HighsClock()
    backend = PyomoBackend(solver, qp_solver, options)
    tracing = Tracing(backend, highs)
    tracing.parent = index
    compile_clock = [0.0]

    def timed_compile(layout):
        c0 = time.thread_time()
        try:
            return model_module.compile_pyomo(layout)
        finally:
            compile_clock[0] += time.thread_time() - c0

    c0 = time.thread_time()
    pyomo = solve_parent(problem, tracing, timed_compile)
    print(json.dumps({"parent": index, "pyomo_cpu_s": round(time.thread_time() - c0, 3),
                      "parent_model": round(compile_clock[0], 3), "solves": tracing.calls,
                      "pyomo_level": pyomo.stats.level, "failsafe": [st.action for st in pyomo.failsafe],
                      "identical_outputs": bool(np.array_equal(direct.hist, pyomo.hist))}), flush=True)


#: What ``--without`` can switch off in solvers/pyomo_path.py, to measure what each is worth.
WITHOUT = ("pause_gc", "bulk_columns", "reuse")


def switch_off(names: list[str]) -> None:
    """Undo the Pyomo path's speed-ups named (:data:`WITHOUT`) in this process: collections during model
    building (``pause_gc``), columns handed to a persistent solver row by row by its own ``set_instance``
    (``bulk_columns``), a fresh model for every L2 pass (``reuse``)."""
    import contextlib

    from topdown.solvers import pyomo_path

    for name in names:
        if name == "pause_gc":
            pyomo_path.PauseGC = contextlib.nullcontext
        elif name == "bulk_columns":
            pyomo_path.hand_over = lambda opt, m, z: opt.set_instance(m)
        elif name == "reuse":
            pyomo_path._same_rows = lambda a, b: False
        else:
            raise SystemExit(f"--without: unknown {name!r} (known: {', '.join(WITHOUT)})")


def compare(folder: Path, solver: str, qp_solver: str | None, every: int, check: bool,
            levels: set[str] | None = None, shard: tuple[int, int] = (0, 1), parents: set[int] | None = None,
            options: dict | None = None, trace: bool = False, direct_tol: float | None = None) -> None:
    from topdown.solvers import solve_parent
    from topdown.solvers.backends import PiqpHighs
    from topdown.solvers import model as model_module
    from topdown.solvers.pyomo_path import PyomoBackend

    items = pickle.loads((folder / "problems.pkl").read_bytes())
    warm = items[-1][1] if not levels else next(p for level, p in reversed(items) if level in levels)
    if parents is not None:  # keep the indices: the shards are taken by them
        items = [(level, p) if i in parents else ("", None) for i, (level, p) in enumerate(items)]
    if levels:
        items = [(level, p) for level, p in items if level in levels]
    kept = [(level, p) for level, p in items if p is not None]
    lowest = {level for level, problem in kept if len(problem.children[0]) == max(len(p.children[0]) for _, p in kept)}
    highs = HighsClock()
    compile_clock = [0.0]
    compile_pyomo = model_module.compile_pyomo

    def timed_compile(layout):
        c0 = time.thread_time()
        try:
            return compile_pyomo(layout)
        finally:
            compile_clock[0] += time.thread_time() - c0

    rows: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    backend = PyomoBackend(solver, qp_solver, options)
    solve_parent(warm, backend, timed_compile)  # imports and first solver calls off the clock
    solving = Tracing(backend, highs, sys.stderr) if trace else backend
    checked_against = None if direct_tol is None else PiqpHighs(direct_tol, max_iter=1000)
    for i, (level, problem) in enumerate(items):
        if problem is None or (every > 1 and level in lowest and i % every) or i % shard[1] != shard[0]:
            continue
        row = rows[level]
        c0 = time.thread_time()
        direct = solve_parent(problem)
        c1 = time.thread_time()
        backend.clock.clear()
        highs.seconds, compile_clock[0] = 0.0, 0.0
        c2 = time.thread_time()
        if trace:
            solving.parent = i
        pyomo = solve_parent(problem, solving, timed_compile)
        c3 = time.thread_time()
        row["parents"] += 1
        row["children"] += problem.n_children
        row["direct_cpu_s"] += c1 - c0
        row["pyomo_cpu_s"] += c3 - c2
        row["parent_model"] += compile_clock[0]
        row["pass_models"] += backend.clock["build"]
        row["solver"] += highs.seconds
        row["transfer"] += backend.clock["solve"] - highs.seconds
        row["read"] += backend.clock["read"]
        row["identical_outputs"] += bool(np.array_equal(direct.hist, pyomo.hist))
        if check and not direct.stats.shortcut and direct.stats.level == pyomo.stats.level == "exact":
            cmp = compare_parent(problem, solving, checked_against)
            if "failsafe" in cmp:
                row["failsafe_differs"] += 1
            elif cmp:
                row["compared"] += 1
                row["l2_max_abs"] = max(row["l2_max_abs"], cmp["l2_max_abs"])
                row["l2_objective_rel"] = max(row["l2_objective_rel"], cmp["l2_objective_rel"])
                row[f"rounding_{cmp['rounding']}"] += 1
    total: dict[str, float] = defaultdict(float)
    for level, row in sorted(rows.items()):
        print(json.dumps(_shown(level, row)), flush=True)
        for key, val in row.items():
            total[key] = max(total[key], val) if key in ("l2_max_abs", "l2_objective_rel") else total[key] + val
    print(json.dumps(_shown("all", total)), flush=True)


def _shown(level: str, row: dict) -> dict:
    out = {"level": level, **{k: (round(v, 9) if isinstance(v, float) and k.startswith("l2") else
                                  round(v, 3) if isinstance(v, float) else v) for k, v in row.items()}}
    for path in ("direct", "pyomo"):
        out[f"{path}_ms_per_child"] = round(1000 * row[f"{path}_cpu_s"] / max(row["children"], 1), 3)
    out["ratio"] = round(row["pyomo_cpu_s"] / max(row["direct_cpu_s"], 1e-9), 2)
    return out


def merge(files: list[Path]) -> None:
    """The rows of several ``compare --shard`` outputs combined, level by level, as one ``compare`` prints them."""
    rows: dict[str, dict] = defaultdict(lambda: defaultdict(float))
    for f in files:
        for line in f.read_text().splitlines():
            shown = json.loads(line)
            row = rows[shown.pop("level")]
            for key, val in shown.items():
                if key.endswith("_ms_per_child") or key == "ratio":
                    continue
                row[key] = max(row[key], val) if key.startswith("l2") else row[key] + val
    for level, row in sorted(rows.items(), key=lambda kv: (kv[0] == "all", kv[0])):
        print(json.dumps(_shown(level, row)), flush=True)


def solver_options(pairs: list[str]) -> dict:
    """``KEY=VALUE`` pairs as solver options (a VALUE that parses as JSON is taken as such: 1e5, true)."""
    out = {}
    for pair in pairs:
        key, sep, val = pair.partition("=")
        if not sep:
            raise SystemExit(f"--option: {pair!r} is not KEY=VALUE")
        try:
            out[key] = json.loads(val)
        except json.JSONDecodeError:
            out[key] = val
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("config")
    c.add_argument("--input", required=True, type=Path)
    c.add_argument("--out", required=True, type=Path)
    c.add_argument("--products", default=None, help="comma-separated (default: the configuration's)")
    c.add_argument("--paths", type=int, default=None, metavar="N",
                   help="only the parents on the paths of a sample of leaves (capture_paths: N per level)")
    m = sub.add_parser("compare")
    m.add_argument("folder", type=Path)
    m.add_argument("--solver", default="highs")
    m.add_argument("--qp-solver", default=None)
    m.add_argument("--every", type=int, default=1, help="every N-th parent of the lowest level only")
    m.add_argument("--no-check", dest="check", action="store_false", help="times only, no pass-by-pass comparison")
    m.add_argument("--levels", default=None, help="comma-separated product.Level names (default: every level)")
    m.add_argument("--without", default="", help=f"comma-separated speed-ups to switch off: {', '.join(WITHOUT)}")
    m.add_argument("--shard", default="0/1", help="K/N: only the parents whose index is K modulo N (for N processes)")
    m.add_argument("--trace", action="store_true", help="one JSON line per Pyomo solve on standard error (profile's)")
    m.add_argument("--parents", default=None, help="comma-separated indices in problems.pkl: only these parents")
    m.add_argument("--option", action="append", default=[], metavar="KEY=VALUE",
                   help="a solver option for every Pyomo solve (solver_options; VALUE read as JSON where it parses)")
    m.add_argument("--direct-tol", type=float, default=None,
                   help="compare pass by pass against PIQP at this tolerance (default: the direct path's, 1e-11)")
    pr = sub.add_parser("profile")
    pr.add_argument("folder", type=Path)
    pr.add_argument("--parent", required=True, type=int, help="its index in problems.pkl")
    pr.add_argument("--solver", default="highs")
    pr.add_argument("--qp-solver", default=None)
    pr.add_argument("--option", action="append", default=[], metavar="KEY=VALUE", help="as compare's")
    g = sub.add_parser("merge")
    g.add_argument("files", nargs="+", type=Path, help="the outputs of compare --shard K/N, K = 0..N-1")
    args = ap.parse_args()
    if args.cmd == "capture":
        if args.paths:
            n = capture_paths(args.config, args.input, args.out, args.paths)
        else:
            n = capture(args.config, args.input, args.out, args.products.split(",") if args.products else None)
        print(json.dumps({"captured": n, "dir": str(args.out)}))
    elif args.cmd == "merge":
        merge(args.files)
    elif args.cmd == "profile":
        profile(args.folder, args.parent, args.solver, args.qp_solver, solver_options(args.option))
    else:
        switch_off([n for n in args.without.split(",") if n])
        k, n = (int(x) for x in args.shard.split("/"))
        compare(args.folder, args.solver, args.qp_solver, args.every, args.check,
                set(args.levels.split(",")) if args.levels else None, (k, n),
                {int(i) for i in args.parents.split(",")} if args.parents else None, solver_options(args.option),
                args.trace, args.direct_tol)


if __name__ == "__main__":
    main()
