"""Tabulation rolled up the spine: per level, the nodes, their true histograms, invariants and constraints.

Histograms are scipy CSR matrices (nodes x cells) so that rolling up is one sparse product and a
parent's children are a row slice. Node rows are sorted by geocode at every level.
"""
from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from functools import cached_property
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp

from topdown.geo.spine import PREFIX, STATE, Spine, is_sorted, sorted_factorize

from ..configuration.config import ConfigError, ProductConfig
from ..inputs.invariants import (UNIT_COLUMNS, WHOLE_STATE, InvariantError, LevelConstraints, MatchedCounts, check_feasible,
                                 configured_below, level_rhs, total_invariants)
from topdown.vocab.census import Product
from topdown.vocab.queries import build_query


@dataclass
class LevelPart:
    """A shard's partial true histograms of one level, on a worker: a Dask future of (node rows, matrix),
    the lowest and highest node row it holds, and which rows between them (None: all of them)."""

    future: object
    lo: int
    hi: int
    rows: np.ndarray | None = None  # sorted


class LevelParts(list):
    """A level's parts (:class:`LevelPart`) that list the rows they hold: above the blocks a shard's nodes
    are spread over its state (a chunk's rows lie in the ranges of most shards), so :func:`holding` looks
    them up in an index of (row, part) pairs built when first asked."""

    _keys: np.ndarray | None = None
    _owner: np.ndarray | None = None

    def holding(self, rows: np.ndarray) -> list:
        if self._keys is None:
            keys = np.concatenate([np.asarray(p.rows, dtype=np.int64) for p in self] or [np.zeros(0, np.int64)])
            owner = np.repeat(np.arange(len(self)), [len(p.rows) for p in self])
            order = np.argsort(keys, kind="stable")
            self._keys, self._owner = keys[order], owner[order]
        first = np.searchsorted(self._keys, rows, "left")
        counts = np.searchsorted(self._keys, rows, "right") - first
        picked = np.repeat(first - np.cumsum(counts) + counts, counts) + np.arange(counts.sum())
        return [self[i].future for i in np.unique(self._owner[picked])]


def holding(parts: list[LevelPart], rows: np.ndarray) -> list:
    """The futures of the ``parts`` that may hold node ``rows``, in part order: those listing one of them
    (:class:`LevelParts`), else those whose row range holds one of them (a chunk's rows can lie in two runs
    far apart, two states' blocks, with many parts between them)."""
    if isinstance(parts, LevelParts):
        return parts.holding(rows)
    rows = np.sort(rows)
    lo, hi = np.array([(p.lo, p.hi) for p in parts], dtype=np.int64).reshape(-1, 2).T
    hit = np.searchsorted(rows, lo, "left") < np.searchsorted(rows, hi, "right")
    return [p.future for p, h in zip(parts, hit) if h]


class Shares(Sequence):
    """Each node's budget share, stored as a code per node into the few distinct shares (a block level of a
    national spine has millions of nodes and a handful of distinct shares)."""

    def __init__(self, codes: np.ndarray, values: list[Fraction]) -> None:
        self.codes, self.values = codes, values

    def __len__(self) -> int:
        return len(self.codes)

    def __getitem__(self, i: int) -> Fraction:
        return self.values[self.codes[i]]

    def take(self, rows: np.ndarray) -> "Shares":
        """The shares of node ``rows`` (a chunk's children: an array, not a Fraction per node, to pickle)."""
        return Shares(self.codes[rows], self.values)


