"""Coverage of the uncertainty table's intervals against a known truth, per method, level and
block-size bin, with the exact binomial 99 % band of the nominal rate; mean widths per method and level beside
the published counts' mean absolute error. Prints markdown tables (``--json FILE`` also writes the rows).

    python benchmarks/coverage.py RUN --truth INPUT --uncertainty FILE [--entities BAF] [--product persons]
        [--draws RUN2:FILE2 ...] [--central]

RUN is the run the file was computed from (its spine; ``topdown uncertainty RUN --out FILE [--replicates DIR]``),
INPUT the run's confidential input. A geounit's bin is its true total (every level, so blocks by size); the
cells of the other queries in the file (hispanic, cenrace...) are reported per method and level, zero and
non-zero true counts apart. ``--draws`` pools runs of the same input with other seeds (each draw's geounits
count as trials of their own); ``--central`` adds ``gls_central``, the Bureau's central interval cut at 0 from
the same GLS estimates (it covers a true 0 at (1 + level) / 2). The band
treats the geounits as independent trials, which they are not quite (one run's noise is shared along the
tree): a method within its band at every level and bin is consistent with nominal coverage, no more.
Confidential: the output is about the true counts (coverage and errors per bin); keep it private.
"""
from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

from topdown.pipeline.evaluation.amc import Tabulator
from topdown.pipeline.evaluation.bounded import z_value
from topdown.pipeline.evaluation.evaluate import entities_on_spine, load_entities, load_truth
from topdown.pipeline.evaluation.uncertainty import Source
from topdown.pipeline.runtime.rundir import RunReader

BINS = [-0.5, 0.5, 9.5, 49.5, 99.5, 249.5, np.inf]
BIN_LABELS = ["0", "1-9", "10-49", "50-99", "100-249", "250+"]
LEVELS = (0.90, 0.95)
#: The queries measured besides ``total`` (the others in the file are skipped: the table stays small).
QUERIES = ("hispanic", "cenrace")


def band(n: int, p: float) -> tuple[float, float]:
    """The exact binomial 99 % band of the coverage share of ``n`` intervals at nominal rate ``p``."""
    lo, hi = stats.binom.ppf([0.005, 0.995], n, p)
    return float(lo) / n, float(hi) / n


def with_truth(unc: pd.DataFrame, truth: dict, totals: dict) -> pd.DataFrame:
    """``unc``'s rows with ``truth`` (their cell's true count), ``size`` (their geounit's true total) and
    ``bin``; ``truth``/``totals`` map (product, level, query) / (product, level) to (node index, array)."""
    frames = []
    for (product, level, query), g in unc.groupby(["product", "level", "query"], sort=False):
        nodes, arr = truth[product, level, query]
        rows = nodes.get_indexer(g["geocode"].astype(str))
        tnodes, tarr = totals[product, level]
        frames.append(g.assign(truth=arr[rows, g["cell"].to_numpy()],
                               size=tarr[tnodes.get_indexer(g["geocode"].astype(str)), 0]))
    out = pd.concat(frames, ignore_index=True)
    out["bin"] = pd.cut(out["size"], BINS, labels=BIN_LABELS)
    return out


def coverage_table(rows: pd.DataFrame, by: list[str]) -> pd.DataFrame:
    """Per group of ``by``: n, coverage at 90 % and 95 %, their bands and whether each is within."""
    out = []
    for key, g in rows.groupby(by, sort=False, observed=True):
        n = len(g)
        rec = dict(zip(by, key if isinstance(key, tuple) else (key,)), n=n)
        for level in LEVELS:
            tag = f"{round(level * 100)}"
            cov = float(((g[f"ci{tag}_low"] <= g["truth"]) & (g["truth"] <= g[f"ci{tag}_high"])).mean())
            lo, hi = band(n, level)
            rec.update({f"cov{tag}": cov, f"band{tag}": f"{lo:.3f}-{hi:.3f}", f"ok{tag}": lo <= cov <= hi})
        out.append(rec)
    return pd.DataFrame(out)


