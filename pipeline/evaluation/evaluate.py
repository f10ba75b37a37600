"""``topdown evaluate``: accuracy and empirical privacy loss of one or more runs against the truth.

The output is CONFIDENTIAL by nature: it is computed from the true counts. It is written to the directory
the user names (``out``) or ``RUN/evaluation-CONFIDENTIAL/`` of the first run, never beside the protected
outputs, and the report says so at the top. A statistic over fewer than :data:`MIN_NODES` geounits (the
US total's error, a State mean over two states) would pin down true counts: such rows are suppressed
(values blank, ``suppressed`` = True) unless ``EvalOptions.suppress`` is False (``--no-suppress``).

Writes (into ``out``)::

    summary.parquet         run, seed, product, level, query, n, n_answers, mean_abs_error (paper Tables 9-10:
                            per-geounit L1 averaged over geounits), mean_abs_cell_error, median_abs_error,
                            max_abs_error, signed residual quantiles q0.005..q0.995 over all answers
    errors_by_bin.parquet   TOTAL error by true-population bin per level (DAS-2020 accuracy_metrics; paper Tables 11-12)
    blau.parquet            TOTAL error by Blau-index quintile per level (paper Table 13)
    homogeneity.parquet     TOTAL bias by homogeneity index per level (Petti & Flaxman 2020, Figure 3)
    entities.parquet        off-spine entities: TOTAL error and largest-group share within 5 points, by bin
    epl.parquet             empirical privacy loss per run, level and query (metrics.empirical_privacy_loss:
                            status, epl and its bootstrap interval epl_lo..epl_hi) beside the theoretical
                            epsilon of the query's measurement at that level and of the whole product
    sampling.parquet        simple-random-sample baselines: the same error and EPL metrics per rate
    replicates.parquet      run-to-run spread of each geounit's estimate (several runs only)
    *.png, report.html      figures and a one-page report

Only summaries over geounits are written: a per-geounit error next to the published estimate would disclose
the confidential count. The runs and the sampling replicates are evaluated as one Dask job.
"""
from __future__ import annotations

import logging
from contextlib import nullcontext
from fractions import Fraction
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from . import metrics as M
from .eval_report import first_product
from .metrics import MIN_NODES
from topdown.geo import one_line
from topdown.vocab.queries import build_query
from ..execution.dataplane import find_input
from ..execution.private_files import private_dir, seal
from ..execution.progress import compute
from ..execution.rundir import RunReader, check_out, removed_on_failure, write_table
from topdown.pipeline.configuration.census import PERSONS, PERSONS_PRODUCT, PL94, read_as_declared
from topdown.vocab.census import Census, Product
from ..inputs.tabulate import block_histograms, sparse_counts, tabulate
from ..inputs.validate import PERSON_RECORDS, UNIT_RECORDS, check_records
from ..privacy.budget import of_entry

log = logging.getLogger("topdown")

#: Blau index cells: hispanic x majorRaces, 14 cells (DAS-2020 accuracy_metrics.py).
BLAU_QUERY = "hispanic * majorRaces"
#: Largest-group share query for off-spine entities (DAS-2020 accuracy_metrics.py, "L1 relative").
SHARE_QUERY = "hispanic * cenrace_7lev_two_comb"
SAMPLING_RATES: tuple[float, ...] = (0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95)
#: Petti & Flaxman's total count (TC) and age/race/ethnicity stratified count (SC).
SAMPLING_QUERIES: tuple[str, ...] = ("total", "votingage * hispanic * cenrace")
#: Default output folder inside the first run directory.
CONFIDENTIAL_DIR = "evaluation-CONFIDENTIAL"
#: Columns that identify a row (never suppressed).
KEY_COLUMNS = ("run", "seed", "rate", "replicate", "sampling_seed", "product", "level", "entity_type", "query", "bin",
               "quintile", "homogeneity", "n", "n_answers", "n_residuals", "status", "epsilon_query", "epsilon_total",
               "suppressed")


class EvaluationError(ValueError):
    """Inputs that cannot be evaluated together (names the offending file or entry)."""