@dataclass
class Level:
    """One level of the spine for one product. The block level of a partitioned run keeps its public unit
    counts and constraints on the workers, with its true histograms (``units`` and ``constraints`` None,
    ``meta``: dataplane.BlockMeta futures)."""

    name: str
    nodes: pd.Index  # node geocodes, sorted
    parent: np.ndarray | None  # row of each node's parent in the level above (None at the root)
    hist: sp.csr_matrix | None  # true histograms, int64, nodes x cells (confidential: never written); None: reprocessing
    units: pd.DataFrame | None  # u0..u7, occupied (+ tot where invariant, NaN for a part of a state), by node geocode
    constraints: LevelConstraints | None
    plb: Sequence[Fraction]  # each node's geolevel budget share (0: not measured, copied from its parent)
    state: np.ndarray | None  # the (real) state of each node, for the state-total group invariant
    state_total: pd.Series | None = None  # State level with the 'tot' invariant: each real state's total
    parts: list[LevelPart] | None = None  # true histograms kept on the workers (dataplane.py); None: in ``hist``
    meta: list[LevelPart] | None = None  # the block level's unit counts and constraints on the workers
    matched: MatchedCounts | None = None  # published counts the nodes' estimates equal (published.py)

    def __post_init__(self) -> None:
        self.nodes = one_chunk(self.nodes)

    def __len__(self) -> int:
        return len(self.nodes)


def one_chunk(index: pd.Index) -> pd.Index:
    """``index`` over one contiguous Arrow array where it is Arrow-backed in several chunks: a take (the
    children of a chunk, its parents' names) from an array of many chunks costs time in proportion to the
    whole array, at every call (benchmarks/RESULTS_national.md, the national run's driver)."""
    arr = index.array
    if not isinstance(arr, pd.arrays.ArrowExtensionArray):
        return index
    data = pa.chunked_array(arr.__arrow_array__())
    if data.num_chunks <= 1:
        return index
    combined = pa.chunked_array([data.combine_chunks()])
    values = type(arr)(combined, dtype=arr.dtype) if isinstance(arr, pd.arrays.ArrowStringArray) else type(arr)(combined)
    return pd.Index(values, name=index.name, copy=False)


def node_names(index: pd.Index, rows: slice | np.ndarray) -> list[str]:
    """The geocodes of node ``rows`` (a slice, or row numbers) as Python strings, read from the Arrow array where
    ``index`` has one: a pandas slice or take and ``tolist`` cost about 20 times more, for every chunk the driver
    builds."""
    arr = index.array
    data = pa.chunked_array(arr.__arrow_array__()) if isinstance(arr, pd.arrays.ArrowExtensionArray) else None
    if data is not None and (pa.types.is_string(data.type) or pa.types.is_large_string(data.type)):
        if isinstance(rows, slice):
            return data.slice(rows.start, rows.stop - rows.start).to_pylist()
        return data.take(pa.array(np.asarray(rows, dtype=np.int64))).to_pylist()
    return [str(g) for g in index[rows].tolist()]


def aggregate(agg: sp.spmatrix, hist: sp.spmatrix) -> sp.csr_matrix:
    """``agg @ hist`` (nodes x blocks times blocks x cells), CSR with sorted indices, from the non-zero entries
    only: scipy's sparse product keeps two work arrays as long as ``hist`` has columns (1.5 GB at 128 M cells)."""
    agg, hist = sp.coo_matrix(agg), sp.csr_matrix(hist)
    lengths = np.diff(hist.indptr)[agg.col]
    ends = np.cumsum(lengths)
    take = np.repeat(hist.indptr[agg.col] - ends + lengths, lengths) + np.arange(int(ends[-1]) if ends.size else 0)
    dtype = np.result_type(agg.dtype, hist.dtype)
    data = hist.data[take].astype(dtype) * np.repeat(agg.data.astype(dtype), lengths)
    out = sp.csr_matrix((data, (np.repeat(agg.row, lengths), hist.indices[take])), shape=(agg.shape[0], hist.shape[1]))
    out.sum_duplicates()
    out.eliminate_zeros()
    return out


def block_matrix(block_hist: pd.DataFrame, geoids: pd.Index, ncells: int) -> sp.csr_matrix:
    """Long (geocode, cell, count) block histograms as a CSR matrix with rows in ``geoids`` order."""
    rows = geoids.get_indexer(block_hist["geocode"])
    if (rows < 0).any():
        missing = block_hist["geocode"].to_numpy()[np.flatnonzero(rows < 0)[0]]
        raise ValueError(f"block {missing} has persons but is not in the spine")
    m = sp.csr_matrix(
        (block_hist["count"].to_numpy(np.int64), (rows, block_hist["cell"].to_numpy(np.int64))),
        shape=(len(geoids), ncells), dtype=np.int64,
    )
    m.sum_duplicates()
    return m


