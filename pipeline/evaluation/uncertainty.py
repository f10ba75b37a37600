"""``topdown uncertainty``: GLS estimates, variances and confidence intervals of every published count,
from a run's noisy measurements alone (or a noisy measurement file), on Dask.

Output (one Parquet file, columns :data:`amc.SCHEMA`): per method, one row per answer cell of every output
query at every node of every level and every off-spine entity: ``product, level, geocode, query, cell, method,
published, estimate, variance, ci90_low, ci90_high, ci95_low, ci95_high, rep_n, rep_bias, rep_rmse``. ``cell``
is the answer's position in the query's cell order (pipeline/execution/nmf.py). ``gls`` rows: the GLS
estimate and variance, and the interval of a count >= 0 from them (Feldman-Cousins, pipeline/evaluation/
bounded.py: nominal at every true count, 0 included, never empty; the central ``est +- z sd`` once ``est >= 2 z
sd``) with integer bounds rounded inward; ``published`` where the run has its histograms. ``amc`` rows (with replicates): the Bureau's approximate Monte Carlo interval of
the published count (pipeline/evaluation/amc.py). ``calibrated`` rows (with replicates and a second generation
of them): the published count's interval from the replicates' error by size, extrapolated one generation
back and inverted (pipeline/evaluation/calibrated.py).

Work plan, all in Dask tasks (the client holds no level's arrays): the block level is read and estimated one
task per block measurement part (whole block groups), in two passes: their sums up to the block groups; then
one task estimates the levels above (few nodes: both passes, their rows, and the entities' covariances) and
writes the block groups' final state to files; then, given it, the blocks' estimates, written as part files,
and their sums over entity covers; then one task per part adds the published counts (and the ``amc`` rows,
amc.py) and one task concatenates the parts into the table. Covariances depend on the variances only, not on
the data, so all blocks with the same measurements' variances under one parent share one covariance.
"""
from __future__ import annotations

import io
import json
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from .bounded import count_interval, exact_count, z_value
from .gls import (MAX_ZERO_BLOCK, BlocksTooLarge, GLSError, KronAlgebra, LevelState, downward, entity_covariance,
                  gain, leaf_covariance, leaf_estimate, segment_sum, snap, top_down_cov, top_down_est, upward,
                  with_zeros)
from topdown.geo.spine import Spine
from topdown.vocab.queries import build_query
from ..configuration.config import Config
from ..inputs.invariants import configured_below
from ..execution.levels import level_constraints, published_units
from ..execution.memory import release_memory
from ..execution.nmf import nmf_invariants
from ..runtime.outdir import MARKER_KEY, claimed_file
from ..runtime.rundir import RunDirError, RunReader, remove_tree, removed_on_failure, write_table, writing
from ..runtime.storage import StorePath, location, parquet_file, parquet_writer, read_table, scratch
from ..runtime.progress import gather, track
from .amc import SCHEMA, codes, published_and_amc, replicate_dirs
from .calibrated import calibrated_parts, second_generation
from .evaluate import entities_on_spine, load_entities
from topdown.vocab.census import Product

log = logging.getLogger("topdown")

Z90, Z95 = z_value(0.90), z_value(0.95)
META_KEY = b"topdown.uncertainty"


# ------------------------------------------------------------------------------------------ the source
@dataclass
class Source:
    """A complete run directory's noisy measurements and its spine's structure."""

    root: Path
    levels: list[str]
    products: list[Product]  # the run's, as its configuration declares them
    spine: pd.DataFrame  # geoid + one column per level (strings)
    nodes: list[pd.Index] = field(default_factory=list)
    parents: list[np.ndarray | None] = field(default_factory=list)
    config: Config | None = None  # the configuration the measurements were taken with
    spine_obj: Spine | None = None
    #: A product's published invariants table (None where it has none) and where it was read from.
    invariants: Callable[[Product], tuple[pd.DataFrame | None, str]] | None = None

    @classmethod
    def open(cls, path: str | Path) -> "Source":
        path = location(path)
        reader = RunReader(path)
        reader.complete_manifest("computing its uncertainty")  # RunDirError: exit 4, as verify

        def invariants(spec: Product) -> tuple[pd.DataFrame | None, str]:
            table = reader.invariants(spec.name)
            return (reader.table(table) if table.exists() else None), str(table)

        return cls._of(path, reader.spine(), reader.products(), reader.config(), invariants)

    @classmethod
    def from_nmf(cls, nmf_dir: str | Path, spine: str | Path | None, config: str | Path | None,
                 staging: Path) -> "Source":
        """A noisy measurement file (ours or the Bureau's layout) read with its spine file and the configuration
        it was measured with (as ``topdown reprocess`` reads one): its measurements are written under
        ``staging`` as a run's parts, one DPQuery part at a time."""
        from ..execution.reprocess import invariants_of_nmf, open_nmf, write_measurement_parts

        cfg, spine_obj, nmf = open_nmf(location(nmf_dir), spine, config)
        for product in cfg.run_products:
            for level in spine_obj.levels:
                write_measurement_parts(nmf, product, level,
                                        staging / "noisy_measurements" / product.name / f"level={level}", spine_obj)
        products = list(cfg.run_products)

        def invariants(spec: Product) -> tuple[pd.DataFrame | None, str]:
            if spec.name not in nmf.constraints:
                return None, f"{nmf_dir} ({spec.name})"
            return invariants_of_nmf(nmf, spec, products, spine_obj), f"{nmf_dir} ({spec.name} invariants)"

        return cls._of(staging, spine_obj, products, cfg, invariants)

    @classmethod
    def _of(cls, root: Path, spine: Spine, products: list[Product], config: Config, invariants) -> "Source":
        table = spine.table[["geoid", *spine.levels]].astype(str)
        src = cls(root, list(spine.levels), products, table, config=config, spine_obj=spine, invariants=invariants)
        for i, level in enumerate(src.levels):
            nodes = pd.Index(np.sort(table[level].unique()))
            src.nodes.append(nodes)
            if i:
                pairs = table[[level, src.levels[i - 1]]].drop_duplicates(level).set_index(level)[src.levels[i - 1]]
                src.parents.append(src.nodes[i - 1].get_indexer(pairs.reindex(nodes).to_numpy()))
            else:
                src.parents.append(None)
        return src

    def parts(self, product: Product, level: str) -> list[Path]:
        return sorted((self.root / "noisy_measurements" / product.name / f"level={level}").glob("part-*.parquet"))


