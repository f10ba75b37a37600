"""``topdown audit``: the direct estimate of empirical privacy loss on neighbouring databases.

TopDown runs N times on the input D and N times on D', the same input with one record of the audited product
(a person) moved from leaf FROM to leaf TO (blocks on the U.S. spine; a bounded neighbour: one record changed).
Any declared census is audited: its records are read as a run reads them, its queries named on the audited
product's schema. For every node on the two leaves' paths and every audited query, the count of the answer that holds the moved person is recorded; for each threshold
event {error >= k} and its complement, where error = output - (true count in D), the frequencies in the
two samples give a log-ratio, and Clopper-Pearson bounds give a lower confidence bound on it (Ding et al.
2018; Flaxman 2019, "Empirical quantification of privacy loss
with examples relevant to the 2020 US Census", "direct estimate"). The largest lower bound over the events is a lower
confidence bound on the privacy loss that this count shows; it can never prove more than the truth.

Runs are cheap because only what the audited counts depend on is computed: a node's estimate depends on
its parent's estimate and on the measurements of its parent's children, so each run solves, level by level,
only the parents on the two paths (with all their children), through the engine's own chunk code
(:func:`engine.make_chunks`, :func:`tasks.run_chunk`) with the measurements kept in memory. The levels'
true histograms are tabulated once; the runs are Dask tasks, each a batch of runs of one database.
Run r of D uses seed ``seed + 2 r`` and of D' ``seed + 2 r + 1`` in test mode, so every run is independent
and reproducible, and the first N runs of a larger audit are those of a smaller one.

Known answer (tests/test_audit.py). Pure DP with the geometric mechanism gives a query with budget
epsilon_q noise P(Z = z) proportional to exp(-epsilon_q |z| / 2): the project's neighbour relation is
bounded (change one record), under which a marginal has L1 sensitivity 2 (budget.NEIGHBOURS).
Moving one person changes the FROM block's count by -1 and the TO block's by +1. For one count X = c + Z
(far from 0, so non-negativity never binds) and the event {X >= c + k}, P_D / P_D' = P(Z >= k) / P(Z >= k+1)
= exp(epsilon_q / 2) for every k >= 0 and less for k < 0, and no event on X does better since the pmf ratio
of neighbouring values is exp(epsilon_q / 2). So one audited count shows exactly epsilon_q / 2: half the
guarantee, which covers both counts together.

The output is CONFIDENTIAL: it comes from many runs on the true data (their average is the truth).
"""
from __future__ import annotations

import re
import time
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp
from scipy.special import betaincinv  # the beta distribution's quantile, without importing scipy.stats

from topdown.geo.spine import US_HIERARCHY, build_spine

from ..configuration.config import BudgetConfig, Config, ConfigError, census_hierarchy
from ..configuration.limits import MAX_AUDIT_RUNS, check_count
from ..privacy.budget import of_config
from ..execution.engine import make_chunks
from ..inputs.invariants import InvariantError, LevelConstraints
from ..execution.levels import Level, build_levels
from ..runtime.progress import gather
from topdown.vocab.queries import build_query
from ..runtime.private_files import private_dir, seal
from ..runtime.outdir import check, claimed
from ..runtime.rundir import write_json_atomic, write_table
from topdown.vocab.census import Census, Hierarchy, Product
from ..execution.dataplane import counts_units, find_input
from ..inputs.tabulate import block_units, sparse_counts
from ..execution.tasks import Chunk, run_chunk
from ..inputs.validate import (PERSON_RECORDS, UNIT_RECORDS, block_problem, by_type, check_records, check_units,
                               raise_block_problem)

#: Audited queries by default: the total and the detailed cell of the moved person.
AUDIT_QUERIES: tuple[str, ...] = ("total", "detailed")
#: Runs per Dask task (a batch reuses the task's worker and the shipped plan).
BATCH = 25
AUDIT_ALPHA = 0.05
CONFIDENTIAL_BANNER = "CONFIDENTIAL: computed from many runs on the true data. Do not publish."


