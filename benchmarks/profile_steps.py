"""Where one parent's CPU goes, step by step: layout, Pyomo build, compile, each L2 pass,
each tau LP, each rounder pass, the row check and the Python between them.

Sub-commands:

``capture CONFIG --out DIR``: runs CONFIG (persons) in this process on a one-thread Dask client and
pickles the first task (Chunk) of the County -> Tract level and of the Block_Group -> Block level to
DIR (``chunk-Tract.pkl``, ``chunk-Block.pkl``), then stops the run. The pickles hold the chunk's true
child histograms (confidential input): keep DIR private; nothing of them is printed.

``capture ... --every N`` also keeps every N-th Block-level chunk (in DIR/block/) and skips solving the
Block level (``--level NAME``: another spine's last level, such as the 1940 census's ``Enumdist``; its chunks
go to DIR/block/ as well, and every sub-command below reads them as "blocks"); ``blocks DIR`` then runs those
chunks one after the other in this process and prints their CPU seconds per block (run it alternately with the untouched and the changed tree on the Python path: an
A/B comparison under the same load).

``ab DIR --tree PATH --tree '' [--rounds R]``: the same chunks under several trees at once, interleaved
chunk by chunk (one warm process per tree: ``''`` this tree, else a PYTHONPATH such as a shim of an
older tree), so that a machine load that changes during the comparison falls on every tree alike;
prints each tree's CPU per block, the median over chunk runs of its CPU over the first tree's, and
whether the estimates and measurement files are byte-identical.

``splits DIR --costs 5000,50000 [--query "sex * age"]``: the captured Block chunks solved with each value of
``split_cost`` in turn (one process, chunk by chunk); prints per value the CPU per block and, against the chunks'
true child histograms (a synthetic input's), the mean absolute error of a block's total and the L1 of its
detailed cells, and the summed absolute error of each ``--query`` (repeatable). Confidential when the input is
real: the figures come from the true histograms.

``profile DIR [--repeats 3]``: for the largest County parent of the Tract chunk and for the Block_Group
parent of median size in the Block chunk, times every step of ``solve_parent`` (CPU seconds of this
process, the median over the repeats) and prints one JSON object per parent; then the whole Block chunk
(``run_chunk``: noise draws included) per step, with the CPU per block.

Usage:
  OPENBLAS_NUM_THREADS=1 python benchmarks/profile_steps.py capture conf/ri2010.toml --out /tmp/prof
  OPENBLAS_NUM_THREADS=1 python benchmarks/profile_steps.py profile /tmp/prof
  OPENBLAS_NUM_THREADS=1 python benchmarks/profile_steps.py capture CONFIG --out /tmp/prof --every 1
  OPENBLAS_NUM_THREADS=1 python benchmarks/profile_steps.py blocks /tmp/prof
  OPENBLAS_NUM_THREADS=1 python benchmarks/profile_steps.py ab /tmp/prof --tree /tmp/shim-old --tree ''
  OPENBLAS_NUM_THREADS=1 python benchmarks/profile_steps.py splits /tmp/prof --costs 10000,5000,50000 \
      --query "sex * age"
"""
from __future__ import annotations

import argparse
import functools
import json
import pickle
import statistics
import time
from collections import defaultdict
from pathlib import Path

WANTED = ("Tract", "Block")


def capture(config_path: str, out: Path, every: int = 0, level: str = "Block") -> None:
    """Pickle the first chunk of the Tract and Block levels; with ``every`` > 0 also every ``every``-th
    chunk of ``level`` (the spine's last) to ``out/block/`` (that level is then not solved: the run stops
    after it)."""
    from distributed import Client

    from topdown.pipeline import load_config, run
    from topdown.pipeline.execution import dataplane
    from topdown.pipeline.execution.tasks import ChunkResult

    out.mkdir(parents=True, exist_ok=True)
    (out / "block").mkdir(exist_ok=True)
    original = dataplane.run_chunk  # the workers' chunk runner (dataplane.run_part_chunk calls it)
    files = [out / f"chunk-{level}.pkl" for level in WANTED]

    def grab(chunk):  # runs on the worker thread (a pickled copy: state goes through the files)
        import scipy.sparse as sp

        path = out / f"chunk-{chunk.level}.pkl"
        if chunk.level in WANTED and chunk.index == 0 and not path.exists():
            path.write_bytes(pickle.dumps(chunk))
        if chunk.level == level and every > 0:
            if chunk.index % every == 0:
                (out / "block" / f"{chunk.index:05d}.pkl").write_bytes(pickle.dumps(chunk))
            return ChunkResult(chunk.index, chunk.children, sp.csr_matrix((len(chunk.children), 1), dtype="int64"))
        if all(f.exists() for f in files) and every == 0:
            raise RuntimeError("captured")
        return original(chunk)

    dataplane.run_chunk = grab
    config = load_config(config_path).with_overrides(products=["persons"])
    with Client(processes=False, n_workers=1, threads_per_worker=1, dashboard_address=None) as client:
        try:
            run(config, out / "run", client=client)
        except Exception:
            if not all(f.exists() for f in files):
                raise
    print(json.dumps({"captured": [f.name for f in files if f.exists()],
                      "block_chunks": len(list((out / "block").glob("*.pkl"))), "dir": str(out)}))


