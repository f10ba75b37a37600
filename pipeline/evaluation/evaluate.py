"""``topdown evaluate``: accuracy and empirical privacy loss of one or more runs against the truth.

The output is CONFIDENTIAL by nature: it is computed from the true counts. It is written to the directory
the user names (``out``) or ``RUN-evaluation-CONFIDENTIAL/`` beside the first run, never inside a published
output (``outdir``), and the report says so at the top. A statistic over fewer than :data:`MIN_NODES` geounits (the
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
the confidential count. The studies beyond each query's errors (Blau index, homogeneity, entities, sampling)
use the queries each product declares for them (``[census.products.P.evaluation]``,
:class:`~topdown.vocab.census.EvaluationRoles`); a product that declares none has those tables empty.

No task reads a level or the truth whole: the truth is tabulated one read task at a time and,
with each run's spine and levels, routed to groups of whole states (:mod:`.grouped`, verify's groups); one
Dask task per group computes every run's and every sample's metrics there, as mergeable parts
(:class:`LevelPart`: per query the distribution of residuals as distinct values and counts, exact sums), which
the driver merges into exactly the tables of the whole level (the root level, one node, is read whole). What
stays per geounit of a level: the Blau quintiles (ranks over the level) keep each populated geounit's name,
Blau index and TOTAL error (about 32 bytes); the replicates table (several runs) each geounit's estimates. The
simple random samples are drawn per state (a multivariate hypergeometric split of the sample over the states,
then each state's persons from its block histograms), so a sample does not depend on the grouping.
"""
from __future__ import annotations

import logging
import os
from contextlib import nullcontext
from fractions import Fraction
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Sequence

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from . import metrics as M
from .eval_report import first_product
from .metrics import MIN_NODES
from .grouped import (SPILL_DIR, block_keys, group_rows, route_entities, route_level, route_spine, route_truth,
                      router, tabulate_task, truth_tasks)
from topdown.geo import one_line
from topdown.vocab.queries import build_query
from ..configuration.errors import ConfigError
from ..execution.dataplane import find_input
from ..runtime.private_files import private_dir, seal
from ..runtime.progress import Steps, compute, reporter
from ..runtime.outdir import check, claimed
from ..runtime.rundir import RunReader, remove_tree, removed_on_failure, write_table
from ..runtime.storage import StorePath, dataset, location, read_frame, read_schema, read_table, scratch
from ..outputs.verify import _Groups, _records
from topdown.pipeline.configuration.census import default_census
from topdown.vocab.census import Census, Product
from ..privacy.budget import of_entry

log = logging.getLogger("topdown")

SAMPLING_RATES: tuple[float, ...] = (0.05, 0.10, 0.25, 0.50, 0.75, 0.90, 0.95)
#: The default output folder's name: the first run's followed by this, beside it.
CONFIDENTIAL_SUFFIX = "-evaluation-CONFIDENTIAL"
#: Columns that identify a row (never suppressed).
KEY_COLUMNS = ("run", "seed", "rate", "replicate", "sampling_seed", "product", "level", "entity_type", "query", "bin",
               "quintile", "homogeneity", "n", "n_answers", "n_residuals", "status", "epsilon_query", "epsilon_total",
               "suppressed")


class EvaluationError(ValueError):
    """Inputs that cannot be evaluated together (names the offending file or entry)."""


@dataclass
class EvalOptions:
    """What to compute. Queries are per product; ``dense_limit`` caps a level's replicate estimates (geounits x
    answers) kept for replicates.parquet."""

    queries: dict[str, tuple[str, ...]] = field(default_factory=dict)  # default: each product's evaluation_queries
    sampling_rates: tuple[float, ...] = SAMPLING_RATES
    sampling_replicates: int = 1
    sampling_seed: int = 0
    sampling_queries: tuple[str, ...] | None = None  # default: the sampled product's declared sample_queries
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
    """True block histograms per product (geocode = 15-character block GEOID)."""

    blocks: dict[str, pd.DataFrame]


def load_truth(truth: Path, census: Census | None = None) -> Truth:
    """The true block histograms of a run's input directory (one file each, or directories of partitions:
    ``dataplane.find_input``), tabulated a read task at a time (:func:`.grouped.tabulate_task`) and held
    whole (evaluation studies of small inputs; ``topdown evaluate`` holds a group of states at a time). The
    records of every product of ``census`` (None: the default census) are read and tabulated as a run reads
    them (``validate.check_records``)."""
    census = census or default_census()
    files = find_input(truth, census)  # FileNotFoundError naming what is missing
    parts: dict[str, list[pd.DataFrame]] = {p.name: [] for p in census.products}
    for path, rgs, products in truth_tasks(files, census):
        for product in products:
            parts[product.name].append(tabulate_task(path, rgs, product, census))
    return Truth({name: _summed(frames) for name, frames in parts.items()})


def _summed(frames: list[pd.DataFrame]) -> pd.DataFrame:
    """Block histogram rows (geocode, cell, count) of several read tasks: a block read twice adds up; sorted."""
    rows = pd.concat(frames, ignore_index=True) if frames else pd.DataFrame(
        {"geocode": pd.Series(dtype="str"), "cell": pd.Series(dtype="int64"), "count": pd.Series(dtype="int64")})
    rows["geocode"] = rows["geocode"].astype(str)
    return rows.groupby(["geocode", "cell"], as_index=False, sort=True)["count"].sum()


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


