"""Joint against two-stage solves (solvers/split.py) of one synthetic parent: time and accuracy.

Prints one JSON object per mode: wall and CPU seconds, the groups, the failsafe level, and the mean absolute error per
child against the synthetic truth of TOTAL, HHGQ, VOTINGAGE x HISPANIC x CENRACE and the detailed cells.
Usage: python benchmarks/split_accuracy.py CHILDREN PEOPLE SEED [--modes joint,25]
(a mode is "joint", a group size, or "default": the pipeline's split rule). Set OPENBLAS_NUM_THREADS=1 for single-threaded figures.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np
from parents import SPLIT_ABOVE, SPLIT_COST, synthetic_case

from topdown.vocab.queries import build_query
from topdown.solvers import solve_parent

QUERIES = ("total", "hhgq", "votingage * hispanic * cenrace", "detailed")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("children", type=int)
    ap.add_argument("people", type=int)
    ap.add_argument("seed", type=int)
    ap.add_argument("--modes", default="joint,25")
    args = ap.parse_args()
    problem, truth = synthetic_case(np.random.default_rng(args.seed), args.children, args.people, True)
    for mode in args.modes.split(","):
        prob = (replace(problem, split_above=0, split_cost=0) if mode == "joint"
                else replace(problem, split_above=SPLIT_ABOVE, split_cost=SPLIT_COST) if mode == "default"
                else replace(problem, split_above=1, split_group=int(mode)))
        t0, c0 = time.perf_counter(), time.process_time()
        sol = solve_parent(prob)
        seconds, cpu_s = time.perf_counter() - t0, time.process_time() - c0
        errors = {q: round(float(np.abs(build_query(prob.schema, q).answer(sol.hist - truth)).mean()), 4)
                  for q in QUERIES}
        print(json.dumps({"children": args.children, "people": args.people, "seed": args.seed, "mode": mode,
                          "seconds": round(seconds, 1), "cpu_s": round(cpu_s, 1), "split": sol.stats.split,
                          "failsafe_level": sol.stats.level, **errors}),
              flush=True)


if __name__ == "__main__":
    main()
