"""Start-up time of ``topdown`` commands, for one or two code trees measured alternately.

``python benchmarks/startup.py RUN [--tree SHIM ...] [--repeat 7]`` times ``topdown verify --help`` and
``topdown verify RUN`` in fresh processes (``python -m topdown.pipeline.cli``), each tree's import path on
PYTHONPATH ('' = the installed package), alternating trees so that the machine's load falls on both alike, and
prints per tree and command the median wall seconds, the median child CPU seconds (user + system), and whether
the process imported ``distributed`` (``python -X importtime``).
"""
from __future__ import annotations

import argparse
import os
import resource
import statistics
import subprocess
import sys
import time


def once(tree: str, argv: list[str]) -> tuple[float, float]:
    env = {**os.environ, "PYTHONPATH": tree} if tree else dict(os.environ)
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-m", "topdown.pipeline.cli", *argv], env=env, check=True,
                   stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def imports_distributed(tree: str, argv: list[str]) -> bool:
    env = {**os.environ, "PYTHONPATH": tree} if tree else dict(os.environ)
    done = subprocess.run([sys.executable, "-X", "importtime", "-m", "topdown.pipeline.cli", *argv], env=env,
                          stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)
    return any(line.rstrip().endswith("| distributed") for line in done.stderr.splitlines())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("run")
    ap.add_argument("--tree", action="append", default=None, help="a shim folder to put on PYTHONPATH ('' = installed)")
    ap.add_argument("--repeat", type=int, default=7)
    args = ap.parse_args()
    trees = args.tree or [""]
    commands = {"verify --help": ["verify", "--help"], "verify RUN": ["verify", args.run]}
    times = {(t, c): [] for t in trees for c in commands}
    for _ in range(args.repeat):
        for c, argv in commands.items():
            for t in trees:
                times[(t, c)].append(once(t, argv))
    print(f"load average at the end: {os.getloadavg()[0]:.2f}; {args.repeat} runs each, medians")
    print(f"{'tree':40s} {'command':14s} {'wall s':>7s} {'CPU s':>7s}  imports distributed")
    for (t, c), runs in times.items():
        wall = statistics.median(r[0] for r in runs)
        cpu = statistics.median(r[1] for r in runs)
        print(f"{t or '(installed)':40s} {c:14s} {wall:7.2f} {cpu:7.2f}  {imports_distributed(t, commands[c])}")


if __name__ == "__main__":
    main()