def width_table(rows: pd.DataFrame) -> pd.DataFrame:
    """Per level: each method's mean 90 % and 95 % width (``total``) and the published counts' MAE."""
    tot = rows[rows["query"] == "total"]
    out = tot.assign(w90=tot["ci90_high"] - tot["ci90_low"], w95=tot["ci95_high"] - tot["ci95_low"]).pivot_table(
        index="level", columns="method", values=["w90", "w95"], aggfunc="mean", sort=False)
    out.columns = [f"{m}_{w}" for w, m in out.columns]
    out = out[sorted(out.columns, key=lambda c: (not c.startswith("gls"), c))]
    gls = tot[tot["method"] == "gls"]
    out.insert(0, "geounits", gls.groupby("level", sort=False).size())
    if gls["published"].notna().any():
        out["published_mae"] = (gls["published"] - gls["truth"]).abs().groupby(gls["level"], sort=False).mean()
        out["gls_estimate_mae"] = (gls["estimate"] - gls["truth"]).abs().groupby(gls["level"], sort=False).mean()
    return out.reset_index()


def markdown(table: pd.DataFrame) -> str:
    def cell(v):
        if isinstance(v, (bool, np.bool_)):
            return "yes" if v else "**no**"
        if isinstance(v, (float, np.floating)):
            return f"{v:.3f}" if abs(v) < 10 else f"{v:,.1f}"
        return str(v)
    lines = ["| " + " | ".join(table.columns) + " |", "|" + "---|" * len(table.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in table.itertuples(index=False)]
    return "\n".join(lines)


def truth_rows(run: Path, truth_dir: Path, unc: pd.DataFrame, entities_path: Path | None = None) -> pd.DataFrame:
    """``unc``'s rows (one product) with their true count, geounit true total and bin (:func:`with_truth`)."""
    src = Source.open(run)
    (product,) = unc["product"].unique()
    entities = None
    if entities_path is not None:
        entities = entities_on_spine(load_entities(entities_path), pd.Index(src.spine["geoid"]), entities_path)
    else:  # the entities' rows need the block assignment they were made from
        unc = unc[unc["level"].isin(src.levels)].reset_index(drop=True)
    keys = {tuple(k) for k in unc[["product", "level", "query"]].drop_duplicates().itertuples(index=False)}
    keys |= {(product, level, "total") for level in unc["level"].unique()}
    tab = Tabulator(src, entities, sorted(keys))
    blocks = load_truth(truth_dir, RunReader(run).census()).blocks[product]
    rows = tab.geoids.get_indexer(blocks["geocode"].astype(str))
    if (rows < 0).any():
        raise SystemExit(f"coverage: {truth_dir}: block {blocks['geocode'].iloc[np.flatnonzero(rows < 0)[0]]} "
                         "is not on the run's spine (another input?)")
    arrays = tab.zeros(product)
    tab.add(arrays, rows, blocks["cell"].to_numpy(), blocks["count"].to_numpy(np.float64))
    truth = {k: (tab.aggs[k[1]][0], a) for k, a in arrays.items()}
    totals = {(p, lv): truth[p, lv, q] for p, lv, q in truth if q == "total"}
    return with_truth(unc, truth, totals)


def tables(table: pd.DataFrame) -> dict[str, pd.DataFrame]:
    """The three tables of :func:`measure` from rows with their truth (:func:`truth_rows`)."""
    total = table[table["query"] == "total"]
    cells = table[table["query"] != "total"]
    out = {"coverage_total": coverage_table(total, ["method", "level", "bin"]),
           "widths": width_table(table)}
    if len(cells):  # zero and non-zero true counts apart (a central interval cut at 0 over-covers a true 0)
        cells = cells.assign(cell_truth=np.where(cells["truth"] > 0, ">0", "0"))
        out["coverage_cells"] = coverage_table(cells, ["method", "query", "level", "cell_truth"])
    return out


def read_rows(unc_path: Path, product: str, queries: tuple[str, ...]) -> pd.DataFrame:
    """The uncertainty file's rows of ``product`` and the queries total and ``queries``."""
    unc = pd.read_parquet(unc_path, filters=[("product", "==", product), ("query", "in", ["total", *queries])])
    if unc.empty:
        raise SystemExit(f"coverage: {unc_path} has no rows of product {product!r}")
    return unc.reset_index(drop=True)


def with_central(unc: pd.DataFrame) -> pd.DataFrame:
    """``unc`` and, for its ``gls`` rows, ``gls_central`` rows: the Bureau's central interval cut at 0,
    ``[max(ceil(est - z sd), 0), max(floor(est + z sd), 0)]``, from the same estimate and variance."""
    gls = unc[unc["method"] == "gls"]
    est, sd = gls["estimate"].to_numpy(), np.sqrt(gls["variance"].to_numpy())
    central = gls.assign(method="gls_central")
    for level in LEVELS:
        z, tag = z_value(level), f"{round(level * 100)}"
        central[f"ci{tag}_low"] = np.maximum(np.ceil(est - z * sd), 0)
        central[f"ci{tag}_high"] = np.maximum(np.floor(est + z * sd), 0)
    return pd.concat([unc, central], ignore_index=True)


def measure(run: Path, truth_dir: Path, unc_path: Path, entities_path: Path | None = None,
            product: str | None = None, queries: tuple[str, ...] = QUERIES,
            draws: list[tuple[Path, Path]] = (), central: bool = False) -> dict[str, pd.DataFrame]:
    """The three tables: coverage of ``total`` per method, level and bin; of the other ``queries``' cells per
    method, query, level and zero/non-zero truth; widths and errors per level. ``draws``: more (run,
    uncertainty file) pairs of the same input (other seeds), pooled with the first; ``central``: add
    :func:`with_central`'s rows."""
    product = product or Source.open(run).products[0].name
    frames = []
    for r, u in [(run, unc_path), *draws]:
        unc = read_rows(u, product, queries)
        frames.append(truth_rows(r, truth_dir, with_central(unc) if central else unc, entities_path))
    return tables(pd.concat(frames, ignore_index=True) if draws else frames[0])


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("run")
    parser.add_argument("--truth", required=True, type=Path, help="the run's (confidential) input directory")
    parser.add_argument("--uncertainty", required=True, type=Path, help="a `topdown uncertainty` file of RUN")
    parser.add_argument("--entities", type=Path, help="the BAF directory or entity table given to uncertainty")
    parser.add_argument("--product", help="the product to measure (default: the run's first)")
    parser.add_argument("--queries", nargs="*", default=list(QUERIES),
                        help=f"queries whose cells are measured besides total (default: {' '.join(QUERIES)})")
    parser.add_argument("--json", type=Path, help="also write the tables' rows to this JSON file")
    parser.add_argument("--draws", nargs="*", default=[], metavar="RUN:FILE",
                        help="more runs of the same input with other seeds and their uncertainty files, pooled")
    parser.add_argument("--central", action="store_true",
                        help="also measure the gls rows' central interval cut at 0 (the Bureau's form), as gls_central")
    args = parser.parse_args(argv)
    draws = [tuple(Path(p) for p in d.rsplit(":", 1)) for d in args.draws]
    tables = measure(Path(args.run), args.truth, args.uncertainty, args.entities, args.product, tuple(args.queries),
                     draws, args.central)
    titles = {"coverage_total": "Coverage of the true total, per method, level and block-size bin (true total)",
              "coverage_cells": "Coverage of the other queries' cells, per method, query, level and whether the "
                                "cell's true count is 0",
              "widths": "Mean interval width (total) per method and level, and the mean absolute errors"}
    for name, table in tables.items():
        print(f"\n### {titles[name]}\n\n{markdown(table)}")
    if args.json:
        args.json.write_text(json.dumps({k: json.loads(t.to_json(orient="records")) for k, t in tables.items()},
                                        indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