class _MovedModules(pickle.Unpickler):
    """Loads chunks captured by a tree with another package layout (``topdown.pipeline.tasks`` before the
    regrouping, ``topdown.pipeline.execution.tasks`` after): a module that is not found is looked up by
    its last name among the pipeline's subpackages, ``vocab`` and ``pipeline`` itself."""

    def find_class(self, module: str, name: str):
        import importlib
        import os

        import topdown

        shim = getattr(topdown, "__file__", None)  # a shim's package (PYTHONPATH), not the editable install
        root = os.path.dirname(shim) if shim else ""

        def found(name: str) -> bool:
            if root and name.startswith("topdown."):  # in the shim's tree, not where the install maps it
                path = os.path.join(root, *name.split(".")[1:])
                return os.path.exists(path + ".py") or os.path.exists(os.path.join(path, "__init__.py"))
            try:
                importlib.import_module(name)
            except ModuleNotFoundError:
                return False
            return True

        if not found(module):
            leaf = module.rsplit(".", 1)[-1]
            groups = ("configuration", "privacy", "inputs", "execution", "outputs", "evaluation")
            for cand in [f"topdown.pipeline.{g}.{leaf}" for g in groups] + [f"topdown.vocab.{leaf}",
                                                                          f"topdown.pipeline.{leaf}"]:
                if found(cand):
                    module = cand
                    break
        return super().find_class(module, name)


def _chunk_runner(tmp: str):
    """A function that runs one captured Block chunk (a pickle path) with the tree on the path and returns
    its CPU seconds, blocks, and the SHA-256 of its estimates and of its measurement file."""
    import hashlib
    import io

    try:  # a tree from before pipeline/ was regrouped (the editable install maps the new subpackages)
        from topdown.pipeline.tasks import run_chunk
    except ModuleNotFoundError:
        from topdown.pipeline.execution.tasks import run_chunk

    import distributed  # noqa: F401  (imported on every worker; not the chunks' cost)
    import numpy as np

    def one(path: Path) -> dict:
        chunk = _MovedModules(io.BytesIO(path.read_bytes())).load()
        chunk.measurements_path = f"{tmp}/{path.stem}.parquet"
        # the configuration validated again by the tree that runs it (fields added since the capture get their
        # defaults; a pickled pydantic model keeps only the fields of the tree that pickled it)
        chunk.cfg = type(chunk.cfg).model_validate(chunk.cfg.model_dump())
        c0 = time.process_time()
        res = run_chunk(chunk)
        cpu = time.process_time() - c0
        hist = np.ascontiguousarray(res.hist.toarray(), dtype=np.int64)
        return {"chunk": path.stem, "cpu_s": cpu, "blocks": len(chunk.children),
                "estimates_sha256": hashlib.sha256(hist.tobytes()).hexdigest(),
                "measurements_sha256": hashlib.sha256(Path(chunk.measurements_path).read_bytes()).hexdigest()}
    return one


def _summary(rows: list[dict]) -> dict:
    import hashlib

    cpu, blocks = sum(r["cpu_s"] for r in rows), sum(r["blocks"] for r in rows)
    digest = {k: hashlib.sha256("".join(r[k] for r in rows).encode()).hexdigest()[:16]
              for k in ("estimates_sha256", "measurements_sha256")}
    return {"chunks": len(rows), "blocks": blocks, "cpu_s": round(cpu, 3),
            "cpu_ms_per_block": round(1000 * cpu / max(blocks, 1), 3), **digest}