class RunHead:
    """One run directory, without its spine: manifest, census, levels (what evaluate checks up front)."""

    def __init__(self, root: Path, label: str):
        self.root, self.label = location(root), label
        self.reader = RunReader(self.root)
        self.manifest = self.reader.complete_manifest("evaluating it")  # RunDirError: exit 4, as verify
        self.census = self.reader.census()
        self.levels: list[str] = list(self.manifest.levels)
        columns = [c for c in read_schema(self.reader.spine_path).names if not c.startswith("__index_level_")]
        if columns != ["geoid", *self.levels]:
            raise EvaluationError(f"{self.root / 'spine.parquet'}: columns are not geoid + the manifest's levels")

    @property
    def seed(self) -> Any:
        return self.manifest.seed

    def theoretical_epsilon(self, product: Product) -> tuple[float | None, dict[tuple[str, str], float]]:
        """The product's certified epsilon and, per (level, query) measured, the epsilon of that one
        measurement (zCDP rho_q converted at the product's delta; pure DP epsilon_q), from certificate.json."""
        cert = self.reader.certificate().products.get(product.name) if self.reader.certificate_path.exists() else None
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



class RunView(RunHead):
    """One run directory with its whole spine and the node number of every block at every level (studies of
    small runs: benchmarks/petti_flaxman.py; ``topdown evaluate`` reads a group of states at a time)."""

    def __init__(self, root: Path, label: str):
        super().__init__(root, label)
        spine = self.reader.spine_table()
        self.spine = spine
        self.geoid_index = pd.Index(spine["geoid"])
        self.nodes: dict[str, pd.Index] = {}
        self.codes: dict[str, np.ndarray] = {}
        for level in self.levels:
            codes, nodes = pd.factorize(spine[level], sort=True)
            self.nodes[level], self.codes[level] = pd.Index(nodes.astype(str)), codes.astype(np.int64)

    def truth_at(self, blocks: pd.DataFrame, level: str) -> M.SparseHist:
        """True block histograms rolled up to ``level`` by this run's spine."""
        return _rolled_up(blocks, self.geoid_index, self.codes[level], len(self.nodes[level]), self.root)

    def estimate_at(self, product: Product, level: str) -> M.SparseHist:
        """The run's estimates of ``product`` at ``level`` (:func:`read_estimates`)."""
        return read_estimates(self.reader.histograms(product.name, level), level, self.nodes[level])


def _rolled_up(blocks: pd.DataFrame, geoids: pd.Index, codes: np.ndarray, n: int, root: Path) -> M.SparseHist:
    """Block histograms (geocode = block GEOID) rolled up to the nodes ``codes`` gives each spine row."""
    rows = geoids.get_indexer(blocks["geocode"])
    if (rows < 0).any():
        raise EvaluationError(f"{root / 'spine.parquet'}: truth geocode {blocks['geocode'].iloc[np.flatnonzero(rows < 0)[0]]} "
                              "is not in the run's spine (truth and run do not match)")
    return M.SparseHist(codes[rows], blocks["cell"].to_numpy(np.int64), blocks["count"].to_numpy(np.int64), n)


def read_estimates(path: Path, level: str, nodes: pd.Index) -> M.SparseHist:
    """A level's estimates (a Parquet file or folder of parts) as node numbers of ``nodes``, read a batch at a
    time (only each row's node number, cell and count are kept)."""
    if not path.exists():
        raise EvaluationError(f"{path}: histograms of level {level} not found")
    units, cells, counts = [], [], []
    for batch in dataset(path).to_batches(columns=["geocode", "cell", "count"]):
        geocode = batch.column("geocode").to_pandas().astype(str)
        rows = nodes.get_indexer(geocode)
        if (rows < 0).any():
            raise EvaluationError(f"{path}: geocode {geocode.iloc[np.flatnonzero(rows < 0)[0]]!r} is not a "
                                  f"{level} node of the spine")
        units.append(rows)
        cells.append(batch.column("cell").to_numpy().astype(np.int64))
        counts.append(batch.column("count").to_numpy().astype(np.int64))
    empty = np.zeros(0, np.int64)
    return M.SparseHist(np.concatenate(units) if units else empty, np.concatenate(cells) if cells else empty,
                        np.concatenate(counts) if counts else empty, len(nodes))


# -- one group of states (one Dask task each) ------------------------------------------------------------

def _key(run: str, seed: Any, product: Product, level: str, **more) -> dict:
    return {"run": run, "seed": None if seed is None else str(seed), "product": product.name, "level": level, **more}


def _summary_row(rs: M.ResidualSummary) -> dict:
    med, mx = rs.abs_quantiles((0.5, 1.0))
    row = {"n": rs.n_units, "n_answers": rs.n_answers, "mean_abs_error": rs.mean_abs_error,
           "mean_abs_cell_error": rs.mean_abs_cell_error, "median_abs_error": float(med), "max_abs_error": float(mx)}
    row.update({M.quantile_column(q): float(v) for q, v in zip(M.QUANTILES, rs.signed_quantiles(M.QUANTILES))})
    return row


def _epl_row(rs: M.ResidualSummary, opts: EvalOptions) -> dict:
    res = M.empirical_privacy_loss(rs.values, rs.counts, factor=opts.epl_factor, min_count=opts.epl_min_count,
                                   n_boot=opts.epl_bootstrap)
    return {"n": rs.n_units, "n_residuals": res.n_residuals, "status": res.status, "epl": res.epl, "epl_lo": res.lo,
            "epl_hi": res.hi, "bandwidth": res.bandwidth,
            "range_lo": float(res.x.min()) if res.x.size else None, "range_hi": float(res.x.max()) if res.x.size else None}