@dataclass
class Structure:
    """A product's public structure the GLS uses (gls.py): per level, the structural zeros (zero constraint
    query -> ``(nodes, answers)`` bool, True where the right-hand side is 0; none at the leaf level, as the
    Bureau's code) and the exact totals (the invariants; NaN where not invariant), rows in ``Source.nodes`` order.
    The parts of a state split by the AIAN spine have no total of their own (the whole state's, which binds
    several nodes, is not used; the U.S. total is)."""

    zeros: list[dict[str, np.ndarray]]
    totals: list[np.ndarray]

    @property
    def zero_queries(self) -> tuple[str, ...]:
        return tuple(sorted({q for lv in self.zeros for q, a in lv.items() if a.any()}))


#: Right-hand side kinds of the invariant totals' own constraints: conditioned on exactly, not zeros.
TOTAL_KINDS = ("total", "housing_units")


def public_structure(src: Source, spec: Product) -> Structure:
    """The structural zeros and exact totals of ``spec`` from the run's configuration and published invariants
    (the constraints' right-hand sides rebuilt as ``topdown nmf`` does)."""
    cfg = src.config.product(spec.name)
    table, path = src.invariants(spec)
    n = len(src.levels)
    if table is None:
        if any(cfg.invariants.values()) or any(cfg.constraints.values()):
            raise RunDirError(f"{path}: missing: the uncertainty of {spec.name} needs the run's published "
                              "invariants (its structural zeros and exact totals)")
        return Structure([{} for _ in range(n)], [np.full(len(x), np.nan) for x in src.nodes])
    spine = src.spine_obj
    units, parents, _, _ = published_units(spine, table, where=path)
    units = [u.assign(occupied=np.nan) for u in units]  # not invariant; only a lower bound uses it
    cons = level_constraints(spec, cfg, spine.levels, units, parents)
    zeros: list[dict[str, np.ndarray]] = []
    totals: list[np.ndarray] = []
    for i, level in enumerate(src.levels):
        order = units[i].index.astype(str).get_indexer(src.nodes[i])
        if (order < 0).any():
            raise RunDirError(f"{path}: no invariants for {level} node {src.nodes[i][np.flatnonzero(order < 0)[0]]!r}")
        found: dict[str, np.ndarray] = {}
        for c in (cons[i].rhs.values() if i < n - 1 else ()):
            if c.sense in ("<=", "==") and spec.constraints[c.name].rhs not in TOTAL_KINDS:
                zero = np.nan_to_num(c.rhs[order], nan=1.0) == 0
                found[c.query] = found[c.query] | zero if c.query in found else zero
        zeros.append(found)
        t = np.full(len(src.nodes[i]), np.nan)
        for name, cols, query in nmf_invariants(spec):
            if query == "total" and name in configured_below(cfg.invariants, spine.levels, level) and cols[0] in units[i]:
                t = np.where(np.isnan(t), units[i][cols[0]].to_numpy(dtype=float)[order], t)
        totals.append(t)
    return Structure(zeros, totals)


def read_part(path: Path) -> pa.Table:
    """A measurement part in Arrow (its geocode and query columns hold a few distinct strings each: they are
    read as dictionaries, not as a Python string per row)."""
    return read_table(path, read_dictionary=["geocode", "query"])


# ----------------------------------------------------------------------------------- measurement arrays
def measured_queries(src: Source, product: Product) -> tuple[str, ...]:
    """Every query measured at some level of ``product`` (from the parts' schema-free contents)."""
    names: set[str] = set()
    for level in src.levels:
        for part in src.parts(product, level):
            names |= set(codes(read_table(part, columns=["query"], read_dictionary=["query"]).column("query"))[1])
    return tuple(sorted(names))