@dataclass
class EvalOptions:
    """What to compute. Queries are per product; ``dense_limit`` caps dense per-geounit answer arrays."""

    queries: dict[str, tuple[str, ...]] = field(default_factory=dict)  # default: each product's evaluation_queries
    sampling_rates: tuple[float, ...] = SAMPLING_RATES
    sampling_replicates: int = 1
    sampling_seed: int = 0
    sampling_queries: tuple[str, ...] = SAMPLING_QUERIES
    replicate_queries: tuple[str, ...] = ("total",)
    entity_bins: tuple[int, ...] = M.ENTITY_BINS
    epl_factor: float = 0.1
    epl_min_count: int = M.EPL_MIN_COUNT
    epl_bootstrap: int = M.EPL_BOOTSTRAP
    suppress: bool = True
    dense_limit: int = 20_000_000
    figures: bool = True
    uncertainty: Path | None = None  # a `topdown uncertainty` file of the first run: interval figure + coverage


# -- inputs ----------------------------------------------------------------------------------------------

@dataclass
class Truth:
    """True block histograms per product (geocode = 15-character block GEOID) and the person records."""

    blocks: dict[str, pd.DataFrame]
    persons: pd.DataFrame


def load_truth(truth: Path, census: Census | None = None) -> Truth:
    """Read the person and unit files of a run's input directory (one file each, or directories of
    partitions: ``dataplane.find_input``) and tabulate them by block (in memory: evaluation studies). A
    declared ``census``'s records are read and tabulated as a run reads them (``validate.check_records``);
    its truth has no person records (the person-record metrics are P.L. 94-171's)."""
    if census is not None and read_as_declared(census):
        return _declared_truth(truth, census)
    files = find_input(truth)  # FileNotFoundError naming what is missing
    persons = pd.concat([pd.read_parquet(f, columns=["geoid", *PERSONS.dim_names]) for f in files.persons],
                        ignore_index=True)
    persons["geoid"] = persons["geoid"].astype(str)
    units = pd.concat([pd.read_parquet(f, columns=["geoid", "unit_type", "occupied"]) for f in files.units],
                      ignore_index=True)
    units["geoid"] = units["geoid"].astype(str)
    records = {PERSON_RECORDS: persons, UNIT_RECORDS: units}
    return Truth({p.name: tabulate(p, records) for p in PL94.products}, persons)


def _declared_truth(truth: Path, census: Census) -> Truth:
    files = find_input(truth, census)
    blocks = {}
    for product in census.products:
        if census.units is not None and product.records.name == census.units.name:
            continue  # a product counting the unit records: not evaluated from a declared census's truth yet
        read = [check_records(f, product, census.hierarchy) for f in files.persons]
        leaf = pd.concat([r[0] for r in read], ignore_index=True)
        blocks[product.name] = sparse_counts(leaf, np.concatenate([r[1] for r in read]), product.schema.ncells)
    return Truth(blocks, pd.DataFrame())


def load_entities(path: Path) -> pd.DataFrame:
    """Block-to-entity table (geoid, entity_type, entity) from a CSV/Parquet table or a BAF directory
    (every kind of entity its files give: geo.baf.baf_entities)."""
    path = Path(path)
    if path.is_dir():
        from topdown.geo.baf import baf_entities, read_baf_dir

        series = baf_entities(read_baf_dir(path))
        table = pd.concat([pd.DataFrame({"geoid": s.index.astype(str), "entity_type": kind,
                                         "entity": s.to_numpy().astype(str)}) for kind, s in series])
    elif path.suffix in (".parquet", ".csv", ".txt"):
        try:
            table = (pd.read_parquet(path) if path.suffix == ".parquet"
                     else pd.read_csv(path, dtype=str, keep_default_na=False))
        except (pa.ArrowException, pd.errors.ParserError, pd.errors.EmptyDataError, UnicodeDecodeError) as exc:
            raise EvaluationError(f"{path}: not a readable entities table ({one_line(exc)})") from None
    else:
        raise EvaluationError(f"{path}: entities must be a .csv/.parquet table or a BAF directory")
    missing = {"geoid", "entity_type", "entity"} - set(table.columns)
    if missing:
        raise EvaluationError(f"{path}: entities table lacks column(s) {', '.join(sorted(missing))}")
    table = table[["geoid", "entity_type", "entity"]].astype(str)
    table = table[table["entity"] != ""].reset_index(drop=True)
    dup = table.duplicated(["geoid", "entity_type"])
    if dup.any():
        row = table[dup].iloc[0]
        raise EvaluationError(f"{path}: block {row['geoid']} is in two {row['entity_type']!r} entities")
    return table


