"""``topdown uncertainty``: GLS estimates, variances and confidence intervals of every published count,
from a run's noisy measurements alone (or a noisy measurement file), on Dask.

Output (one Parquet file, columns :data:`amc.SCHEMA`): per method, one row per answer cell of every output
query at every node of every level and every off-spine entity: ``product, level, geocode, query, cell, method,
published, estimate, variance, ci90_low, ci90_high, ci95_low, ci95_high, rep_n, rep_bias, rep_rmse``. ``cell``
is the answer's position in the query's cell order (pipeline/execution/nmf.py). ``gls`` rows: the GLS
intervals in the Bureau's integer form ``[max(ceil(est - z sd), 0), max(floor(est + z sd), 0)]``, which
covers a non-negative integer count exactly when the real interval ``est +- z sd`` does; ``published`` where
the run has its histograms. ``amc`` rows (with replicates): the Bureau's approximate Monte Carlo interval of
the published count (pipeline/evaluation/amc.py).

Work plan: the levels above the blocks (few nodes) are estimated in the client process; the block level is
read and estimated in Dask tasks, one per block measurement part (whole block groups), in two passes (their
sums up to the block groups; then, given the block groups' final estimates, the blocks' estimates, written
as part files, and their sums over entity covers). Covariances depend on the variances only, not on the
data, so all blocks with the same measurements' variances under one parent share one covariance.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from .gls import (GLSError, KronAlgebra, LevelState, downward, entity_covariance, gain, leaf_covariance,
                  segment_sum, top_down_cov, top_down_est, upward)
from topdown.vocab.queries import build_query
from ..execution.rundir import RunDirError, RunReader, removed_on_failure, writing
from ..execution.progress import gather
from .amc import SCHEMA, published_and_amc, replicate_dirs
from .evaluate import entities_on_spine, load_entities
from topdown.vocab.census import Product

log = logging.getLogger("topdown")

Z90, Z95 = 1.6448536269514722, 1.959963984540054
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

    @classmethod
    def open(cls, path: str | Path) -> "Source":
        path = Path(path)
        reader = RunReader(path)
        m = reader.complete_manifest("computing its uncertainty")  # RunDirError: exit 4, as verify
        spine = reader.spine()
        table = spine.table[["geoid", *spine.levels]].astype(str)
        src = cls(path, list(spine.levels), reader.products(), table)
        for i, level in enumerate(src.levels):
            nodes = pd.Index(np.sort(table[level].unique()))
            src.nodes.append(nodes)
            if i:
                pairs = table[[level, src.levels[i - 1]]].drop_duplicates(level).set_index(level)[src.levels[i - 1]]
                src.parents.append(src.nodes[i - 1].get_indexer(pairs.reindex(nodes).to_numpy()))
            else:
                src.parents.append(None)
        return src

    def parts(self, product: str, level: str) -> list[Path]:
        return sorted((self.root / "noisy_measurements" / product / f"level={level}").glob("part-*.parquet"))


def read_part(path: Path) -> pd.DataFrame:
    return pq.read_table(path).to_pandas()


# ----------------------------------------------------------------------------------- measurement arrays
def measured_queries(src: Source, product: str) -> tuple[str, ...]:
    """Every query measured at some level of ``product`` (from the parts' schema-free contents)."""
    names: set[str] = set()
    for level in src.levels:
        for part in src.parts(product, level):
            names |= set(pq.read_table(part, columns=["query"]).column("query").unique().to_pylist())
    return tuple(sorted(names))


def node_arrays(alg: KronAlgebra, long: pd.DataFrame, nodes: pd.Index, where: str):
    """Rows of ``nodes`` present in ``long`` and their weights (n, n_queries), precision and information."""
    rows_all = nodes.get_indexer(long["geocode"].astype(str))
    if (rows_all < 0).any():
        raise GLSError(f"{where}: measurement of unknown node {long['geocode'].iloc[np.flatnonzero(rows_all < 0)[0]]!r}")
    present = np.unique(rows_all)
    local = np.searchsorted(present, rows_all)
    weights = np.zeros((present.size, len(alg.queries)))
    answers, wq = {}, {}
    for qi, q in enumerate(alg.queries):
        sel = (long["query"] == q).to_numpy()
        if not sel.any():
            continue
        var = long["variance"].to_numpy()[sel]
        if (var <= 0).any() or not np.isfinite(var).all():
            raise GLSError(f"{where}: query {q!r} has variance {var[(var <= 0) | ~np.isfinite(var)][0]}: GLS needs "
                           "noisy measurements (a zero-noise run has no uncertainty to report)")
        y = np.zeros((present.size, build_query(alg.schema, q).n_answers))
        y[local[sel], long["answer"].to_numpy()[sel]] = long["value"].to_numpy()[sel]
        weights[local[sel], qi] = 1.0 / var
        answers[q], wq[q] = y, weights[:, qi]
    info = alg.information(answers, wq) if answers else np.zeros((present.size, alg.schema.ncells))
    return present, weights, info


def _full_level(alg: KronAlgebra, src: Source, product: str, i: int) -> LevelState:
    level, nodes = src.levels[i], src.nodes[i]
    n = len(nodes)
    parts = src.parts(product, level)
    long = pd.concat([read_part(p) for p in parts], ignore_index=True) if parts else None
    weights = np.zeros((n, len(alg.queries)))
    info = np.zeros((n, alg.schema.ncells))
    if long is not None and len(long):
        rows, w, z = node_arrays(alg, long, nodes, f"{product} {level}")
        weights[rows], info[rows] = w, z
    return LevelState(src.parents[i], alg.precision(weights), info)


# ------------------------------------------------------------------------------------------- output rows
def interval(est: np.ndarray, sd: np.ndarray, z: float) -> tuple[np.ndarray, np.ndarray]:
    """The Bureau's integer interval ``[max(ceil(est - z sd), 0), max(floor(est + z sd), 0)]``."""
    return np.maximum(np.ceil(est - z * sd), 0), np.maximum(np.floor(est + z * sd), 0)


def cell_rows(alg: KronAlgebra, product: str, level: str, geocodes: np.ndarray, est: np.ndarray, cov: np.ndarray,
              cov_index: np.ndarray | None, queries: tuple[str, ...]) -> pd.DataFrame:
    """Rows for histograms ``est (N, ncells)`` with covariances ``cov[cov_index]`` (class blocks)."""
    frames = []
    idx = np.arange(len(geocodes)) if cov_index is None else cov_index
    for q in queries:
        query = build_query(alg.schema, q)
        e = query.answer(est)
        v = alg.cell_variance(cov, q)[idx]
        v = np.maximum(v, 0.0)
        sd = np.sqrt(v)
        lo90, hi90 = interval(e, sd, Z90)
        lo95, hi95 = interval(e, sd, Z95)
        k = query.n_answers
        frames.append(pd.DataFrame({
            "product": product, "level": level, "geocode": np.repeat(np.asarray(geocodes, dtype=object), k),
            "query": q, "cell": np.tile(np.arange(k, dtype=np.int32), len(geocodes)), "method": "gls",
            "published": np.nan, "estimate": e.ravel(),
            "variance": v.ravel(), "ci90_low": lo90.ravel(), "ci90_high": hi90.ravel(),
            "ci95_low": lo95.ravel(), "ci95_high": hi95.ravel()}))
    return pd.concat(frames, ignore_index=True)


# ---------------------------------------------------------------------------------------- block tasks
@dataclass
class LeafTask:
    product: Product
    part: str
    queries: tuple[str, ...]
    level: str
    nodes: pd.Index  # all leaves
    parents: np.ndarray  # parent row of every leaf


def _leaf_local(t: LeafTask):
    alg = KronAlgebra(t.product.schema, t.queries)
    rows, weights, info = node_arrays(alg, read_part(Path(t.part)), t.nodes, f"{t.product.name} {t.level} {t.part}")
    sig, inv_sig = np.unique(weights, axis=0, return_inverse=True)
    v_minus = leaf_covariance(alg.precision(sig), f"{t.product.name} {t.level}")
    b_minus = alg.apply(v_minus[inv_sig.ravel()], info)
    return alg, rows, weights, inv_sig.ravel(), v_minus, b_minus


def leaf_pass1(t: LeafTask) -> dict:
    """The leaves' weights and the sums of their ``b_-`` per parent."""
    cpu = time.process_time()
    alg, rows, weights, _, _, b_minus = _leaf_local(t)
    par = t.parents[rows]
    ups, inv = np.unique(par, return_inverse=True)
    return {"rows": rows, "weights": weights, "parents": ups, "s_est": segment_sum(b_minus, inv.ravel(), ups.size),
            "cpu": time.process_time() - cpu}


@dataclass
class LeafPass2(LeafTask):
    parent_rows: np.ndarray = None  # the parents the part's leaves hang from (sorted)
    parent_b: np.ndarray = None
    parent_s_est: np.ndarray = None
    parent_s_inv: np.ndarray = None
    parent_v: np.ndarray = None
    out: str = ""
    out_queries: tuple[str, ...] = ()
    write_rows: bool = True
    cover: dict[int, list[int]] = field(default_factory=dict)  # leaf row -> entity numbers it covers


def leaf_pass2(t: LeafPass2) -> dict:
    """The leaves' final estimates and covariances: rows written to ``t.out``, entity sums returned."""
    cpu = time.process_time()
    alg, rows, _, sig, v_minus, b_minus = _leaf_local(t)
    p = np.searchsorted(t.parent_rows, t.parents[rows])
    key, kinv = np.unique(np.stack([sig, p], axis=1), axis=0, return_inverse=True)
    kinv = kinv.ravel()
    a_key = gain(v_minus[key[:, 0]], t.parent_s_inv[key[:, 1]])
    v_key = top_down_cov(v_minus[key[:, 0]], a_key, t.parent_v[key[:, 1]])
    b = top_down_est(alg, b_minus, a_key[kinv], t.parent_b[p], t.parent_s_est[p])
    if t.write_rows:
        frame = cell_rows(alg, t.product.name, t.level, np.asarray(t.nodes[rows]), b, v_key, kinv, t.out_queries)
        pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), t.out, compression="zstd")
    sums: dict[int, np.ndarray] = {}
    for r, bb in zip(rows, b):
        for e in t.cover.get(int(r), ()):
            sums[e] = sums.get(e, 0) + bb
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