def node_arrays(alg: KronAlgebra, long: pa.Table, nodes: pd.Index, where: str):
    """Rows of ``nodes`` present in the measurements ``long`` (:func:`read_part`) and their weights
    (n, n_queries), precision and information."""
    geo, geo_names = codes(long.column("geocode"))
    rows_all = nodes.get_indexer(pd.Index(geo_names, dtype=object))[geo]
    if (rows_all < 0).any():
        raise GLSError(f"{where}: measurement of unknown node {geo_names[geo[np.flatnonzero(rows_all < 0)[0]]]!r}")
    present = np.unique(rows_all)
    local = np.searchsorted(present, rows_all)
    query, query_names = codes(long.column("query"))
    answer = long.column("answer").to_numpy()
    value = long.column("value").to_numpy()
    variance = long.column("variance").to_numpy()
    weights = np.zeros((present.size, len(alg.queries)))
    answers, wq = {}, {}
    for qi, q in enumerate(alg.queries):
        sel = query == query_names.index(q) if q in query_names else np.zeros(len(query), dtype=bool)
        if not sel.any():
            continue
        var = variance[sel]
        if (var <= 0).any() or not np.isfinite(var).all():
            raise GLSError(f"{where}: query {q!r} has variance {var[(var <= 0) | ~np.isfinite(var)][0]}: GLS needs "
                           "noisy measurements (a zero-noise run has no uncertainty to report)")
        y = np.zeros((present.size, build_query(alg.schema, q).n_answers))
        y[local[sel], answer[sel]] = value[sel]
        weights[local[sel], qi] = 1.0 / var
        answers[q], wq[q] = y, weights[:, qi]
    info = alg.information(answers, wq) if answers else np.zeros((present.size, alg.schema.ncells))
    return present, weights, info


def _full_level(alg: KronAlgebra, src: Source, product: Product, i: int, structure: Structure) -> LevelState:
    """An upper level's precision and information, read part by part (a level's measurements in one frame
    would be several times the arrays they fill), with its structural zeros and invariant totals."""
    level, nodes = src.levels[i], src.nodes[i]
    n = len(nodes)
    weights = np.zeros((n, len(alg.queries)))
    info = np.zeros((n, alg.schema.ncells))
    for part in src.parts(product, level):  # a node's measurements are in one part (its chunk's)
        long = read_part(part)
        if long.num_rows:
            rows, w, z = node_arrays(alg, long, nodes, f"{product.name} {level}")
            weights[rows] += w
            info[rows] += z
        del long
        release_memory()  # a part's columns and arrays, before the next part
    precision = alg.precision(weights)
    zeros = {q: a for q, a in structure.zeros[i].items() if q in alg.zeros}
    if zeros:
        precision += alg.zero_precision(zeros, n)
    return LevelState(src.parents[i], precision, info, total=structure.totals[i])


# ------------------------------------------------------------------------------------------- output rows
def cell_rows(alg: KronAlgebra, product: Product, level: str, geocodes: np.ndarray, est: np.ndarray, cov: np.ndarray,
              cov_index: np.ndarray | None, queries: tuple[str, ...]) -> pd.DataFrame:
    """``product``'s rows for histograms ``est (N, ncells)`` with covariances ``cov[cov_index]`` (class blocks)."""
    frames = []
    idx = np.arange(len(geocodes)) if cov_index is None else cov_index
    for q in queries:
        query = build_query(alg.schema, q)
        e = query.answer(est)
        v = alg.cell_variance(cov, q)[idx]
        v = np.maximum(v, 0.0)
        sd = np.sqrt(v)
        exact = exact_count(e, sd)
        e = np.where(np.isnan(exact), e, exact)  # an exact count: its value and variance 0, without float rounding
        v = np.where(np.isnan(exact), v, 0.0)
        lo90, hi90 = count_interval(e, sd, 0.90)
        lo95, hi95 = count_interval(e, sd, 0.95)
        k = query.n_answers
        frames.append(pd.DataFrame({
            "product": product.name, "level": level, "geocode": np.repeat(np.asarray(geocodes, dtype=object), k),
            "query": q, "cell": np.tile(np.arange(k, dtype=np.int32), len(geocodes)), "method": "gls",
            "published": np.nan, "estimate": e.ravel(),
            "variance": v.ravel(), "ci90_low": lo90.ravel(), "ci90_high": hi90.ravel(),
            "ci95_low": lo95.ravel(), "ci95_high": hi95.ravel()}))
    return pd.concat(frames, ignore_index=True)


def total_queries(alg: KronAlgebra, queries: tuple[str, ...]) -> list[str]:
    """The queries among ``queries`` whose one answer is the whole histogram's total."""
    out = []
    for q in queries:
        query = build_query(alg.schema, q)
        if query.n_answers == 1 and (query.groups >= 0).all():
            out.append(q)
    return out


def exact_rows(frame: pd.DataFrame, alg: KronAlgebra, queries: tuple[str, ...], geocodes: np.ndarray,
               totals: np.ndarray | None) -> pd.DataFrame:
    """The total's rows of nodes whose total is exact (an invariant, ``totals`` not NaN) get that value as the
    estimate, variance 0.0 and the interval [t, t]: the conditioned GLS has them up to float rounding."""
    if totals is None or not np.isfinite(totals).any():
        return frame
    sel = np.flatnonzero(frame["query"].isin(total_queries(alg, queries)).to_numpy())
    t = pd.Series(totals, index=np.asarray(geocodes, dtype=object)).reindex(frame["geocode"].to_numpy()[sel]).to_numpy()
    rows = sel[np.isfinite(t)]
    t = t[np.isfinite(t)]
    for col in ("estimate", "ci90_low", "ci90_high", "ci95_low", "ci95_high"):
        frame.loc[rows, col] = t
    frame.loc[rows, "variance"] = 0.0
    return frame


