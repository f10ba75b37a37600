"""How the ``calibrated`` intervals (pipeline/evaluation/calibrated.py) were chosen and checked:
TopDown's bias and spread of the total by true size in three generations, and the coverage of the method with
and without its generational step (C4), against a known truth.

    python benchmarks/calibrated_coverage.py RUN --truth INPUT --uncertainty FILE --replicates REPS --calibrate REPS2

FILE: ``topdown uncertainty RUN --out FILE --replicates REPS --calibrate REPS2`` (its ``amc`` rows hold the first
generation's statistics). Printed, per level (``--levels``, default Block Block_Group Tract):

1. bias ``b`` and spread ``s`` (C1-C2) at true sizes ``t``: ``1`` truth -> published (fitted by TRUE size from the
   truth: what the method must reproduce, unseen by it), ``2`` published -> replicates (REPS), ``3`` replicate
   -> its replicates (REPS2), and ``C4``, the method's extrapolation one generation back from 2 and 3;
2. coverage of the true total per level and true-size bin (benchmarks/coverage.py) of ``calibrated`` (the
   file's rows, with C4) and ``calibrated_gen1`` (C1-C3 on the first generation alone, computed here), beside
   ``gls`` and ``amc``, and the mean widths.

Confidential: the output is about the true counts; keep it private.
"""
from __future__ import annotations

import argparse
import importlib.util
import sys
from pathlib import Path

import numpy as np
import pandas as pd

from topdown.pipeline.evaluation import calibrated as cal
from topdown.pipeline.evaluation.amc import Tabulator, replicate_dirs
from topdown.pipeline.evaluation.uncertainty import Source

_spec = importlib.util.spec_from_file_location("coverage_bench", Path(__file__).with_name("coverage.py"))
cov = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(cov)

GRID = {"Block": [0, 1, 2, 3, 5, 7, 10, 15, 20, 30, 40, 50, 75, 100, 150, 250, 400, 700]}
UPPER_GRID = [100, 250, 500, 1_000, 2_000, 5_000]


def generations(src, table: pd.DataFrame, reps: Path, second: Path, level: str) -> pd.DataFrame:
    """Part 1 for the total at ``level``: b and s of each generation and of (C4) at the grid's true sizes."""
    rows = table[(table["level"] == level) & (table["method"] == "amc") & (table["query"] == "total")]
    err = (rows["published"] - rows["truth"]).to_numpy()
    m1 = cal.fit(cal.bin_sums(rows["truth"].to_numpy(), err, err * err))
    m2 = cal.fit(cal.bin_sums(rows["published"].to_numpy(), rows["rep_bias"].to_numpy(),
                              rows["rep_rmse"].to_numpy() ** 2))
    base, kept = cal.second_generation(reps, second)
    key = (rows["product"].iloc[0], level, "total")
    tab = Tabulator(src, None, [key])
    mask = np.ones_like(tab.zeros(key[0])[key], dtype=bool)
    m3 = cal.fit(cal.second_sums(tab, {key: mask}, base, kept)[key])
    out = pd.DataFrame({"t": GRID.get(level, UPPER_GRID)})
    for name, m in (("1", m1), ("2", m2), ("3", m3), ("C4", cal.extrapolate(m2, m3))):
        out[f"b{name}"], out[f"s{name}"] = m.at(out["t"].to_numpy(np.float64))
    return out[["t", "b1", "b2", "b3", "bC4", "s1", "s2", "s3", "sC4"]]


def first_generation_rows(unc: pd.DataFrame) -> pd.DataFrame:
    """(C1)-(C3) on the ``amc`` rows alone (no C4), as method ``calibrated_gen1``."""
    amc_rows = unc[unc["method"] == "amc"].reset_index(drop=True)
    sums: dict = {}
    cal.add_sums(sums, amc_rows)
    return cal.rows(amc_rows, {k: cal.fit(v) for k, v in sums.items()}).assign(method="calibrated_gen1")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run", type=Path)
    parser.add_argument("--truth", required=True, type=Path)
    parser.add_argument("--uncertainty", required=True, type=Path)
    parser.add_argument("--replicates", required=True, type=Path)
    parser.add_argument("--calibrate", required=True, type=Path)
    parser.add_argument("--product", default="persons")
    parser.add_argument("--levels", nargs="+", default=["Block", "Block_Group", "Tract"])
    args = parser.parse_args(argv)
    src = Source.open(args.run)
    unc = cov.read_rows(args.uncertainty, args.product, ())
    unc = unc[unc["level"].isin(src.levels)]
    unc = pd.concat([unc, first_generation_rows(unc)], ignore_index=True)
    table = cov.truth_rows(args.run, args.truth, unc)
    print(f"replicates: {len(replicate_dirs(args.replicates))} first generation, "
          f"{len(cal.second_generation(args.replicates, args.calibrate)[1])} second generation")
    for level in args.levels:
        print(f"\n### Bias and spread of the total by true size, {level}: 1 truth->published, 2 published->"
              "replicate, 3 replicate->its replicate, C4 the extrapolation from 2 and 3\n")
        print(cov.markdown(generations(src, table, args.replicates, args.calibrate, level).round(2)))
    out = cov.tables(table)
    print("\n### Coverage of the true total, per method, level and block-size bin (true total)\n")
    print(cov.markdown(out["coverage_total"]))
    print("\n### Mean interval width (total) per method and level, and the mean absolute errors\n")
    print(cov.markdown(out["widths"]))
    return 0


if __name__ == "__main__":
    sys.exit(main())