@dataclass
class LevelPart:
    """A level's metrics at some of its geounits (a group's, or the root's), mergeable with :func:`_merge_levels`:
    per query a :class:`~.metrics.ResidualSummary`; the TOTAL's :class:`~.metrics.ErrorStats` per true-population
    bin and per homogeneity value; each populated geounit's name, Blau index and TOTAL error (quintiles are ranks
    over the whole level); each replicate query's estimates by geounit."""

    queries: dict[str, M.ResidualSummary]
    bins: list[M.ErrorStats] | None = None
    blau: tuple[np.ndarray, np.ndarray, np.ndarray] | None = None
    homogeneity: dict[int, M.ErrorStats] | None = None
    replicates: dict[str, pd.Series] = field(default_factory=dict)


def _names(nodes: pd.Index) -> np.ndarray:
    """Node names as a compact array that sorts as the names do (bytes when ASCII)."""
    values = nodes.to_numpy().astype(str)
    try:
        return np.char.encode(values, "ascii") if values.size else values
    except UnicodeEncodeError:
        return values


def _level_part(spec: Product, true: M.SparseHist, est: M.SparseHist, nodes: pd.Index, queries: Sequence[str],
                edges: Sequence[int] | None, replicate: set[str], rate: float = 1.0) -> LevelPart:
    """The metrics of one level at the geounits ``nodes`` (``true``, ``est`` their histograms); ``edges``: the
    TOTAL's bins (None: no per-geounit metrics, as for the sampling baselines); the Blau and homogeneity
    studies as ``spec`` declares them."""
    part = LevelPart({})
    err = true_total = None
    for name in queries:
        query = build_query(spec.schema, name)
        dense = edges is not None and name == "total" or name in replicate
        qe = M.query_errors(true, est, query, true.n_units * query.n_answers if dense else -1, rate=rate)
        part.queries[name] = qe.summary()
        if name in replicate:
            idx = pd.MultiIndex.from_product([nodes, range(qe.n_answers)], names=["geocode", "answer"])
            part.replicates[name] = pd.Series(qe.est.ravel(), index=idx)
        if edges is not None and name == "total":
            true_total, err = qe.true[:, 0], (qe.est - qe.true)[:, 0]
    if edges is None:
        return part
    part.bins = M.bin_stats(true_total, err, edges)
    roles = spec.evaluation
    if roles.diversity_query:
        blau_query = build_query(spec.schema, roles.diversity_query)
        blau = M.blau_index(M.query_errors(true, true, blau_query, true.n_units * blau_query.n_answers).true)
        kept = ~np.isnan(blau)
        part.blau = (_names(nodes)[kept], blau[kept], err[kept])
    if roles.homogeneity:
        part.homogeneity = M.homogeneity_stats(M.homogeneity_index(M.nonzero_cells(true), spec.schema.ncells), err)
    return part


def _merge_levels(parts: list[LevelPart]) -> LevelPart:
    """The metrics of a level from those of its groups (exact: counts and exact sums add, distributions merge)."""
    queries = {name: M.ResidualSummary.merge([p.queries[name] for p in parts]) for name in parts[0].queries}
    out = LevelPart(queries)
    if parts[0].bins is not None:
        out.bins = [M.ErrorStats.merge([p.bins[b] for p in parts]) for b in range(len(parts[0].bins))]
    if parts[0].blau is not None:
        names, blau, err = (np.concatenate([p.blau[i] for p in parts]) for i in range(3))
        order = np.argsort(names, kind="stable")  # the level's node order (nodes are numbered in sorted order)
        out.blau = (names[order], blau[order], err[order])
    if parts[0].homogeneity is not None:
        keys = sorted({k for p in parts for k in p.homogeneity})
        out.homogeneity = {k: M.ErrorStats.merge([p.homogeneity[k] for p in parts if k in p.homogeneity])
                           for k in keys}
    for name in parts[0].replicates:
        out.replicates[name] = pd.concat([p.replicates[name] for p in parts]).sort_index()
    return out


@dataclass
class RunPlan:
    """What a group's task evaluates of one run: its label, seed, spine levels and per product the queries
    and the replicate queries kept (dense arrays small enough)."""

    label: str
    seed: Any
    levels: list[str]
    products: dict[str, tuple[Product, list[str], dict[str, set[str]]]]
    root_nodes: pd.Index  # the root level's nodes (read whole)


@dataclass
class SamplePlan:
    """The simple random samples of ``product``'s records: per (rate, replicate) the records drawn from each key
    of the groups (:func:`.grouped.block_keys`: a state on the U.S. spine), and the ``queries`` compared."""

    product: Product
    queries: tuple[str, ...]
    draws: dict[tuple[float, int], np.ndarray]
    groups: _Groups  # a router (.grouped.router): each block's key
    seed: int


def _group_nodes(spine: pd.DataFrame, level: str) -> tuple[pd.Index, np.ndarray]:
    codes, nodes = pd.factorize(spine[level], sort=True)
    return pd.Index(np.asarray(nodes, dtype=object).astype(str)), codes.astype(np.int64)


