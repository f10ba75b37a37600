"""Errors of E2E 1940 runs as Petti and Flaxman measure them, beside their published figures.

Petti & Flaxman, "Differential privacy in the 2020 US census: what will it do? Quantifying the accuracy/privacy
tradeoff", Gates Open Research 3:1722 (2019/2020), ran the 2018 End-to-End TopDown on the 1940 full count, 4
runs per epsilon; their figures are the JSON files of GitHub aflaxman/dp_2020_census (anchors below). Their
metrics, per geographic level, pooled over the runs of one epsilon:

* TC: the total count of each geounit; the error is DP - exact of every geounit.
* SC: the counts stratified by voting age x race x ethnicity (their code groups by state, county, enum_dist,
  age, race, eth: summed over the group-quarters types; here the query "age18plus * hispanic * race", 24
  answers per geounit). Only the answers present in the exact or the DP data count: an answer zero in both is
  left out (their outer merge of two grouped frames).
* median, 95th percentile and root mean square of the absolute errors; their quantiles are numpy's default
  (linear interpolation: np.median, np.quantile), as here (:func:`linear_quantile`).
* Also given, without an anchor: "cells", the 192 single cells of the histogram (GQ type x voting age x
  ethnicity x race), zero-zero cells left out the same way.

Levels: Enumdist (ED), County, State. The truth is the run's input, read one row group at a time as a run
reads it (validate.check_records); estimates are read a batch at a time (evaluate.RunView); a level is held
as numpy arrays of (node, cell, count), never as a frame. Runs are grouped by their certified epsilon.

The output (``--out``, default ``RUN-petti_flaxman-CONFIDENTIAL.json`` beside the first run, a private file,
never inside a published output: ``outdir.claimed_file``) holds error statistics only, no true count.
``--describe-input`` also prints, to the terminal only, the input's median and 95th-percentile TC and median non-zero SC answer per level: statistics of TRUE counts, for a
synthetic input (to compare its shape with the 1940 file's), never for confidential data.

Usage: python benchmarks/petti_flaxman.py --truth INPUT [--out FILE] [--describe-input] RUN [RUN ...]
"""
from __future__ import annotations

import argparse
import json
import os
import sys
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from topdown.pipeline.cli import EXIT_INPUT, EXIT_RUNDIR, input_errors
from topdown.pipeline.evaluation import metrics as M
from topdown.pipeline.evaluation.evaluate import EvaluationError, RunView
from topdown.pipeline.execution.dataplane import find_input
from topdown.pipeline.runtime.outdir import MARKER_KEY, claimed_file
from topdown.pipeline.runtime.private_files import private_file
from topdown.pipeline.runtime.rundir import RunDirError
from topdown.pipeline.inputs.tabulate import sparse_counts
from topdown.pipeline.inputs.validate import check_records
from topdown.pipeline.privacy.budget import of_entry
from topdown.vocab.census import Census, Product
from topdown.vocab.queries import build_query

PRODUCT = "persons"
#: Petti & Flaxman's levels and their names in the e2e_1940 census.
LEVELS = {"ED": "Enumdist", "county": "County", "state": "State"}
#: Their counts (TC the geounit's total, SC voting age x race x ethnicity) and the histogram's single cells.
QUERIES = {"TC": "total", "SC": "age18plus * hispanic * race", "cells": "detailed"}
#: Petti & Flaxman (Gates Open Research 3:1722), via GitHub aflaxman/dp_2020_census: (median, p95, RMSE) of
#: |DP - exact| pooled over 4 runs, per epsilon, count and level. TC at state level is invariant (0).
ANCHORS: dict[str, dict[tuple[str, str], tuple[int, int, int]]] = {
    "0.25": {("TC", "ED"): (56, 190, 93), ("TC", "county"): (81, 277, 140), ("SC", "ED"): (17, 107, 49),
             ("SC", "county"): (16, 107, 48), ("SC", "state"): (18, 110, 50)},
    "1": {("TC", "ED"): (15, 52, 26), ("TC", "county"): (24, 81, 41), ("SC", "ED"): (6, 29, 14),
          ("SC", "county"): (6, 29, 14), ("SC", "state"): (7, 29, 14)},
    "4": {("TC", "ED"): (4, 14, 7), ("TC", "county"): (7, 22, 12), ("SC", "ED"): (2, 8, 4),
          ("SC", "county"): (2, 8, 4), ("SC", "state"): (2, 8, 4)},
}
#: Their input (the 1940 full count): median TC, p95 TC and median SC answer per level (the shape a synthetic input
#: is held to).
ANCHOR_INPUT = {"ED": (865, 2_342, 88), "county": (18_679, 122_710, 47), "state": (1_903_133, 7_419_040, 229)}


@dataclass
class LeafTruth:
    """True leaf histograms: ``geoids`` and, per non-zero cell, the index of its geoid, its cell and count."""

    geoids: np.ndarray
    leaf: np.ndarray
    cell: np.ndarray
    count: np.ndarray


