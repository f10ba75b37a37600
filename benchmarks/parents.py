"""Time solve_parent on census-like synthetic parents: our Pyomo path against the direct numpy/scipy
build of the same problem solved by the same back ends and the same pass code (the floor).

Prints one JSON object per line: level, children, people, variables, ours_s, floor_s (medians of wall
seconds), ours_cpu_s (median CPU seconds: the figure to use on a shared, loaded machine), ratio,
where our time goes (model build and compile, L2 QPs, tau LPs, rounder LPs) and the process's peak RSS.
Usage: python benchmarks/parents.py [--cases bg15,bg80,tract5,county30,state60 (default)]
       [--repeats 3] [--no-floor] [--steps] [--split-above N] [--split-cost C] [--split-group G]
Cases at the 2020 national averages of children per parent (Abowd et al. 2022, the TDA paper, Table 2;
benchmarks/projection.py):
bg14, tract5, county24, state40, us88; the largest parents: state250 (a state of 250 counties, Texas-like)
and county2000 (a county of 2,000 tracts, Los Angeles-like); state215 (the California-sized synthetic state:
215 counties, 39.5 M persons).
Set OPENBLAS_NUM_THREADS=1 for single-threaded figures (solver_notes pitfall 3).
"""
from __future__ import annotations

import argparse
import json
import resource
import statistics
import time
from dataclasses import asdict, replace

import numpy as np

from topdown.pipeline.configuration.config import EstimationConfig
from topdown.vocab.queries import build_query
from topdown.pipeline.configuration.census import PERSONS
from topdown.pipeline.inputs.ingest import CENRACE_COMBOS
from topdown.solvers import Constraint, Measurement, ParentProblem, solve_parent
from topdown.solvers.direct import compile_direct
from topdown.solvers.model import compile_pyomo

#: Variances per query (solver_notes "Synthetic workload").
VARIANCES = {"total": 4, "cenrace": 20, "hispanic": 10, "votingage": 10, "hhinstlevels": 10, "hhgq": 15,
             "hispanic * cenrace": 30, "votingage * cenrace": 30, "votingage * hispanic": 12,
             "votingage * hispanic * cenrace": 50, "detailed": 100}
L2_PASSES = [["total"], [q for q in VARIANCES if q != "total"]]
ROUNDER_PASSES = [["total"], ["hhgq", "hhgq * hispanic", "hhgq * hispanic * cenrace",
                              "hhgq * votingage * hispanic * cenrace", "detailed"]]
#: name: (level, children, people, dense)
CASES = {"bg15": ("Block_Group -> Block", 15, 830, False), "bg80": ("Block_Group -> Block", 80, 3200, False),
         "tract5": ("Tract -> Block_Group", 5, 4000, False), "county30": ("County -> Tract", 30, 120_000, True),
         "state60": ("State -> County", 60, 1_500_000, True),
         # national averages: 331M persons; 5,892,698 blocks / 409,548 block groups / 84,589 tracts /
         # 3,496 counties / 88 state parts
         "bg14": ("Block_Group -> Block", 14, 810, False), "county24": ("County -> Tract", 24, 95_000, True),
         "state40": ("State -> County", 40, 3_760_000, True), "us88": ("US -> State", 88, 331_000_000, True),
         "state250": ("State -> County", 250, 29_000_000, True),
         "county2000": ("County -> Tract", 2000, 10_000_000, True),
         "state215": ("State -> County", 215, 39_500_000, True)}
#: The pipeline's defaults for two-stage solves of huge parents (solvers/split.py).
SPLIT_ABOVE = EstimationConfig.model_fields["split_above"].default
SPLIT_GROUP = EstimationConfig.model_fields["split_group"].default
SPLIT_COST = EstimationConfig.model_fields["split_cost"].default
NATIONAL = np.array([0.616, 0.124, 0.011, 0.060, 0.002, 0.084])  # White, Black, AIAN, Asian, NHPI, SOR


