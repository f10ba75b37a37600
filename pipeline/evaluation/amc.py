"""The Census Bureau's approximate Monte Carlo (AMC) intervals for published counts, and the ``published``
column of the uncertainty table.

The rule, as the Bureau's public repository uscensusbureau/AMC_Confidence_Intervals states it (README.md and
jupyter_Approx_Monte_Carlo_confidence_interval_notebook.ipynb, function ``ci_wald_t_conditional``; paper
Approx_Monte_Carlo_confidence_interval_paper.pdf, Ashmead et al.): TopDown is rerun n times with the published
microdata (PPMF0) as its input; for one published count q0 and its replicate counts q_1..q_n

- ``MEAN = mean(q_i)``, ``BIAS = MEAN - q0``, ``MSE = mean((q_i - q0)^2)`` (over n), ``RMSE = sqrt(MSE)``,
  ``STD`` = the sample standard deviation of the q_i (pandas ``std``: n - 1 in the denominator);
- the bias-corrected point estimate ``q0 - BIAS`` is used only when all three hold: ``q0 > 5``,
  ``|BIAS| / STD >= 0.5`` and (``BIAS < 0`` or ``q0 >= 25``); otherwise the point estimate is q0 (a 0/0
  ratio fails the test, x/0 passes it, as in pandas);
- the interval at level L is ``[floor(max(0, POINT - t RMSE)), ceil(POINT + t RMSE)]`` with t the
  1 - (1 - L)/2 quantile of Student's t with 5 degrees of freedom ("preferring a more conservative, larger
  interval"): 2.015 at 90 %, 2.571 at 95 % (the notebook's function at ``ci_level=0.95``); the upper bound is
  not clipped (it is at least q0 >= 0 anyway, since RMSE >= |BIAS|).

The notebook's demonstration used 25 replicates of 2010 data; ``topdown replicates --n`` defaults to 50. In the uncertainty table an ``amc`` row has ``estimate`` = the point estimate,
``variance`` = MSE (so the interval is estimate +- t sqrt(variance) before rounding), ``rep_bias`` = BIAS,
``rep_rmse`` = RMSE and ``rep_n`` = n.

Streaming: each output part is rewritten by a Dask task of its own (:func:`rewrite_part`), which accumulates
the published counts and the replicates' sums of d_i = q_i - q0 and d_i^2 per (product, level, query) for the
part's own nodes only, from one block-histogram part file of one run directory at a time (only the files whose
geocode range holds one of those nodes' blocks), and writes the part by batches of :data:`REWRITE_ROWS` rows.
"""
from __future__ import annotations

import hashlib
import json
import time
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp
from scipy import stats

from topdown.vocab.census import Product
from topdown.vocab.queries import build_query

from ..execution.memory import release_memory
from ..runtime.progress import gather
from ..runtime.rundir import RunDirError
from ..runtime.storage import location, parquet_file, parquet_writer, read_table
from .evaluate import EvaluationError

#: Degrees of freedom of the Bureau's Student t.
T_DF = 5
#: Smallest published count, and smallest one with a positive bias, that the bias correction applies to.
MIN_CORRECTED, MIN_CORRECTED_POSITIVE = 5, 25
#: |BIAS| / STD at or above which the bias correction applies.
BIAS_RATIO = 0.5

#: The uncertainty table's columns (docs/how-to/uncertainty.md), one row per method, node, query and cell.
SCHEMA = pa.schema([("product", pa.string()), ("level", pa.string()), ("geocode", pa.string()),
                    ("query", pa.string()), ("cell", pa.int32()), ("method", pa.string()),
                    ("published", pa.float64()), ("estimate", pa.float64()), ("variance", pa.float64()),
                    ("ci90_low", pa.float64()), ("ci90_high", pa.float64()), ("ci95_low", pa.float64()),
                    ("ci95_high", pa.float64()), ("rep_n", pa.int32()), ("rep_bias", pa.float64()),
                    ("rep_rmse", pa.float64())])
KEY = ["product", "level", "query"]
#: The string columns of an output part read as dictionaries (codes into a few distinct values).
KEY_COLUMNS = [*KEY, "geocode"]