def entities_on_spine(entities: pd.DataFrame, spine_geoids: pd.Index, source: Path) -> pd.DataFrame:
    """The rows of ``entities`` whose blocks are blocks of the run (on its spine); the rest are left out with a
    warning saying how many. A BAF directory covers every block of its states, so any run block missing from it
    means files of another census's blocks (warned with the count); no block on the spine at all is refused."""
    on = entities["geoid"].isin(spine_geoids)
    blocks = entities["geoid"].nunique()
    matched = entities.loc[on, "geoid"].nunique()
    if matched == 0:
        raise EvaluationError(f"{source}: none of its {blocks:,} blocks is a block of the run (entities of another "
                              "census's blocks, or of other states?)")
    if Path(source).is_dir():
        missing = len(spine_geoids) - matched
        if missing:
            log.warning("%s: %s of the run's %s blocks are not in these block assignment files (files of another "
                        "census's blocks?); every entity is made of the %s blocks that are", source, f"{missing:,}",
                        f"{len(spine_geoids):,}", f"{matched:,}")
    elif matched < blocks:
        log.warning("%s: %s of its %s blocks are not blocks of the run (unpopulated, or of another census); they "
                    "are left out", source, f"{blocks - matched:,}", f"{blocks:,}")
    return entities[on].reset_index(drop=True)