def block_chunks(d: Path) -> None:
    """CPU seconds of run_chunk (noise draws, solves, writing the measurements) over the captured Block
    chunks, and per block (with this tree or, through PYTHONPATH, an older one of either package layout)."""
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        one = _chunk_runner(tmp)
        rows = [one(path) for path in sorted((d / "block").glob("*.pkl"))]
    print(json.dumps(_summary(rows)), flush=True)


def serve(d: Path) -> None:
    """Run the captured chunk named on each line of standard input; one JSON line per chunk (for ``ab``)."""
    import sys
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        one = _chunk_runner(tmp)
        for line in sys.stdin:
            print(json.dumps(one(d / "block" / f"{line.strip()}.pkl")), flush=True)


def ab(d: Path, trees: list[str], rounds: int) -> None:
    """The captured Block chunks under several trees, interleaved: one warm process per tree (``""`` =
    this tree, else a PYTHONPATH such as a shim of an older tree), each chunk run by every tree in turn
    (the order alternating), so a changing machine load falls on all trees alike. Prints one JSON line
    per tree (CPU, per block, the median per-chunk CPU ratio to the first tree, digests of the estimates
    and measurements) and whether they agree."""
    import os
    import subprocess
    import sys

    procs = []
    for tree in trees:
        env = dict(os.environ)
        if tree:
            env["PYTHONPATH"] = tree
        procs.append(subprocess.Popen([sys.executable, __file__, "serve", str(d)], stdin=subprocess.PIPE,
                                      stdout=subprocess.PIPE, text=True, env=env))
    rows: list[list[dict]] = [[] for _ in trees]
    stems = [p.stem for p in sorted((d / "block").glob("*.pkl"))]
    try:
        for r in range(rounds):
            for i, stem in enumerate(stems):
                order = list(range(len(trees)))
                if (r * len(stems) + i) % 2:
                    order.reverse()
                for t in order:
                    procs[t].stdin.write(stem + "\n")
                    procs[t].stdin.flush()
                    rows[t].append(json.loads(procs[t].stdout.readline()))
    finally:
        for p in procs:
            p.stdin.close()
            p.wait()
    sums = [_summary(r) for r in rows]
    for tree, row, mine in zip(trees, sums, rows):
        # Robust to load spikes: the median over chunk runs of this tree's CPU over the first tree's.
        ratio = statistics.median(a["cpu_s"] / b["cpu_s"] for a, b in zip(mine, rows[0]))
        print(json.dumps({"tree": tree or "this tree", "rounds": rounds, **row,
                          "median_chunk_cpu_ratio_to_first": round(ratio, 4)}), flush=True)
    same = all(s["estimates_sha256"] == sums[0]["estimates_sha256"]
               and s["measurements_sha256"] == sums[0]["measurements_sha256"] for s in sums)
    print(json.dumps({"identical_outputs": same}), flush=True)


class StepClock:
    """CPU seconds by step label; functions are wrapped so that each call adds to its label."""

    def __init__(self) -> None:
        self.cpu: dict[str, float] = defaultdict(float)
        self.phase = ""
        self.counts: dict[str, int] = defaultdict(int)

    def wrap(self, module, name: str, label: str | None = None, phase: str | None = None) -> None:
        f = getattr(module, name)

        @functools.wraps(f)
        def timed(*a, **k):
            outer = self.phase
            if phase is not None:
                self.phase = phase
                self.counts[phase] = 0
            c0 = time.process_time()
            try:
                return f(*a, **k)
            finally:
                if label is not None:
                    self.cpu[label] += time.process_time() - c0
                self.phase = outer
        setattr(module, name, timed)

    def wrap_solver(self, backend) -> None:
        """Label each QP/LP call by the phase it is in (L2 pass k, rounder pass k)."""
        for kind in ("qp", "lp"):
            f = getattr(backend, kind)

            def timed(*a, _f=f, _kind=kind, **k):
                if self.phase == "tau":
                    label = "tau LP"
                else:
                    label = f"{self.phase} pass {self.counts[self.phase]}"
                    self.counts[self.phase] += 1
                c0 = time.process_time()
                try:
                    return _f(*a, **k)
                finally:
                    self.cpu[label] += time.process_time() - c0
            setattr(backend, kind, timed)