def _rows(alg: KronAlgebra, product: Product, level: str, geocodes: np.ndarray, est: np.ndarray, cov: np.ndarray,
          cov_index: np.ndarray | None, queries: tuple[str, ...], totals: np.ndarray | None) -> pd.DataFrame:
    """:func:`cell_rows` with the exact totals' rows (:func:`exact_rows`)."""
    frame = cell_rows(alg, product, level, geocodes, est, cov, cov_index, queries)
    return exact_rows(frame, alg, queries, geocodes, totals)


# ---------------------------------------------------------------------------------------- block tasks
@dataclass
class LeafTask:
    product: Product
    part: str
    queries: tuple[str, ...]
    level: str
    nodes: pd.Index  # the leaves the part may hold (pass 1: all; pass 2: the part's own)
    parents: np.ndarray  # parent row of each of ``nodes``
    zeros: tuple[str, ...] = ()  # the algebra's zero queries (no zeros at the leaves, but the same layout)
    totals: np.ndarray | None = None  # each of ``nodes``' exact total, NaN where none


def leaf_signature(weights: np.ndarray, totals: np.ndarray | None) -> np.ndarray:
    """What a leaf's ``V_-`` depends on: its measurements' weights and whether its total is exact."""
    exact = np.zeros(len(weights)) if totals is None else np.isfinite(totals).astype(float)
    return np.column_stack([weights, exact])


def _leaf_local(t: LeafTask):
    alg = KronAlgebra(t.product.schema, t.queries, t.zeros)
    rows, weights, info = node_arrays(alg, read_part(t.part), t.nodes, f"{t.product.name} {t.level} {t.part}")
    total = None if t.totals is None else t.totals[rows]
    sig, inv_sig = np.unique(leaf_signature(weights, total), axis=0, return_inverse=True)
    inv_sig = inv_sig.ravel()
    sig_exact = sig[:, -1] > 0
    precision = alg.precision(sig[:, :-1])
    v_minus = leaf_covariance(precision, f"{t.product.name} {t.level}", sig_exact)
    b_minus = np.empty_like(info)
    for k in range(len(sig)):  # leaves of one signature share P_g and V_-
        idx = np.flatnonzero(inv_sig == k)
        shape = (idx.size, *v_minus.shape[1:])
        b_minus[idx] = leaf_estimate(alg, np.broadcast_to(precision[k], shape), np.broadcast_to(v_minus[k], shape),
                                     info[idx], None if total is None else total[idx])
    return alg, rows, weights, inv_sig, v_minus, b_minus, sig_exact, total


def leaf_pass1(leaves: LeafTask, part: str) -> dict:
    """The weights of the leaves of ``part`` and the sums of their ``b_-`` per parent (``leaves``: every leaf)."""
    cpu = time.process_time()
    t = replace(leaves, part=part)
    alg, rows, weights, _, _, b_minus, _, _ = _leaf_local(t)
    par = t.parents[rows]
    ups, inv = np.unique(par, return_inverse=True)
    out = {"rows": rows, "weights": weights, "parents": ups, "s_est": segment_sum(b_minus, inv.ravel(), ups.size)}
    del alg, b_minus
    release_memory()  # the worker's heap back to where it was before the task
    return out | {"cpu": time.process_time() - cpu}


@dataclass
class LeafPass2(LeafTask):
    parent_rows: np.ndarray = None  # the parents the part's leaves hang from (sorted)
    parents_in: str = ""  # prefix of the parents' state files (:func:`upper_pass`)
    out: str = ""
    out_queries: tuple[str, ...] = ()
    write_rows: bool = True
    cover: dict[int, list[int]] = field(default_factory=dict)  # row of ``nodes`` -> entity numbers it is in


def leaf_pass2(t: LeafPass2) -> dict:
    """The leaves' final estimates and covariances: rows written to ``t.out``, entity sums returned."""
    cpu = time.process_time()
    alg, rows, _, sig, v_minus, b_minus, sig_exact, total = _leaf_local(t)
    parent = {name: load_array(f"{t.parents_in}-{name}.npy")[t.parent_rows] for name in PARENT_ARRAYS}
    p = np.searchsorted(t.parent_rows, t.parents[rows])
    key, kinv = np.unique(np.stack([sig, p], axis=1), axis=0, return_inverse=True)
    kinv = kinv.ravel()
    a_key = gain(v_minus[key[:, 0]], parent["s_inv"][key[:, 1]])
    v_key = top_down_cov(v_minus[key[:, 0]], a_key, parent["v"][key[:, 1]])
    b = top_down_est(alg, b_minus, a_key[kinv], parent["b"][p], parent["s_est"][p])
    snap(v_key, b, total, sig_exact[key[:, 0]])
    if t.write_rows:
        frame = _rows(alg, t.product, t.level, np.asarray(t.nodes[rows]), b, v_key, kinv, t.out_queries, total)
        write_table(frame, t.out, compression="zstd")
        del frame
    sums: dict[int, np.ndarray] = {}
    for r, bb in zip(rows, b):
        for e in t.cover.get(int(r), ()):
            sums[e] = sums.get(e, 0) + bb
    del alg, b, b_minus, v_minus, parent
    release_memory()
    return {"sums": sums, "cpu": time.process_time() - cpu}