def _group_truth(tmp: Path, product: Product, g: int) -> pd.DataFrame:
    """Group ``g``'s true block histograms of ``product`` (a block read by two tasks adds up), sorted."""
    return _summed([group_rows(tmp / "truth" / product.name, g, {"geocode": "str", "cell": "int64", "count": "int64"})])


def _root_rows(blocks: pd.DataFrame, geoids: pd.Index, codes: np.ndarray, root: Path) -> pd.DataFrame:
    """Block rows summed per (root node, cell): a group's share of the root level's histogram."""
    hist = _rolled_up(blocks, geoids, codes, 0, root)
    return (pd.DataFrame({"unit": hist.unit, "cell": hist.cell, "count": hist.count})
            .groupby(["unit", "cell"], as_index=False)["count"].sum())


def _sample(blocks: pd.DataFrame, state: np.ndarray, draws: np.ndarray, seed: tuple[int, ...]) -> np.ndarray:
    """Records drawn without replacement from each key's block histograms (``draws[k]`` of key k, ``state`` each
    row's key number: :func:`.grouped.block_keys`, a state on the U.S. spine): the sampled count of each row. A
    key's draw depends on the seed and the key only, not on its group."""
    counts = blocks["count"].to_numpy(np.int64)
    out = np.zeros(len(blocks), np.int64)
    for k in np.unique(state):
        rows = np.flatnonzero(state == k)
        rng = np.random.default_rng((*seed, int(k)))
        out[rows] = rng.multivariate_hypergeometric(counts[rows], int(draws[k]), method="marginals")
    return out


def evaluate_group(g: int, tmp: Path, runs: list[tuple[Path, RunPlan]], sampling: SamplePlan | None,
                   entity_kinds: int, opts: EvalOptions) -> dict:
    """Every metric's share of group ``g`` of states: per run, product and level below the root a
    :class:`LevelPart`; the group's rows of each root histogram; the sampling baselines; the entities' sums."""
    out: dict[str, dict] = {"runs": {}, "root_truth": {}, "srs": {}, "srs_root": {}, "entities": {}}
    truth: dict[str, pd.DataFrame] = {}
    for i, (root, plan) in enumerate(runs):
        spine = group_rows(tmp / "spine" / str(i), g, {c: "str" for c in ["geoid", *plan.levels]}).astype(str)
        geoids = pd.Index(spine["geoid"])
        top, below = plan.levels[0], plan.levels[1:]
        nodes = {level: _group_nodes(spine, level) for level in below}
        root_codes = plan.root_nodes.get_indexer(spine[top])
        for product, (spec, queries, replicate) in plan.products.items():
            if product not in truth:
                truth[product] = _group_truth(tmp, spec, g)
            blocks = truth[product]
            out["root_truth"][(i, product)] = _root_rows(blocks, geoids, root_codes, root)
            for level in below:
                names, codes = nodes[level]
                est_rows = group_rows(tmp / "est" / str(i) / product / level, g,
                                      {"geocode": "str", "cell": "int64", "count": "int64"})
                est = _group_estimates(est_rows, names, level, root / "histograms" / product / f"level={level}")
                true = _rolled_up(blocks, geoids, codes, len(names), root)
                edges = M.BLOCK_BINS if level == plan.levels[-1] else M.COUNTY_BINS
                out["runs"][(i, product, level)] = _level_part(spec, true, est, names, queries, edges,
                                                             replicate[level])
                if level == plan.levels[-1] and spec.evaluation.share_query and entity_kinds:
                    out["entities"][(i, product)] = _entity_sums(tmp, g, blocks, spine, level, est, entity_kinds,
                                                                 root, spec)
        if i == 0 and sampling is not None:
            blocks = truth[sampling.product.name]
            state = block_keys(sampling.groups, blocks["geocode"])
            for (rate, rep), draws in sampling.draws.items():
                sampled = blocks.assign(count=_sample(blocks, state, draws,
                                                      (sampling.seed, int(round(rate * 10000)), rep)))
                out["srs_root"][(rate, rep)] = _root_rows(sampled, geoids, root_codes, root)
                for level in below:
                    names, codes = nodes[level]
                    true, est = (_rolled_up(b, geoids, codes, len(names), root) for b in (blocks, sampled))
                    out["srs"][(rate, rep, level)] = _level_part(sampling.product, true, est, names,
                                                                 sampling.queries, None, set(), rate)
    return out


def _group_estimates(rows: pd.DataFrame, nodes: pd.Index, level: str, path: Path) -> M.SparseHist:
    """A group's estimate rows of ``level`` as node numbers of its ``nodes``."""
    geocode = rows["geocode"].astype(str)
    units = nodes.get_indexer(geocode)
    if (units < 0).any():
        raise EvaluationError(f"{path}: geocode {geocode.iloc[np.flatnonzero(units < 0)[0]]!r} is not a "
                              f"{level} node of the spine")
    return M.SparseHist(units.astype(np.int64), rows["cell"].to_numpy(np.int64), rows["count"].to_numpy(np.int64),
                        len(nodes))


def _entity_queries(spec: Product) -> tuple[str, str]:
    """The off-spine entity queries of ``spec``: TOTAL and its declared largest-group share query."""
    return "total", spec.evaluation.share_query