def instrument() -> StepClock:
    from topdown.pipeline.execution import tasks
    from topdown.solvers import backends, l2, model, rounder, solve

    clock = StepClock()
    clock.wrap(solve, "build_layout", "layout")
    clock.wrap(model, "build_model", "Pyomo build")
    clock.wrap(model, "compile_model", "compile")
    if getattr(solve, "DEFAULT_COMPILER", None) is not None:  # the direct build of the model's rows
        clock.wrap(solve, "DEFAULT_COMPILER", "compile")
    clock.wrap(solve, "check_rows", "checks")
    clock.wrap(solve, "run_l2", phase="L2")
    clock.wrap(l2, "tau_lp", phase="tau")
    clock.wrap(solve, "run_rounder", phase="rounder")
    clock.wrap_solver(backends.DEFAULT_BACKEND)
    return clock


def _problem(chunk, task):
    """The ParentProblem run_chunk builds for ``task`` (same measurements and settings)."""
    import numpy as np

    from topdown.vocab.problem import Measurement, ParentProblem

    measured = chunk.source.noisy(chunk)
    rows, cfg = task.child_rows, chunk.cfg
    return ParentProblem(
        schema=chunk.product.schema, parent=task.parent, children=task.children, parent_hist=task.parent_hist,
        measurements=[Measurement(m.query, m.values[rows], np.where(m.variance[rows] == 0, 1.0, m.variance[rows]))
                      for m in measured],
        constraints=task.constraints, group_totals=task.group_totals,
        l2_passes=cfg.estimation.l2_passes.get(chunk.level, []),
        rounder_passes=cfg.estimation.rounder_passes.get(chunk.level, []),
        tau_slack=cfg.estimation.tau_slack, split_above=cfg.estimation.split_above,
        split_cost=cfg.estimation.split_cost, split_group=cfg.estimation.split_group)


def profile_parent(clock: StepClock, problem, repeats: int) -> dict:
    from topdown.solvers import solve_parent
    from topdown.vocab.problem import SparseHist

    runs = []
    for _ in range(repeats):
        clock.cpu.clear()
        c0 = time.process_time()
        sol = solve_parent(problem)
        total = time.process_time() - c0
        steps = dict(clock.cpu)
        steps["Python overhead"] = total - sum(steps.values())
        steps["total"] = total
        runs.append(steps)
    keys = runs[0].keys()
    med = {k: round(statistics.median(r.get(k, 0.0) for r in runs), 4) for k in keys}
    return {"parent_level": None, "children": problem.n_children,
            "nonzero_parent_cells": int(SparseHist.of(problem.parent_hist).cells.size), "columns": sol.stats.n_cols,
            "rows": sol.stats.n_rows, "failsafe": sol.stats.level, "cpu_s": med}