def _check_out(out: Path) -> Path:
    """``--out`` must be absent or an earlier uncertainty table (a Parquet file this module wrote): anything
    else is refused (:class:`RunDirError`) before it is touched."""
    if not out.exists() and not out.is_symlink():
        return out
    try:
        ours = out.is_file() and META_KEY in (pq.read_schema(out).metadata or {})
    except (OSError, pa.ArrowException):
        ours = False
    if not ours:
        raise RunDirError(f"{out}: cannot write the uncertainty table: {'a folder' if out.is_dir() else 'a file'} "
                          "that is not an earlier output of this command (an uncertainty table) is in the way; "
                          "nothing was touched (name a new file)")
    return out


def uncertainty(run: str | Path, out: str | Path, *, entities: pd.DataFrame | Path | None = None,
                levels: list[str] | None = None, queries: dict[str, tuple[str, ...]] | None = None,
                client=None, scheduler: str | None = None, workers: int | None = None,
                replicates: str | Path | None = None) -> Cost:
    """Write the uncertainty table of ``run`` to ``out`` (Parquet, atomically); returns the cost. ``entities``:
    a (geoid, entity_type, entity) frame, or a table file or BAF directory to read and match with the spine."""
    from ..execution.runner import dask_client

    t0, c0 = time.perf_counter(), time.process_time()
    source = entities if isinstance(entities, Path) else None
    if source is not None:  # a bad entities file is reported before the run is opened
        entities = load_entities(source)
    src = Source.open(run)
    if source is not None:
        entities = entities_on_spine(entities, pd.Index(src.spine["geoid"]), source)
    out = _check_out(Path(out))
    if replicates is not None:
        replicate_dirs(Path(replicates))  # a bad folder is reported before any work
    has_hist = replicates is not None or (src.root / "histograms").exists()  # published counts, if any
    RunReader(run).check_sums(("spine.parquet", "noisy_measurements", *(("histograms",) if has_hist else ())),
                              "uncertainty")
    want = set(levels or src.levels)
    unknown = want - set(src.levels)
    if unknown:
        from ..configuration.config import ConfigError

        raise ConfigError(f"--levels: unknown level(s) {', '.join(sorted(unknown))}; levels are {', '.join(src.levels)}")
    staging = out.with_name(f".{out.name}.parts")
    shutil.rmtree(staging, ignore_errors=True)
    with writing(staging):
        staging.mkdir(parents=True)
    cost = Cost()
    parts_written: list[Path] = []
    try:
        with dask_client(client, scheduler, workers) as dclient:
            for product in src.products:
                wanted = queries[product.name] if queries else product.uncertainty_queries
                parts_written += _product(dclient, src, product, wanted, want, entities, staging, cost)
        parts_written = published_and_amc(parts_written, src, staging, entities,
                                          Path(replicates) if replicates is not None else None)
        if not parts_written:
            raise GLSError(f"{run}: no rows to write")
        cost.rows = sum(pq.read_metadata(part).num_rows for part in parts_written)
        cost.wall_seconds = time.perf_counter() - t0
        cost.client_cpu_seconds = time.process_time() - c0
        meta = json.dumps({"run": str(run), "cost": cost.__dict__, "z90": Z90, "z95": Z95})
        schema = SCHEMA.with_metadata({META_KEY: meta})
        tmp = out.with_name(f".{out.name}.tmp")
        with writing(out), removed_on_failure(tmp):
            with pq.ParquetWriter(tmp, schema, compression="zstd") as writer:  # the parts, concatenated once
                for part in parts_written:
                    writer.write_table(pq.read_table(part).cast(schema))
            os.replace(tmp, out)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return cost