def _entity_sums(tmp: Path, g: int, blocks: pd.DataFrame, spine: pd.DataFrame, leaf: str, est: M.SparseHist,
                 kinds: int, root: Path, spec: Product) -> dict:
    """Per entity kind and query of ``spec`` (:func:`_entity_queries`), the group's sparse answer sums (keys
    entity x answer) of the truth and of the estimates (exact integer sums: the groups' add up to the
    entities' whole)."""
    leaf_nodes, leaf_codes = _group_nodes(spine, leaf)
    if len(leaf_nodes) != len(spine):
        raise EvaluationError(f"{root / 'spine.parquet'}: {leaf} nodes are not one per block GEOID")
    leaf_geoid = np.empty(len(spine), dtype=object)
    leaf_geoid[leaf_codes] = spine["geoid"].to_numpy()
    table = group_rows(tmp / "entities", g, {"geoid": "str", "kind": "int64", "entity": "int64"})
    out = {}
    for kind in range(kinds):
        rows = table[table["kind"] == kind]
        where = pd.Index(rows["geoid"].astype(str))
        t_rows, e_rows = where.get_indexer(blocks["geocode"]), where.get_indexer(pd.Index(leaf_geoid[est.unit].astype(str)))
        t_sel, e_sel = t_rows >= 0, e_rows >= 0
        entity = rows["entity"].to_numpy(np.int64)
        true = M.SparseHist(entity[t_rows[t_sel]], blocks["cell"].to_numpy(np.int64)[t_sel],
                            blocks["count"].to_numpy(np.int64)[t_sel], 0)
        esth = M.SparseHist(entity[e_rows[e_sel]], est.cell[e_sel], est.count[e_sel], 0)
        out[kind] = {name: (M.answer_totals(true, build_query(spec.schema, name)),
                            M.answer_totals(esth, build_query(spec.schema, name))) for name in _entity_queries(spec)}
    return out


def _entity_tables(label: str, seed: Any, spec: Product, parts: list[dict], kinds: list[tuple[str, int]],
                   opts: EvalOptions) -> list[pd.DataFrame]:
    """The entity metrics of one run and product from its groups' answer sums (``kinds``: name and number of
    entities)."""
    frames = []
    total, share = _entity_queries(spec)
    for k, (kind, n) in enumerate(kinds):
        dense = {}
        for name in (total, share):
            a = build_query(spec.schema, name).n_answers
            pair = []
            for side in (0, 1):
                keys = np.concatenate([p[k][name][side][0] for p in parts]) if parts else np.zeros(0, np.int64)
                sums = np.concatenate([p[k][name][side][1] for p in parts]) if parts else np.zeros(0)
                values = np.zeros(n * a)
                np.add.at(values, keys, sums)
                pair.append(values.reshape(n, a))
            dense[name] = pair
        (tt, te), (st, se) = dense[total], dense[share]
        frame = M.entity_metrics(tt[:, 0], (te - tt)[:, 0], M.largest_share_error(se, st), opts.entity_bins)
        frames.append(frame.assign(run=label, seed=None if seed is None else str(seed), entity_type=kind,
                                   query="total"))
    return frames


def _level_rows(label: str, seed: Any, spec: Product, level: str, part: LevelPart, edges: Sequence[int],
                eps: tuple[float | None, dict], opts: EvalOptions, out: dict[str, list]) -> None:
    """A merged level's rows of every table of one run and product (appended to ``out``)."""
    for name, rs in part.queries.items():
        out["summary"].append({**_key(label, seed, spec, level, query=name), **_summary_row(rs)})
        out["epl"].append({**_key(label, seed, spec, level, query=name), **_epl_row(rs, opts),
                           "epsilon_query": eps[1].get((level, name)), "epsilon_total": eps[0]})
    out["errors_by_bin"].append(M.bin_rows(part.bins, edges).assign(**_key(label, seed, spec, level, query="total")))
    if part.blau is not None:
        out["blau"].append(M.blau_quintile_errors(part.blau[1], part.blau[2]).assign(**_key(label, seed, spec, level)))
    if part.homogeneity is not None:
        out["homogeneity"].append(M.homogeneity_rows(part.homogeneity).assign(**_key(label, seed, spec, level)))


def _frame(parts: list) -> pd.DataFrame:
    if not parts:
        return pd.DataFrame()
    if isinstance(parts[0], pd.DataFrame):
        frame = pd.concat(parts, ignore_index=True)
    else:
        frame = pd.DataFrame(parts)
    lead = [c for c in ("run", "seed", "rate", "replicate", "product", "level", "entity_type", "query") if c in frame]
    return frame[lead + [c for c in frame.columns if c not in lead]]


def _sum_rows(frames: list[pd.DataFrame], n: int) -> M.SparseHist:
    """The groups' rows of a root histogram (unit, cell, count) summed into one."""
    rows = pd.concat(frames, ignore_index=True).groupby(["unit", "cell"], as_index=False, sort=True)["count"].sum()
    return M.SparseHist(rows["unit"].to_numpy(np.int64), rows["cell"].to_numpy(np.int64),
                        rows["count"].to_numpy(np.int64), n)


def _sample_queries(spec: Product, opts: EvalOptions) -> tuple[str, ...]:
    """The queries compared with simple random samples of ``spec``'s records: its declared ``sample_queries``
    (``opts.sampling_queries`` instead, when given, for a product that declares some); none: not sampled."""
    declared = spec.evaluation.sample_queries
    return declared if not declared or opts.sampling_queries is None else tuple(opts.sampling_queries)


