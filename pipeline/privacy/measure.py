"""Noisy measurements of every configured query at a set of nodes (DESIGN.md, the map: measure, per level).

Noise for (node, query) is drawn from a stream keyed by (run seed, product, level, node geocode, query)
(``rng.noise_key``), so the answers do not depend on how nodes are grouped into tasks or on the number of
workers, and no two streams of a run share a key.
"""
from __future__ import annotations

from collections.abc import Collection
from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp

from .accounting import allocate
from ..configuration.config import BudgetConfig
from ..configuration.errors import InputError
from topdown.vocab.census import Product
from topdown.vocab.queries import build_query
from .rng import noise_sources
from topdown.vocab.schema import Schema
from topdown.vocab.support import SupportError, answers_above, support


@dataclass
class NodeMeasurements:
    """Noisy answers of one query for a block of nodes: values[n, answers], variance[n] (inf: unmeasured);
    ``answers`` (sorted) the query's answers the columns hold when only some were measured (None: all)."""

    query: str
    values: np.ndarray
    variance: np.ndarray
    answers: np.ndarray | None = None

    def rows(self, rows: slice | np.ndarray) -> "NodeMeasurements":
        """The same measurements of some of the nodes."""
        return NodeMeasurements(self.query, self.values[rows], self.variance[rows], self.answers)


def measure(
    product: Product, budget: BudgetConfig, level: str, geocodes: pd.Index | list[str],
    plb: list[Fraction], hist: sp.csr_matrix, mode: str, seed: int | None, held: np.ndarray | None = None,
    only: Collection[str] | None = None,
) -> tuple[list[NodeMeasurements], pa.Table]:
    """Measure every query configured for ``level`` at the given nodes of ``product``.

    Returns per-query noisy answers (for the solver) and the long noisy-measurement table to publish
    (geocode, query, answer, value, variance: an Arrow table of :data:`MEASUREMENT_SCHEMA`). Nodes with a
    zero budget share are not measured (variance inf, no rows). With ``held`` (sorted cells: the non-zero
    cells of the nodes' parent's published estimate), each query is measured only on its answers that count
    one of those cells (a sub-query of the declared one, each answer with the declared query's noise; DESIGN.md
    item 30), and the table has a row for exactly those answers. ``only``: measure these of the level's queries
    (in budget order), not all.
    """
    schema = product.schema
    geocodes = list(geocodes)
    n = len(geocodes)
    out: list[NodeMeasurements] = []
    frames: list[pd.DataFrame] = []
    by_plb: dict[Fraction, list[int]] = {}  # nodes of each non-zero privacy-loss share, in node order
    for i, node_plb in enumerate(plb):  # once per call: hashing a Fraction takes a modular inverse
        if node_plb != 0:
            by_plb.setdefault(node_plb, []).append(i)
    for query, share in budget.queries.get(level, {}).items():
        if only is not None and query not in only:
            continue
        q = build_query(schema, query)
        answers = None if held is None else q.answers_of(held)
        true = q.answer_rows(hist, answers)
        width = true.shape[1]
        values = np.full((n, width), np.nan)
        variance = np.full(n, np.inf)
        for node_plb, nodes in (by_plb.items() if share != 0 and width else ()):  # width 0: nothing held
            alloc = allocate(budget, level, query, plb=node_plb)
            idx = np.asarray(nodes, dtype=np.int64)
            if budget.infinite:
                values[idx] = true[idx]
                variance[idx] = 0.0
            else:
                sources = noise_sources(mode, seed, product.name, level, [geocodes[i] for i in nodes], query)
                values[idx] = true[idx] + alloc.noise(sources, width)  # same draws as one stream at a time
                variance[idx] = alloc.variance
        out.append(NodeMeasurements(query, values, variance, answers))
        measured = np.flatnonzero(np.isfinite(variance))
        if measured.size:
            ids = np.arange(width, dtype=np.int32) if answers is None else answers.astype(np.int32)
            frames.append((query, measured, ids, values[measured], variance[measured]))
    return out, _long_table(geocodes, frames)


def root_cells(schema: Schema, budget: BudgetConfig, measured: list[NodeMeasurements], row: int) -> np.ndarray | None:
    """The root node's cells in play (sorted), a function of its noisy answers only (post-processing: DESIGN.md
    item 31): the cells whose every answer in each measured ``budget.root_support`` query is above
    ``budget.root_threshold``. None (every cell) when none of those queries was measured at the node."""
    chosen = [(build_query(schema, m.query), _ids(m, answers_above(m.values[row], budget.root_threshold)))
              for m in measured if m.query in budget.root_support and np.isfinite(m.variance[row])]
    if not chosen:
        return None
    try:
        return support(chosen, limit=ROOT_SUPPORT_LIMIT)
    except SupportError as exc:
        raise InputError(f"root_support: {exc}; raise root_threshold or add finer queries to root_support") from None