def profile(d: Path, repeats: int) -> None:
    from topdown.pipeline.execution import tasks

    clock = instrument()
    tract = pickle.loads((d / "chunk-Tract.pkl").read_bytes())
    block = pickle.loads((d / "chunk-Block.pkl").read_bytes())
    county = max(tract.parents, key=lambda t: len(t.children))
    sizes = sorted(block.parents, key=lambda t: (len(t.children), t.parent))
    bg = sizes[len(sizes) // 2]
    for name, chunk, task in (("Block_Group -> Block", block, bg), ("County -> Tract", tract, county)):
        row = profile_parent(clock, _problem(chunk, task), repeats)
        row["parent_level"] = name
        print(json.dumps(row), flush=True)
    clock.wrap(type(block.source), "noisy", "noise draws")
    clock.cpu.clear()
    c0 = time.process_time()
    res = tasks.run_chunk(block)
    total = time.process_time() - c0
    steps = {k: round(v, 3) for k, v in clock.cpu.items()}
    print(json.dumps({"chunk": "Block level task 0", "parents": len(block.parents), "solved": res.solved,
                      "blocks": len(block.children), "cpu_s": round(total, 3),
                      "cpu_ms_per_block": round(1000 * total / len(block.children), 3), "steps": steps}), flush=True)


def _errors(product, estimate, truth, queries: list[str]) -> dict:
    """Summed absolute errors of the estimate against the truth (both children x cells): of each child's total
    (``total``, from the rows' sums), of the detailed cells, and of each query's answers (``abs_error NAME``)."""
    import numpy as np

    from topdown.vocab.queries import build_query

    diff = (estimate.astype(np.int64) - truth.astype(np.int64)).tocoo()
    out = {"total": float(np.abs(np.bincount(diff.row, diff.data, minlength=diff.shape[0])).sum()),
           "detailed": float(np.abs(diff.data).sum())}
    for name in queries:
        query = build_query(product.schema, name)
        key = diff.row * query.n_answers + query.groups_at(diff.col)
        out[f"abs_error {name}"] = float(np.abs(np.bincount(key, diff.data,
                                                       minlength=diff.shape[0] * query.n_answers)).sum())
    return out


def splits(d: Path, costs: list[int], queries: list[str]) -> None:
    """The captured Block chunks solved with each ``split_cost`` in turn (the values in the given order for each
    chunk): per value, CPU seconds and ms a block, the mean absolute error of a block's total, the L1 of its
    detailed cells per block, and the summed absolute error of each query, against the chunks' true histograms."""
    import io
    import tempfile
    from collections import Counter

    from topdown.pipeline.execution.tasks import run_chunk

    sums = {cost: Counter() for cost in costs}
    with tempfile.TemporaryDirectory() as tmp:
        for path in sorted((d / "block").glob("*.pkl")):
            for cost in costs:
                chunk = _MovedModules(io.BytesIO(path.read_bytes())).load()
                chunk.measurements_path = f"{tmp}/{path.stem}-{cost}.parquet"
                chunk.cfg = type(chunk.cfg).model_validate({**chunk.cfg.model_dump(), "estimation": {
                    **chunk.cfg.estimation.model_dump(), "split_cost": cost}})
                c0 = time.process_time()
                res = run_chunk(chunk)
                cpu = time.process_time() - c0
                sums[cost].update({"cpu_s": cpu, "blocks": len(chunk.children), "chunks": 1,
                                   **_errors(chunk.product, res.hist, chunk.child_hist, queries)})
    for cost, s in sums.items():
        blocks = max(s["blocks"], 1)
        print(json.dumps({"split_cost": cost, "chunks": s["chunks"], "blocks": s["blocks"],
                          "cpu_s": round(s["cpu_s"], 2), "cpu_ms_per_block": round(1000 * s["cpu_s"] / blocks, 1),
                          "mae_total": round(s["total"] / blocks, 3),
                          "l1_detailed_per_block": round(s["detailed"] / blocks, 2),
                          **{f"abs_error {q}": s[f"abs_error {q}"] for q in queries}}), flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    c = sub.add_parser("capture")
    c.add_argument("config")
    c.add_argument("--out", type=Path, required=True)
    c.add_argument("--every", type=int, default=0, help="also keep every N-th chunk of --level (0: none)")
    c.add_argument("--level", default="Block", help="the spine's last level, whose chunks --every keeps")
    b = sub.add_parser("blocks")
    b.add_argument("dir", type=Path)
    v = sub.add_parser("serve")
    v.add_argument("dir", type=Path)
    x = sub.add_parser("ab")
    x.add_argument("dir", type=Path)
    x.add_argument("--tree", action="append", required=True,
                   help="a PYTHONPATH to run the chunks with (repeat; '' = this tree)")
    x.add_argument("--rounds", type=int, default=1)
    t = sub.add_parser("splits")
    t.add_argument("dir", type=Path)
    t.add_argument("--costs", required=True, help="values of split_cost, comma-separated (0: no cost rule)")
    t.add_argument("--query", action="append", default=[], help="a query of the product to score (repeat)")
    p = sub.add_parser("profile")
    p.add_argument("dir", type=Path)
    p.add_argument("--repeats", type=int, default=3)
    args = ap.parse_args()
    if args.cmd == "capture":
        capture(args.config, args.out, args.every, args.level)
    elif args.cmd == "blocks":
        block_chunks(args.dir)
    elif args.cmd == "serve":
        serve(args.dir)
    elif args.cmd == "ab":
        ab(args.dir, args.tree, args.rounds)
    elif args.cmd == "splits":
        splits(args.dir, [int(v) for v in args.costs.split(",")], args.query)
    else:
        profile(args.dir, args.repeats)


if __name__ == "__main__":
    main()