def _plan(head: RunHead, groups: _Groups, truth_names: set[str], n_runs: int, opts: EvalOptions) -> RunPlan:
    """What is evaluated of one run (:class:`RunPlan`); ``groups`` its spine's groups."""
    products = {}
    sizes = {level: len(pc.unique(groups.spine.column(level).cast(pa.large_string()))) for level in head.levels}
    for spec in head.census.products:  # the truth is tabulated as the run's census's products
        if spec.name not in head.manifest.products or spec.name not in truth_names:
            continue
        extra = _sample_queries(spec, opts)
        asked = opts.queries.get(spec.name, spec.evaluation_queries)
        queries = list(dict.fromkeys(["total", *asked, *extra, *opts.replicate_queries]))
        replicate = {level: {q for q in opts.replicate_queries if q in queries and n_runs > 1
                             and sizes[level] * build_query(spec.schema, q).n_answers <= opts.dense_limit}
                     for level in head.levels}
        products[spec.name] = (spec, queries, replicate)
    root = groups.spine.column(head.levels[0]).cast(pa.large_string())
    return RunPlan(head.label, head.seed, head.levels, products, pd.Index(sorted(pc.unique(root).to_pylist())))


def _evaluate_grouped(heads: list[RunHead], truth: Path, entities: pd.DataFrame | None, tmp: Path, client,
                      opts: EvalOptions) -> tuple[dict[str, pd.DataFrame], list[dict], tuple[Product, ...]]:
    """Every table of the evaluation, computed one group of states at a time (module :mod:`.grouped`); and the
    first run's products evaluated, in order."""
    import dask

    first = heads[0]
    census = first.census
    files = find_input(truth, census)  # FileNotFoundError naming what is missing
    truth_names = {p.name for p in census.products}
    reader = first.reader
    records = _records(reader, reader.products(), first.levels[1])
    plans, groups0 = [], None
    for i, head in enumerate(heads):
        groups = _Groups(head.reader.spine_path, head.levels, head.reader.hierarchy().us, records)
        if groups0 is None:
            groups0 = router(groups)
        elif groups.count != groups0.count or not all(np.array_equal(a, b) for a, b in
                                                     zip(groups.runs["key"], groups0.runs["key"])):
            raise EvaluationError(f"{head.root / 'spine.parquet'}: its blocks do not group into states as those of "
                                  f"{first.root} do (evaluate runs of one input together)")
        plan = _plan(head, groups, truth_names, len(heads), opts)
        plans.append(plan)
        route_spine(groups, tmp / "spine" / str(i))
        for product in plan.products:
            for level in head.levels[1:]:
                path = head.reader.histograms(product, level)
                if not path.exists():
                    raise EvaluationError(f"{path}: histograms of level {level} not found")
                route_level(groups, path, tmp / "est" / str(i) / product / level, level)
        if i == 0 and entities is not None:
            kinds, rows = [], []
            for kind, table in entities.groupby("entity_type", sort=True):
                codes, names = pd.factorize(table["entity"], sort=True)
                kinds.append((kind, len(names)))
                rows.append(pd.DataFrame({"geoid": table["geoid"].to_numpy(), "kind": len(kinds) - 1,
                                          "entity": codes.astype(np.int64)}))
            route_entities(groups, pd.concat(rows, ignore_index=True), tmp / "entities")
        del groups
    kinds = kinds if entities is not None else []
    routed = [dask.delayed(route_truth)(path, rgs, prods, census, groups0, tmp / "truth", k)
              for k, (path, rgs, prods) in enumerate(truth_tasks(files, census))]
    totals = compute(routed, client, "tabulate the truth by group of states")
    sampling = None
    sampled = next((spec for spec, _, _ in plans[0].products.values() if _sample_queries(spec, opts)), None)
    if sampled is not None:  # the first product declaring sample queries
        per_key = np.sum([t[sampled.name] for t in totals if sampled.name in t], axis=0).astype(np.int64)
        draws = {}
        for rate in opts.sampling_rates:
            if not 0 < rate <= 1:
                raise ValueError(f"sampling rate {rate} is not in (0, 1]")
            size = int(round(rate * int(per_key.sum())))
            for rep in range(opts.sampling_replicates):
                rng = np.random.default_rng((opts.sampling_seed, int(round(rate * 10000)), rep))
                draws[(rate, rep)] = rng.multivariate_hypergeometric(per_key, size, method="marginals")
        sampling = SamplePlan(sampled, _sample_queries(sampled, opts), draws, groups0, opts.sampling_seed)
    tasks = [dask.delayed(evaluate_group)(g, tmp, list(zip([h.root for h in heads], plans)), sampling, len(kinds), opts)
             for g in range(groups0.count)]
    parts = compute(tasks, client, "evaluate groups of states")
    return (*_merged_tables(heads, plans, parts, sampling, kinds, opts),
            tuple(spec for spec, _, _ in plans[0].products.values()))


