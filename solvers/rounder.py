"""Multi-pass controlled rounding (eq. 7.7) as LPs in a totally unimodular flow form.

x = F + b with F = floor(x_L2 + 1e-9) and b in [0, 1] on cells where the parent still has people to
hand out (D = parent - sum_c F > 0; every variable cell at the root or with a relaxed parent). All
structural rows are kept with their right-hand sides reduced by F (eq. 7.7's rhs minus floors). Pass k
minimizes the L1 distance of its queries' answers to the L2 answers: for answer row g with target
T_g = (Q b_L2)_g, r = floor(T_g), f = T_g - r, the row ``(Q b)_g - u1 - u2 + v = r`` with
u1 in [0, 1] at cost 1 - 2f and u2, v >= 0 at cost 1 prices |Q b - T| up to a constant
(solver_notes (d)); ``detailed`` is the cellwise cost (1 - 2f) b. Earlier passes' rounded answers are
fixed (rows, or bounds for the cells). An answer with no cell in play gets no flow row (its cost is a
constant), and one with a single cell in play (and floor(T_g) = 0) none either: its row would price exactly
(1 - 2f) b of that cell, which goes into the cell's cost (``fold_single_cell_rows``; at the Block level a
third of the rows).
The LP's variables are only the b of the cells in play and the parent slacks (``projection``): every other
column of the parent's form is a sum of those (an aux column) or 0 (a cell out of play), so its rows are
written over the cells directly and the definition rows are left out. At the Block level that is a fifth of
the rows and two thirds of the columns of the full form, which is what HiGHS's presolve would find at
several times the cost of the simplex; the LP goes to the simplex unpresolved (``presolve=False``).
On a laminar query chain the matrix is TU (dropping rows and substituting sums keeps it so), so the simplex
vertex is integral; that is checked after each solve (max |b - round b| < 1e-6) and a MILP re-solve is the
fallback.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from topdown.vocab.queries import canonical_name

from .backends import Backend
from .l2 import SolveFailure
from .layout import DETAILED, Layout, concat
from .standard import StandardForm, restrict_for_passes, select

INTEGRAL_TOL = 1e-6
FLOOR_EPS = 1e-9


def column_values(layout: Layout, hist: np.ndarray) -> np.ndarray:
    """All column values implied by child histograms ``hist[c, j]`` over the layout's cells (aux = answers,
    slacks = excess)."""
    z = layout.answers_of_x @ np.asarray(hist, float)[layout.xcol >= 0]
    if layout.relax_parent:
        diff = hist.sum(axis=0) - layout.parent_at_cells().astype(float)
        cells = np.flatnonzero(layout.spcol >= 0)
        z[layout.spcol[cells]] = np.maximum(diff[cells], 0.0)
        z[layout.sncol[cells]] = np.maximum(-diff[cells], 0.0)
    return z


def l2_histograms(layout: Layout, z: np.ndarray) -> np.ndarray:
    """Child histograms over the layout's cells from L2 column values: clipped at 0 and, with an exact parent
    equality, rescaled cell by cell so the children sum to the parent exactly (removes solver tolerance)."""
    p = layout.problem
    hist = np.zeros(layout.xcol.shape)
    have = layout.xcol >= 0
    hist[have] = np.maximum(z[layout.xcol[have]], 0.0)
    if p.parent_hist is not None and not layout.relax_parent:
        parent = layout.parent_at_cells().astype(float)
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


#: Coefficients of a flow row on its own three columns (u1, u2, v).
_FLOW_COEFS = np.array([-1.0, -1.0, 1.0])


def flow_rows(rows: sp.csr_matrix, target: np.ndarray, sizes: list[int]
              ) -> tuple[sp.csr_matrix, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """The flow rows of a pass's queries, ``sizes[q]`` answer rows of query q after those of the earlier ones:
    row g' reads ``rows[g'] y - u1 - u2 + v = floor(target[g'])`` over the n = ``rows.shape[1]`` variables y,
    then its own columns, three per row: per query of g rows, its g u1, g u2 and g v (each in answer order)
    after those of the earlier queries. Returns the rows (CSR, n + 3 * len(target) columns), their
    right-hand sides, and the cost, lower and upper bound of the extra columns."""
    f, n = rows.shape
    sizes_a = np.asarray(sizes, dtype=np.int64)
    query = np.repeat(np.arange(sizes_a.size), sizes_a)
    start = (np.cumsum(sizes_a) - sizes_a)[query]
    u1 = 3 * start + (np.arange(f) - start)  # extra-column index of each row's u1; u2, v are g and 2g later
    g = sizes_a[query]
    r = np.floor(target + FLOOR_EPS)
    frac = np.clip(target - r, 0.0, 1.0)
    per_row = np.diff(rows.indptr)
    indptr = np.concatenate(([0], np.cumsum(per_row + 3)))
    indices = np.empty(indptr[-1], dtype=np.int64)
    data = np.empty(indptr[-1])
    at = np.arange(rows.nnz) + 3 * np.repeat(np.arange(f), per_row)  # each earlier row's 3 extra entries
    indices[at], data[at] = rows.indices, rows.data
    for j, coef in enumerate(_FLOW_COEFS):  # u1, u2, v: g columns apart
        indices[indptr[1:] - 3 + j] = n + u1 + j * g
        data[indptr[1:] - 3 + j] = coef
    cost = np.ones(3 * f)
    cost[u1] = 1.0 - 2.0 * frac
    ub = np.full(3 * f, np.inf)
    ub[u1] = 1.0
    return sp.csr_matrix((data, indices, indptr), shape=(f, n + 3 * f)), r, cost, np.zeros(3 * f), ub


def with_flow_rows(a: sp.csr_matrix, flow: sp.csr_matrix) -> sp.csr_matrix:
    """``[[A, 0], [flow rows]]``: the structural rows widened by the flow columns, then the flow rows (the
    matrix scipy's hstack/vstack of the blocks gives, entry for entry, built from the CSR arrays)."""
    a = sp.csr_matrix(a)
    return sp.csr_matrix((np.concatenate([a.data.astype(float), flow.data]),
                          np.concatenate([a.indices.astype(np.int64), flow.indices.astype(np.int64)]),
                          np.concatenate([a.indptr.astype(np.int64), a.nnz + flow.indptr[1:].astype(np.int64)])),
                         shape=(a.shape[0] + flow.shape[0], flow.shape[1]))


def projection(layout: Layout, keep: np.ndarray, pos: np.ndarray, play: np.ndarray) -> tuple[sp.csr_matrix, np.ndarray]:
    """The rounder LP's variables y (b of every cell in play, row-major, then every parent slack) and the map
    E (CSR, kept columns x y) with b = E y on every kept column: a cell out of play has b = 0 (its bounds),
    an aux column the sum of its cells' b (what its definition rows say), so those rows and columns need not
    be in the LP. Returns E and each variable's kept column."""
    play_x = layout.xcol[play]  # increasing: count columns are numbered row-major
    slack = np.concatenate([s[s >= 0] for s in (layout.spcol, layout.sncol)])
    kept, in_play = np.zeros(layout.n_cols, dtype=bool), np.zeros(layout.n_x, dtype=bool)
    kept[keep], in_play[play_x] = True, True
    cells = select(layout.answers_of_x, kept, in_play)
    slacks = sp.csr_matrix((np.ones(slack.size), (pos[slack], np.arange(slack.size))), shape=(keep.size, slack.size))
    return sp.hstack([cells, slacks], format="csr"), np.concatenate([pos[play_x], pos[slack]])


def run_rounder(layout: Layout, form: StandardForm, z_l2: np.ndarray, backend: Backend
                ) -> tuple[np.ndarray, list[dict]]:
    """Integer child histograms over the layout's cells (int64[n_children, len(layout.cells)]) and per-pass
    statistics."""
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
    xcols = pos[layout.xcol[have]]
    if p.parent_hist is None or layout.relax_parent:
        play = have
    else:
        deficit = layout.parent_at_cells().astype(float) - floor.sum(axis=0)
        if (deficit < -FLOOR_EPS).any():
            raise SolveFailure("rounder: the floors of the L2 solution exceed the parent")
        play = have & (deficit > 0.5)[None, :]
    e, var_cols = projection(layout, keep, pos, play)
    n_play, n_y = int(play.sum()), e.shape[1]
    play_cols, slacks = var_cols[:n_play], var_cols[n_play:]
    structural = np.ones(form.a.shape[0], dtype=bool)
    structural[form.rows["definitions"]] = False  # b = E y satisfies them
    offset = form.a @ shift
    rows = [sp.csr_matrix(select(form.a, structural, np.ones(keep.size, dtype=bool)) @ e)]
    row_lo, row_hi = [(form.lo - offset)[structural]], [(form.hi - offset)[structural]]
    y_lb = np.zeros(n_y)
    y_ub = np.concatenate([np.ones(n_play), np.full(n_y - n_play, np.inf)])
    stats = []
    z = np.zeros(keep.size)
    counts, single_x = play_counts(layout, play)
    for k, names in enumerate(passes):
        base_cost = np.zeros(keep.size)
        if DETAILED in names:
            base_cost[play_cols] = 1.0 - 2.0 * frac_hist[play]
        base_cost[slacks] = 1.0
        flow_cols = []
        for name in names:
            if name == DETAILED:
                continue
            cols = layout.acol[name][layout.acol[name] >= 0]
            flow_cols.append(fold_single_cell_rows(cols, counts, single_x, target_all, base_cost, pos))
        cols = concat(flow_cols, np.int64)
        flow, rhs, cost, flb, fub = flow_rows(e[pos[cols]], target_all[cols], [c.size for c in flow_cols])
        a = with_flow_rows(sp.vstack(rows, format="csr"), flow)
        c = np.concatenate([base_cost[var_cols], cost])
        lo, hi = np.concatenate(row_lo + [rhs]), np.concatenate(row_hi + [rhs])
        col_lb, col_ub = np.concatenate([y_lb, flb]), np.concatenate([y_ub, fub])
        res = backend.lp(c, a, lo, hi, col_lb, col_ub, presolve=False)
        stat = {"pass": k, "status": res.status, "lp_s": round(res.seconds, 6), "milp": False,
                "columns": a.shape[1], "rows": a.shape[0]}
        if not res.ok:
            stats.append(stat)
            raise SolveFailure(f"rounder pass {k} ({', '.join(names)}): solver status {res.status}")
        b = res.x[:n_play]
        gap = float(np.abs(b - np.round(b)).max()) if b.size else 0.0
        stat["max_fraction"] = gap
        if gap >= INTEGRAL_TOL:
            integer = np.zeros(a.shape[1], dtype=bool)
            integer[:n_play] = True
            res = backend.lp(c, a, lo, hi, col_lb, col_ub, integer=integer)
            stat.update(milp=True, status=res.status, lp_s=round(stat["lp_s"] + res.seconds, 6))
            if not res.ok:
                stats.append(stat)
                raise SolveFailure(f"rounder pass {k} MILP fallback: solver status {res.status}")
        y = np.round(res.x[:n_y])
        z = e @ y
        for name in names:  # later passes keep this pass's rounded answers
            if name == DETAILED:
                y_lb[:n_play] = y_ub[:n_play] = y[:n_play]
            else:
                cols = pos[layout.cols(name)[layout.cols(name) >= 0]]
                rows.append(e[cols])
                row_lo.append(z[cols])
                row_hi.append(z[cols])
        stats.append(stat)
    out = floor.copy()
    out[have] += z[xcols]
    return out.astype(np.int64), stats