# ------------------------------------------------------------------------------------------ entities
def entity_covers(src: Source, entities: pd.DataFrame) -> tuple[list[tuple[str, str]], list[list[np.ndarray]]]:
    """For every entity (type, id): per level the rows of the maximal spine nodes wholly inside it."""
    keys: list[tuple[str, str]] = []
    covers: list[list[np.ndarray]] = []
    spine = src.spine
    for etype, table in entities.groupby("entity_type", sort=True):
        ent = spine["geoid"].map(table.drop_duplicates("geoid").set_index("geoid")["entity"])
        taken = pd.Series(False, index=spine.index)
        per_entity: dict[str, list[list[int]]] = {}
        for i, level in enumerate(src.levels):
            g = pd.DataFrame({"node": spine[level], "ent": ent.fillna("\0")})
            whole = g.groupby("node")["ent"].agg(lambda s: s.iloc[0] if s.nunique() == 1 else "\0")
            whole = whole[whole != "\0"]
            new = spine[level].isin(whole.index) & ~taken
            for node in spine.loc[new, level].unique():
                per_entity.setdefault(whole[node], [[] for _ in src.levels])[i].append(src.nodes[i].get_loc(node))
            taken |= new
        for e in sorted(per_entity):
            keys.append((str(etype), e))
            covers.append([np.array(sorted(r), dtype=np.int64) for r in per_entity[e]])
    return keys, covers


class _Indexed:
    """Rows of a shared array through an index (leaf covariances are shared by many leaves)."""

    def __init__(self, values: np.ndarray, index: np.ndarray):
        self.values, self.index = values, index

    def __getitem__(self, r):
        return self.values[self.index[r]]


# -------------------------------------------------------------------------------------------- driver
@dataclass
class Cost:
    wall_seconds: float = 0.0
    client_cpu_seconds: float = 0.0
    worker_cpu_seconds: float = 0.0
    tasks: int = 0
    rows: int = 0


def uncertainty(run: str | Path, out: str | Path, *, entities: pd.DataFrame | Path | None = None,
                levels: list[str] | None = None, queries: dict[str, tuple[str, ...]] | None = None,
                client=None, scheduler: str | None = None, workers: int | None = None,
                replicates: str | Path | None = None, spine: str | Path | None = None,
                config: str | Path | None = None, calibrate: str | Path | None = None) -> Cost:
    """Write the uncertainty table of ``run`` to ``out`` (Parquet, atomically); returns the cost. ``entities``:
    a (geoid, entity_type, entity) frame, or a table file or BAF directory to read and match with the spine.
    ``run`` may be a noisy measurement file, read with its ``spine`` file and ``config`` (:meth:`Source.from_nmf`).
    ``calibrate``: replicates of one of the ``replicates`` (adds the ``calibrated`` rows). ``out`` must be absent
    or an earlier uncertainty table (``outdir.claimed_file``), held by this call alone while it runs."""
    with claimed_file(out, "uncertainty") as marker:
        return _uncertainty(run, location(out), marker, entities=entities, levels=levels, queries=queries, client=client,
                            scheduler=scheduler, workers=workers, replicates=replicates, spine=spine, config=config,
                            calibrate=calibrate)