def _merged_tables(heads: list[RunHead], plans: list[RunPlan], parts: list[dict], sampling: SamplePlan | None,
                   kinds: list[tuple[str, int]], opts: EvalOptions) -> tuple[dict[str, pd.DataFrame], list[dict]]:
    """The tables from the groups' parts; the root level from the groups' root rows and the root estimates."""
    out: dict[str, list] = {k: [] for k in ("summary", "errors_by_bin", "blau", "homogeneity", "entities", "epl")}
    run_results = []
    progress = reporter()  # a bar over the levels merged (their errors and empirical privacy loss take a while)
    bar = progress.bar("merge the groups' tables", sum(len(p.products) * len(p.levels) for p in plans)
                  + (len(sampling.draws) * len(plans[0].levels) if sampling is not None else 0), "levels")
    for i, (head, plan) in enumerate(zip(heads, plans)):
        replicates: dict[tuple[str, str, str], pd.Series] = {}
        top = plan.levels[0]
        for product, (spec, queries, replicate) in plan.products.items():
            eps = head.theoretical_epsilon(spec)
            for level in plan.levels:
                edges = M.BLOCK_BINS if level == plan.levels[-1] else M.COUNTY_BINS
                if level == top:
                    true = _sum_rows([p["root_truth"][(i, product)] for p in parts], len(plan.root_nodes))
                    est = read_estimates(head.reader.histograms(product, top), top, plan.root_nodes)
                    part = _level_part(spec, true, est, plan.root_nodes, queries, edges, replicate[top])
                else:
                    part = _merge_levels([p["runs"][(i, product, level)] for p in parts])
                _level_rows(plan.label, plan.seed, spec, level, part, edges, eps, opts, out)
                replicates.update({(product, level, name): s for name, s in part.replicates.items()})
                progress.check()
                bar.update(1)
            if spec.evaluation.share_query and kinds:
                out["entities"] += _entity_tables(plan.label, plan.seed, spec, [p["entities"][(i, product)]
                                                                                for p in parts], kinds, opts)
        run_results.append({"replicates": replicates, "label": plan.label})
    tables = {k: _frame(v) for k, v in out.items()}
    rows = []
    if sampling is not None:
        plan = plans[0]
        true_root = _sum_rows([p["root_truth"][(0, sampling.product.name)] for p in parts], len(plan.root_nodes))
        for (rate, rep) in sampling.draws:
            for level in plan.levels:
                if level == plan.levels[0]:
                    est = _sum_rows([p["srs_root"][(rate, rep)] for p in parts], len(plan.root_nodes))
                    part = _level_part(sampling.product, true_root, est, plan.root_nodes, sampling.queries, None,
                                       set(), rate)
                else:
                    part = _merge_levels([p["srs"][(rate, rep, level)] for p in parts])
                for name, rs in part.queries.items():
                    s, e = _summary_row(rs), _epl_row(rs, opts)
                    rows.append({"rate": rate, "replicate": rep, "sampling_seed": opts.sampling_seed, "level": level,
                                 "query": name, "n": s["n"], "mean_abs_error": s["mean_abs_error"],
                                 "median_abs_error": s["median_abs_error"],
                                 "mean_abs_cell_error": s["mean_abs_cell_error"], "status": e["status"],
                                 "epl": e["epl"], "epl_lo": e["epl_lo"], "epl_hi": e["epl_hi"]})
                progress.check()
                bar.update(1)
    progress.close(bar)
    tables["sampling"] = _frame([pd.DataFrame(rows)] if rows else [])
    return tables, run_results


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


# -- suppression of small statistics --------------------------------------------------

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


def default_out(run: Path | StorePath) -> Path | StorePath:
    """Where the evaluation of ``run`` goes without ``--out``: ``RUN-evaluation-CONFIDENTIAL`` beside it."""
    run = location(run)
    run = run if isinstance(run, StorePath) else Path(os.path.abspath(run))
    return run.with_name(run.name + CONFIDENTIAL_SUFFIX)


def evaluate(run_dirs: list[Path], truth: Path, entities: Path | None = None, out: Path | None = None, client=None,
             options: EvalOptions | None = None, audit: Path | None = None) -> Path:
    """Evaluate ``run_dirs`` against the input directory ``truth`` and write the tables, figures and
    report.html to ``out`` (default: :func:`default_out` of the first run). Returns the output directory.
    ``audit``: the output directory of ``topdown audit``, whose bounds the report shows beside the EPL.

    The truth's read tasks, then one task per group of states (all runs and sampling replicates), are computed
    on ``client`` if given, else locally on threads; the groups' rows lie meanwhile in a private folder inside
    ``out`` (:data:`.grouped.SPILL_DIR`, room for a copy of the runs' histograms and the tabulated truth),
    removed at the end. ``entities``: a (geoid, entity_type, entity) CSV/Parquet table or a BAF directory.
    """
    opts = options or EvalOptions()
    runs = [location(r) for r in run_dirs]
    if not runs:
        raise EvaluationError("evaluate needs at least one run directory")
    seen: dict[Path, Path] = {}
    for r in runs:  # several runs are replicates: the same one twice would count as two
        if (first := seen.setdefault(r.resolve(), r)) is not r:
            raise ConfigError(f"{r}: the run {first} named twice (several runs are replicates of different seeds)")
    labels = _labels(runs)
    heads = [RunHead(r, lab) for r, lab in zip(runs, labels)]  # fail fast, naming the offending directory
    if opts.uncertainty is not None:
        _check_uncertainty_file(opts.uncertainty)
    out = location(out) if out is not None else default_out(runs[0])
    check(out, "evaluate")
    ent = None
    if entities is not None:
        spine = read_table(heads[0].reader.spine_path, columns=["geoid"]).column("geoid")
        ent = entities_on_spine(load_entities(Path(entities)), pd.Index(spine.to_pandas(types_mapper=pd.ArrowDtype)),
                                Path(entities))
    from .eval_report import Declared, write_report

    # computed from the true counts: the user's alone, private (docs/reference/output-layout.md); a new folder:
    # complete or absent
    with claimed(out, "evaluate") as claim, removed_on_failure(out) if not claim.earlier else nullcontext():
        tmp = scratch(out, SPILL_DIR)
        try:
            tables, run_results, evaluated = _evaluate_grouped(heads, location(truth), ent, private_dir(tmp), client,
                                                               opts)
        finally:
            remove_tree(tmp)
        steps = Steps("write the evaluation", 2 + bool(opts.figures) + (opts.uncertainty is not None))
        steps.start("tables")
        tables["replicates"] = replicate_spread(run_results)  # protected estimates only: nothing to suppress
        if opts.suppress:
            for name in ("summary", "errors_by_bin", "blau", "homogeneity", "entities", "epl", "sampling"):
                tables[name] = suppress_small(tables[name])
        if audit is not None:
            tables["audit"] = load_audit(Path(audit))
        for name, frame in tables.items():
            write_table(frame, out / f"{name}.parquet")
        extra = None
        if opts.uncertainty is not None:
            steps.start("intervals")
            extra = _intervals(runs[0], truth, entities, opts, out)
        steps.start("figures" if opts.figures else "report")
        census = heads[0].census
        write_report(out, tables, labels, figures=opts.figures, suppressed=opts.suppress, extra=extra,
                     step=steps.start, declared=Declared(census.name, evaluated, census.hierarchy.us))
        steps.close()
    return seal(out)


