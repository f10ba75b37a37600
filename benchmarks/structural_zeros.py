"""Issue 31 items 3 and 7: mean 90 % interval width and coverage per level of two uncertainty tables of the
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
    hist = block_histograms(pd.read_parquet(f"{inp}/persons.parquet"))
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


def summary(path: str, true: pd.DataFrame) -> pd.DataFrame:
    t = pd.read_parquet(path, filters=[("product", "==", "persons")])
    t = t[t["query"].isin(QUERIES)].merge(true, on=["level", "geocode", "query", "cell"], validate="1:1")
    half = Z90 * np.sqrt(t["variance"].clip(lower=0))
    t["width"] = 2 * half
    t["covered"] = (t["estimate"] - half <= t["truth"]) & (t["truth"] <= t["estimate"] + half)
    t["zero_var"] = t["variance"] == 0
    return t.groupby(["level", "query"], sort=False).agg(cells=("width", "size"), width=("width", "mean"),
                                                       coverage=("covered", "mean"), exact=("zero_var", "sum"))


def main(run: str, inp: str, before: str, after: str) -> None:
    true = truth(run, inp)
    b, a = summary(before, true), summary(after, true)
    out = b.join(a, lsuffix="_before", rsuffix="_after")
    out["narrower_%"] = 100 * (1 - out["width_after"] / out["width_before"])
    n = out["cells_after"].to_numpy()
    out["band_99"] = [f"{lo:.3f}-{hi:.3f}" for lo, hi in zip(*(stats.binom.ppf([[0.005], [0.995]], n, 0.9) / n))]
    cols = ["cells_after", "width_before", "width_after", "narrower_%", "coverage_before", "coverage_after",
            "band_99", "exact_after"]
    print(out[cols].to_markdown(floatfmt=".4g"))


if __name__ == "__main__":
    main(*sys.argv[1:5])