def _uncertainty(run: str | Path, out: Path, marker: dict[str, str], *, entities, levels, queries, client, scheduler,
                 workers, replicates, spine, config, calibrate) -> Cost:
    """:func:`uncertainty` into the file ``out`` it holds; the table carries ``marker``."""
    from ..execution.runner import dask_client

    t0, c0 = time.perf_counter(), time.process_time()
    source = entities if isinstance(entities, Path) else None
    if source is not None:  # a bad entities file is reported before the run is opened
        entities = load_entities(source)
    from ..execution.reprocess import is_nmf

    from_nmf = is_nmf(run)
    if from_nmf and replicates is not None:
        from ..configuration.config import ConfigError

        raise ConfigError(f"{run}: --replicates needs the run directory (its published MDF), not a noisy measurement file")
    if not from_nmf and (spine is not None or config is not None):
        from ..configuration.config import ConfigError

        flag = "--spine" if spine is not None else "--config"
        raise ConfigError(f"{flag}: only with a noisy measurement file; the run directory {run} carries its own")
    converted = scratch(out.parent, f".{out.name}.nmf")
    with removed_on_failure(converted):  # the file's measurements as a run's parts, removed when done
        src = Source.from_nmf(run, spine, config, converted) if from_nmf else Source.open(run)
        if source is not None:
            entities = entities_on_spine(entities, pd.Index(src.spine["geoid"]), source)
        if calibrate is not None and replicates is None:
            from ..configuration.config import ConfigError

            raise ConfigError("--calibrate needs --replicates (its replicates are of one of them)")
        if replicates is not None:
            replicate_dirs(location(replicates))  # a bad folder is reported before any work
            if calibrate is not None:
                second_generation(location(replicates), location(calibrate))
        has_hist = not from_nmf and (replicates is not None or (src.root / "histograms").exists())  # published counts
        if not from_nmf:
            RunReader(run).check_sums(("spine.parquet", "noisy_measurements", *(("histograms",) if has_hist else ())),
                                      "uncertainty")
    want = set(levels or src.levels)
    unknown = want - set(src.levels)
    if unknown:
        from ..configuration.config import ConfigError

        raise ConfigError(f"--levels: unknown level(s) {', '.join(sorted(unknown))}; levels are {', '.join(src.levels)}")
    staging = scratch(out.parent, f".{out.name}.parts")
    with writing(staging):
        staging.mkdir(parents=True)
    cost = Cost()
    parts_written: list[Path] = []
    try:
        with dask_client(client, scheduler, workers) as dclient:
            too_large, keys_only = [], []
            for product in src.products:
                wanted = queries[product.name] if queries else product.uncertainty_queries
                try:
                    parts_written += _product(dclient, src, product, wanted, want, entities, staging, cost)
                except BlocksTooLarge as err:  # raised before the product's tasks: the others go on
                    too_large.append(err)
                    if replicates is None:
                        log.warning("uncertainty: %s; its rows are left out", err)
                    else:
                        log.warning("uncertainty: %s; its gls rows are left out, its amc rows are written", err)
                        keys_only += amc_keys(src, product, wanted, want, entities, staging)
            if len(too_large) == len(src.products) and replicates is None:
                raise too_large[0]
            parts_written, cpu = published_and_amc(parts_written + keys_only, _shipped(src, spine=True), staging,
                                                   entities, location(replicates) if replicates is not None else None,
                                                   dclient, keys_only=frozenset(map(str, keys_only)))
            cost.tasks += len(parts_written)
            cost.worker_cpu_seconds += cpu
            if calibrate is not None:
                parts_written += calibrated_parts(parts_written, src, staging, entities, location(replicates),
                                                  location(calibrate))
            if not parts_written:
                raise GLSError(f"{run}: no rows to write")
            cost.rows = sum(parquet_file(part).metadata.num_rows for part in parts_written)
            cost.wall_seconds = time.perf_counter() - t0
            cost.client_cpu_seconds = time.process_time() - c0
            meta = json.dumps({"run": str(run), "cost": cost.__dict__, "z90": Z90, "z95": Z95})
            schema = SCHEMA.with_metadata({META_KEY: meta, MARKER_KEY: json.dumps(marker)})
            parts = [str(p) for p in parts_written]
            if isinstance(out, StorePath):  # one PUT: the object appears whole or not at all
                with writing(out):
                    dclient.submit(concatenate, parts, str(out), schema, pure=False).result()
            else:
                tmp = out.with_name(f".{out.name}.tmp")
                with writing(out), removed_on_failure(tmp):
                    dclient.submit(concatenate, parts, str(tmp), schema, pure=False).result()
                    os.replace(tmp, out)
    finally:
        remove_tree(staging)
        remove_tree(converted)
    return cost


#: Nodes per part file of :func:`amc_keys` (the block level's parts are rewritten one Dask task each).
KEY_PART_NODES = 50_000


def amc_keys(src: Source, product: Product, queries: tuple[str, ...], want: set[str],
             entities: pd.DataFrame | None, staging: Path) -> list[Path]:
    """The keys (product, level, geocode, query, cell) of the ``amc`` rows of a product whose GLS is not
    computed: every answer of ``queries`` at every node of the levels ``want`` and every entity, as part files
    of at most :data:`KEY_PART_NODES` nodes, to which :func:`published_and_amc` adds the rows."""
    answers = [(q, build_query(product.schema, q).n_answers) for q in queries]
    places = [(level, nodes) for level, nodes in zip(src.levels, src.nodes) if level in want]
    if entities is not None and len(entities):
        on_spine = entities[entities["geoid"].isin(src.spine["geoid"])]
        places += [(str(t), pd.Index(np.sort(g["entity"].astype(str).unique())))
                   for t, g in on_spine.groupby("entity_type")]
    out = []
    for level, nodes in places:
        for start in range(0, len(nodes), KEY_PART_NODES):
            geocodes = np.asarray(nodes[start:start + KEY_PART_NODES], dtype=object)
            frame = pd.concat([pd.DataFrame({"geocode": np.repeat(geocodes, n), "query": q,
                                             "cell": np.tile(np.arange(n, dtype=np.int32), len(geocodes))})
                               for q, n in answers], ignore_index=True)
            frame.insert(0, "level", level)
            frame.insert(0, "product", product.name)
            path = staging / f"{product.name}-keys-{len(out):05d}.parquet"
            write_table(frame, path)
            out.append(path)
    return out


def save_array(path: str, array: np.ndarray) -> None:
    """``np.save`` to a local file or a store's object."""
    target = location(path)
    if isinstance(target, StorePath):
        buffer = io.BytesIO()
        np.save(buffer, array)
        target.write_bytes(buffer.getvalue())
    else:
        np.save(target, array)


def load_array(path: str) -> np.ndarray:
    """An array of :func:`save_array` (a local file memory-mapped, read only)."""
    source = location(path)
    if isinstance(source, StorePath):
        return np.load(io.BytesIO(source.read_bytes()))
    return np.load(source, mmap_mode="r")