def rollup(codes: pd.Series) -> tuple[pd.Index, np.ndarray]:
    """Sorted unique node codes and each block's node row, int32 (factorized on the Arrow strings: no Python
    object per block)."""
    found = sorted_factorize(codes)  # a sorted column (a standard spine's) needs no hash table
    inverse, nodes = found if found is not None else pd.factorize(codes, sort=True)
    return pd.Index(nodes), inverse.astype(np.int32, copy=False)


@dataclass
class _Geography:
    """One level's nodes, each block's node row, and each node's first block (None: one node per block)."""

    name: str
    nodes: pd.Index
    inverse: np.ndarray | None  # None once given to the shards (dataplane.tabulate_levels)
    first_block: np.ndarray | None
    block_geoids: pd.Index

    @property
    def agg(self) -> sp.csr_matrix:
        """The node x block aggregation matrix."""
        return sp.csr_matrix((np.ones(self.inverse.size, dtype=np.int64), (self.inverse, np.arange(self.inverse.size))),
                             shape=(self.nodes.size, self.inverse.size))

    @cached_property
    def state(self) -> np.ndarray:
        """The (real) state of each node: that of its first block (computed when asked: a block level's would
        cost a string per block)."""
        first = self.block_geoids if self.first_block is None else self.block_geoids[self.first_block]
        width = PREFIX[STATE]  # whole states are U.S. ones (the state-total group invariant)
        return np.asarray(first.str.slice(0, width), dtype=f"U{width}")


def _geography(spine: Spine) -> tuple[pd.Index, list[_Geography], list[np.ndarray | None]]:
    """Block geoids in block-geocode order, every level's nodes, and every level's parent rows."""
    table = spine.table
    if not is_sorted(table[spine.levels[-1]]):  # a spine built here is sorted: no copy
        table = table.sort_values(spine.levels[-1]).reset_index(drop=True)
    tab_geoid = pd.Index(table["geoid"], dtype="str")
    geo = []
    for name in spine.levels:
        nodes, inverse = rollup(table[name])
        first_block = None
        if len(nodes) < len(inverse):
            first_block = np.zeros(len(nodes), dtype=np.int64)
            first_block[inverse[::-1]] = np.arange(len(inverse))[::-1]
        geo.append(_Geography(name, nodes, inverse, first_block, tab_geoid))
    # Parent rows: the node of the level above that holds the node's first block.
    parents: list[np.ndarray | None] = [None]
    for up, g in zip(geo[:-1], geo[1:]):
        par = np.zeros(len(g.nodes), dtype=np.int64)
        par[g.inverse] = up.inverse
        parents.append(par)
    return tab_geoid, geo, parents


def level_constraints(product: Product, cfg: ProductConfig, levels: list[str], units: list[pd.DataFrame],
                      parents: list[np.ndarray | None], below: LevelConstraints | None = None) -> list[LevelConstraints]:
    """Constraint right-hand sides of every level, bottom-up (they propagate as sums), from the public
    invariants only: ``units[i]`` is level i's node frame (u0..u7, occupied, and tot where invariant) and
    ``parents[i]`` each node's row in level i - 1 (the noisy measurement file and reprocessing recompute
    them from a run's invariants file). ``units`` may stop above the block level: ``below`` then holds the
    block level's right-hand sides summed per node of the last level given (a partitioned run's shards sum
    them), which gives the same sums."""
    cons: list[LevelConstraints | None] = [None] * len(units)
    for i in range(len(units) - 1, -1, -1):
        if i + 1 < len(units):
            child, child_parent = cons[i + 1], parents[i + 1]
        else:
            child, child_parent = below, None if below is None else np.arange(len(units[i]))
        cons[i] = level_rhs(product, cfg, levels, levels[i], units[i], child, child_parent)
    return cons


def shares(spine: Spine, budget_levels: dict[str, Fraction], name: str, nodes: pd.Index | np.ndarray) -> Shares:
    """Each node's geolevel budget share (the sum of the budget proportions of the levels it carries)."""
    codes, keys = spine.budget_codes(name, nodes)
    return Shares(codes, [sum((budget_levels[lv] for lv in key), Fraction(0)) for key in keys])


