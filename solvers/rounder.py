"""Multi-pass controlled rounding (eq. 7.7) as LPs in a totally unimodular flow form.

x = F + b with F = floor(x_L2 + 1e-9) and b in [0, 1] on cells where the parent still has people to
hand out (D = parent - sum_c F > 0; every variable cell at the root or with a relaxed parent). All
structural rows are kept with their right-hand sides reduced by F (eq. 7.7's rhs minus floors). Pass k
minimizes the L1 distance of its queries' answers to the L2 answers: for answer row g with target
T_g = (Q b_L2)_g, r = floor(T_g), f = T_g - r, the row ``(Q b)_g - u1 - u2 + v = r`` with
u1 in [0, 1] at cost 1 - 2f and u2, v >= 0 at cost 1 prices |Q b - T| up to a constant
(solver_notes (d)); ``detailed`` is the cellwise cost (1 - 2f) b. Earlier passes' rounded answers are
fixed (column bounds). An answer with no cell in play gets no flow row (its cost is a constant), and one
with a single cell in play (and floor(T_g) = 0) none either: its row would price exactly (1 - 2f) b of
that cell, which goes into the cell's cost (``fold_single_cell_rows``; at the Block level a third of the
rows). On a laminar query chain the matrix is TU (dropping rows keeps it so), so the simplex vertex is
integral; that is checked after each solve (max |b - round b| < 1e-6) and a MILP re-solve is the fallback.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from topdown.vocab.queries import canonical_name

from .backends import Backend
from .l2 import SolveFailure
from .layout import DETAILED, Layout
from .standard import StandardForm, restrict_for_passes

INTEGRAL_TOL = 1e-6
FLOOR_EPS = 1e-9


def column_values(layout: Layout, hist: np.ndarray) -> np.ndarray:
    """All column values implied by child histograms ``hist[c, cell]`` (aux = answers, slacks = excess)."""
    z = layout.answers_of_x @ np.asarray(hist, float)[layout.xcol >= 0]
    if layout.relax_parent:
        diff = hist.sum(axis=0) - np.asarray(layout.problem.parent_hist, float)
        cells = np.flatnonzero(layout.spcol >= 0)
        z[layout.spcol[cells]] = np.maximum(diff[cells], 0.0)
        z[layout.sncol[cells]] = np.maximum(-diff[cells], 0.0)
    return z


def l2_histograms(layout: Layout, z: np.ndarray) -> np.ndarray:
    """Child histograms from L2 column values: clipped at 0 and, with an exact parent equality,
    rescaled cell by cell so the children sum to the parent exactly (removes solver tolerance)."""
    p = layout.problem
    hist = np.zeros(layout.xcol.shape)
    have = layout.xcol >= 0
    hist[have] = np.maximum(z[layout.xcol[have]], 0.0)
    if p.parent_hist is not None and not layout.relax_parent:
        parent = np.asarray(p.parent_hist, float)
        total = hist.sum(axis=0)
        pos = parent > 0
        scale = np.divide(parent, total, out=np.zeros_like(parent), where=total > 0)
        hist[:, pos & (total > 0)] *= scale[pos & (total > 0)]
        empty = pos & (total <= 0)
        if empty.any():
            counts = have[:, empty].sum(axis=0)
            hist[:, empty] = np.where(have[:, empty], parent[empty] / np.maximum(counts, 1), 0.0)
    return hist


def play_counts(layout: Layout, play: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Per layout column: how many of its cells are in play, and (where exactly one is) that cell's
    count column (-1 elsewhere); two products with ``answers_of_x``."""
    play_x = np.zeros(layout.n_x)
    play_x[layout.xcol[play]] = 1.0
    counts = layout.answers_of_x @ play_x
    which = layout.answers_of_x @ (play_x * np.arange(1, layout.n_x + 1))  # exact: integers below 2^53
    return counts, np.where(counts == 1, which - 1, -1).astype(np.int64)


