"""Invariants and constraint right-hand sides per node (the Bureau's DAS-2020 code:
``source/programs/invariants/invariantsmaker.py``, ``source/programs/constraints/``).

Node data per level is a frame indexed by node geocode with unit counts ``u0..u7`` (housing units
and GQ facilities of each major type, sums of block values: ``gqhh_vect``), ``occupied``
(occupied housing units), and ``tot`` (total persons) where ``tot`` is an invariant.

Constraint right-hand sides follow DAS-2020 ``querybase_constraints.py`` (``calculateRightHandSideHhgqTotal``):
without a total invariant the hhgq bounds are ``persons_k >= u_k * m_k`` and ``persons_k <= u_k * 99999``; with the
total T invariant (State): ``ub_k = min(T - M_k if u_k > 0 else 0, 99999 u_k)`` and ``lb_k = L_k if O_k > 0 else
T``, the stricter of that and the sum of the children's right-hand sides; above State (US) the sum of the States'.

The total T of a State node is used only where the node is a whole state: a part of a state split by the AIAN spine
(DESIGN.md, "State totals") has no invariant total (``tot`` is NaN), gets the bounds without a total, and the whole
state's total binds the parts together as a group total. The Bureau used the part's total here, which pins the
total of a part without GQ facilities (lb_0 = ub_0 = T) and so publishes it (DESIGN.md).
"""
from __future__ import annotations

from dataclasses import dataclass, replace

import numpy as np
import pandas as pd
import scipy.sparse as sp

from topdown.geo.spine import STATE
from topdown.vocab.census import MAX_UNIT_TYPES, ConstraintSpec, Product, UnitBounds
from topdown.vocab.problem import Constraint
from topdown.vocab.queries import build_query

from ..configuration.config import ConfigError, ProductConfig

UNIT_COLUMNS = [f"u{k}" for k in range(MAX_UNIT_TYPES)]  # units of each type, unused types 0
#: The order constraints are bound in (the solvers' rows; the feasibility checks report the first violated),
#: by right-hand side kind, then in declaration order.
RHS_ORDER = ("unit_lower", "unit_upper", "zero", "occupied", "housing_units", "unit_counts", "total")


def bind(spec: ConstraintSpec, rhs: np.ndarray) -> Constraint:
    """The declared constraint with right-hand sides ``rhs[n_nodes, n_answers]``."""
    return Constraint(spec.name, spec.query, spec.sense, rhs)


#: The ``level`` of the rows of ``invariants/persons.parquet`` that hold each whole state's total.
WHOLE_STATE = "whole_state"


class InvariantError(ValueError):
    """The input violates a declared invariant or constraint (an infeasible problem)."""


@dataclass
class LevelConstraints:
    """Right-hand sides of every constraint for every node of one level, rows in node order."""

    nodes: pd.Index
    rhs: dict[str, Constraint]  # name -> the constraint with rhs[n_nodes, n_answers], one row per node

    def take(self, idx: np.ndarray) -> list[Constraint]:
        """The constraints of the nodes at integer positions ``idx`` (a parent's children)."""
        return [replace(c, rhs=c.rhs[idx]) for c in self.rhs.values()]


@dataclass
class MatchedCounts:
    """Published counts of a marginal that the estimates of some nodes must equal (``[<product>.estimation]
    match_published``): ``counts[node row, answer]`` of the product's query ``query``, sparse. They enter each
    parent's problem as the equality constraint ``name`` on its children, in the L2 passes and the rounder alike."""

    name: str
    query: str
    counts: sp.csr_matrix  # int64[n_nodes, n_answers]

    def take(self, rows: np.ndarray) -> "MatchedCounts":
        """The counts of node ``rows`` (a chunk's children, in its order)."""
        return MatchedCounts(self.name, self.query, self.counts[rows])

    def constraint(self, rows: slice) -> Constraint:
        """The equality constraint of node ``rows`` (a parent's children)."""
        return Constraint(self.name, self.query, "==", self.counts[rows].toarray().astype(float))

    def in_play(self, schema, cells: np.ndarray | None, row: int = 0) -> np.ndarray | None:
        """``cells`` (a root's cells in play, sorted; None: all) with, for each positive count of node ``row`` that
        no cell of ``cells`` is counted in, every cell of its answer: a choice from published counts only, without
        which the equality would have no cell to hold it. Uses the query's schema-sized answer array."""
        if cells is None:
            return None
        query = build_query(schema, self.query)
        counts = self.counts[row]
        missing = np.setdiff1d(counts.indices[counts.data > 0], query.answers_of(cells))
        if not missing.size:
            return cells
        return np.union1d(cells, np.flatnonzero(np.isin(query.groups, missing))).astype(np.int64)