def _plb(cfg: ProductConfig, spine: Spine, name: str, nodes: pd.Index) -> Shares:
    return shares(spine, cfg.budget.levels, name, nodes)


def build_levels(
    product: Product, cfg: ProductConfig, spine: Spine, block_hist: pd.DataFrame, block_units: pd.DataFrame,
) -> list[Level]:
    """True histograms, invariants and constraint right-hand sides at every level, top-down, in memory (the
    audit's repeated runs; a run keeps the histograms on its workers, dataplane.py).

    ``block_units`` is indexed by block geoid with columns u0..u7 and occupied.
    """
    geography = _geography(spine)
    tab_geoid, geo, _ = geography
    bhist = block_matrix(block_hist, tab_geoid, product.schema.ncells)
    hists = [aggregate(g.agg, bhist) for g in geo]
    answers = [node_answers(product, h) for h in hists]
    levels = levels_from_answers(product, cfg, spine, geography, block_units, answers)
    for level, hist in zip(levels, hists):
        level.hist = hist
    return levels


def node_answers(product: Product, hist: sp.csr_matrix) -> dict[str, np.ndarray]:
    """Per node (rows of ``hist``) the answers of the queries the feasibility checks and total invariants need
    (float64, summed from the non-zero cells only)."""
    return {q: build_query(product.schema, q).answer_rows(hist).astype(float) for q in product.feasibility_queries}


def levels_from_answers(product: Product, cfg: ProductConfig, spine: Spine, geography: tuple, block_units: pd.DataFrame,
                        answers: list[dict[str, np.ndarray]]) -> list[Level]:
    """Every level's nodes, invariants and constraint right-hand sides, top-down, from the spine's
    ``geography`` (:func:`_geography`, computed once by the caller), the public block unit counts and, per
    level, the true answers of :func:`node_answers` (checked against the constraints; ``hist`` is left None)."""
    tab_geoid, geo, parents = geography
    columns = UNIT_COLUMNS + ["occupied"]
    pos = block_units.index.get_indexer(tab_geoid)  # blocks without units (-1) have none
    bunits = np.zeros((len(tab_geoid), len(columns)), dtype=np.int64)
    bunits[pos >= 0] = block_units[columns].to_numpy(dtype=np.int64)[pos[pos >= 0]]
    units = [pd.DataFrame(g.agg @ bunits, index=g.nodes, columns=columns) for g in geo]
    del bunits
    return levels_from_units(product, cfg, spine, geo, parents, units, answers)


def levels_from_units(product: Product, cfg: ProductConfig, spine: Spine, geo: list, parents: list[np.ndarray | None],
                      units: list[pd.DataFrame], answers: list[dict[str, np.ndarray]],
                      below: LevelConstraints | None = None) -> list[Level]:
    """The levels ``geo[:len(units)]`` from their node frames (u0..u7, occupied) and true answers: invariant
    totals added, constraints (``below``: see :func:`level_constraints`) built and checked, lowest level
    first."""
    totals = [a["total"][:, 0] for a in answers]
    state_level = spine.state_index
    for i, g in enumerate(geo[:len(units)]):
        if total_is_invariant(product, cfg, spine, i):
            units[i] = units[i].assign(tot=_invariant_totals(totals[i].astype(float), g.state if i == state_level else None))
    cons = level_constraints(product, cfg, spine.levels, units, parents, below)
    for g, ans, c in reversed(list(zip(geo, answers, cons))):  # the lowest infeasible level is reported
        check_feasible(g.name, c, {q: ans[q] for q in {con.query for con in c.rhs.values()}})
    state_total = None
    if state_level is not None and state_level < len(units) and "tot" in units[state_level].columns:
        g = geo[state_level]
        state_total = pd.Series(totals[state_level], index=g.nodes).groupby(g.state).sum()
    return [Level(g.name, g.nodes, parents[i], None, units[i], cons[i], _plb(cfg, spine, g.name, g.nodes), g.state,
                  state_total if i == state_level else None)
            for i, g in enumerate(geo[:len(units)])]


