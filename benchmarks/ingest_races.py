"""The ingest's choice for the collapsed groups (``--races spread|compact``): how it moves the
block-level error an evaluation reports.

``python benchmarks/ingest_races.py CSV WORK [--config conf/ri2010.toml] [--seeds 2010,2011,2012] [--workers 2]``
ingests the block table CSV both ways into WORK/input-{spread,compact}, runs CONFIG on each with every seed
(test mode; complete runs are reused), evaluates each choice's runs together and prints, per block-level persons
query, the mean absolute error over the seeds (and their standard deviation) for both choices and the ratio.
It also prints the true non-zero detailed cells per block of each input. Level-wide means only: no true count.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

CHOICES = ("spread", "compact")


def topdown(*argv: str | Path) -> None:
    subprocess.run([sys.executable, "-m", "topdown.pipeline.cli", *map(str, argv)], check=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("work", type=Path)
    ap.add_argument("--config", default="conf/ri2010.toml")
    ap.add_argument("--seeds", default="2010,2011,2012")
    ap.add_argument("--workers", default="2")
    args = ap.parse_args()
    seeds = args.seeds.split(",")
    means, cells = {}, {}
    for choice in CHOICES:
        inp = args.work / f"input-{choice}"
        if not (inp / "units.parquet").exists():
            topdown("ingest", "blocks", args.csv, "--out", inp, "--races", choice)
        persons = pd.read_parquet(inp / "persons.parquet")
        cells[choice] = len(persons.drop_duplicates()) / persons["geoid"].nunique()
        runs = []
        for seed in seeds:
            out = args.work / f"run-{choice}-{seed}"
            if not (out / "manifest.json").exists() or '"complete"' not in (out / "manifest.json").read_text():
                topdown("run", args.config, "--input", inp, "--out", out, "--seed", seed, "--workers", args.workers,
                        "--quiet", "--force")
            runs.append(out)
        ev = args.work / f"evaluation-{choice}"
        topdown("evaluate", *runs, "--truth", inp, "--out", ev, "--workers", args.workers)
        s = pd.read_parquet(ev / "summary.parquet")
        s = s[(s["product"] == "persons") & (s["level"] == "Block")]
        means[choice] = s.groupby("query")["mean_abs_error"].mean()
        means[f"{choice} sd"] = s.groupby("query")["mean_abs_error"].std()
    table = pd.DataFrame(means)
    table["compact / spread"] = table["compact"] / table["spread"]
    print(f"true non-zero detailed cells per block: " + ", ".join(f"{c} {cells[c]:.2f}" for c in CHOICES))
    print(f"block-level mean absolute error over seeds {args.seeds}:")
    print(table.round(3).to_string())


if __name__ == "__main__":
    main()