def concatenate(parts: list[str], path: str, schema: pa.Schema) -> None:
    """The parts' rows as one Parquet file, row group by row group (amc.REWRITE_ROWS rows at most); a Dask task,
    so that the reader's and writer's buffers (about 60 MB at the Hawaii size) stay out of the client."""
    with parquet_writer(path, schema, compression="zstd") as writer:
        for part in parts:
            f = parquet_file(part)
            for g in range(f.num_row_groups):
                writer.write_table(f.read_row_group(g).cast(schema))
    release_memory()


# ------------------------------------------------------------------------------------ the upper levels
#: The leaves' parents' final state that pass 2 reads (one .npy file each, rows in node order).
PARENT_ARRAYS = ("b", "s_est", "s_inv", "v")


@dataclass
class UpperTask:
    """The levels above the leaves, estimated in one Dask task (their arrays and rows stay out of the client)."""

    src: Source  # without its spine table, reader or configuration (:func:`_shipped`)
    product: Product
    queries: tuple[str, ...]
    zeros: tuple[str, ...]
    structure: Structure
    out_queries: tuple[str, ...]
    want: frozenset[str]
    rows_out: str  # the upper levels' rows (Parquet), written when one of them is wanted
    parents_out: str  # prefix of the leaves' parents' state files (:data:`PARENT_ARRAYS`)
    covers: list[list[np.ndarray]] = field(default_factory=list)  # the entities' covers (:func:`entity_covers`)


def _shipped(src: Source, spine: bool = False) -> Source:
    """``src`` as a task needs it: levels, nodes, parents and parts, with ``spine`` its spine table too (the
    readers and the configuration stay)."""
    return Source(src.root, src.levels, src.products, src.spine if spine else src.spine.iloc[:0], src.nodes,
                  src.parents)


def upper_pass(t: UpperTask, res1: list[dict]) -> dict:
    """Both GLS passes over the levels above the leaves, given the leaves' pass-1 results ``res1`` (one per
    block part): writes the upper levels' rows and the leaves' parents' state; returns each part's leaf rows,
    the entities' covariances, exact totals and upper-level sums, and the CPU of pass 1 and of this task."""
    cpu = time.process_time()
    src, spec, structure = t.src, t.product, t.structure
    product = spec.name
    alg = KronAlgebra(spec.schema, t.queries, t.zeros)
    leaf = len(src.levels) - 1
    leaf_total = structure.totals[leaf]
    upper = [_full_level(alg, src, spec, i, structure) for i in range(leaf)]
    n_up = len(src.nodes[leaf - 1])
    weights = np.full((len(src.nodes[leaf]), len(alg.queries)), np.nan)
    s_est = np.zeros((n_up, alg.schema.ncells))
    for r in res1:
        weights[r["rows"]] = r["weights"]
        s_est[r["parents"]] += r["s_est"]
    if np.isnan(weights).any():
        g = src.nodes[leaf][np.flatnonzero(np.isnan(weights).any(axis=1))[0]]
        raise GLSError(f"{product} {src.levels[leaf]} {g}: no noisy measurements (a leaf must be measured)")
    sig, sig_of = np.unique(leaf_signature(weights, leaf_total), axis=0, return_inverse=True)
    sig_of = sig_of.ravel()
    del weights
    v_sig = leaf_covariance(alg.precision(sig[:, :-1]), f"{product} {src.levels[leaf]}", sig[:, -1] > 0)
    counts = np.zeros((n_up, len(sig)))
    np.add.at(counts, (src.parents[leaf], sig_of), 1)
    upper[-1].s_cov = np.einsum("ps,scij->pcij", counts, v_sig)
    upper[-1].s_est = s_est
    upper[-1].s_total = segment_sum(leaf_total, src.parents[leaf], n_up)
    upward(alg, upper, [f"{product} {lv}" for lv in src.levels[:leaf]])
    downward(alg, upper)
    for lv in upper:
        lv.info = None  # no longer needed
    release_memory()

    frames = [_rows(alg, spec, src.levels[i], np.asarray(src.nodes[i]), upper[i].b, upper[i].v, None,
                    t.out_queries, upper[i].total) for i in range(leaf) if src.levels[i] in t.want]
    if frames:
        write_table(pd.concat(frames, ignore_index=True), t.rows_out, compression="snappy")
    del frames
    release_memory()
    par = upper[-1]
    for name in PARENT_ARRAYS:
        save_array(f"{t.parents_out}-{name}.npy", getattr(par, name))

    entities = None
    if t.covers:
        # The leaf level as the entity covariance needs it: V_- and A shared through (signature, parent).
        key, kinv = np.unique(np.stack([sig_of, src.parents[leaf]], axis=1), axis=0, return_inverse=True)
        a_key = gain(v_sig[key[:, 0]], par.s_inv[key[:, 1]])
        leaf_state = LevelState(src.parents[leaf], v_sig[:1], None, v_minus=_Indexed(v_sig, sig_of),
                                gain=_Indexed(a_key, kinv.ravel()))
        states = upper + [leaf_state]
        n = len(t.covers)
        est = np.zeros((n, alg.schema.ncells))
        cov = np.zeros((n, alg.n_classes, alg.d, alg.d))
        tot = np.zeros(n)  # exact where every node of the cover is
        for e, cv in enumerate(t.covers):
            est[e] = sum((upper[i].b[cv[i]].sum(axis=0) for i in range(leaf)), np.zeros(alg.schema.ncells))
            cov[e] = entity_covariance(states, cv)
            tot[e] = sum(upper[i].total[cv[i]].sum() for i in range(leaf)) + leaf_total[cv[leaf]].sum()
        entities = (est, cov, tot)
    del upper, par
    release_memory()
    return {"rows": [r["rows"] for r in res1], "entities": entities,
            "pass1_cpu": sum(r["cpu"] for r in res1), "cpu": time.process_time() - cpu}


