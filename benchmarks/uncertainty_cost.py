"""``uncertainty`` against ``reprocess`` of the same run, back to back: CPU and peak memory per
process of each, alternating, so that both see the same load.

    python benchmarks/uncertainty_cost.py RUN --work DIR [--repeat 2] [--workers 2] [--replicates REPS]

Runs ``reprocess RUN`` then ``uncertainty RUN`` (each measured by ``process_cost.measure``: the command's own
process, which holds the embedded scheduler, and its workers), ``--repeat`` times, and prints one Markdown row
per command and the ratios uncertainty / reprocess: of each pair, and of the means. Outputs go under DIR and
are removed after each command.
"""
from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from process_cost import Cost, measure  # noqa: E402

MIB = 2 ** 20
HEADER = ("| # | command | load before -> after | wall | CPU total | client CPU | worker CPU | peak RSS client "
          "| peak RSS largest worker |\n| --- | --- | --- | ---: | ---: | ---: | ---: | ---: | ---: |")


def row(k: int, name: str, cost: Cost, load: tuple[float, float]) -> str:
    """One Markdown row of a measured command."""
    return (f"| {k} | `{name}` | {load[0]:.1f} -> {load[1]:.1f} | {cost.wall:.0f} s | {cost.cpu:.1f} s | "
            f"{cost.client_cpu:.1f} s | {cost.cpu - cost.client_cpu:.1f} s | {cost.peak.get(cost.root, 0) / MIB:.0f} MiB | "
            f"{max(cost.others, default=0) / MIB:.0f} MiB |")


def ratios(pairs: list[tuple[Cost, Cost]]) -> list[str]:
    """uncertainty / reprocess of CPU, client peak and largest worker peak, per pair and of the means."""
    def measures(c: Cost) -> tuple[float, float, float]:
        return c.cpu, c.peak.get(c.root, 0), max(c.others, default=0)

    lines = []
    for k, (rep, unc) in enumerate(pairs, 1):
        r = [u / p for u, p in zip(measures(unc), measures(rep))]
        lines.append(f"pair {k}: CPU {r[0]:.2f}x, client peak {r[1]:.2f}x, largest worker peak {r[2]:.2f}x")
    mean = [statistics.mean(measures(c)[i] for _, c in pairs) / statistics.mean(measures(c)[i] for c, _ in pairs)
            for i in range(3)]
    lines.append(f"means: CPU {mean[0]:.2f}x, client peak {mean[1]:.2f}x, largest worker peak {mean[2]:.2f}x")
    return lines


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", help="a complete run directory")
    parser.add_argument("--work", required=True, type=Path, help="folder for the outputs (created)")
    parser.add_argument("--repeat", type=int, default=2, help="pairs of commands (default 2)")
    parser.add_argument("--workers", type=int, default=2)
    parser.add_argument("--replicates", help="a `topdown replicates` folder for uncertainty's amc rows")
    args = parser.parse_args(argv)
    args.work.mkdir(parents=True, exist_ok=True)
    common = ["--workers", str(args.workers), "--quiet"]
    commands = [("reprocess", ["reprocess", args.run, "--out", str(args.work / "reprocess"), *common]),
                ("uncertainty", ["uncertainty", args.run, "--out", str(args.work / "uncertainty.parquet"), *common,
                                 *(["--replicates", args.replicates] if args.replicates else [])])]
    print(HEADER, flush=True)
    pairs = []
    for k in range(1, args.repeat + 1):
        pair = []
        for name, cmd in commands:
            before = os.getloadavg()[0]
            cost = measure([sys.executable, "-m", "topdown.pipeline.cli", *cmd])
            print(row(k, name, cost, (before, os.getloadavg()[0])), flush=True)
            if cost.code:
                print(f"{name} exited {cost.code}", file=sys.stderr)
                return 1
            pair.append(cost)
            shutil.rmtree(args.work / "reprocess", ignore_errors=True)
            (args.work / "uncertainty.parquet").unlink(missing_ok=True)
        pairs.append(tuple(pair))
    print("\n".join(ratios(pairs)))
    return 0


if __name__ == "__main__":
    sys.exit(main())