class RunView:
    """One run directory: manifest, spine and the unit index of every block at every level."""

    def __init__(self, root: Path, label: str):
        self.root, self.label = Path(root), label
        self.reader = RunReader(self.root)
        self.manifest = self.reader.complete_manifest("evaluating it")  # RunDirError: exit 4, as verify
        self.census = self.reader.census()
        self.levels: list[str] = list(self.manifest.levels)
        spine = self.reader.spine_table()
        if list(spine.columns) != ["geoid", *self.levels]:
            raise EvaluationError(f"{self.root / 'spine.parquet'}: columns are not geoid + the manifest's levels")
        self.spine = spine
        self.geoid_index = pd.Index(spine["geoid"])
        self.nodes: dict[str, pd.Index] = {}
        self.codes: dict[str, np.ndarray] = {}
        for level in self.levels:
            codes, nodes = pd.factorize(spine[level], sort=True)
            self.nodes[level], self.codes[level] = pd.Index(nodes.astype(str)), codes.astype(np.int64)

    @property
    def seed(self) -> Any:
        return self.manifest.seed

    def theoretical_epsilon(self, product: str) -> tuple[float | None, dict[tuple[str, str], float]]:
        """The product's certified epsilon and, per (level, query) measured, the epsilon of that one
        measurement (zCDP rho_q converted at the product's delta; pure DP epsilon_q), from certificate.json."""
        cert = self.reader.certificate().products.get(product) if self.reader.certificate_path.exists() else None
        total = of_entry(cert) if cert else None
        if total is None or total.infinite:
            return None, {}
        delta = Fraction(cert["delta"])
        per: dict[tuple[str, str], float] = {}
        for row in cert.get("queries", []):
            query = of_entry({**row, "mechanism": cert["mechanism"]})
            if not query.zero and not query.infinite:
                per[(row["level"], row["query"])] = query.epsilon_at(delta)
        return total.epsilon_at(delta), per

    def truth_at(self, blocks: pd.DataFrame, level: str) -> M.SparseHist:
        """True block histograms rolled up to ``level`` by this run's spine."""
        rows = self.geoid_index.get_indexer(blocks["geocode"])
        if (rows < 0).any():
            raise EvaluationError(f"{self.root / 'spine.parquet'}: truth block {blocks['geocode'].iloc[np.flatnonzero(rows < 0)[0]]} "
                                  "is not in the run's spine (truth and run do not match)")
        return M.SparseHist(self.codes[level][rows], blocks["cell"].to_numpy(np.int64), blocks["count"].to_numpy(),
                            len(self.nodes[level]))

    def estimate_at(self, product: str, level: str) -> M.SparseHist:
        """The run's estimates at ``level``, read a batch of a part at a time (a level is never a frame of
        geocodes in memory: only each row's node number, cell and count are kept)."""
        path = self.reader.histograms(product, level)
        if not path.exists():
            raise EvaluationError(f"{path}: histograms of level {level} not found")
        units, cells, counts = [], [], []
        for batch in ds.dataset(path, format="parquet").to_batches(columns=["geocode", "cell", "count"]):
            geocode = batch.column("geocode").to_pandas().astype(str)
            rows = self.nodes[level].get_indexer(geocode)
            if (rows < 0).any():
                raise EvaluationError(f"{path}: geocode {geocode.iloc[np.flatnonzero(rows < 0)[0]]!r} is not a "
                                      f"{level} node of the spine")
            units.append(rows)
            cells.append(batch.column("cell").to_numpy().astype(np.int64))
            counts.append(batch.column("count").to_numpy().astype(np.int64))
        empty = np.zeros(0, np.int64)
        return M.SparseHist(np.concatenate(units) if units else empty, np.concatenate(cells) if cells else empty,
                            np.concatenate(counts) if counts else empty, len(self.nodes[level]))

    def block_geoids(self) -> np.ndarray:
        """GEOID of each Block-level node (the leaf level must be one node per tabulation block)."""
        leaf = self.levels[-1]
        if len(self.nodes[leaf]) != len(self.spine):
            raise EvaluationError(f"{self.root / 'spine.parquet'}: {leaf} nodes are not one per block GEOID")
        out = np.empty(len(self.spine), dtype=object)
        out[self.codes[leaf]] = self.spine["geoid"].to_numpy()
        return out


# -- per-run evaluation (one Dask task) ------------------------------------------------------------------

def _key(run: str, seed: Any, product: str, level: str, **more) -> dict:
    return {"run": run, "seed": None if seed is None else str(seed), "product": product, "level": level, **more}


def _summary_row(qe: M.QueryErrors) -> dict:
    med, mx = qe.abs_quantiles((0.5, 1.0))
    row = {"n": qe.n_units, "n_answers": qe.n_answers, "mean_abs_error": qe.mean_abs_error,
           "mean_abs_cell_error": float(qe.l1.sum() / (qe.n_units * qe.n_answers)) if qe.n_units else np.nan,
           "median_abs_error": float(med), "max_abs_error": float(mx)}
    row.update({M.quantile_column(q): float(v) for q, v in zip(M.QUANTILES, qe.signed_quantiles(M.QUANTILES))})
    return row


def _epl_row(qe: M.QueryErrors, opts: EvalOptions) -> dict:
    res = M.empirical_privacy_loss(qe.values, qe.counts, factor=opts.epl_factor, min_count=opts.epl_min_count,
                                   n_boot=opts.epl_bootstrap)
    return {"n": qe.n_units, "n_residuals": res.n_residuals, "status": res.status, "epl": res.epl, "epl_lo": res.lo,
            "epl_hi": res.hi, "bandwidth": res.bandwidth,
            "range_lo": float(res.x.min()) if res.x.size else None, "range_hi": float(res.x.max()) if res.x.size else None}


