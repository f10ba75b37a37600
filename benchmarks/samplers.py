"""Throughput of the exact noise samplers, one JSON object per line.

For sigma2 in {1.2, 20, 8000} it times the discrete Gaussian and the two-sided geometric mechanism with
sensitivity 2 at (about) the same variance, in this single process. ``per_core`` divides by the
process CPU time (so other load on the machine does not count); ``wall`` by elapsed time.

    python benchmarks/samplers.py [--n 2000000] [--repeat 3]
"""
from __future__ import annotations

import argparse
import json
import math
import platform
import time
from fractions import Fraction
from typing import Callable

import numpy as np

from topdown.pipeline.privacy.mechanisms import discrete_gaussian, geometric, geometric_variance
from topdown.pipeline.privacy.rng import SeededSource

SIGMA2 = (Fraction(6, 5), Fraction(20), Fraction(8000))


def epsilon_for_variance(variance: float, sensitivity: int = 2) -> Fraction:
    """An exact epsilon whose geometric noise has about ``variance``: 1 / (2 sinh^2(lam / 2)) = variance."""
    lam = 2 * math.asinh(1 / math.sqrt(2 * variance))
    return Fraction(lam * sensitivity).limit_denominator(1 << 20)


def measure(draw: Callable[[int], np.ndarray], n: int, repeat: int) -> dict[str, float]:
    draw(10_000)                                             # warm-up
    best_cpu, best_wall = math.inf, math.inf
    for _ in range(repeat):
        c0, w0 = time.process_time(), time.perf_counter()
        y = draw(n)
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    return {"per_core": n / best_cpu, "wall": n / best_wall, "sample_var": float(y.astype(float).var())}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=2_000_000, help="samples per timing")
    parser.add_argument("--repeat", type=int, default=3, help="timings per case (best is reported)")
    args = parser.parse_args()
    for sigma2 in SIGMA2:
        src = SeededSource(0, "bench", f"dg-{sigma2}")
        r = measure(lambda k: discrete_gaussian(src, sigma2, k), args.n, args.repeat)
        print(json.dumps({"mechanism": "discrete_gaussian", "sigma2": str(sigma2), "variance": float(sigma2),
                          "n": args.n, "samples_per_s_per_core": round(r["per_core"]),
                          "samples_per_s_wall": round(r["wall"]), "sample_variance": round(r["sample_var"], 3),
                          "python": platform.python_version(), "numpy": np.__version__}), flush=True)
        eps = epsilon_for_variance(float(sigma2))
        src = SeededSource(0, "bench", f"geo-{eps}")
        r = measure(lambda k: geometric(src, eps, 2, k), args.n, args.repeat)
        print(json.dumps({"mechanism": "geometric", "epsilon": str(eps), "sensitivity": 2,
                          "variance": round(geometric_variance(eps, 2), 4), "n": args.n,
                          "samples_per_s_per_core": round(r["per_core"]), "samples_per_s_wall": round(r["wall"]),
                          "sample_variance": round(r["sample_var"], 3),
                          "python": platform.python_version(), "numpy": np.__version__}), flush=True)


if __name__ == "__main__":
    main()
