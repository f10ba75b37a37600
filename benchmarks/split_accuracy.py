"""Joint against two-stage solves (solvers/split.py) of one synthetic parent: time and accuracy.

Prints one JSON object per mode: wall seconds, the failsafe level, and the mean absolute error per
child against the synthetic truth of TOTAL, HHGQ, VOTINGAGE x HISPANIC x CENRACE and the detailed cells.
Usage: python benchmarks/split_accuracy.py CHILDREN PEOPLE SEED [--modes joint,25]
(a mode is "joint" or a group size). Set OPENBLAS_NUM_THREADS=1 for single-threaded figures.
"""
from __future__ import annotations

import argparse
import json
import time
from dataclasses import replace

import numpy as np
from parents import synthetic_case

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
        prob = (replace(problem, split_above=0) if mode == "joint"
                else replace(problem, split_above=1, split_group=int(mode)))
        t0 = time.perf_counter()
        sol = solve_parent(prob)
        seconds = time.perf_counter() - t0
        errors = {q: round(float(np.abs(build_query(prob.schema, q).answer(sol.hist - truth)).mean()), 4)
                  for q in QUERIES}
        print(json.dumps({"children": args.children, "people": args.people, "seed": args.seed, "mode": mode,
                          "seconds": round(seconds, 1), "failsafe_level": sol.stats.level, **errors}),
              flush=True)


if __name__ == "__main__":
    main()
