"""Tabulation rolled up the spine: per level, the nodes, their true histograms, invariants and constraints.

Histograms are scipy CSR matrices (nodes x cells) so that rolling up is one sparse product and a
parent's children are a row slice. Node rows are sorted by geocode at every level.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction

import numpy as np
import pandas as pd
import scipy.sparse as sp

from topdown.geo.spine import Spine

from .config import ProductConfig
from .invariants import (UNIT_COLUMNS, LevelConstraints, check_feasible, configured_below, person_constraints,
                         unit_constraints)
from .queries import build_query
from .schema import Schema


@dataclass
class Level:
    """One level of the spine for one product."""

    name: str
    nodes: pd.Index  # node geocodes, sorted
    parent: np.ndarray | None  # row of each node's parent in the level above (None at the root)
    hist: sp.csr_matrix  # true histograms, int64, nodes x cells (confidential: never written)
    units: pd.DataFrame  # u0..u7, occupied (+ tot where invariant, NaN for a part of a state), by node geocode
    constraints: LevelConstraints
    plb: list[Fraction]  # each node's geolevel budget share (0: not measured, copied from its parent)
    state: np.ndarray  # the (real) state of each node, for the state-total group invariant
    state_total: pd.Series | None = None  # State level with the 'tot' invariant: each real state's total

    def __len__(self) -> int:
        return len(self.nodes)


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


def _rollup(codes: np.ndarray) -> tuple[pd.Index, sp.csr_matrix, np.ndarray]:
    """Sorted unique node codes, the node x block aggregation matrix, and each block's node row."""
    nodes, inverse = np.unique(codes, return_inverse=True)
    agg = sp.csr_matrix((np.ones(codes.size, dtype=np.int64), (inverse, np.arange(codes.size))),
                        shape=(nodes.size, codes.size))
    return pd.Index(nodes), agg, inverse


def level_constraints(product: str, cfg: ProductConfig, spine_levels: list[str], units: list[pd.DataFrame],
                      parents: list[np.ndarray | None]) -> list[LevelConstraints]:
    """Constraint right-hand sides of every level, bottom-up (they propagate as sums), from the public
    invariants only: ``units[i]`` is level i's node frame (u0..u7, occupied, and tot where invariant) and
    ``parents[i]`` each node's row in level i - 1 (the noisy measurement file recomputes them from a run's
    invariants file)."""
    cons: list[LevelConstraints | None] = [None] * len(units)
    for i in range(len(units) - 1, -1, -1):
        if product == "persons":
            child = cons[i + 1] if i + 1 < len(units) else None
            child_par = parents[i + 1] if i + 1 < len(units) else None
            cons[i] = person_constraints(cfg, spine_levels, spine_levels[i], units[i], child, child_par)
        else:
            cons[i] = unit_constraints(units[i])
    return cons


def build_levels(
    product: str, schema: Schema, cfg: ProductConfig, spine: Spine, block_hist: pd.DataFrame, block_units: pd.DataFrame,
) -> list[Level]:
    """True histograms, invariants and constraint right-hand sides at every level, top-down.

    ``block_units`` is indexed by block geoid with columns u0..u7 and occupied.
    """
    table = spine.table.sort_values(spine.levels[-1]).reset_index(drop=True)
    tab_geoid = table["geoid"].to_numpy()
    bhist = block_matrix(block_hist, pd.Index(tab_geoid), schema.ncells)
    bunits = block_units.reindex(tab_geoid).fillna(0).astype(np.int64)
    state_of_block = np.array([g[:2] for g in tab_geoid])

    levels: list[Level] = []
    queries_needed = {"total", "hhgq", "gqNursingTotal * nonvoting", "householdTotal"} if product == "persons" else {"total"}
    per_level = []
    for name in spine.levels:
        nodes, agg, inverse = _rollup(table[name].to_numpy())
        hist = (agg @ bhist).tocsr()
        units = pd.DataFrame(agg @ bunits[UNIT_COLUMNS + ["occupied"]].to_numpy(), index=nodes,
                             columns=UNIT_COLUMNS + ["occupied"])
        first_block = np.zeros(len(nodes), dtype=np.int64)
        first_block[inverse[::-1]] = np.arange(len(inverse))[::-1]
        per_level.append((name, nodes, hist, units, inverse, state_of_block[first_block]))

    # Parent rows: the node of the level above that holds the node's first block.
    parents: list[np.ndarray | None] = [None]
    for (_, nodes_up, _, _, inv_up, _), (_, nodes, _, _, inv, _) in zip(per_level[:-1], per_level[1:]):
        par = np.zeros(len(nodes), dtype=np.int64)
        par[inv] = inv_up
        parents.append(par)

    # The declared person total where it is invariant (State and above), then the constraints bottom-up.
    state_level = spine.levels.index("State") if "State" in spine.levels else None
    for i, (name, nodes, hist, units, inv, st) in enumerate(per_level):
        if (product == "persons" and state_level is not None and i <= state_level
                and "tot" in configured_below(cfg.invariants, spine.levels, name)):  # only a declared total
            tot = _invariant_totals(hist, st if i == state_level else None)
            per_level[i] = (name, nodes, hist, units.assign(tot=tot), inv, st)
    cons = level_constraints(product, cfg, spine.levels, [p[3] for p in per_level], parents)
    for (name, _, hist, _, _, _), c in reversed(list(zip(per_level, cons))):  # bottom-up, as before
        answers = {q: build_query(schema, q).matrix() @ hist.T for q in queries_needed if q in
                   {r[0] for r in c.rhs.values()}}
        check_feasible(name, c, {q: np.asarray(a.T.todense()) for q, a in answers.items()})

    for i, (name, nodes, hist, units, _, state) in enumerate(per_level):
        plb = [sum((cfg.budget.levels[lv] for lv in spine.budget_levels(name, g)), Fraction(0)) for g in nodes]
        totals = None
        if i == state_level and "tot" in units.columns:
            totals = pd.Series(np.asarray(hist.sum(axis=1)).ravel(), index=nodes).groupby(state).sum()
        levels.append(Level(name, nodes, parents[i], hist, units, cons[i], plb, state, totals))
    return levels


def _invariant_totals(hist: sp.csr_matrix, state: np.ndarray | None) -> np.ndarray:
    """Node totals that are invariant: every node above State; at State (``state`` given: each node's real
    state) only a node that is a whole state. A part of a state split by the AIAN spine gets NaN: only the
    whole state's total is invariant (facts 2.6), so a part's total is neither written nor used in a bound."""
    totals = np.asarray(hist.sum(axis=1), dtype=float).ravel()
    if state is None:
        return totals
    _, inverse, parts = np.unique(state, return_inverse=True, return_counts=True)
    return np.where(parts[inverse] == 1, totals, np.nan)