def _level_metrics(run: str, seed: Any, spec: Product, level: str, true: M.SparseHist, est: M.SparseHist,
                   queries: Sequence[str], opts: EvalOptions) -> tuple[list[dict], list[dict], dict[str, M.QueryErrors]]:
    product, schema = spec.name, spec.schema
    summary, epl, kept = [], [], {}
    for name in queries:
        qe = M.query_errors(true, est, build_query(schema, name), opts.dense_limit)
        summary.append({**_key(run, seed, product, level, query=name), **_summary_row(qe)})
        epl.append({**_key(run, seed, product, level, query=name), **_epl_row(qe, opts)})
        if qe.true is not None:
            kept[name] = qe
    return summary, epl, kept


def evaluate_run(root: Path, label: str, truth: Truth, entities: pd.DataFrame | None, opts: EvalOptions) -> dict:
    """All metrics of one run directory; returns frames keyed by output table, plus replicate estimates."""
    view = RunView(root, label)
    out: dict[str, list] = {k: [] for k in ("summary", "errors_by_bin", "blau", "homogeneity", "entities", "epl")}
    replicates: dict[tuple[str, str, str], pd.Series] = {}
    seed = view.seed
    for spec in view.census.products:  # the truth is tabulated as the run's census's products
        product = spec.name
        if product not in view.manifest.products or product not in truth.blocks:
            continue
        person_metrics = spec == PERSONS_PRODUCT  # metrics defined on P.L. 94-171 person records (metrics.py)
        extra = opts.sampling_queries if person_metrics else ()
        asked = opts.queries.get(product, spec.evaluation_queries)
        queries = list(dict.fromkeys(["total", *asked, *extra, *opts.replicate_queries]))
        for level in view.levels:
            true, est = view.truth_at(truth.blocks[product], level), view.estimate_at(product, level)
            summary, epl, kept = _level_metrics(label, seed, spec, level, true, est, queries, opts)
            eps_total, eps_query = view.theoretical_epsilon(product)
            out["summary"] += summary
            out["epl"] += [{**row, "epsilon_query": eps_query.get((level, row["query"])), "epsilon_total": eps_total}
                           for row in epl]
            total = kept["total"]
            err = (total.est - total.true)[:, 0]
            edges = M.BLOCK_BINS if level == view.levels[-1] else M.COUNTY_BINS
            out["errors_by_bin"].append(M.errors_by_bin(total.true[:, 0], err, edges)
                                        .assign(**_key(label, seed, product, level, query="total")))
            for name in opts.replicate_queries:
                if name in kept:
                    qe = kept[name]
                    idx = pd.MultiIndex.from_product([view.nodes[level], range(qe.n_answers)], names=["geocode", "answer"])
                    replicates[(product, level, name)] = pd.Series(qe.est.ravel(), index=idx)
            if not person_metrics:
                continue
            blau_true = M.query_errors(true, true, build_query(PERSONS, BLAU_QUERY), opts.dense_limit).true
            out["blau"].append(M.blau_quintile_errors(M.blau_index(blau_true), err)
                               .assign(**_key(label, seed, product, level)))
            hom = M.homogeneity_index(M.nonzero_cells(true), PERSONS.ncells)
            out["homogeneity"].append(M.bias_by_homogeneity(hom, err).assign(**_key(label, seed, product, level)))
        if person_metrics and entities is not None:
            out["entities"] += _entity_metrics(view, truth.blocks[product], entities, opts)
    frames = {k: _frame(v) for k, v in out.items()}
    return {"tables": frames, "replicates": replicates, "label": label, "seed": seed}


def _frame(parts: list) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame()
    if isinstance(parts[0], pd.DataFrame):
        frame = pd.concat(parts, ignore_index=True)
    else:
        frame = pd.DataFrame(parts)
    lead = [c for c in ("run", "seed", "rate", "replicate", "product", "level", "entity_type", "query") if c in frame]
    return frame[lead + [c for c in frame.columns if c not in lead]]