def read_truth(truth: Path, census: Census, product: Product) -> LeafTruth:
    """The input's leaf histograms, read one Parquet row group at a time as a run reads it."""
    geoids, leaf, cell, count, offset = [], [], [], [], 0
    for path in find_input(truth, census).persons:
        for group in range(pq.ParquetFile(path).num_row_groups):
            geo, cells, _ = check_records(path, product, census.hierarchy, [group])
            part = sparse_counts(geo, cells, product.schema.ncells)  # one row group's rows, sorted by geocode
            codes, uniq = np.unique(part["geocode"].to_numpy(dtype=str), return_inverse=True)
            geoids.append(codes)
            leaf.append(uniq + offset)
            cell.append(part["cell"].to_numpy(np.int64))
            count.append(part["count"].to_numpy(np.int64))
            offset += codes.size
    if not geoids:
        raise EvaluationError(f"{truth}: no person records")
    return LeafTruth(np.concatenate(geoids), np.concatenate(leaf), np.concatenate(cell), np.concatenate(count))


def truth_at(view: RunView, truth: LeafTruth, level: str) -> M.SparseHist:
    """The true histograms of ``level``'s nodes by the run's spine (a leaf split over row groups adds up)."""
    rows = view.geoid_index.get_indexer(truth.geoids)
    if (rows < 0).any():
        raise EvaluationError(f"{view.root / 'spine.parquet'}: input leaf {truth.geoids[np.flatnonzero(rows < 0)[0]]} "
                              "is not in the run's spine (input and run do not match)")
    return M.SparseHist(view.codes[level][rows[truth.leaf]], truth.cell, truth.count, len(view.nodes[level]))


def abs_errors(true: M.SparseHist, est: M.SparseHist, query: str, schema, skip_zero_zero: bool
               ) -> tuple[np.ndarray, np.ndarray]:
    """Distinct |DP - exact| values over all answers of all geounits and how often each occurs; with
    ``skip_zero_zero`` the answers that are zero in both are left out (Petti & Flaxman's SC)."""
    q = build_query(schema, query)
    qe = M.query_errors(true, est, q, dense_limit=0)
    values, counts = np.abs(qe.values), qe.counts.copy()
    if skip_zero_zero:
        either = np.union1d(M.answer_totals(true, q)[0], M.answer_totals(est, q)[0]).size
        counts[values == 0] -= true.n_units * q.n_answers - either
    return values, counts


def linear_quantile(values: np.ndarray, counts: np.ndarray, q: float) -> float:
    """``np.quantile(np.repeat(values, counts), q)`` (linear interpolation) without repeating the values."""
    order = np.argsort(values, kind="stable")
    values, cum = np.asarray(values, dtype=float)[order], np.cumsum(counts[order])
    pos = (cum[-1] - 1) * q
    lo, hi = values[np.searchsorted(cum, [np.floor(pos), np.ceil(pos)], side="right")]
    return float(lo + (hi - lo) * (pos - np.floor(pos)))


def summarize(values: np.ndarray, counts: np.ndarray) -> dict:
    """median, p95 and RMSE of absolute errors given as distinct values and their counts."""
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    n = int(counts.sum())
    if not n:
        return {"n_errors": 0, "median": None, "p95": None, "rmse": None}
    return {"n_errors": n, "median": linear_quantile(values, counts, 0.5), "p95": linear_quantile(values, counts, 0.95),
            "rmse": float(np.sqrt((counts * values.astype(float) ** 2).sum() / n))}


def epsilon_key(view: RunView, spec: Product) -> str:
    """The run's certified total epsilon of ``spec`` as text ("0.25", "1"; "inf" for a zero-noise test run)."""
    eps, _ = view.theoretical_epsilon(spec)
    if eps is not None:
        return f"{eps:g}"
    cert = view.reader.certificate().products.get(PRODUCT) if view.reader.certificate_path.exists() else None
    if cert and of_entry(cert).infinite:
        return "inf"
    raise EvaluationError(f"{view.root / 'certificate.json'}: no certified epsilon for {PRODUCT!r}")


@dataclass
class Pool:
    """Absolute errors of one (epsilon, count, level), pooled over runs."""

    runs: list[str] = field(default_factory=list)
    n_geounits: int = 0
    values: list[np.ndarray] = field(default_factory=list)
    counts: list[np.ndarray] = field(default_factory=list)