def _product(dclient, src: Source, spec: Product, out_queries: tuple[str, ...], want: set[str],
             entities: pd.DataFrame | None, staging: Path, cost: Cost) -> list[Path]:
    product = spec.name
    alg = KronAlgebra(spec.schema, measured_queries(src, product))
    leaf = len(src.levels) - 1
    n_leaf = len(src.nodes[leaf])
    upper = [_full_level(alg, src, product, i) for i in range(leaf)]
    common = dict(product=spec, queries=alg.queries, level=src.levels[leaf], nodes=src.nodes[leaf],
                  parents=src.parents[leaf])
    parts = src.parts(product, src.levels[leaf])
    futures = [dclient.submit(leaf_pass1, LeafTask(part=str(p), **common), pure=False) for p in parts]
    res1 = gather(dclient, futures, f"uncertainty {product} {src.levels[leaf]} (pass 1)")
    cost.tasks += len(res1)
    cost.worker_cpu_seconds += sum(r["cpu"] for r in res1)
    weights = np.full((n_leaf, len(alg.queries)), np.nan)
    s_est = np.zeros((len(src.nodes[leaf - 1]), alg.schema.ncells))
    for r in res1:
        weights[r["rows"]] = r["weights"]
        s_est[r["parents"]] += r["s_est"]
    if np.isnan(weights).any():
        g = src.nodes[leaf][np.flatnonzero(np.isnan(weights).any(axis=1))[0]]
        raise GLSError(f"{product} {src.levels[leaf]} {g}: no noisy measurements (a leaf must be measured)")
    sig, sig_of = np.unique(weights, axis=0, return_inverse=True)
    sig_of = sig_of.ravel()
    v_sig = leaf_covariance(alg.precision(sig), f"{product} {src.levels[leaf]}")
    counts = np.zeros((len(src.nodes[leaf - 1]), len(sig)))
    np.add.at(counts, (src.parents[leaf], sig_of), 1)
    upper[-1].s_cov = np.einsum("ps,scij->pcij", counts, v_sig)
    upper[-1].s_est = s_est
    upward(alg, upper, [f"{product} {lv}" for lv in src.levels[:leaf]])
    downward(alg, upper)

    out_parts: list[Path] = []
    frames = [cell_rows(alg, product, src.levels[i], np.asarray(src.nodes[i]), upper[i].b, upper[i].v, None, out_queries)
              for i in range(leaf) if src.levels[i] in want]
    if frames:
        path = staging / f"{product}-upper.parquet"
        pq.write_table(pa.Table.from_pandas(pd.concat(frames, ignore_index=True), preserve_index=False), path)
        out_parts.append(path)

    keys, covers = entity_covers(src, entities) if entities is not None and len(entities) else ([], [])
    leaf_cover: dict[int, list[int]] = {}
    for e, cov in enumerate(covers):
        for r in cov[leaf]:
            leaf_cover.setdefault(int(r), []).append(e)
    par = upper[-1]
    tasks = []
    for k, part in enumerate(parts):
        rows = res1[k]["rows"]
        prow = np.unique(src.parents[leaf][rows])
        tasks.append(LeafPass2(part=str(part), **common, parent_rows=prow, parent_b=par.b[prow],
                               parent_s_est=par.s_est[prow], parent_s_inv=par.s_inv[prow], parent_v=par.v[prow],
                               out=str(staging / f"{product}-leaf-{k:05d}.parquet"), out_queries=out_queries,
                               write_rows=src.levels[leaf] in want,
                               cover={int(r): leaf_cover[int(r)] for r in rows if int(r) in leaf_cover}))
    res2 = gather(dclient, [dclient.submit(leaf_pass2, t, pure=False) for t in tasks],
                  f"uncertainty {product} {src.levels[leaf]} (pass 2)")
    cost.tasks += len(res2)
    cost.worker_cpu_seconds += sum(r["cpu"] for r in res2)
    if src.levels[leaf] in want:
        out_parts += [Path(t.out) for t in tasks]

    if keys:
        # The leaf level as the entity covariance needs it: V_- and A shared through (signature, parent).
        key, kinv = np.unique(np.stack([sig_of, src.parents[leaf]], axis=1), axis=0, return_inverse=True)
        a_key = gain(v_sig[key[:, 0]], par.s_inv[key[:, 1]])
        leaf_state = LevelState(src.parents[leaf], v_sig[:1], None, v_minus=_Indexed(v_sig, sig_of),
                                gain=_Indexed(a_key, kinv.ravel()))
        states = upper + [leaf_state]
        est = np.zeros((len(keys), alg.schema.ncells))
        cov = np.zeros((len(keys), alg.n_classes, alg.d, alg.d))
        for e, cv in enumerate(covers):
            est[e] = sum((upper[i].b[cv[i]].sum(axis=0) for i in range(leaf)), np.zeros(alg.schema.ncells))
            cov[e] = entity_covariance(states, cv)
        for r in res2:
            for e, s in r["sums"].items():
                est[e] += s
        frames = []
        for etype in sorted({k[0] for k in keys}):
            sel = np.array([k[0] == etype for k in keys])
            frames.append(cell_rows(alg, product, etype, np.array([k[1] for k in keys], dtype=object)[sel],
                                    est[sel], cov[sel], None, out_queries))
        path = staging / f"{product}-entities.parquet"
        pq.write_table(pa.Table.from_pandas(pd.concat(frames, ignore_index=True), preserve_index=False), path)
        out_parts.append(path)
    return out_parts