def _entity_metrics(view: RunView, blocks: pd.DataFrame, entities: pd.DataFrame, opts: EvalOptions) -> list[pd.DataFrame]:
    leaf = view.levels[-1]
    est = view.estimate_at(PERSONS.name, leaf)
    est_geoid = view.block_geoids()[est.unit]
    frames = []
    for kind, table in entities.groupby("entity_type", sort=True):
        codes, names = pd.factorize(table["entity"], sort=True)
        where = pd.Index(table["geoid"])
        t_rows = where.get_indexer(blocks["geocode"])
        e_rows = where.get_indexer(pd.Index(est_geoid.astype(str)))
        t_sel, e_sel = t_rows >= 0, e_rows >= 0
        n = len(names)
        true = M.SparseHist(codes[t_rows[t_sel]], blocks["cell"].to_numpy(np.int64)[t_sel],
                            blocks["count"].to_numpy(np.int64)[t_sel], n)
        esth = M.SparseHist(codes[e_rows[e_sel]], est.cell[e_sel], est.count[e_sel], n)
        tot = M.query_errors(true, esth, build_query(PERSONS, "total"), opts.dense_limit)
        share = M.query_errors(true, esth, build_query(PERSONS, SHARE_QUERY), opts.dense_limit)
        frame = M.entity_metrics(tot.true[:, 0], (tot.est - tot.true)[:, 0],
                                 M.largest_share_error(share.est, share.true), opts.entity_bins)
        frames.append(frame.assign(run=view.label, seed=None if view.seed is None else str(view.seed),
                                   entity_type=kind, query="total"))
    return frames


# -- simple random sampling baselines (one Dask task per rate and replicate) -----------------------------

def sampling_replicate(root: Path, truth: Truth, rate: float, replicate: int, opts: EvalOptions) -> dict:
    """Error and EPL of a simple random sample of persons (without replacement) scaled by 1 / rate, on the
    first run's spine. Generator seed: (sampling_seed, round(rate x 10000), replicate)."""
    view = RunView(root, "srs")
    persons = truth.persons
    seed = (opts.sampling_seed, int(round(rate * 10000)), replicate)
    sample = persons.iloc[M.simple_random_sample(len(persons), rate, seed)]
    blocks = block_histograms(sample)
    scaled = blocks.assign(count=blocks["count"].to_numpy(float) / rate)
    rows = []
    for level in view.levels:
        true, est = view.truth_at(truth.blocks[PERSONS.name], level), view.truth_at(scaled, level)
        summary, epl, _ = _level_metrics("srs", None, PERSONS_PRODUCT, level, true, est, opts.sampling_queries, opts)
        for s, e in zip(summary, epl):
            rows.append({"rate": rate, "replicate": replicate, "sampling_seed": opts.sampling_seed,
                         "level": level, "query": s["query"], "n": s["n"], "mean_abs_error": s["mean_abs_error"],
                         "median_abs_error": s["median_abs_error"], "mean_abs_cell_error": s["mean_abs_cell_error"],
                         "status": e["status"], "epl": e["epl"], "epl_lo": e["epl_lo"], "epl_hi": e["epl_hi"]})
    return {"sampling": pd.DataFrame(rows)}


# -- replicates ------------------------------------------------------------------------------------------

def replicate_spread(results: list[dict]) -> pd.DataFrame:
    """Run-to-run spread of each geounit's estimate: n_runs, mean, std (ddof 1), min, max."""
    keys = sorted({k for r in results for k in r["replicates"]})
    frames = []
    for product, level, query in keys:
        cols = {r["label"]: r["replicates"][(product, level, query)] for r in results if (product, level, query) in r["replicates"]}
        if len(cols) < 2:
            continue
        wide = pd.DataFrame(cols)
        stats = pd.DataFrame({"n_runs": wide.notna().sum(axis=1), "mean_estimate": wide.mean(axis=1),
                              "std_estimate": wide.std(axis=1, ddof=1), "min_estimate": wide.min(axis=1),
                              "max_estimate": wide.max(axis=1)}).reset_index()
        frames.append(stats.assign(product=product, level=level, query=query))
    if not frames:
        return pd.DataFrame()
    frame = pd.concat(frames, ignore_index=True)
    lead = ["product", "level", "query", "geocode", "answer"]
    return frame[lead + [c for c in frame.columns if c not in lead]]


# -- suppression of small statistics (issue 13 item 6) --------------------------------------------------