def _ids(m: NodeMeasurements, columns: np.ndarray) -> np.ndarray:
    """The query's answer ids of some of ``m``'s columns."""
    return columns if m.answers is None else np.asarray(m.answers, dtype=np.int64)[columns]


#: The most candidate cells :func:`root_cells` holds (at 16 bytes each per held coordinate and axis).
ROOT_SUPPORT_LIMIT = 50_000_000


#: Arrow types of the published table (geocode and query dictionary-encoded in memory and in the file).
_NAMES = pa.dictionary(pa.int32(), pa.string())
MEASUREMENT_SCHEMA = pa.schema([("geocode", _NAMES), ("query", _NAMES), ("answer", pa.int32()),
                                ("value", pa.int64()), ("variance", pa.float64())])

#: ``pq.write_table`` options of a measurement part: the dictionary-encoded columns written as they are (the
#: file stores no Arrow schema, so readers see plain strings), answers and values delta-coded, statistics
#: only for the geocode (``sources.Published`` reads its range). A third smaller and faster to write than
#: Parquet's defaults (benchmarks/RESULTS_cpu.md, section (h)).
MEASUREMENT_PARQUET = {"use_dictionary": ["geocode", "query", "variance"], "store_schema": False,
                       "column_encoding": {"answer": "DELTA_BINARY_PACKED", "value": "DELTA_BINARY_PACKED"},
                       "write_statistics": ["geocode"]}


def _long_table(geocodes: list[str], frames: list[tuple]) -> pa.Table:
    """The published long table (geocode, query, answer, value, variance) of the measured nodes, one
    ``(query, measured node rows, answer ids, values, variances)`` per query, in that order. Geocode and query
    are dictionary arrays over the distinct names (a string per row was most of the cost of the table)."""
    if not frames:
        return MEASUREMENT_SCHEMA.empty_table()
    node = np.concatenate([np.repeat(measured, ids.size) for _, measured, ids, _, _ in frames]).astype(np.int32)
    which = np.concatenate([np.full(measured.size * ids.size, i, dtype=np.int32)
                            for i, (_, measured, ids, _, _) in enumerate(frames)])
    return pa.table([
        pa.DictionaryArray.from_arrays(node, pa.array(geocodes, type=pa.string())),
        pa.DictionaryArray.from_arrays(which, pa.array([f[0] for f in frames], type=pa.string())),
        np.concatenate([np.tile(ids, measured.size) for _, measured, ids, _, _ in frames]),
        np.concatenate([vals.ravel().astype(np.int64) for *_, vals, _ in frames]),
        np.concatenate([np.repeat(var, ids.size) for _, _, ids, _, var in frames]),
    ], schema=MEASUREMENT_SCHEMA)


def from_table(schema: Schema, queries: list[str], geocodes: pd.Index | list[str], table: pd.DataFrame,
               where: str = "noisy measurements", held: bool = False) -> list[NodeMeasurements]:
    """The inverse of :func:`measure`'s published table: per query (in ``queries`` order), the noisy answers
    of the nodes ``geocodes``. A node without rows for a query is unmeasured (variance inf), as when drawn.
    ``held``: the nodes (one parent's children) were measured on the answers in play only; every measured
    node must then have the same answers, which the result holds."""
    index = pd.Index(geocodes)
    n = len(index)
    out = []
    for query in queries:
        q = build_query(schema, query)
        sub = table[table["query"] == query]
        rows = index.get_indexer(sub["geocode"].astype(str))
        answer = sub["answer"].to_numpy(np.int64)
        if (rows < 0).any() or (answer < 0).any() or (answer >= q.n_answers).any():
            raise InputError(f"{where}: query {query!r} has rows for another node or an answer outside "
                             f"0..{q.n_answers - 1}")
        answers = np.unique(answer) if held else None
        width = q.n_answers if answers is None else answers.size
        values = np.full((n, width), np.nan)
        variance = np.full(n, np.inf)
        values[rows, answer if answers is None else np.searchsorted(answers, answer)] = sub["value"].to_numpy(np.int64)
        variance[rows] = sub["variance"].to_numpy(float)
        measured = np.isfinite(variance)
        if np.isnan(values[measured]).any():
            bad = index[np.flatnonzero(np.isnan(values).any(axis=1) & measured)[0]]
            raise InputError(f"{where}: query {query!r} at node {bad!r} lacks some of its {width} answers")
        out.append(NodeMeasurements(query, values, variance, answers))
    return out