def evaluate_runs(runs: list[Path], truth_dir: Path) -> tuple[dict[tuple[str, str, str], Pool], dict]:
    """Pooled errors per (epsilon, count, level), and the input's description (true-count statistics)."""
    pools: dict[tuple[str, str, str], Pool] = {}
    truth, described = None, {}
    for run in runs:
        view = RunView(run, run.name)
        spec = next((p for p in view.census.products if p.name == PRODUCT), None)
        if spec is None or PRODUCT not in view.manifest.products:
            raise EvaluationError(f"{run}: no {PRODUCT!r} product")
        missing = [lv for lv in LEVELS.values() if lv not in view.levels]
        if missing:
            raise EvaluationError(f"{run}: level {missing[0]!r} not in the run (an e2e_1940 run is expected)")
        if truth is None:
            truth = read_truth(truth_dir, view.census, spec)
        eps = epsilon_key(view, spec)
        for level_name, level in LEVELS.items():
            true, est = truth_at(view, truth, level), view.estimate_at(spec, level)
            if not described.get(level_name):
                described[level_name] = describe(true, spec)
            for count, query in QUERIES.items():
                values, counts = abs_errors(true, est, query, spec.schema, skip_zero_zero=count != "TC")
                pool = pools.setdefault((eps, count, level_name), Pool())
                pool.runs.append(f"{run.name} (seed {view.seed})")
                pool.n_geounits = true.n_units
                pool.values.append(values)
                pool.counts.append(counts)
    return pools, described


def describe(true: M.SparseHist, spec: Product) -> dict:
    """median and p95 of the geounits' true totals, and the median non-zero true SC answer (TRUE counts)."""
    _, tc = M.answer_totals(true, build_query(spec.schema, QUERIES["TC"]))
    _, sc = M.answer_totals(true, build_query(spec.schema, QUERIES["SC"]))
    ones = np.ones(tc.size, dtype=np.int64)
    return {"TC_median": linear_quantile(tc, ones, 0.5), "TC_p95": linear_quantile(tc, ones, 0.95),
            "SC_median": linear_quantile(sc, np.ones(sc.size, dtype=np.int64), 0.5)}


def table(pools: dict[tuple[str, str, str], Pool]) -> list[dict]:
    rows = []
    for (eps, count, level), pool in sorted(pools.items(), key=lambda kv: (float(kv[0][0]), kv[0][1], kv[0][2])):
        anchor = ANCHORS.get(eps, {}).get((count, level))
        rows.append({"epsilon": eps, "count": count, "level": level, "runs": len(pool.runs), "seeds": pool.runs,
                     "n_geounits": pool.n_geounits,
                     **summarize(np.concatenate(pool.values), np.concatenate(pool.counts)),
                     "petti_flaxman": None if anchor is None else dict(zip(("median", "p95", "rmse"), anchor))})
    return rows


def render(rows: list[dict]) -> str:
    def fmt(v):
        return "-" if v is None else f"{v:.0f}" if float(v).is_integer() else f"{v:.1f}"

    lines = ["epsilon  count level   runs  ours median/p95/RMSE   Petti & Flaxman (1940 file)"]
    for r in rows:
        pf = r["petti_flaxman"]
        ours = "/".join(fmt(r[k]) for k in ("median", "p95", "rmse"))
        theirs = "/".join(str(pf[k]) for k in ("median", "p95", "rmse")) if pf else ("0 (invariant)" if (
            r["count"], r["level"]) == ("TC", "state") else "-")
        lines.append(f"{r['epsilon']:<8} {r['count']:<5} {r['level']:<7} {r['runs']:>4}  {ours:<22} {theirs}")
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", nargs="+", type=Path, help="run directories of e2e_1940 runs (any epsilons)")
    ap.add_argument("--truth", type=Path, required=True, help="the runs' input directory")
    ap.add_argument("--out", type=Path, help="evaluation file (default RUN-petti_flaxman-CONFIDENTIAL.json beside RUN)")
    ap.add_argument("--describe-input", action="store_true",
                    help="also print the input's median TC and SC per level (TRUE counts: synthetic inputs only)")
    args = ap.parse_args(argv)
    try:
        pools, described = evaluate_runs(args.runs, args.truth)
        rows = table(pools)
        run = Path(os.path.abspath(args.runs[0]))
        out = args.out or run.with_name(f"{run.name}-petti_flaxman-CONFIDENTIAL.json")
        with claimed_file(out, "evaluate") as marker:
            tmp = private_file(out.with_name(f".{out.name}.tmp"))  # private from its first byte
            tmp.write_text(json.dumps({MARKER_KEY: marker, "source": "benchmarks/petti_flaxman.py; anchors: Petti "
                                       "& Flaxman, Gates Open Research 3:1722, via GitHub aflaxman/dp_2020_census",
                                       "truth": str(args.truth), "rows": rows}, indent=2, default=str) + "\n")
            os.replace(tmp, out)
    except RunDirError as exc:
        print(f"topdown: {exc}", file=sys.stderr)
        return EXIT_RUNDIR
    except (FileNotFoundError, *input_errors()) as exc:
        print(f"topdown: input error: {exc}", file=sys.stderr)
        return EXIT_INPUT
    print(render(rows))
    if args.describe_input:
        print("\nTRUE-count statistics of the input (median TC, p95 TC, median non-zero SC answer) beside the 1940 "
              "file's:")
        for level, d in described.items():
            ref = ANCHOR_INPUT[level]
            print(f"  {level:<7} {d['TC_median']:>12,.0f} {d['TC_p95']:>12,.0f} {d['SC_median']:>8,.0f}   "
                  f"1940: {ref[0]:,} / {ref[1]:,} / {ref[2]:,}")
    print(f"\nwritten: {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