def suppress_small(frame: pd.DataFrame, min_nodes: int = MIN_NODES) -> pd.DataFrame:
    """Blank every statistic of a row computed over fewer than ``min_nodes`` geounits (column ``n``; for the
    largest-share columns ``n_share``) and mark it ``suppressed``; an EPL row gets status "suppressed"."""
    if frame.empty or "n" not in frame.columns:
        return frame
    frame = frame.copy()
    small = frame["n"].to_numpy() < min_nodes
    stats = [c for c in frame.columns if c not in KEY_COLUMNS and c not in ("n_share", "share_within_5pp")]
    for c in stats:
        frame[c] = frame[c].mask(small)
    if "status" in frame.columns:
        frame.loc[small, "status"] = f"suppressed (fewer than {min_nodes} geounits)"
    if "n_share" in frame.columns:
        small = small | (frame["n_share"].to_numpy() < min_nodes)
        frame["share_within_5pp"] = frame["share_within_5pp"].mask(small)
    frame["suppressed"] = small
    return frame


# -- driver ----------------------------------------------------------------------------------------------

def _labels(runs: list[Path]) -> list[str]:
    labels: list[str] = []
    for r in runs:
        name = r.resolve().name
        labels.append(name if name not in labels else f"{name}#{len(labels)}")
    return labels


def evaluate(run_dirs: list[Path], truth: Path, entities: Path | None = None, out: Path | None = None, client=None,
             options: EvalOptions | None = None, audit: Path | None = None) -> Path:
    """Evaluate ``run_dirs`` against the input directory ``truth`` and write the tables, figures and
    report.html to ``out`` (default: ``<first run>/evaluation-CONFIDENTIAL``). Returns the output directory.
    ``audit``: the output directory of ``topdown audit``, whose bounds the report shows beside the EPL.

    All runs and sampling replicates form one Dask job, computed on ``client`` if given, else locally on
    threads. ``entities``: a (geoid, entity_type, entity) CSV/Parquet table or a BAF directory.
    """
    import dask

    opts = options or EvalOptions()
    runs = [Path(r) for r in run_dirs]
    if not runs:
        raise EvaluationError("evaluate needs at least one run directory")
    labels = _labels(runs)
    views = [RunView(r, "check") for r in runs]  # fail fast, naming the offending directory
    out = check_out(Path(out) if out is not None else runs[0] / CONFIDENTIAL_DIR, "the evaluation",
                    lambda p: (p / "summary.parquet").is_file())
    truth_d = dask.delayed(load_truth)(Path(truth), views[0].census)
    ent_d = (entities_on_spine(load_entities(Path(entities)), views[0].geoid_index, Path(entities))
             if entities is not None else None)
    tasks = [dask.delayed(evaluate_run)(r, lab, truth_d, ent_d, opts) for r, lab in zip(runs, labels)]
    if not read_as_declared(views[0].census) and PERSONS.name in views[0].manifest.products:  # SRS samples P.L. 94-171 persons
        tasks += [dask.delayed(sampling_replicate)(runs[0], truth_d, rate, rep, opts)
                  for rate in opts.sampling_rates for rep in range(opts.sampling_replicates)]
    results = compute(tasks, client, "evaluate runs and samples")  # on local threads without a client
    run_results = results[:len(runs)]
    tables: dict[str, pd.DataFrame] = {}
    for name in ("summary", "errors_by_bin", "blau", "homogeneity", "entities", "epl"):
        tables[name] = _frame([r["tables"][name] for r in run_results if not r["tables"][name].empty])
    tables["sampling"] = _frame([r["sampling"] for r in results[len(runs):]])
    tables["replicates"] = replicate_spread(run_results)  # protected estimates only: nothing to suppress
    if opts.suppress:
        for name in ("summary", "errors_by_bin", "blau", "homogeneity", "entities", "epl", "sampling"):
            tables[name] = suppress_small(tables[name])
    if audit is not None:
        tables["audit"] = load_audit(Path(audit))
    from .eval_report import write_report

    with removed_on_failure(out) if not out.exists() else nullcontext():  # a new folder: complete or absent
        private_dir(out)  # computed from the true counts: the user's alone (README, "Who can read what")
        for name, frame in tables.items():
            write_table(frame, out / f"{name}.parquet")
        extra = _intervals(runs[0], truth, entities, opts, out) if opts.uncertainty is not None else None
        write_report(out, tables, labels, figures=opts.figures, suppressed=opts.suppress, extra=extra)
    return seal(out)