def cell_distribution(rng: np.random.Generator, dense: bool) -> np.ndarray:
    """Probabilities over the 2016 person cells: Dirichlet race mix around national shares, Beta
    Hispanic share, ~77% adults, ~2.5% in group quarters, no minors in nursing facilities."""
    single = rng.dirichlet(NATIONAL * (200 if dense else 20))
    multi = np.array([np.prod([single[r] for r in range(6) if bits[r]]) ** (0.6 if dense else 0.9)
                      for bits in CENRACE_COMBOS])
    single_mask = np.array([sum(b) for b in CENRACE_COMBOS]) == 1
    race = 0.85 * multi * single_mask / (multi * single_mask).sum() + 0.15 * rng.dirichlet(np.full(63, 0.3))
    race /= race.sum()
    hisp = rng.beta(1.5, 3)
    hh = np.array([0.975] + [0.025 / 7] * 7)
    p = (hh[:, None, None, None] * np.array([0.23, 0.77])[None, :, None, None]
         * np.array([1 - hisp, hisp])[None, None, :, None] * race[None, None, None, :])
    p[3, 0] = 0.0
    return (p / p.sum()).reshape(-1)


def synthetic_parent(rng: np.random.Generator, k: int, people: int, dense: bool) -> ParentProblem:
    """Children with Dirichlet(0.8) sizes and their own race affinity; facilities per child."""
    return synthetic_case(rng, k, people, dense)[0]


def synthetic_case(rng: np.random.Generator, k: int, people: int, dense: bool) -> tuple[ParentProblem, np.ndarray]:
    """The synthetic parent and its true child histograms (int64[k, 2016])."""
    base = cell_distribution(rng, dense)
    sizes = rng.multinomial(people, rng.dirichlet(np.full(k, 0.8)))
    truth = np.zeros((k, PERSONS.ncells), dtype=np.int64)
    for c in range(k):
        p = base * rng.gamma(2.0, 1.0, PERSONS.ncells) ** (0.3 if dense else 1.0)
        if not dense:  # a block has group quarters of a few types only
            hh = PERSONS.unravel(np.arange(PERSONS.ncells))[0]
            p[(hh > 0) & ~np.isin(hh, rng.choice(np.arange(1, 8), 1))] = 0.0
            p[(hh > 0)] *= rng.random() < 0.2
        truth[c] = rng.multinomial(sizes[c], p / p.sum())
    per_type = build_query(PERSONS, "hhgq").answer(truth)
    facilities = np.where(per_type > 0, np.minimum(per_type, 1 + rng.poisson(per_type / 50.0)), 0)
    constraints = [Constraint("hhgq_total_lb", "hhgq", ">=", np.where(np.arange(8) == 0, 0, facilities).astype(float)),
                   Constraint("hhgq_total_ub", "hhgq", "<=", (facilities + (np.arange(8) == 0)) * 99999.0),
                   Constraint("nurse_nva_0", "gqNursingTotal * nonvoting", "==", np.zeros((k, 1)))]
    meas = []
    for q, var in VARIANCES.items():
        ans = build_query(PERSONS, q).answer(truth).astype(float)
        meas.append(Measurement(q, ans + rng.normal(0.0, np.sqrt(var), ans.shape), np.full(k, float(var))))
    return ParentProblem(PERSONS, "synthetic", [f"{c:04d}" for c in range(k)], truth.sum(axis=0), meas,
                         constraints, l2_passes=L2_PASSES, rounder_passes=ROUNDER_PASSES), truth


def timed(problem: ParentProblem, compiler) -> tuple[float, dict]:
    """Wall seconds of one solve; its CPU seconds (this process, single-threaded) go into the stats."""
    t0, c0 = time.perf_counter(), time.process_time()
    sol = solve_parent(problem, compiler=compiler)
    return time.perf_counter() - t0, {**asdict(sol.stats), "cpu_s": time.process_time() - c0}


