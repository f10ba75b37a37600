"""One synthetic parent solved inside a task of an N-worker Dask cluster, as the pipeline solves a level
with a single parent (a State -> County parent): a split parent's second-stage groups run as tasks of
the cluster (tasks.map_on_cluster). Prints one JSON object: wall seconds, the workers' CPU seconds,
wall / (CPU / workers) (1.0 when the workers never idle; at most 1.2 is the aim), each worker's CPU seconds and peak RSS, the
groups, and stage 1's CPU seconds (solved again alone in this process). On a loaded machine the wall
ratio is inflated; ``cpu_ratio`` is the load-free estimate from CPU seconds: stage 1 runs alone, then the
groups, so the level takes stage 1 + the busiest worker's group CPU, over the CPU spread evenly.
Usage: python benchmarks/split_spread.py [--case state215] [--workers 2] [--split-cost C] [--split-above N]
Set OPENBLAS_NUM_THREADS=1 for single-threaded figures (the pipeline's workers run one thread each).
"""
from __future__ import annotations

import argparse
import json
import resource
import time
from dataclasses import replace

import numpy as np
from parents import CASES, SPLIT_ABOVE, SPLIT_COST, SPLIT_GROUP, synthetic_parent


def _solve_in_task(problem):
    from topdown.pipeline.execution.tasks import map_on_cluster
    from topdown.solvers import solve_parent
    from topdown.solvers.backends import DEFAULT_BACKEND

    return solve_parent(problem, map_solve=map_on_cluster(DEFAULT_BACKEND)).stats.split


def _usage() -> tuple[float, float]:
    """This worker process's CPU seconds (all threads) and peak RSS in MB."""
    ru = resource.getrusage(resource.RUSAGE_SELF)
    return ru.ru_utime + ru.ru_stime, ru.ru_maxrss / 1024


def main() -> None:
    from distributed import Client, LocalCluster

    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--case", default="state215")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--split-above", type=int, default=SPLIT_ABOVE)
    ap.add_argument("--split-cost", type=int, default=SPLIT_COST)
    ap.add_argument("--split-group", type=int, default=SPLIT_GROUP)
    args = ap.parse_args()
    _, k, people, dense = CASES[args.case]
    problem = replace(synthetic_parent(np.random.default_rng(args.seed), k, people, dense),
                      split_above=args.split_above, split_cost=args.split_cost, split_group=args.split_group)
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True,
                      dashboard_address=None) as cluster, Client(cluster) as client:
        client.run(lambda: __import__("topdown.solvers"))  # imports before the clock starts
        before = client.run(_usage)
        t0 = time.perf_counter()
        future = client.submit(_solve_in_task, problem, pure=False)
        split = future.result()
        wall = time.perf_counter() - t0
        after = client.run(_usage)
        (home,) = client.who_has(future)[future.key]  # the worker that ran the parent's task (stage 1)
    used = {w: after[w][0] - before[w][0] for w in after}
    cpu = sum(used.values())
    stage1 = _stage1_cpu(problem) if split else 0.0
    critical = stage1 + max([used[home] - stage1] + [c for w, c in used.items() if w != home])
    each = sorted(used.values())
    print(json.dumps({"case": args.case, "workers": args.workers, "split": split, "wall_s": round(wall, 1),
                      "worker_cpu_s": round(cpu, 1), "wall_over_cpu_per_worker": round(wall / (cpu / args.workers), 2),
                      "worker_cpu_each_s": [round(c, 1) for c in each], "stage1_cpu_s": round(stage1, 1),
                      "cpu_ratio": round(critical / (cpu / args.workers), 2),
                      "worker_peak_rss_mb": sorted(round(after[w][1]) for w in after)}), flush=True)


def _stage1_cpu(problem) -> float:
    """CPU seconds of the split's stage 1 (the parent against its groups) alone, in this process."""
    from topdown.solvers import solve_parent
    from topdown.solvers.split import group_problem, groups_of

    stage1 = group_problem(problem, groups_of(problem))
    c0 = time.process_time()
    solve_parent(stage1)
    return time.process_time() - c0


if __name__ == "__main__":
    main()