def _intervals(run: Path, truth: Path, entities: Path | None, opts: EvalOptions, out: Path) -> tuple[dict, str]:
    """The interval figure (no true count: the report shows summaries only) and the coverage of the truth by
    each method's 90 % intervals (gls, amc) per level (written as intervals_coverage.parquet)."""
    from .eval_report import _table
    from .intervals import coverage_summary, interval_caption, interval_figure, interval_table, truth_totals

    unc = pd.read_parquet(opts.uncertainty)
    reader = RunReader(run)
    spine, product = reader.spine_table(), reader.products()[0].name  # the run's first product
    ent = load_entities(entities) if entities is not None else None
    totals = truth_totals(load_truth(truth, reader.census()).blocks[product], spine, ent)
    cov = coverage_summary(unc, totals, product)
    if opts.suppress:  # the coverage of one or two geounits says where their true counts lie
        cov = suppress_small(cov.rename(columns={"geounits": "n"})).rename(columns={"n": "geounits"})
    write_table(cov, out / "intervals_coverage.parquet")
    levels = list(spine.columns[1:])
    shown = interval_table(unc, product, (levels[max(len(levels) - 3, 0)], "place"))  # the U.S.: Tract
    figs = {"intervals": (interval_figure(shown, levels), interval_caption(shown, levels))} if opts.figures else {}
    return figs, _table(cov.set_index("level"), "Share of geounits whose 90% interval covers the true TOTAL")


def load_audit(path: Path) -> pd.DataFrame:
    """The per-node table of a ``topdown audit`` output directory (``audit.parquet``)."""
    table = path / "audit.parquet" if path.is_dir() else path
    if not table.exists():
        raise EvaluationError(f"{table}: not an audit output (no audit.parquet; see `topdown audit`)")
    return pd.read_parquet(table)


def evaluate_command(runs: Sequence[str], truth: str, entities: str | None = None, out: str | None = None,
                     scheduler: str | None = None, workers: int | None = None, uncertainty: str | None = None,
                     suppress: bool = True, audit: str | None = None) -> int:
    """CLI helper for ``topdown evaluate RUN [RUN...] --truth INPUT [--entities TABLE] [--out DIR]``: evaluates
    (on a Dask scheduler if given, else threads), prints where the report is and the headline errors."""
    opts = EvalOptions(uncertainty=Path(uncertainty) if uncertainty else None, suppress=suppress)
    audit_dir = Path(audit) if audit else None
    if scheduler or workers:
        from ..execution.runner import dask_client

        with dask_client(None, scheduler, workers) as client:
            path = evaluate([Path(r) for r in runs], Path(truth), Path(entities) if entities else None,
                            Path(out) if out else None, client=client, options=opts, audit=audit_dir)
    else:
        path = evaluate([Path(r) for r in runs], Path(truth), Path(entities) if entities else None,
                        Path(out) if out else None, options=opts, audit=audit_dir)
    summary = pd.read_parquet(path / "summary.parquet")
    main = first_product(summary)
    persons = summary["product"] == main if main is not None else True
    tot = summary[(summary["query"] == "total") & persons].pivot_table(index="level", columns="run", values="mean_abs_error",
                                                            sort=False)
    print(f"CONFIDENTIAL evaluation (computed from the true counts; do not publish) written to {path} "
          f"(report: {path / 'report.html'})" + ("" if suppress else "; statistics over fewer than 3 geounits NOT suppressed"))
    print(f"mean absolute error of {main or 'the'} TOTAL by level:")
    print(tot.to_string(float_format=lambda v: f"{v:.3f}"))
    return 0