def invariant_rows(units: pd.DataFrame, level: str, tot: np.ndarray | float | None) -> pd.DataFrame:
    """One level's rows of the invariants file: geocode, the unit and GQ-facility counts, the level, and
    (``tot`` not None: a product with the person total invariant) the total, NaN where not invariant."""
    rows = units[UNIT_COLUMNS].reset_index(names="geocode").assign(level=level)
    if tot is not None:
        rows["tot"] = tot
    return rows


def configured_below(cfg_map: dict[str, list[str]], levels: list[str], level: str) -> set[str]:
    """Names configured at ``level`` or any level below it (they propagate upward as sums)."""
    return {name for lv in levels[levels.index(level):] for name in cfg_map.get(lv, [])}


def unit_bounds(u: np.ndarray, total: np.ndarray | None, bounds: UnitBounds) -> tuple[np.ndarray, np.ndarray]:
    """Lower and upper bounds on records by unit type (``calculateRightHandSideHhgqTotal``); rows whose ``total``
    is NaN (not an invariant) get the bounds without a total."""
    lower = u * np.asarray(bounds.min_per_unit)
    upper = u * np.asarray(bounds.cap)
    if total is None:
        return lower.astype(float), upper.astype(float)
    known = np.isfinite(total)[:, None]
    t = np.where(known, total[:, None], 0)
    units_total = u.sum(axis=1, keepdims=True)
    others = units_total - u
    forced_others = lower.sum(axis=1, keepdims=True) - lower
    ub = np.where(known, np.minimum(np.where(u > 0, t - forced_others, 0), upper), upper)
    lb = np.where(known & (others == 0), t, lower)
    return lb.astype(float), ub.astype(float)


#: Rows of a level's bounds computed at a time (a block level of millions of nodes would make about ten
#: temporaries of its size at once).
BOUND_ROWS = 50_000


def _unit_bounds_by_rows(u: np.ndarray, total: np.ndarray | None, bounds: UnitBounds) -> tuple[np.ndarray, np.ndarray]:
    """:func:`unit_bounds` of :data:`BOUND_ROWS` rows at a time (the same values)."""
    lb, ub = np.empty(u.shape), np.empty(u.shape)
    for lo in range(0, len(u), BOUND_ROWS):
        rows = slice(lo, lo + BOUND_ROWS)
        lb[rows], ub[rows] = unit_bounds(u[rows], None if total is None else total[rows], bounds)
    return lb, ub


def total_invariants(product: Product) -> list[str]:
    """The names of the product's invariants of kind ``total`` (their values are the ``tot`` column)."""
    return [name for name, spec in product.invariants.items() if spec.kind == "total"]