def total_is_invariant(product: Product, cfg: ProductConfig, spine: Spine, i: int) -> bool:
    """Whether the node totals of ``spine``'s level ``i`` are invariant: a total invariant is declared there or
    below, and (a U.S. spine) the level is not below State (a state's parts are not)."""
    lowest = len(spine.levels) - 1 if spine.state_index is None else spine.state_index
    return i <= lowest and bool(set(total_invariants(product))
                                & configured_below(cfg.invariants, spine.levels, spine.levels[i]))


def _invariant_totals(node_totals: np.ndarray, state: np.ndarray | None) -> np.ndarray:
    """Node totals that are invariant: every node above State; at State (``state`` given: each node's real
    state) only a node that is a whole state. A part of a state split by the AIAN spine gets NaN: only the
    whole state's total is invariant (DESIGN.md, "State totals"), so a part's total is neither written nor used
    in a bound."""
    if state is None:
        return node_totals
    _, inverse, parts = np.unique(state, return_inverse=True, return_counts=True)
    return np.where(parts[inverse] == 1, node_totals, np.nan)


def published_units(spine: Spine, invariants: pd.DataFrame, where: str = "invariants"
                    ) -> tuple[list[pd.DataFrame], list[np.ndarray | None], list[np.ndarray], pd.Series | None]:
    """Every level's node frame (``u0..u7``, and ``tot`` where invariant, as :func:`build_levels` makes them)
    rebuilt from a published invariants table (``level, geocode, u0.., tot``, and each whole state's total in
    rows of level ``WHOLE_STATE``), with every level's parent rows, every node's state, and the State level's
    whole-state totals (None without them)."""
    _, geo, parents = _geography(spine)
    whole = invariants[invariants["level"] == WHOLE_STATE]
    state_total = (whole.assign(geocode=whole["geocode"].astype(str)).set_index("geocode")["tot"].astype(np.int64)
                   if len(whole) else None)
    state_level = spine.state_index
    units = []
    for i, g in enumerate(geo):
        inv = invariants[invariants["level"] == g.name].set_index("geocode")
        inv.index = inv.index.astype(str)
        missing = g.nodes.difference(inv.index)
        if len(missing):
            raise InvariantError(f"{where}: no invariants for {g.name} node {missing[0]!r} of the spine")
        cols = [c for c in UNIT_COLUMNS if c in inv.columns and inv[c].notna().all()]
        frame = inv.loc[g.nodes, cols].astype(np.int64)
        if "tot" in inv.columns and inv.loc[g.nodes, "tot"].notna().all():
            frame = frame.assign(tot=inv.loc[g.nodes, "tot"].to_numpy(dtype=float))
        elif i == state_level and state_total is not None:
            frame = frame.assign(tot=_invariant_totals(state_total.reindex(g.state).to_numpy(dtype=float), g.state))
        if i == state_level and state_total is None and "tot" in frame.columns:  # every State node a whole state
            state_total = frame["tot"].groupby(g.state).sum().astype(np.int64)
        units.append(frame)
    return units, parents, [g.state for g in geo], state_total


def public_levels(product: Product, cfg: ProductConfig, spine: Spine, invariants: pd.DataFrame,
                  where: str = "invariants") -> list[Level]:
    """The levels rebuilt from public data only, for reprocessing: the spine and the published invariants
    (:func:`published_units`); no histogram (``hist`` is None). Constraints are rebuilt from the invariants
    exactly as :func:`build_levels` builds them from the same values."""
    occupied = {s.name for s in product.constraints.values() if s.rhs == "occupied"}
    if used := sorted(occupied & {n for names in cfg.constraints.values() for n in names}):
        raise ConfigError(f"[{product.name}.constraints] {used[0]} needs the occupied housing units of every "
                          "node, which are not invariant and not published; it cannot be rebuilt by reprocessing")
    units, parents, states, state_total = published_units(spine, invariants, where)
    state_level = spine.state_index
    cons = level_constraints(product, cfg, spine.levels, units, parents)
    return [Level(name, u.index, parents[i], None, u, cons[i], _plb(cfg, spine, name, u.index), states[i],
                  state_total if i == state_level else None)
            for i, (name, u) in enumerate(zip(spine.levels, units))]