def fold_single_cell_rows(cols: np.ndarray, counts: np.ndarray, single_x: np.ndarray, target: np.ndarray,
                          cost: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """The answer columns ``cols`` that keep a flow row (``counts``/``single_x``: :func:`play_counts`). An
    answer with no cell in play has a constant flow cost (dropped); one with a single cell in play and
    floor(target) = 0 costs (1 - 2f) b of that cell for b in [0, 1] (f its target): the cost the flow row
    would price, added to the cell's cost instead (the same LP optimum, fewer rows)."""
    single = (counts[cols] == 1) & (np.floor(target[cols] + FLOOR_EPS) == 0)
    np.add.at(cost, pos[single_x[cols[single]]], 1.0 - 2.0 * np.clip(target[cols[single]], 0.0, 1.0))
    return cols[~single & (counts[cols] > 0)]


def flow_rows(blocks: list[tuple[np.ndarray, np.ndarray]], n: int
              ) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The flow rows of a pass's queries, ``(cols, target)`` each: per query of g answer rows, row g'
    reads ``z[cols[g']] - u1 - u2 + v = floor(target[g'])`` over the n structural columns, then its own
    3g columns (u1, u2, v, each in answer order) after those of the earlier queries. Returns the rows'
    column indices ``int64[rows, 4]`` (coefficients +1, -1, -1, +1), their right-hand sides, and the
    cost, lower and upper bound of the 3g extra columns per query, end to end."""
    idx, rhs, cost, ub = [], [], [], []
    width = n
    for cols, target in blocks:
        g = cols.size
        r = np.floor(target + FLOOR_EPS)
        f = np.clip(target - r, 0.0, 1.0)
        own = width + np.arange(g)
        idx.append(np.column_stack([cols, own, own + g, own + 2 * g]))
        rhs.append(r)
        cost += [1.0 - 2.0 * f, np.ones(2 * g)]
        ub += [np.ones(g), np.full(2 * g, np.inf)]
        width += 3 * g
    idx_all = np.concatenate(idx).astype(np.int64, copy=False) if idx else np.zeros((0, 4), np.int64)
    extra_cost = np.concatenate(cost) if cost else np.zeros(0)
    return (idx_all, np.concatenate(rhs) if rhs else np.zeros(0), extra_cost, np.zeros(extra_cost.size),
            np.concatenate(ub) if ub else np.zeros(0))


#: Coefficients of a flow row on its four columns (z, u1, u2, v).
_FLOW_COEFS = np.array([1.0, -1.0, -1.0, 1.0])


def with_flow_rows(a: sp.csr_matrix, idx: np.ndarray) -> sp.csr_matrix:
    """``[[A, 0], [flow rows]]``: the structural rows widened by the flow columns, then the flow rows (the
    matrix scipy's hstack/vstack of the blocks gives, entry for entry, built from the CSR arrays)."""
    a = sp.csr_matrix(a)
    m, n = a.shape
    rows = idx.shape[0]
    indptr = np.concatenate([a.indptr.astype(np.int64), a.nnz + 4 * np.arange(1, rows + 1, dtype=np.int64)])
    indices = np.concatenate([a.indices.astype(np.int64), idx.reshape(-1)])
    data = np.concatenate([a.data.astype(float), np.tile(_FLOW_COEFS, rows)])
    return sp.csr_matrix((data, indices, indptr), shape=(m + rows, n + 3 * rows))


def run_rounder(layout: Layout, form: StandardForm, z_l2: np.ndarray, backend: Backend
                ) -> tuple[np.ndarray, list[dict]]:
    """Integer child histograms (int64[n_children, ncells]) and per-pass statistics."""
    p = layout.problem
    passes = [[canonical_name(n) for n in names] for names in p.rounder_passes] or [[DETAILED]]
    form, keep, pos = restrict_for_passes(layout, form, passes)
    hist = l2_histograms(layout, z_l2)
    have = layout.xcol >= 0
    floor = np.where(have, np.floor(hist + FLOOR_EPS), 0.0)
    frac_hist = hist - floor
    shift = column_values(layout, floor)
    if layout.relax_parent:
        shift[layout.spcol[layout.spcol >= 0]] = 0.0
        shift[layout.sncol[layout.sncol >= 0]] = 0.0
    target_all = column_values(layout, hist) - shift
    shift = shift[keep]
    n = keep.size
    lb = np.full(n, -np.inf)
    ub = np.full(n, np.inf)
    xcols = pos[layout.xcol[have]]
    if p.parent_hist is None or layout.relax_parent:
        play = have
    else:
        deficit = np.asarray(p.parent_hist, float) - floor.sum(axis=0)
        if (deficit < -FLOOR_EPS).any():
            raise SolveFailure("rounder: the floors of the L2 solution exceed the parent")
        play = have & (deficit > 0.5)[None, :]
    play_cols = pos[layout.xcol[play]]
    slacks = pos[np.concatenate([s[s >= 0] for s in (layout.spcol, layout.sncol)])]
    lb[xcols] = 0.0
    ub[xcols] = 0.0
    ub[play_cols] = 1.0
    lb[slacks] = 0.0
    offset = form.a @ shift
    lo, hi = form.lo - offset, form.hi - offset
    stats = []
    z = np.zeros(n)
    counts, single_x = play_counts(layout, play)
    for k, names in enumerate(passes):
        base_cost = np.zeros(n)
        if DETAILED in names:
            base_cost[play_cols] = 1.0 - 2.0 * frac_hist[play]
        base_cost[slacks] = 1.0
        blocks = []
        for name in names:
            if name == DETAILED:
                continue
            cols = layout.acol[name][layout.acol[name] >= 0]
            cols = fold_single_cell_rows(cols, counts, single_x, target_all, base_cost, pos)
            blocks.append((pos[cols], target_all[cols]))
        idx, rhs, cost, flb, fub = flow_rows(blocks, n)
        a = with_flow_rows(form.a, idx)
        c = np.concatenate([base_cost, cost])
        row_lo = np.concatenate([lo, rhs])
        row_hi = np.concatenate([hi, rhs])
        col_lb = np.concatenate([lb, flb])
        col_ub = np.concatenate([ub, fub])
        res = backend.lp(c, a, row_lo, row_hi, col_lb, col_ub)
        stat = {"pass": k, "status": res.status, "lp_s": round(res.seconds, 6), "milp": False,
                "columns": a.shape[1], "rows": a.shape[0]}
        if not res.ok:
            stats.append(stat)
            raise SolveFailure(f"rounder pass {k} ({', '.join(names)}): solver status {res.status}")
        y = res.x[xcols]
        gap = float(np.abs(y - np.round(y)).max()) if y.size else 0.0
        stat["max_fraction"] = gap
        if gap >= INTEGRAL_TOL:
            integer = np.zeros(a.shape[1], dtype=bool)
            integer[play_cols] = True
            res = backend.lp(c, a, row_lo, row_hi, col_lb, col_ub, integer=integer)
            stat.update(milp=True, status=res.status, lp_s=round(stat["lp_s"] + res.seconds, 6))
            if not res.ok:
                stats.append(stat)
                raise SolveFailure(f"rounder pass {k} MILP fallback: solver status {res.status}")
        z = np.round(res.x[:n])
        for name in names:
            cols = pos[layout.cols(name)[layout.cols(name) >= 0]]
            lb[cols] = ub[cols] = z[cols]
        stats.append(stat)
    out = floor.copy()
    out[have] += z[xcols]
    return out.astype(np.int64), stats