def where(stats: dict) -> dict:
    """Seconds of the pieces a solve reports: build (layout, model, compile), QPs, tau LPs, rounder LPs."""
    l2 = stats.get("l2", [])
    return {"build_s": stats.get("build_s"), "qp_s": round(sum(st.get("qp_s", 0.0) for st in l2), 3),
            "tau_lp_s": round(sum(st.get("tau_lp_s", 0.0) for st in l2), 3),
            "rounder_lp_s": round(sum(st.get("lp_s", 0.0) for st in stats.get("rounder", [])), 3)}


def trace_steps() -> None:
    """Print each solve step's wall and CPU seconds and the peak RSS to stderr as it ends (for parents
    too large to wait for: what finished, and where the time went, survives a timeout)."""
    import functools
    import sys

    from topdown.solvers import model, solve

    def wrap(module, name: str) -> None:
        f = getattr(module, name)

        @functools.wraps(f)
        def timed_step(*a, **k):
            t0, c0 = time.perf_counter(), time.process_time()
            try:
                return f(*a, **k)
            finally:
                print(f"  step {name}: {time.perf_counter() - t0:.2f} s wall, {time.process_time() - c0:.2f} s CPU, "
                      f"peak RSS {resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024:.0f} MB",
                      file=sys.stderr, flush=True)
        setattr(module, name, timed_step)

    for name in ("build_layout", "run_l2", "run_rounder", "check_rows"):
        wrap(solve, name)
    for name in ("build_model", "compile_model"):
        wrap(model, name)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--cases", default="bg15,bg80,tract5,county30,state60")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--no-floor", dest="floor", action="store_false", help="skip the direct-build floor")
    ap.add_argument("--steps", action="store_true", help="print every solve step's time to stderr")
    ap.add_argument("--split-above", type=int, default=SPLIT_ABOVE,
                    help=f"two-stage solve above this many children (default: the pipeline's, {SPLIT_ABOVE}; 0: no "
                         f"children-count rule; with --split-cost 0: always joint)")
    ap.add_argument("--split-cost", type=int, default=SPLIT_COST,
                    help=f"two-stage solve above this many children x non-zero parent cells (default: the "
                         f"pipeline's, {SPLIT_COST}; 0: children count only)")
    ap.add_argument("--split-group", type=int, default=SPLIT_GROUP, help=f"children per group (default {SPLIT_GROUP})")
    args = ap.parse_args()
    if args.steps:
        trace_steps()
    timed(synthetic_parent(np.random.default_rng(args.seed), *CASES["bg15"][1:]), compile_pyomo)  # warm imports
    for name in args.cases.split(","):
        level, k, people, dense = CASES[name]
        t0 = time.perf_counter()
        problem = replace(synthetic_parent(np.random.default_rng(args.seed), k, people, dense),
                          split_above=args.split_above, split_cost=args.split_cost, split_group=args.split_group)
        gen_s = time.perf_counter() - t0
        ours, ours_cpu, floor = [], [], []
        for _ in range(args.repeats):
            t, stats = timed(problem, compile_pyomo)
            ours.append(t)
            ours_cpu.append(stats["cpu_s"])
            if args.floor:
                floor.append(timed(problem, compile_direct)[0])
        o = statistics.median(ours)
        f = statistics.median(floor) if floor else None
        print(json.dumps({"case": name, "level": level, "children": k, "people": people,
                          "nonzero_parent_cells": int((problem.parent_hist > 0).sum()), "variables": stats["n_x"],
                          "columns": stats["n_cols"], "rows": stats["n_rows"], "ours_s": round(o, 4),
                          "ours_cpu_s": round(statistics.median(ours_cpu), 4),
                          "floor_s": None if f is None else round(f, 4),
                          "ratio": None if f is None else round(o / f, 2), **where(stats),
                          "failsafe_level": stats["level"], "rounder_milp": stats["rounder_milp"],
                          "split": stats.get("split"),
                          "generate_s": round(gen_s, 2),
                          "peak_rss_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024)}),
              flush=True)


if __name__ == "__main__":
    main()
