"""How long a parent's solve keeps other threads of its process waiting (a Dask worker's event loop, which sends its
heartbeats, is such a thread): a thread that wakes every 5 ms records the longest gap between its wake-ups while
``solve_parent`` runs with each back end.

Prints one JSON object per back end: wall and CPU seconds (the solver helper's included), the longest QP and the
longest gap.
Usage: python benchmarks/gil_hold.py [--case county30] (a case of benchmarks/parents.py)
"""
from __future__ import annotations

import argparse
import json
import os
import threading
import time

import numpy as np
import psutil

from parents import CASES, synthetic_parent
from topdown.solvers import isolated, solve_parent
from topdown.solvers.backends import ClarabelHighs, PiqpHighs

BACKENDS = {"piqp in process": PiqpHighs(isolate_above=None), "piqp in a helper": PiqpHighs(isolate_above=0),
            "clarabel-highs": ClarabelHighs()}


def longest_gap(fn) -> tuple[float, object]:
    """The longest gap (seconds) between the 5 ms wake-ups of another thread while ``fn()`` runs, and its result."""
    gaps, stop = [0.0], threading.Event()

    def tick() -> None:
        last = time.perf_counter()
        while not stop.is_set():
            time.sleep(0.005)
            now = time.perf_counter()
            gaps[0] = max(gaps[0], now - last)
            last = now

    thread = threading.Thread(target=tick)
    thread.start()
    try:
        result = fn()
    finally:
        stop.set()
        thread.join()
    return gaps[0], result


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--case", default="county30", choices=sorted(CASES))
    args = ap.parse_args()
    _, k, people, dense = CASES[args.case]
    problem = synthetic_parent(np.random.default_rng(0), k, people, dense)
    helper = psutil.Process(isolated.call(os.getpid))  # started before the clocks run
    for name, backend in BACKENDS.items():
        h0, c0, w0 = sum(helper.cpu_times()[:2]), time.process_time(), time.perf_counter()
        gap, sol = longest_gap(lambda: solve_parent(problem, backend))
        wall, cpu = time.perf_counter() - w0, time.process_time() - c0 + sum(helper.cpu_times()[:2]) - h0
        print(json.dumps({"case": args.case, "backend": name, "columns": max(st["columns"] for st in sol.stats.l2),
                          "wall_s": round(wall, 2), "cpu_s": round(cpu, 2),
                          "longest_qp_s": round(max(st["qp_s"] for st in sol.stats.l2), 2),
                          "longest_gap_s": round(gap, 3)}), flush=True)


if __name__ == "__main__":
    main()