def level_rhs(
    product: Product, cfg: ProductConfig, levels: list[str], level: str, nodes: pd.DataFrame,
    child_rhs: LevelConstraints | None, child_parent: np.ndarray | None,
) -> LevelConstraints:
    """Constraint right-hand sides of ``product`` at one level, from each declared constraint's kind.

    ``nodes`` has columns u0..u7, occupied and (if invariant here) tot. ``child_rhs`` are the right-hand sides
    one level down and ``child_parent`` maps each child row to its row here, for the sum propagation (None at
    the lowest level). A constraint configured at a level applies at every level above it (its right-hand
    sides are sums), except ``total``, which applies where configured (it needs the total invariant)."""
    active = configured_below(cfg.constraints, levels, level)
    here = set(cfg.constraints.get(level, []))
    n = len(nodes)
    totals = total_invariants(product)
    has_tot = "tot" in nodes.columns and nodes["tot"].notna().any() and bool(set(totals) & set(cfg.invariants.get(level, [])))
    above_state = level in levels[: levels.index(STATE)] if STATE in levels else False
    rhs: dict[str, Constraint] = {}

    def summed(name: str) -> np.ndarray | None:
        if child_rhs is None or name not in child_rhs.rhs:
            return None
        vals = child_rhs.rhs[name].rhs
        out = np.zeros((n, vals.shape[1]))
        np.add.at(out, child_parent, vals)
        return out

    bounds: tuple[np.ndarray, np.ndarray] | None = None
    for spec in sorted((s for s in product.constraints.values() if s.name in active), key=lambda s: RHS_ORDER.index(s.rhs)):
        if spec.rhs in ("unit_lower", "unit_upper"):
            if bounds is None:
                u = nodes[UNIT_COLUMNS[:len(product.unit_bounds.cap)]].to_numpy(dtype=np.int64)  # types 0..k-1
                bounds = _unit_bounds_by_rows(u, nodes["tot"].to_numpy(dtype=float) if has_tot else None,
                                              product.unit_bounds)
            value, from_children = bounds[spec.rhs == "unit_upper"], summed(spec.name)
            if above_state and from_children is not None:
                value = from_children
            elif has_tot and from_children is not None:
                value = (np.minimum if spec.rhs == "unit_upper" else np.maximum)(value, from_children)
        elif spec.rhs == "zero":
            value = np.zeros((n, build_query(product.schema, spec.query).n_answers))
        elif spec.rhs == "occupied":
            value = nodes[["occupied"]].to_numpy(dtype=float)
        elif spec.rhs == "housing_units":
            value = nodes[["u0"]].to_numpy(dtype=float)
        elif spec.rhs == "unit_counts":
            value = nodes[UNIT_COLUMNS[:build_query(product.schema, spec.query).n_answers]].to_numpy(dtype=float)
        else:  # total
            if spec.name not in here:
                continue
            if "tot" not in nodes.columns or nodes["tot"].isna().any():
                raise ConfigError(f"constraint {spec.name!r} at {level} needs the invariant "
                                  f"{(totals or ['tot'])[0]!r} at {level} or below, and nodes that are whole states (on "
                                  "a spine that splits states into AIAN parts the whole state's total binds the parts "
                                  "as a group; a part's total is not invariant)")
            value = nodes[["tot"]].to_numpy(dtype=float)
        rhs[spec.name] = bind(spec, value)
    return LevelConstraints(nodes.index, rhs)


def infeasible(cons: LevelConstraints, true_answers: dict[str, np.ndarray]) -> dict[str, tuple[int, int]]:
    """Per constraint (in order) that the true data violate: its first offending row and how many rows do."""
    found = {}
    for name, c in cons.rhs.items():
        val, rhs, sense = true_answers[c.query], c.rhs, c.sense
        ok = np.isnan(rhs) | {"==": np.isclose(val, rhs), "<=": val <= rhs + 1e-9, ">=": val >= rhs - 1e-9}[sense]
        bad = np.flatnonzero(~ok.all(axis=1))
        if bad.size:
            found[name] = (int(bad[0]), int(bad.size))
    return found


def infeasible_error(level: str, name: str, node: str, count: int) -> InvariantError:
    """The error of :func:`check_feasible`: it names the level, constraint and node but no count of persons."""
    return InvariantError(f"input data violate constraint {name!r} at level {level} for node {node!r} "
                          f"({count} node(s) in all): the declared invariants are infeasible")


def check_feasible(level: str, cons: LevelConstraints, true_answers: dict[str, np.ndarray]) -> None:
    """The true data must satisfy every constraint; otherwise the invariants are contradictory.

    The message names the level, constraint and node but no count.
    """
    for name, (row, count) in infeasible(cons, true_answers).items():
        raise infeasible_error(level, name, cons.nodes[row], count)
