"""Mean 90 % interval width and coverage per level of two uncertainty tables of the
same run (before and after the structural zeros and exact invariants), against the run's true input.

    python benchmarks/structural_zeros.py RUN INPUT BEFORE.parquet AFTER.parquet

INPUT is the ingested input folder (persons.parquet); only summaries are printed (no count of a node).
"""
from __future__ import annotations

import sys

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy import stats

from topdown.pipeline.configuration.census import PERSONS
from topdown.pipeline.evaluation.uncertainty import Z90
from topdown.pipeline.inputs.tabulate import block_histograms
from topdown.vocab.queries import build_query

QUERIES = ("total", "hhgq", "votingage * hispanic * cenrace")


def truth(run: str, inp: str) -> pd.DataFrame:
    spine = pd.read_parquet(f"{run}/spine.parquet").astype(str)
    hist = block_histograms(pd.read_parquet(f"{inp}/persons.parquet"), PERSONS)
    blocks = pd.Index(spine["geoid"])
    rows = blocks.get_indexer(hist["geocode"].astype(str))
    x = sp.csr_matrix((hist["count"].to_numpy(float), (rows, hist["cell"].to_numpy())), shape=(len(blocks), PERSONS.ncells))
    frames = []
    for level in spine.columns[1:]:
        codes, nodes = pd.factorize(spine[level], sort=True)
        agg = sp.csr_matrix((np.ones(len(codes)), (codes, np.arange(len(codes)))), shape=(len(nodes), len(codes)))
        h = agg @ x
        for q in QUERIES:
            m = build_query(PERSONS, q).matrix()
            ans = np.asarray((m @ h.T).T.todense())
            frames.append(pd.DataFrame({"level": level, "geocode": np.repeat(np.asarray(nodes), ans.shape[1]),
                                        "query": q, "cell": np.tile(np.arange(ans.shape[1]), len(nodes)),
                                        "truth": ans.ravel()}))
    return pd.concat(frames, ignore_index=True)


def cells(path: str, true: pd.DataFrame) -> pd.DataFrame:
    t = pd.read_parquet(path, filters=[("product", "==", "persons")], columns=[
        "level", "geocode", "query", "cell", "estimate", "variance"])
    t = t[t["query"].isin(QUERIES)].merge(true, on=["level", "geocode", "query", "cell"], validate="1:1")
    half = Z90 * np.sqrt(t["variance"].clip(lower=0))
    t["width"] = 2 * half
    t["covered"] = (t["estimate"] - half <= t["truth"]) & (t["truth"] <= t["estimate"] + half)
    return t.set_index(["level", "geocode", "query", "cell"])[["width", "covered", "variance"]]


def main(run: str, inp: str, before: str, after: str) -> None:
    true = truth(run, inp)
    both = cells(before, true).join(cells(after, true), lsuffix="_before", rsuffix="_after").reset_index()
    # the hhgq cells that became structural zeros (upper bound of 0 above the blocks) apart from the others
    zero = (both["query"] == "hhgq") & (both["variance_after"] < 0.05)
    both["cells"] = np.where(zero, "hhgq, zero cells", np.where(both["query"] == "hhgq", "hhgq, other", both["query"]))
    both["exact"] = both["variance_after"] == 0
    order = {lv: i for i, lv in enumerate(["US", "State", "County", "Tract", "Block_Group", "Block"])}
    g = both.groupby(["level", "cells"]).agg(n=("width_after", "size"), width_before=("width_before", "mean"),
                                            width_after=("width_after", "mean"), cov_before=("covered_before", "mean"),
                                            cov_after=("covered_after", "mean"), exact=("exact", "sum")).reset_index()
    g = g.sort_values(["level", "cells"], key=lambda c: c.map(order) if c.name == "level" else c)
    print("| level | cells | n | mean 90 % width before | after | narrower | coverage before | after | 99 % band | exact (var 0) |")
    print("| --- | --- | ---: | ---: | ---: | ---: | ---: | ---: | --- | ---: |")
    for r in g.itertuples():
        lo, hi = stats.binom.ppf([0.005, 0.995], r.n, 0.9) / r.n
        narrower = 100 * (1 - r.width_after / r.width_before) if r.width_before > 0 else 0.0
        print(f"| {r.level} | {r.cells} | {r.n:,} | {r.width_before:.4g} | {r.width_after:.4g} | {narrower:.1f} % | "
              f"{r.cov_before:.4f} | {r.cov_after:.4f} | {lo:.3f}-{hi:.3f} | {r.exact:,} |")


if __name__ == "__main__":
    main(*sys.argv[1:5])
