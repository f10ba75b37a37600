"""CPU and peak memory of one parent's solve on a DHC-P-sized histogram (relgq 42 x sex 2 x age 116 x hispanic 2 x
cenrace 63 = 1,227,744 cells; DESIGN.md item 30): a block-group-like parent of ``--children`` children on
``--cells`` non-zero cells, measured on total, sex * age, relgq and detailed (synthetic counts and noise).

``--dense`` gives the parent and the detailed measurement as declared-size arrays (the only form the solvers
took before item 30; run it under the old tree too: ``PYTHONPATH=<shim>``); without it they are given sparse
(``SparseHist``, ``Measurement.answers``). Prints one JSON line: CPU seconds of the solve, the process's peak RSS
(MiB) and the count variables.

    python benchmarks/sparse_parent.py --dense
    PYTHONPATH=<shim of the old tree> python benchmarks/sparse_parent.py --dense
    python benchmarks/sparse_parent.py
"""
from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np

from topdown.solvers import Measurement, ParentProblem, solve_parent
from topdown.vocab.queries import build_query
from topdown.vocab.schema import Schema

DHCP = Schema("dhcp", (("relgq", 42), ("sex", 2), ("age", 116), ("hispanic", 2), ("cenrace", 63)))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--children", type=int, default=15)
    ap.add_argument("--cells", type=int, default=300)
    ap.add_argument("--dense", action="store_true")
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    rng = np.random.default_rng(args.seed)
    k = args.children
    support = np.sort(rng.choice(DHCP.ncells, args.cells, replace=False))
    counts = np.zeros((k, support.size), dtype=np.int64)
    for c in range(k):
        np.add.at(counts[c], rng.integers(0, support.size, 3 * support.size // k + 1), 1)
    keep = counts.sum(axis=0) > 0
    support, counts = support[keep], counts[:, keep]
    meas = []
    for name, var in (("total", 4.0), ("sex * age", 20.0), ("relgq", 20.0), ("detailed", 100.0)):
        q = build_query(DHCP, name)
        if name == "detailed":
            true = counts.astype(float)
        else:
            true = np.stack([q.answer_sparse(support, counts[c])
                             for c in range(k)])
        noisy = true + rng.normal(0, np.sqrt(var), true.shape)
        if name == "detailed" and args.dense:
            full = np.zeros((k, DHCP.ncells))
            full[:, support] = noisy
            meas.append(Measurement(name, full, np.full(k, var)))
        elif name == "detailed":
            meas.append(Measurement(name, noisy, np.full(k, var), answers=support))
        else:
            meas.append(Measurement(name, noisy, np.full(k, var)))
    if args.dense:
        parent = np.zeros(DHCP.ncells, dtype=np.int64)
        parent[support] = counts.sum(axis=0)
    else:
        from topdown.vocab.problem import SparseHist

        parent = SparseHist(support, counts.sum(axis=0), DHCP.ncells)
    problem = ParentProblem(DHCP, "bg", [f"b{i}" for i in range(k)], parent, meas,
                            l2_passes=[["total"], ["sex * age", "relgq", "detailed"]],
                            rounder_passes=[["total"], ["sex * age", "relgq", "detailed"]])
    t0 = time.process_time()
    sol = solve_parent(problem)
    cpu = time.process_time() - t0
    print(json.dumps({"dense_inputs": args.dense, "children": k, "parent_cells": int(support.size),
                      "cpu_s": round(cpu, 3), "peak_rss_mib": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1),
                      "n_x": sol.stats.n_x}))


if __name__ == "__main__":
    main()