def _finished(futures: list, desc: str) -> None:
    """Wait for ``futures``, counted on a bar, without fetching their results; the first error is raised."""
    from distributed import as_completed

    for fut in track(as_completed(futures), desc, len(futures), "tasks"):
        if fut.status == "error":
            fut.result()


def _product(dclient, src: Source, spec: Product, out_queries: tuple[str, ...], want: set[str],
             entities: pd.DataFrame | None, staging: Path, cost: Cost) -> list[Path]:
    """One product's rows as part files under ``staging``: pass 1 over the block parts, the upper levels in one
    task, pass 2 over the block parts, then the entities. The client holds no level's arrays."""
    product = spec.name
    structure = public_structure(src, spec)
    measured = dclient.submit(measured_queries, _shipped(src), spec, pure=False).result()  # reads every part
    alg, left_out = with_zeros(spec.schema, measured, structure.zero_queries)
    alg.check_size()  # before the product's estimation tasks
    if left_out:
        log.info("uncertainty %s: the structural zeros of %s are not used (their cells would make the covariance "
                 "blocks larger than %d x %d)", product, ", ".join(left_out), MAX_ZERO_BLOCK, MAX_ZERO_BLOCK)
    leaf = len(src.levels) - 1
    leaf_total = structure.totals[leaf]
    common = dict(product=spec, queries=alg.queries, level=src.levels[leaf], zeros=alg.zeros)
    parts = src.parts(spec, src.levels[leaf])
    # Every leaf's geocode, parent and total, sent to the workers once (not with each of the tasks).
    leaves = dclient.scatter(LeafTask(part="", nodes=src.nodes[leaf], parents=src.parents[leaf], totals=leaf_total,
                                      **common), broadcast=True, hash=False)
    futures = [dclient.submit(leaf_pass1, leaves, str(p), pure=False) for p in parts]
    _finished(futures, f"uncertainty {product} {src.levels[leaf]} (pass 1)")
    keys, covers = entity_covers(src, entities) if entities is not None and len(entities) else ([], [])
    upper_out = staging / f"{product}-upper.parquet"
    parents_out = staging / f"{product}-parents"
    task = UpperTask(_shipped(src), spec, alg.queries, alg.zeros, structure, out_queries, frozenset(want),
                     str(upper_out), str(parents_out), covers)
    res = gather(dclient, [dclient.submit(upper_pass, task, futures, pure=False)],
                 f"uncertainty {product} {', '.join(src.levels[:leaf])}")[0]
    del futures, leaves, task
    cost.tasks += len(parts) + 1
    cost.worker_cpu_seconds += res["pass1_cpu"] + res["cpu"]
    out_parts = [upper_out] if any(lv in want for lv in src.levels[:leaf]) else []

    leaf_cover: dict[int, list[int]] = {}
    for e, cov in enumerate(covers):
        for r in cov[leaf]:
            leaf_cover.setdefault(int(r), []).append(e)
    tasks = []
    for k, part in enumerate(parts):
        rows = res["rows"][k]  # the part's leaves (sorted): a task carries theirs only, numbered 0, 1, ...
        own = dict(common, nodes=src.nodes[leaf][rows], parents=src.parents[leaf][rows], totals=leaf_total[rows])
        tasks.append(LeafPass2(part=str(part), **own, parent_rows=np.unique(src.parents[leaf][rows]),
                               parents_in=str(parents_out), out=str(staging / f"{product}-leaf-{k:05d}.parquet"),
                               out_queries=out_queries, write_rows=src.levels[leaf] in want,
                               cover={i: leaf_cover[int(r)] for i, r in enumerate(rows) if int(r) in leaf_cover}))
    res2 = gather(dclient, [dclient.submit(leaf_pass2, t, pure=False) for t in tasks],
                  f"uncertainty {product} {src.levels[leaf]} (pass 2)")
    cost.tasks += len(res2)
    cost.worker_cpu_seconds += sum(r["cpu"] for r in res2)
    if src.levels[leaf] in want:
        out_parts += [location(t.out) for t in tasks]
    for name in PARENT_ARRAYS:
        location(f"{parents_out}-{name}.npy").unlink(missing_ok=True)

    if keys:
        est, cov, tot = res["entities"]
        for r in res2:
            for e, s in r["sums"].items():
                est[e] += s
        snap(cov, est, tot)
        frames = []
        for etype in sorted({k[0] for k in keys}):
            sel = np.array([k[0] == etype for k in keys])
            frames.append(_rows(alg, spec, etype, np.array([k[1] for k in keys], dtype=object)[sel],
                                est[sel], cov[sel], None, out_queries, tot[sel]))
        path = staging / f"{product}-entities.parquet"
        write_table(pd.concat(frames, ignore_index=True), path, compression="snappy")
        out_parts.append(path)
    return out_parts