class AuditError(ValueError):
    """A move or audit setting that cannot be audited (names the offending value)."""


# -- statistics -----------------------------------------------------------------------------------------

def clopper_pearson(k: np.ndarray, n: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """One-sided Clopper-Pearson bounds at level ``alpha`` each: P(p < lo) <= alpha and P(p > hi) <= alpha."""
    k = np.asarray(k, dtype=float)
    lo = np.where(k > 0, betaincinv(np.maximum(k, 1), n - k + 1, alpha), 0.0)
    hi = np.where(k < n, betaincinv(k + 1, np.maximum(n - k, 1), 1 - alpha), 1.0)
    return lo, hi


@dataclass
class EventLoss:
    """The largest lower confidence bound on log P_A(E) / P_B(E) over the threshold events, and its event."""

    lower: float
    point: float
    event: str
    n_events: int


def threshold_event_loss(err_d: np.ndarray, err_d2: np.ndarray, alpha: float = AUDIT_ALPHA) -> EventLoss:
    """Privacy loss shown by threshold events on one count, from samples of its error on D and on D'.

    Events: {error >= k} and {error < k} for every k between the smallest and largest observed error, each
    compared both ways (D over D' and D' over D). With m comparisons, each lower bound uses Clopper-Pearson
    bounds at alpha / (2 m) (Bonferroni), so the maximum over all of them is a lower confidence bound at
    level 1 - alpha. ``point`` is the frequency log-ratio of the chosen event.
    """
    a, b = np.sort(np.asarray(err_d)), np.sort(np.asarray(err_d2))
    ks = np.unique(np.concatenate([a, b]))[1:]
    if ks.size == 0:
        return EventLoss(0.0, 0.0, "none (every output equal)", 0)
    na, nb = a.size, b.size
    ge_a = na - np.searchsorted(a, ks, side="left")
    ge_b = nb - np.searchsorted(b, ks, side="left")
    counts = [(ge_a, ge_b, ">="), (na - ge_a, nb - ge_b, "<")]
    m = 4 * ks.size
    best = EventLoss(0.0, 0.0, "none", m)
    for ca, cb, op in counts:
        for num, nn, den, nd, way in ((ca, na, cb, nb, "D/D'"), (cb, nb, ca, na, "D'/D")):
            lo_num, _ = clopper_pearson(num, nn, alpha / (2 * m))
            _, hi_den = clopper_pearson(den, nd, alpha / (2 * m))
            with np.errstate(divide="ignore"):
                lower = np.log(lo_num) - np.log(hi_den)
            i = int(np.argmax(lower))
            if lower[i] > best.lower:
                with np.errstate(divide="ignore"):
                    point = float(np.log((num[i] / nn) / (den[i] / nd))) if den[i] else float("nan")
                best = EventLoss(float(lower[i]), point, f"error {op} {int(ks[i])}, {way}", m)
    return best


# -- the neighbouring database --------------------------------------------------------------------------

def parse_move(text: str, hierarchy: Hierarchy = US_HIERARCHY) -> tuple[str, str]:
    """``FROM:TO`` as two different leaf geocodes of ``hierarchy`` (each matching its ``pattern``, if any)."""
    parts = text.split(":")
    leaf = hierarchy.leaf
    if (len(parts) != 2 or not all(parts) or parts[0] == parts[1]
            or hierarchy.pattern and not all(re.fullmatch(hierarchy.pattern, p) for p in parts)):
        shape = f" matching {hierarchy.pattern!r}" if hierarchy.pattern else ""
        raise AuditError(f"--move {text!r}: expected {leaf.upper()}_FROM:{leaf.upper()}_TO, two different {leaf} "
                         f"geocodes{shape}")
    return parts[0], parts[1]


@dataclass
class Records:
    """The audited product's records in input order (each one's leaf geocode and histogram cell), the unit
    records (geoid, unit_type, occupied; none for a census without them) and the leaves as ``build_spine``
    takes them."""

    leaf: np.ndarray
    cells: np.ndarray
    units: pd.DataFrame
    geography: pd.Series | pd.DataFrame


def read_records(config: Config, input_dir: Path, product: Product) -> Records:
    """The input of ``config``'s census, read and checked as a run reads it (``validate.check_records``, and the
    leaves' records against the units they need: ``validate.block_problem``)."""
    census = config.census
    if counts_units(census, product):
        raise AuditError(f"product {product.name!r} counts unit records: the audit moves one record of a product "
                         "that counts the census's person records")
    files = find_input(Path(input_dir), census)
    hierarchy = census.hierarchy
    read = [check_records(path, product, hierarchy) for path in files.persons]
    units = [check_units(path, None, hierarchy, census.units)[1] for path in files.units]
    leaf = np.concatenate([r[0].to_numpy().astype(str) for r in read]) if read else np.zeros(0, str)
    cells = np.concatenate([r[1] for r in read]) if read else np.zeros(0, np.int64)
    frame = (pd.concat(units, ignore_index=True) if units
             else pd.DataFrame({"geoid": pd.Series(dtype=str), "unit_type": pd.Series(dtype=np.int64),
                                "occupied": pd.Series(dtype=bool)}))
    if product.unit_bounds is not None and census.units is not None:
        _check_unit_bounds(files, census, product, leaf, cells, frame)
    if hierarchy.by_prefix:
        geography = pd.Series(np.union1d(frame["geoid"].unique().astype(str), np.unique(leaf)), name="geoid")
    else:
        geography = pd.concat([r[2] for r in read] + [u.attrs["geography"] for u in units],
                              ignore_index=True).drop_duplicates(ignore_index=True)
    return Records(leaf, cells, frame, geography)


def _check_unit_bounds(files, census: Census, product: Product, leaf: np.ndarray, cells: np.ndarray,
                       units: pd.DataFrame) -> None:
    """Raise the :class:`InputError` of the first leaf whose records of a unit type exceed what its units of that
    type hold, or whose units lack their residents (``product``'s unit bounds), as a run's read raises it."""
    blocks = np.union1d(units["geoid"].unique().astype(str), np.unique(leaf))
    bounds = product.unit_bounds
    levels = product.schema.unravel(cells)[product.schema.dim_names.index(bounds.attribute)]
    records = by_type(pd.Series(leaf), levels, blocks, len(bounds.cap))
    held = by_type(units["geoid"].astype(str), units["unit_type"].to_numpy(), blocks, census.units.types)
    raise_block_problem(block_problem(blocks, records, held[:, :len(bounds.cap)], product),
                        files.where(PERSON_RECORDS), files.where(UNIT_RECORDS), product, census.units)


def move_one_record(records: Records, product: Product, src: str, dst: str, leaf: str) -> tuple[np.ndarray, int]:
    """D': the first record (in input order) of leaf ``src`` that may live in leaf ``dst``, moved there: with unit
    bounds (the P.L. 94-171 persons' ``hhgq``), one whose level of the bounded attribute is a unit type ``dst``
    has (0 a housing unit, 1.. a group-quarters type); the moved records' leaves and that record's position."""
    rows = np.flatnonzero(records.leaf == src)
    if rows.size == 0:
        raise AuditError(f"--move: {leaf} {src} has no {product.records.name} records to move")
    fits = rows
    bounds = product.unit_bounds
    if bounds is not None:
        types = sorted(set(records.units.loc[records.units["geoid"] == dst, "unit_type"].astype(int)))
        attribute = product.schema.dim_names.index(bounds.attribute)
        level = product.schema.unravel(records.cells[rows])[attribute]
        fits = rows[np.isin(level, types)]
        if fits.size == 0:
            raise AuditError(f"--move: no record of {leaf} {src} can live in {leaf} {dst} (it has no housing unit "
                             f"or group quarters of their {bounds.attribute})")
    moved = records.leaf.copy()
    moved[fits[0]] = dst
    return moved, int(fits[0])


# -- the plan: the sub-levels a run solves ----------------------------------------------------------------

def sub_level(level: Level, rows: np.ndarray, parent_rows: np.ndarray | None) -> Level:
    """The nodes ``rows`` of ``level``, with parent rows renumbered into ``parent_rows`` (the sub-level above)."""
    parent = None
    if level.parent is not None and parent_rows is not None:
        parent = np.searchsorted(parent_rows, level.parent[rows])
    cons = LevelConstraints(level.constraints.nodes[rows],
                            {k: replace(c, rhs=c.rhs[rows]) for k, c in level.constraints.rhs.items()})
    return Level(level.name, level.nodes[rows], parent, level.hist[rows], level.units.iloc[rows], cons,
                 [level.plb[r] for r in rows], level.state[rows])


@dataclass
class Target:
    """One audited count: a node on a path, a query and the answer that holds the moved person."""

    level: int
    row: int  # row in the sub-level
    geocode: str
    path: str  # "from", "to" or "both": the moved person's old block, new block, or both are below it
    query: str
    answer: int
    cells: np.ndarray  # cells of that answer


@dataclass
class Plan:
    """What one run computes: sub-levels top-down (None: a level not estimated) and the audited targets."""

    product: Product
    config: Config
    levels: list[Level | None]
    targets: list[Target]
    independent: bool = False
    truth: np.ndarray = field(default_factory=lambda: np.zeros(0))  # true value of each target in this database
    #: Per level that depends on no estimate (every level of an independent plan, else the root): its chunks
    #: and their child order, built by the first run here; a run sets only its seed on them.
    fixed: dict[int, tuple[list[Chunk], np.ndarray]] = field(default_factory=dict, repr=False, compare=False)


def make_plan(product: Product, config: Config, levels: list[Level], blocks: list[str], cell: int,
              queries: tuple[str, ...], independent: bool) -> Plan:
    """Sub-levels holding the children of the parents on the paths of ``blocks`` (block GEOIDs equal the
    leaf nodes' codes on the standard spine; otherwise looked up by the leaf level's node index)."""
    schema = product.schema
    leaf = levels[-1]
    start = leaf.nodes.get_indexer(blocks)
    if (start < 0).any():
        raise AuditError(f"--move: block(s) {', '.join(b for b in blocks if b not in leaf.nodes)} not in the spine")
    walks = []  # per block, its node row at every level
    for row in start:
        walk = [int(row)]
        for i in range(len(levels) - 1, 0, -1):
            walk.append(int(levels[i].parent[walk[-1]]))
        walks.append(walk[::-1])
    path = [np.unique([w[i] for w in walks]) for i in range(len(levels))]
    subs: list[Level | None] = []
    kept: list[np.ndarray] = []
    for i, level in enumerate(levels):
        if independent and i < len(levels) - 1:
            subs.append(None)
            kept.append(np.zeros(0, dtype=np.int64))
            continue
        if i == 0 or independent:
            rows = np.arange(len(level)) if not independent else path[i]
            parent_rows = None
        else:
            parent_rows = kept[i - 1]
            rows = np.flatnonzero(np.isin(level.parent, path[i - 1]))
        subs.append(sub_level(level, rows, parent_rows))
        kept.append(rows)
    targets, truth = [], []
    for i, level in enumerate(levels):
        if subs[i] is None:
            continue
        for r in path[i]:
            on = [w[i] == r for w in walks]
            where = "both" if all(on) else ("from" if on[0] else "to")
            for name in queries:
                q = build_query(schema, name)
                answer = int(q.groups[cell])
                cells = np.flatnonzero(q.groups == answer)
                sub_row = int(np.searchsorted(kept[i], r))
                targets.append(Target(i, sub_row, str(level.nodes[r]), where, name, answer, cells))
                truth.append(int(level.hist[r][:, cells].sum()))
    return Plan(product, config, subs, targets, independent, np.asarray(truth, dtype=np.int64))


def run_plan(plan: Plan, seed: int) -> np.ndarray:
    """One TopDown run restricted to the plan (engine chunks, measurements in memory): each target's value."""
    cfg = plan.config.model_copy(update={"run": plan.config.run.model_copy(update={"mode": "test", "seed": seed})})
    hists: list[sp.csr_matrix | None] = []
    parent: Level | None = None
    parent_hist: sp.csr_matrix | None = None
    for i, level in enumerate(plan.levels):
        if level is None:
            hists.append(None)
            continue
        if plan.independent or parent is None:
            if i not in plan.fixed:
                plan.fixed[i] = make_chunks(plan.product, cfg, level, None, None, None, plan.independent)
            built, order = plan.fixed[i]
            chunks = [replace(chunk, mode="test", seed=seed) for chunk in built]
        else:
            chunks, order = make_chunks(plan.product, cfg, level, parent, parent_hist, None)
        parts, pos = [], 0
        for chunk in chunks:
            res = run_chunk(chunk)
            n = len(res.children)
            parts.append((order[pos:pos + n], res.hist))
            pos += n
        hist = sp.vstack([p[1] for p in parts]).tocsr()[np.argsort(np.concatenate([p[0] for p in parts]))]
        hists.append(hist)
        parent, parent_hist = level, hist
    return np.array([hists[t.level][t.row][:, t.cells].sum() for t in plan.targets], dtype=np.int64)


def run_batch(plan: Plan, seeds: list[int]) -> np.ndarray:
    """Several runs in one task: values[len(seeds), targets]."""
    return np.stack([run_plan(plan, s) for s in seeds])


# -- the command ----------------------------------------------------------------------------------------

@dataclass
class AuditResult:
    table: pd.DataFrame
    seconds: float
    runs: int


def audited_product(config: Config) -> Product:
    """The product ``topdown audit`` audits: the run's first (P.L. 94-171's persons)."""
    return config.run_products[0]


def build_plans(config: Config, input_dir: Path, move: tuple[str, str], queries: tuple[str, ...] = AUDIT_QUERIES,
                product: Product | None = None) -> tuple[Plan, Plan]:
    """The plans of D (the input) and D' (one record of ``product``, default :func:`audited_product`, moved
    ``move[0]`` -> ``move[1]``)."""
    product = product or audited_product(config)
    if product.name not in config.run.products:
        raise ConfigError(f"{config.source}: run.products does not list {product.name!r}")
    hierarchy = census_hierarchy(config)
    records = read_records(config, input_dir, product)
    src, dst = move
    leaves = records.geography if hierarchy.by_prefix else records.geography[hierarchy.leaf]
    if dst not in set(leaves):
        raise AuditError(f"--move: {hierarchy.leaf} {dst} is not a {hierarchy.leaf} of the input")
    moved, record = move_one_record(records, product, src, dst, hierarchy.leaf)
    cell = int(records.cells[record])
    units = records.units
    independent = config.run.algorithm == "block_by_block"
    if independent:
        from ..execution.runner import block_by_block_config

        config = block_by_block_config(config)
    spine = build_spine(config.run.spine, records.geography, baf_dir=config.run.baf, units=units, hierarchy=hierarchy)
    bunits = block_units(units).set_index("geoid")
    leaf = spine.table.set_index("geoid")[spine.levels[-1]]
    blocks = [str(leaf.loc[g]) for g in (src, dst)]
    plans = []
    for name, where in (("D", records.leaf), ("D' (one record moved)", moved)):
        hist = sparse_counts(pd.Series(where, name="geoid"), records.cells, product.schema.ncells)
        try:
            levels = build_levels(product, config.product(product.name), spine, hist, bunits)
        except InvariantError as exc:
            raise AuditError(f"--move {src}:{dst}: {name} is not a valid input ({exc}); move the record to a leaf "
                             "where the invariants and constraints allow one more of them") from None
        plans.append(make_plan(product, config, levels, blocks, cell, queries, independent))
    return plans[0], plans[1]


def audit(config: Config, input_dir: Path, move: tuple[str, str], runs: int, client, product: Product | None = None,
          queries: tuple[str, ...] = AUDIT_QUERIES, seed: int = 0, alpha: float = AUDIT_ALPHA,
          batch: int = BATCH) -> AuditResult:
    """Run the audit on ``client`` (a Dask client); returns the per-target table (no true counts in it)."""
    check_count(runs, "--runs", 1, MAX_AUDIT_RUNS)
    start = time.perf_counter()
    product = product or audited_product(config)
    return audit_plans(build_plans(config, input_dir, move, queries, product), runs, client, seed, alpha, batch,
                       start)


def audit_plans(plans: tuple[Plan, Plan], runs: int, client, seed: int = 0, alpha: float = AUDIT_ALPHA,
                batch: int = BATCH, start: float | None = None) -> AuditResult:
    """:func:`audit` of plans already built (:func:`build_plans`)."""
    start = time.perf_counter() if start is None else start
    product = plans[0].product
    futures = []
    for db, plan in enumerate(plans):
        shipped = client.scatter(plan, broadcast=True)
        for lo in range(0, runs, batch):
            seeds = [seed + 2 * r + db for r in range(lo, min(runs, lo + batch))]
            futures.append((db, client.submit(run_batch, shipped, seeds, pure=False)))
    values: list[list[np.ndarray]] = [[], []]
    for (db, _), value in zip(futures, gather(client, [f for _, f in futures], "audit runs", "batches")):
        values[db].append(value)
    d, d2 = (np.concatenate(v) for v in values)
    truth = plans[0].truth
    rows = []
    for j, t in enumerate(plans[0].targets):
        loss = threshold_event_loss(d[:, j] - truth[j], d2[:, j] - truth[j], alpha)
        rows.append({"product": product.name, "level": plans[0].levels[t.level].name, "geocode": t.geocode, "query": t.query,
                     "path": t.path, "changed": bool(truth[j] != plans[1].truth[j]), "runs": runs,
                     "epl_lower": loss.lower, "epl_point": loss.point, "event": loss.event, "n_events": loss.n_events,
                     "alpha": alpha})
    return AuditResult(pd.DataFrame(rows), time.perf_counter() - start, runs)


def theoretical_epsilons(config: Config, product: Product) -> dict[tuple[str, str], float]:
    """Per (level, query) measured: the epsilon of that one measurement (pure DP epsilon_q; zCDP rho_q
    converted at the product's delta)."""
    from ..privacy.accounting import allocate

    budget = config.product(product.name).budget
    out = {}
    for level, queries in budget.queries.items():
        for query in queries:
            a = allocate(budget, level, query)
            if a.measured and not a.noiseless:
                out[(level, query)] = a.budget.epsilon_at(budget.delta)
    return out


def product_epsilon(budget: BudgetConfig) -> dict[str, Any]:
    """The ceiling of what one published count can show: the product's whole epsilon, as its certificate states
    it (``epsilon_product``; None for an infinite test budget), with the delta of a zCDP budget (``delta``)."""
    total = of_config(budget)
    eps = None if total.infinite else total.epsilon_at(budget.delta)
    return {"epsilon_product": eps, "delta": None if total.pure else str(budget.delta)}


def _shown_epsilon(eps: float | None) -> str:
    return "infinite (no noise)" if eps is None else f"{eps:.3f}"


def write_audit(out: Path, result: AuditResult, meta: dict) -> Path:
    """audit.parquet (one row per audited count), audit.json (settings, timing) and report.txt, atomically."""
    private_dir(out)  # computed from the true counts: the user's alone (docs/reference/output-layout.md)
    write_table(result.table, out / "audit.parquet")
    write_json_atomic(out / "audit.json", {"confidential": CONFIDENTIAL_BANNER, **meta,
                                            "seconds": round(result.seconds, 2), "runs": result.runs})
    cols = ["level", "geocode", "query", "path", "changed", "epl_lower", "epl_point", "event", "epsilon_query"]
    text = (f"{CONFIDENTIAL_BANNER}\n\nDirect audit: {result.runs} runs on D and {result.runs} on D' (one record moved "
            f"{meta['move']}), {result.seconds:.1f} s.\nepl_lower: {1 - meta['alpha']:.0%} lower confidence bound on "
            "the privacy loss this count shows (Clopper-Pearson, Bonferroni over the threshold events);\n"
            "epsilon_query: the theoretical epsilon of the query's measurement at that level. A published count "
            "depends on every measurement along its path (its node's, its ancestors' and, through the joint "
            "solves, its siblings'), so it can show up to the product's whole epsilon: "
            f"{_shown_epsilon(meta.get('epsilon_product'))} (the certificate's"
            f"{'' if meta.get('delta') is None else ', at delta ' + str(meta['delta'])}).\n\n"
            + result.table[[c for c in cols if c in result.table]].to_string(index=False, float_format=lambda v: f"{v:.3f}")
            + "\n")
    tmp = out / ".report.txt.tmp"
    tmp.write_text(text)
    tmp.replace(out / "report.txt")
    return seal(out)


def audit_command(config_path: str, input_dir: str, move: str, runs: int, out: str | None, queries: str,
                  seed: int, scheduler: str | None, workers: int | None, batch: int = BATCH) -> int:
    """CLI helper of ``topdown audit``: runs the audit on an embedded cluster (or ``scheduler``) and writes
    ``out`` (default ``runs/<name>-audit-CONFIDENTIAL``)."""
    from ..configuration.config import load_config
    from ..execution.runner import dask_client

    check_count(runs, "--runs", 1, MAX_AUDIT_RUNS)
    config = load_config(config_path)
    target, _ = check(Path(out) if out else Path("runs") / f"{config.run.name}-audit-CONFIDENTIAL", "audit")
    src_dst = parse_move(move, census_hierarchy(config))
    product = audited_product(config)
    names = tuple(q.strip() for q in queries.split(",") if q.strip())
    if not names:
        raise AuditError(f"--queries {queries!r}: name at least one query (default: total,detailed)")
    for name in names:
        build_query(product.schema, name)
    with claimed(target, "audit"):
        start = time.perf_counter()
        plans = build_plans(config, Path(input_dir), src_dst, names, product)  # the input's errors before a cluster
        with dask_client(None, scheduler, workers) as client:
            result = audit_plans(plans, runs, client, seed, batch=batch, start=start)
        eps = theoretical_epsilons(config, product)
        result.table["epsilon_query"] = [eps.get((lv, q)) for lv, q in zip(result.table["level"],
                                                                          result.table["query"])]
        meta = {"config": config.source, "config_sha256": config.digest(), "algorithm": config.run.algorithm,
                "move": move, "queries": list(names), "seed": seed,
                "seeds": f"D: seed + 2r, D': seed + 2r + 1, r < {runs}",
                "alpha": AUDIT_ALPHA, **product_epsilon(config.product(product.name).budget)}
        write_audit(target, result, meta)
    print(f"CONFIDENTIAL audit ({runs} runs on D and on D', {result.seconds:.1f} s) written to {target}")
    shown = result.table[result.table["changed"]]
    print(shown[["level", "query", "path", "epl_lower", "epsilon_query"]].to_string(
        index=False, float_format=lambda v: f"{v:.3f}"))
    return 0