#: The columns of a ``topdown uncertainty`` file that ``evaluate --uncertainty`` reads.
UNCERTAINTY_COLUMNS = ("product", "level", "geocode", "query", "cell", "method", "published", "estimate", "ci90_low",
                       "ci90_high")


def _check_uncertainty_file(path: Path) -> None:
    """``evaluate --uncertainty``: a Parquet file with the columns of a ``topdown uncertainty`` file, checked
    before the evaluation starts (:class:`EvaluationError` naming the file)."""
    try:
        names = read_schema(path).names
    except (OSError, pa.ArrowException) as exc:
        raise EvaluationError(f"{path}: --uncertainty is not a readable Parquet file ({one_line(exc)})") from None
    missing = [c for c in UNCERTAINTY_COLUMNS if c not in names]
    if missing:
        raise EvaluationError(f"{path}: --uncertainty is not a `topdown uncertainty` file (no column "
                              f"{missing[0]!r})")


def _intervals(run: Path, truth: Path, entities: Path | None, opts: EvalOptions, out: Path) -> tuple[dict, str]:
    """The interval figure (no true count: the report shows summaries only) and the coverage of the truth by
    each method's 90 % intervals (gls, amc) per level (written as intervals_coverage.parquet)."""
    from .eval_report import _table
    from .intervals import coverage_summary, interval_caption, interval_figure, interval_table, truth_totals

    unc = read_frame(opts.uncertainty)
    reader = RunReader(run)
    spine, product = reader.spine_table(), reader.products()[0]  # the run's first product
    ent = load_entities(entities) if entities is not None else None
    totals = truth_totals(load_truth(truth, reader.census()).blocks[product.name], spine, ent)
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


def total_headline(summary: pd.DataFrame) -> str:
    """The first product's mean absolute error of the total by level and run (the command's last lines), or
    that every one is suppressed."""
    main = first_product(summary)
    rows = summary[(summary["query"] == "total") & ((summary["product"] == main) if main is not None else True)]
    tot = rows.pivot_table(index="level", columns="run", values="mean_abs_error", sort=False)
    if tot.dropna(how="all").empty:
        return (f"mean absolute error of {main or 'the'} TOTAL: every level suppressed (fewer than 3 geounits a "
                "statistic; --no-suppress shows them)")
    return f"mean absolute error of {main or 'the'} TOTAL by level:\n" + tot.to_string(float_format=lambda v: f"{v:.3f}")


def evaluate_command(runs: Sequence[str], truth: str, entities: str | None = None, out: str | None = None,
                     scheduler: str | None = None, workers: int | None = None, uncertainty: str | None = None,
                     suppress: bool = True, audit: str | None = None) -> int:
    """CLI helper for ``topdown evaluate RUN [RUN...] --truth INPUT [--entities TABLE] [--out DIR]``: evaluates
    (on a Dask scheduler if given, else threads), prints where the report is and the headline errors."""
    opts = EvalOptions(uncertainty=location(uncertainty) if uncertainty else None, suppress=suppress)
    if opts.uncertainty is not None:  # before the cluster starts
        _check_uncertainty_file(opts.uncertainty)
    audit_dir = Path(audit) if audit else None
    check(location(out) if out else default_out(runs[0]), "evaluate")  # refused before the cluster starts
    if scheduler or workers:
        from ..execution.runner import dask_client

        with dask_client(None, scheduler, workers) as client:
            path = evaluate(list(runs), location(truth), Path(entities) if entities else None,
                            location(out) if out else None, client=client, options=opts, audit=audit_dir)
    else:
        path = evaluate(list(runs), location(truth), Path(entities) if entities else None,
                        location(out) if out else None, options=opts, audit=audit_dir)
    print(f"CONFIDENTIAL evaluation (computed from the true counts; do not publish) written to {path} "
          f"(report: {path / 'report.html'})" + ("" if suppress else "; statistics over fewer than 3 geounits NOT suppressed"))
    print(total_headline(read_frame(path / "summary.parquet")))
    return 0