# -------------------------------------------------------------------------------------------- the rule
def t_value(level: float, df: int = T_DF) -> float:
    """The two-sided ``level`` quantile of Student's t with ``df`` degrees of freedom (2.015 at 0.90, 5)."""
    return float(stats.t.ppf(1 - (1 - level) / 2, df))


def replicate_moments(n: int, s1: np.ndarray, s2: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """BIAS, MSE and STD from ``n`` replicates' sums ``s1 = sum(q_i - q0)`` and ``s2 = sum((q_i - q0)^2)``."""
    if n < 2:
        raise ValueError(f"{n} replicate(s): the sample standard deviation needs at least 2")
    bias, mse = s1 / n, s2 / n
    return bias, mse, np.sqrt(np.maximum(s2 - s1 * s1 / n, 0.0) / (n - 1))


def bias_corrected(q0: np.ndarray, bias: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Where the Bureau's conditional bias correction applies (all three criteria)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        ratio = np.abs(bias) / sd
    return (q0 > MIN_CORRECTED) & (ratio >= BIAS_RATIO) & ((bias < 0) | (q0 >= MIN_CORRECTED_POSITIVE))


def point_estimate(q0: np.ndarray, bias: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """``q0 - BIAS`` where the correction applies, else ``q0``."""
    return np.where(bias_corrected(q0, bias, sd), q0 - bias, q0)


def amc_interval(point: np.ndarray, rmse: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """``[floor(max(0, point - t RMSE)), ceil(point + t RMSE)]``, t of :func:`t_value` at ``level``."""
    t = t_value(level)
    return np.floor(np.maximum(point - t * rmse, 0.0)), np.ceil(point + t * rmse)


# ------------------------------------------------------------------------------- tabulating run folders
def _cached(cache: dict, key, make):
    """``cache[key]``, made by ``make()`` the first time."""
    if key not in cache:
        cache[key] = make()
    return cache[key]


def aggregators(src, entities: pd.DataFrame | None, nodes: dict[str, np.ndarray] | None = None,
                cache: dict | None = None) -> dict[str, tuple[pd.Index, sp.csr_matrix]]:
    """Per output level (spine levels and entity types): node index and node x block (spine row) matrix;
    with ``nodes``, only its levels, each restricted to the given nodes (those of one output part).
    ``cache`` keeps each level's node of every block for the next call."""
    cache = {} if cache is None else cache
    geoids = _cached(cache, "geoids", lambda: pd.Index(src.spine["geoid"]))
    out = {}
    for i, level in enumerate(src.levels):
        if nodes is not None and level not in nodes:
            continue
        level_nodes = src.nodes[i]
        rows = _cached(cache, ("rows", level), lambda: level_nodes.get_indexer(src.spine[level]))
        if nodes is not None:  # renumber the kept nodes 0, 1, ...; the others -1
            keep = level_nodes.isin(nodes[level])
            rows = np.where(keep, np.cumsum(keep) - 1, -1)[rows]
            level_nodes = level_nodes[keep]
        blocks = np.flatnonzero(rows >= 0)
        out[level] = (level_nodes, sp.csr_matrix((np.ones(len(blocks)), (rows[blocks], blocks)),
                                                 shape=(len(level_nodes), len(geoids))))
    if entities is not None:
        for etype, t in entities.groupby("entity_type"):
            if nodes is not None and str(etype) not in nodes:
                continue
            t = t[t["geoid"].isin(geoids)]
            if nodes is not None:
                t = t[t["entity"].isin(nodes[str(etype)])]
            ent = pd.Index(np.sort(t["entity"].unique()))
            out[str(etype)] = (ent, sp.csr_matrix((np.ones(len(t)), (ent.get_indexer(t["entity"]),
                                                                      geoids.get_indexer(t["geoid"]))),
                                                  shape=(len(ent), len(geoids))))
    return out


def _stat(path: Path) -> tuple[str, int, int]:
    """A file's identity for a cache: path, size and modification time."""
    st = path.stat()
    return str(path), st.st_size, st.st_mtime_ns


def _geocode_range(path: Path) -> tuple[str, str] | None:
    """The smallest and largest geocode of a histogram part (its footer's statistics; None without them)."""
    meta = parquet_file(path).metadata
    col = meta.schema.to_arrow_schema().get_field_index("geocode")
    lo = hi = None
    for g in range(meta.num_row_groups):
        st = meta.row_group(g).column(col).statistics
        if st is None or not st.has_min_max:
            return None
        lo = st.min if lo is None else min(lo, st.min)
        hi = st.max if hi is None else max(hi, st.max)
    if lo is None:
        return None
    return tuple(v.decode() if isinstance(v, bytes) else str(v) for v in (lo, hi))


class Tabulator:
    """Answers of the queries ``keys`` (product, level, query) over a run folder's block histograms, read one
    part file at a time; nodes and cells as :func:`aggregators` and the query's answer order. With ``nodes``
    (level -> geocodes), only those nodes, and only the part files that may hold their blocks are read.
    ``cache``: what one Tabulator may leave to the next of the same run (spine rows, part ranges, matrices)."""

    def __init__(self, src, entities: pd.DataFrame | None, keys: list[tuple[str, str, str]],
                 nodes: dict[str, np.ndarray] | None = None, cache: dict | None = None):
        self.cache = {} if cache is None else cache
        self.aggs = aggregators(src, entities, nodes, self.cache)
        self.geoids = self.cache["geoids"]
        self.leaf = src.levels[-1]  # the block histograms' level, in the run and in its replicates
        self.spine_file = location(src.root) / "spine.parquet"
        self.columns = {level: m.tocsc() for level, (_, m) in self.aggs.items()}  # sliced by block below
        #: The spine rows the nodes cover (None: every block).
        self.blocks = None if nodes is None else np.unique(np.concatenate(
            [m.indices for _, m in self.aggs.values()] + [np.zeros(0, np.int32)]))
        self.products = {p.name: p for p in src.products}
        self.keys = sorted(keys)
        self.matrices = {(p, q): _cached(self.cache, ("matrix", p, q),
                                         lambda: build_query(self.products[p].schema, q).matrix().T.tocsr())
                         for p, _, q in self.keys}

    def spine_path(self, run_dir: Path) -> Path:
        """A run folder's own spine, or the original run's (replicates may share it)."""
        own = run_dir / "spine.parquet"
        return own if own.exists() else self.spine_file

    def block_rows(self, run_dir: Path) -> pd.Series:
        """A run folder's leaf geocodes -> rows of :attr:`geoids`, read once per distinct spine file (the run and
        its replicates have the same one)."""
        path = self.spine_path(run_dir)
        digest = _cached(self.cache, ("sha256", *_stat(path)), lambda: hashlib.sha256(path.read_bytes()).hexdigest())

        def read() -> pd.Series:
            spine = read_table(path).to_pandas().astype(str)
            return pd.Series(self.geoids.get_indexer(spine["geoid"]), index=spine[spine.columns[-1]])

        return _cached(self.cache, ("block_rows", digest), read)

    def parts(self, run_dir: Path, product_name: str) -> list[Path]:
        folder = run_dir / "histograms" / product_name / f"level={self.leaf}"
        return sorted(folder.glob("*.parquet")) if folder.is_dir() else []

    def _needed(self, parts: list[Path], rows_of: pd.Series) -> list[Path]:
        """The ``parts`` whose geocode range holds one of :attr:`blocks` (all of them without a restriction)."""
        if self.blocks is None:
            return parts
        wanted = np.sort(rows_of.index[rows_of.isin(self.blocks)].to_numpy(dtype=str))
        out = []
        for part in parts:
            rng = _cached(self.cache, ("range", *_stat(part)), lambda: _geocode_range(part))
            if rng is not None:
                i = np.searchsorted(wanted, rng[0])
                if i == len(wanted) or wanted[i] > rng[1]:
                    continue
            out.append(part)
        return out

    def tabulate(self, run_dir: Path, product_name: str) -> dict[tuple[str, str, str], np.ndarray]:
        """Dense (nodes, answers) arrays of the keys of product ``product_name`` (keys and histograms are named by
        the product's name); :class:`RunDirError` without block histograms."""
        name = product_name
        rows_of = self.block_rows(run_dir)
        parts = self.parts(run_dir, name)
        if not parts:
            raise RunDirError(f"{run_dir}: no {self.leaf} histograms of product {name!r} "
                              f"(histograms/{name}/level={self.leaf})")
        out = self.zeros(name)
        for part in self._needed(parts, rows_of):
            table = read_table(part, columns=["geocode", "cell", "count"]).to_pandas()
            rows = rows_of.reindex(table["geocode"].astype(str)).to_numpy()
            bad = np.isnan(rows) | (rows < 0)
            if bad.any():
                raise RunDirError(f"{part}: {self.leaf} {table['geocode'].iloc[np.flatnonzero(bad)[0]]} is not in the "
                                  "original run's spine")
            self.add(out, rows.astype(np.int64), table["cell"].to_numpy(), table["count"].to_numpy(np.float64))
        return out

    def zeros(self, product_name: str) -> dict[tuple[str, str, str], np.ndarray]:
        return {k: np.zeros((len(self.aggs[k[1]][0]), self.matrices[k[0], k[2]].shape[1]))
                for k in self.keys if k[0] == product_name}

    def add(self, out: dict, rows: np.ndarray, cells: np.ndarray, counts: np.ndarray) -> None:
        """Add block histogram entries (spine row, cell, count) to the arrays ``out`` of :meth:`zeros`."""
        if not out:
            return
        ncells = next(iter(self.matrices[k[0], k[2]] for k in out)).shape[0]
        blocks, local = np.unique(rows, return_inverse=True)
        hist = sp.csr_matrix((counts, (local.ravel(), cells)), shape=(len(blocks), ncells))
        by_level, by_query = {}, {}  # each level's columns and each query's answers, once per call
        for k in out:
            cols = _cached(by_level, k[1], lambda: self.columns[k[1]][:, blocks])
            answers = (cols @ _cached(by_query, k[::2], lambda: hist @ self.matrices[k[0], k[2]])).tocoo()
            np.add.at(out[k], (answers.row, answers.col), answers.data)


# ---------------------------------------------------------------------------------------------- driver
def replicate_dirs(rep_dir: Path) -> list[Path]:
    """The finished replicates' run folders that ``rep_dir/replicates.json`` lists (at least 2)."""
    record_path = rep_dir / "replicates.json"
    try:
        record = json.loads(record_path.read_text())
        reps = [rep_dir / r["dir"] for r in record["replicates"]]
    except (OSError, ValueError, KeyError, TypeError) as exc:
        raise EvaluationError(f"{record_path}: not a `topdown replicates` folder ({exc})") from None
    if len(reps) < 2:
        raise EvaluationError(f"{rep_dir}: {len(reps)} replicate(s); at least 2 are needed")
    return reps


def conform(table: pa.Table) -> pa.Table:
    """``table`` with :data:`SCHEMA`'s columns in order (those it lacks as nulls), cast to it."""
    cols = [table.column(f.name).cast(f.type) if f.name in table.column_names else pa.nulls(len(table), f.type)
            for f in SCHEMA]
    return pa.Table.from_arrays(cols, schema=SCHEMA)


def codes(column: pa.ChunkedArray) -> tuple[np.ndarray, list[str]]:
    """A string column as codes (one per row) into its distinct values (as strings)."""
    if pa.types.is_dictionary(column.type):  # chunks may have dictionaries of their own
        arr = column.unify_dictionaries().combine_chunks()
    else:
        arr = pc.dictionary_encode(column.combine_chunks())
    return (arr.indices.to_numpy(zero_copy_only=False).astype(np.int64),
            arr.dictionary.cast(pa.string()).to_pylist())


def key_codes(table: pa.Table) -> tuple[np.ndarray, list[tuple[str, str, str]]]:
    """The table's (product, level, query) keys in the order they first occur, and per row its key's position."""
    parts = [codes(table.column(c)) for c in KEY]
    key = np.zeros(table.num_rows, dtype=np.int64)
    for c, names in parts:  # one number per (product, level, query)
        key = key * len(names) + c
    combos, first, inverse = np.unique(key, return_index=True, return_inverse=True)
    order = np.argsort(first, kind="stable")
    rank = np.empty(len(order), dtype=np.int64)
    rank[order] = np.arange(len(order))
    keys = []
    for combo in combos[order]:
        idx = []
        for _, names in reversed(parts):
            combo, v = divmod(int(combo), len(names))
            idx.append(names[v])
        keys.append(tuple(reversed(idx)))
    return rank[inverse.ravel()], keys


#: Rows of an output part rewritten at a time (a part of the upper levels holds all their nodes' rows).
REWRITE_ROWS = 1 << 16


@dataclass
class PartKeys:
    """An output part's rows as codes: of its (product, level, query) keys (in the order they first occur) and
    of its geocodes, with its cells; the key columns themselves (``table``) for its ``amc`` rows."""

    table: pa.Table  # product, level, geocode, query, cell
    keys: list[tuple[str, str, str]]
    key: np.ndarray  # per row, its key's position in ``keys``
    geo: np.ndarray  # per row, its geocode's position in ``geo_names``
    geo_names: pd.Index

    @classmethod
    def read(cls, part: Path) -> "PartKeys":
        table = read_table(part, columns=["product", "level", "geocode", "query", "cell"], read_dictionary=KEY_COLUMNS)
        key, keys = key_codes(table)
        geo, geo_names = codes(table.column("geocode"))
        return cls(table, keys, key, geo, pd.Index(geo_names, dtype=object))

    def nodes(self) -> dict[str, np.ndarray]:
        """Per level (or entity type), the geocodes of the part's rows."""
        out: dict[str, set] = {}
        for k, (_, level, _) in enumerate(self.keys):
            out.setdefault(level, set()).update(self.geo_names[np.unique(self.geo[self.key == k])])
        return {level: np.array(sorted(g), dtype=object) for level, g in out.items()}

    def published(self, published: dict, aggs) -> np.ndarray:
        """Each row's published count (NaN where its key has none)."""
        q0 = np.full(len(self.key), np.nan)
        cell = self.table.column("cell").to_numpy()
        order = np.argsort(self.key, kind="stable")
        bounds = np.searchsorted(self.key[order], np.arange(len(self.keys) + 1))
        for u, k in enumerate(self.keys):
            if k in published:
                pos = order[bounds[u]:bounds[u + 1]]
                rows = aggs[k[1]][0].get_indexer(self.geo_names)[self.geo[pos]]
                q0[pos] = published[k][rows, cell[pos]]
        return q0


def _amc_rows(pk: PartKeys, k: int, pos: np.ndarray, published: dict, s1: dict, s2: dict, n: int, aggs) -> pa.Table:
    """The ``amc`` rows of the rows ``pos`` of the part's key ``k`` (in their order)."""
    key = pk.keys[k]
    rows = aggs[key[1]][0].get_indexer(pk.geo_names)[pk.geo[pos]]
    cells = pk.table.column("cell").take(pa.array(pos)).to_numpy()
    bias, mse, sd = replicate_moments(n, s1[key][rows, cells], s2[key][rows, cells])
    q0 = published[key][rows, cells]
    point = point_estimate(q0, bias, sd)
    rmse = np.sqrt(mse)
    lo90, hi90 = amc_interval(point, rmse, 0.90)
    lo95, hi95 = amc_interval(point, rmse, 0.95)
    rep = pk.table.take(pa.array(pos))
    for name, values in (("method", pa.array(["amc"] * len(pos))), ("published", q0), ("estimate", point),
                         ("variance", mse), ("ci90_low", lo90), ("ci90_high", hi90), ("ci95_low", lo95),
                         ("ci95_high", hi95), ("rep_n", np.full(len(pos), n)), ("rep_bias", bias),
                         ("rep_rmse", rmse)):
        rep = rep.append_column(name, pa.array(values))
    return conform(rep)


def _rewrite(part: Path, path: Path, pk: PartKeys, published: dict, s1: dict, s2: dict, n: int, aggs,
             keys_only: bool = False) -> None:
    """Write ``part``'s GLS rows with their published counts to ``path`` (none where the part holds keys
    only), then (``s1``, ``s2``: the replicates' sums) the same cells' ``amc`` rows, key by key in the order
    the keys first occur, :data:`REWRITE_ROWS` rows at a time (the part is read by batches, never whole)."""
    q0 = pk.published(published, aggs) if published and not keys_only else np.full(len(pk.key), np.nan)
    start = 0
    with parquet_writer(path, SCHEMA, compression="zstd") as writer:
        for batch in ([] if keys_only else parquet_file(part).iter_batches(batch_size=REWRITE_ROWS)):
            gls = pa.Table.from_batches([batch])
            if "published" in gls.column_names:
                gls = gls.drop_columns(["published"])
            published_q0 = pa.array(q0[start:start + len(gls)], from_pandas=True)  # NaN as null, as pandas writes it
            writer.write_table(conform(gls.append_column("published", published_q0)))
            start += len(gls)
        for k, key in enumerate(pk.keys):
            if key not in s1:
                continue
            positions = np.flatnonzero(pk.key == k)
            for start in range(0, len(positions), REWRITE_ROWS):
                writer.write_table(_amc_rows(pk, k, positions[start:start + REWRITE_ROWS], published, s1, s2, n,
                                             aggs))


@dataclass
class Rewrite:
    """The context of :func:`rewrite_part`, the same for every part (sent to each worker once)."""

    src: object  # uncertainty.Source: root, levels, products, spine, nodes
    entities: pd.DataFrame | None
    reps: list[Path]  # the replicates' run folders
    cache: dict = field(default_factory=dict)  # Tabulator's, filled on each worker by its first task
    keys_only: frozenset[str] = frozenset()  # the parts that hold keys only (amc rows, no gls rows)


def rewrite_part(ctx: Rewrite, part: str, out: str) -> float:
    """Rewrite one output part (:func:`_rewrite`), tabulating the run's and its replicates' block histograms for
    the part's own nodes only (a Dask task: the arrays are those of one part); returns its CPU seconds."""
    cpu = time.process_time()
    pk = PartKeys.read(location(part))
    tab = Tabulator(ctx.src, ctx.entities, pk.keys, pk.nodes(), ctx.cache)
    published, s1, s2 = {}, {}, {}
    for spec in ctx.src.products:
        if not any(k[0] == spec.name for k in pk.keys):
            continue
        if not tab.parts(ctx.src.root, spec.name):
            if ctx.reps:  # replicates need the published counts they are compared with
                tab.tabulate(ctx.src.root, spec.name)  # raises
            continue
        published.update(tab.tabulate(ctx.src.root, spec.name))
        for rep in ctx.reps:  # one replicate's tables at a time, summed in place
            for k, v in tab.tabulate(rep, spec.name).items():
                d = np.subtract(v, published[k], out=v)
                if k in s1:
                    s1[k] += d
                    s2[k] += d * d
                else:
                    s1[k], s2[k] = d, d * d
    _rewrite(location(part), location(out), pk, published, s1, s2, len(ctx.reps), tab.aggs, part in ctx.keys_only)
    del pk, tab, published, s1, s2
    release_memory()  # the worker's heap back to where it was before the task
    return time.process_time() - cpu


def published_and_amc(parts: list[Path], src, staging: Path, entities: pd.DataFrame | None = None,
                      rep_dir: Path | None = None, client=None, keys_only: frozenset[str] = frozenset()
                      ) -> tuple[list[Path], float]:
    """Rewrite each output part (GLS rows) with the published count where the run has block histograms, and
    after them, with ``rep_dir``, the same cells' ``amc`` rows; the parts named in ``keys_only`` hold keys only
    and get their ``amc`` rows alone. Every part conforms to :data:`SCHEMA`. One Dask task per part on
    ``client`` (without one, here, part after part). Returns the parts and the tasks' CPU seconds."""
    ctx = Rewrite(src, entities, replicate_dirs(rep_dir) if rep_dir is not None else [], keys_only=keys_only)
    out = [staging / f"final-{i:05d}.parquet" for i in range(len(parts))]
    if client is None:
        return out, sum(rewrite_part(ctx, str(part), str(path)) for part, path in zip(parts, out))
    shared = client.scatter(ctx, broadcast=True, hash=False)
    cpu = gather(client, [client.submit(rewrite_part, shared, str(part), str(path), pure=False)
                          for part, path in zip(parts, out)], "uncertainty: published counts")
    return out, sum(cpu)
