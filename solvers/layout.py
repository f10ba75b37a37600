"""Which variables and rows one parent's model has (solver_notes.md, "elimination levels" e2 + hier).

Everything is indexed by the parent's cells in play (``Layout.cells``: the parent's non-zero cells, every
cell at the root), never by the declared cells. Columns: one ``x`` per (child, cell) in play, one auxiliary
``a`` per (query, child, answer) that covers at least one ``x`` of that child (none for a query whose grouping
is the identity on cells: it uses the ``x`` columns, as ``detailed``), and, when the parent equality is
relaxed (failsafe steps 2-3, DAS-2020 ``sequential_optimizers.py``), a surplus ``sp`` and deficit ``sn`` per
parent cell. Row families, all linear with 0/+-1 coefficients: ``definitions`` (a = sum of a finer query's
aux columns when one refines it, else the sum of cells), ``parent`` (eq. 7.2's [I I ... I] x = parent),
``marginal`` (steps 2-3 only), the problem's ``constraints`` and ``group_totals``. Both model builders
(Pyomo, direct) read this.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np
import scipy.sparse as sp

from topdown.vocab.queries import (Query, QueryError, build_query, canonical_name, coarse_answers, positions,
                                   refinement)

from topdown.vocab.problem import ParentProblem, SparseHist

DETAILED = "detailed"


class ProblemError(ValueError):
    """A malformed ParentProblem (shapes, unknown query names)."""


def concat(parts: list[np.ndarray], dtype) -> np.ndarray:
    """The arrays end to end as ``dtype`` (empty if there are none)."""
    return np.concatenate(parts).astype(dtype, copy=False) if parts else np.zeros(0, dtype)


@dataclass
class Rows:
    """A family of rows ``lo <= A z <= hi``, collected in chunks of CSR pieces."""

    lengths: list[np.ndarray] = field(default_factory=list)  # entries per row, per chunk
    cols: list[np.ndarray] = field(default_factory=list)
    coefs: list[np.ndarray] = field(default_factory=list)
    lo: list[np.ndarray] = field(default_factory=list)
    hi: list[np.ndarray] = field(default_factory=list)

    def add(self, cols: np.ndarray, coefs: np.ndarray, lo: float, hi: float) -> None:
        """One row."""
        self.extend(np.array([len(cols)]), cols, coefs, np.array([lo]), np.array([hi]))

    def extend(self, lengths: np.ndarray, cols: np.ndarray, coefs: np.ndarray, lo: np.ndarray,
               hi: np.ndarray) -> None:
        """Many rows: row r has the next ``lengths[r]`` entries of ``cols``/``coefs``."""
        self.lengths.append(np.asarray(lengths, dtype=np.int64))
        self.cols.append(np.asarray(cols, dtype=np.int64))
        self.coefs.append(np.asarray(coefs, dtype=float))
        self.lo.append(np.asarray(lo, dtype=float))
        self.hi.append(np.asarray(hi, dtype=float))

    def csr(self) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
        """``(indptr, cols, coefs, lo, hi)`` of the whole family as flat arrays."""
        indptr = np.concatenate(([0], np.cumsum(concat(self.lengths, np.int64))))
        return (indptr, concat(self.cols, np.int64), concat(self.coefs, float), concat(self.lo, float),
                concat(self.hi, float))

    def __len__(self) -> int:
        return sum(len(x) for x in self.lo)


@dataclass
class ConstraintRow:
    """Where a row of the ``constraints`` family came from."""

    constraint: int
    child: int
    answer: int
    sense: str


@dataclass
class Layout:
    """Column maps and row families of one parent's model."""

    problem: ParentProblem
    relax_parent: bool
    queries: dict[str, Query]  # canonical name -> Query, every query the model refers to
    cells: np.ndarray  # int64[n], sorted: the cells in play (a variable for some child, or a parent cell)
    xcol: np.ndarray  # int64[n_children, n]: column of (child, cells[j]), -1 = no variable
    answers: dict[str, np.ndarray]  # query -> its answers in play, sorted (``cells`` if identity)
    acol: dict[str, np.ndarray]  # query -> int64[n_children, len(answers)], -1 = no variable (xcol if identity)
    sources: dict[str, str | None]  # query -> the query its aux columns are defined from (None: cells)
    spcol: np.ndarray  # int64[n] (per cell of ``cells``), -1 unless relax_parent
    sncol: np.ndarray
    n_cols: int
    families: dict[str, Rows]
    constraint_rows: list[ConstraintRow]
    infeasible: list[tuple[str, str]]  # (kind, message): constant rows no variable can satisfy;
    # kind "inequality" for a "<=" / ">=" constraint (failsafe step 3 drops it), else "equality"

    def cols(self, query: str) -> np.ndarray:
        """Column of each (child, answer in play) of a query: the x columns for ``detailed``."""
        return self.xcol if query == DETAILED else self.acol[query]

    def answers_of(self, query: str) -> np.ndarray:
        """The answers the columns of :meth:`cols` stand for (the cells for ``detailed``)."""
        return self.cells if query == DETAILED else self.answers[query]

    def parent_at_cells(self) -> np.ndarray:
        """int64[n]: the parent's count of each cell of ``cells`` (zeros at the root)."""
        out = np.zeros(self.cells.size, dtype=np.int64)
        parent = self.problem.parent_sparse()
        if parent is not None:
            out[positions(self.cells, parent.cells)] = parent.counts
        return out

    @property
    def n_x(self) -> int:
        return int((self.xcol >= 0).sum())

    @cached_property
    def answers_of_x(self) -> sp.csr_matrix:
        """float[n_cols, n_x]: each count and aux column as the sum of the count columns of its cells
        (each answer directly from the cells, entries in cell order: the sums ``Query.answer`` makes)."""
        c_all, i_all = np.nonzero(self.xcol >= 0)  # (child, cell) of every count column, row-major
        x = self.xcol[c_all, i_all]
        rows, cols = [x], [x]
        seen = {id(self.xcol)}
        for name, acol in self.acol.items():
            if id(acol) in seen:  # the count columns, or a query another name already stands for
                continue
            seen.add(id(acol))
            g = positions(self.answers[name], self.queries[name].groups_at(self.cells))[i_all]
            sel = g >= 0
            rows.append(acol[c_all[sel], g[sel]])
            cols.append(x[sel])
        r, c = np.concatenate(rows), np.concatenate(cols)
        return sp.csr_matrix((np.ones(r.size), (r, c)), shape=(self.n_cols, self.n_x))


def parse_query(problem: ParentProblem, name: str, where: str) -> tuple[str, Query]:
    """Canonical name and Query, with an error naming where the bad name came from."""
    try:
        q = build_query(problem.schema, name)
    except QueryError as err:
        raise ProblemError(f"parent {problem.parent!r}, {where}: {err}") from None
    return q.name, q


@lru_cache(maxsize=4096)
def _refinement(fine: Query, coarse: Query) -> tuple[np.ndarray, ...] | None:
    """:func:`~topdown.vocab.queries.refinement`, cached: queries are built once per schema and name, and
    every parent asks about the same pairs."""
    return refinement(fine, coarse)


def _validate(problem: ParentProblem) -> None:
    k, n = problem.n_children, problem.schema.ncells
    if k == 0:
        raise ProblemError(f"parent {problem.parent!r}: no children")
    if problem.parent_hist is None and k != 1:
        raise ProblemError(f"root problem {problem.parent!r} must have exactly one child, has {k}")
    if problem.parent_hist is not None:
        if not isinstance(problem.parent_hist, SparseHist) and np.shape(problem.parent_hist) != (n,):
            raise ProblemError(f"parent {problem.parent!r}: parent_hist has shape {np.shape(problem.parent_hist)}, "
                               f"expected ({n},)")
        parent = problem.parent_sparse()
        if parent.ncells != n or (parent.counts < 0).any():
            raise ProblemError(f"parent {problem.parent!r}: parent_hist has negative entries or {parent.ncells} "
                               f"cells, expected {n}")
    if problem.support is not None:
        cells = np.asarray(problem.support)
        if problem.parent_hist is not None:
            raise ProblemError(f"parent {problem.parent!r}: a support is for the root problem only")
        if cells.ndim != 1 or (cells.size and (np.any(np.diff(cells) <= 0) or cells[0] < 0 or cells[-1] >= n)):
            raise ProblemError(f"root problem {problem.parent!r}: support must be sorted, distinct cells within "
                               f"0..{n - 1}")
    for m in problem.measurements:
        _, q = parse_query(problem, m.query, f"measurement {m.query!r}")
        width = q.n_answers if m.answers is None else np.size(m.answers)
        if m.answers is not None and np.size(m.answers) and (
                np.any(np.diff(m.answers) <= 0) or m.answers[0] < 0 or m.answers[-1] >= q.n_answers):
            raise ProblemError(f"parent {problem.parent!r}, measurement {m.query!r}: answers must be sorted, "
                               f"distinct and within 0..{q.n_answers - 1}")
        if np.shape(m.values) != (k, width) or np.shape(m.variance) != (k,):
            raise ProblemError(f"parent {problem.parent!r}, measurement {m.query!r}: values {np.shape(m.values)} "
                               f"and variance {np.shape(m.variance)}, expected ({k}, {width}) and ({k},)")
        if (np.asarray(m.variance) <= 0).any():
            raise ProblemError(f"parent {problem.parent!r}, measurement {m.query!r}: variance must be > 0")
    for con in problem.constraints:
        _, q = parse_query(problem, con.query, f"constraint {con.name!r}")
        if con.sense not in ("==", "<=", ">="):
            raise ProblemError(f"parent {problem.parent!r}, constraint {con.name!r}: bad sense {con.sense!r}")
        if np.shape(con.rhs) != (k, q.n_answers):
            raise ProblemError(f"parent {problem.parent!r}, constraint {con.name!r}: rhs shape {np.shape(con.rhs)}, "
                               f"expected ({k}, {q.n_answers})")
    for g in problem.group_totals:
        idx = np.asarray(g.children)
        if idx.size == 0 or idx.min() < 0 or idx.max() >= k:
            raise ProblemError(f"parent {problem.parent!r}: group total has child indices outside 0..{k - 1}")


def _in_play(problem: ParentProblem, relax_parent: bool, relax_inequalities: bool) -> tuple[np.ndarray, np.ndarray]:
    """The cells in play (sorted; DAS-2020 `findDesiredIndices`) and bool[n_children, len(cells)]: which
    child has a variable there (the child structural zeros removed)."""
    schema, k = problem.schema, problem.n_children
    parent = problem.parent_sparse()
    if parent is None:
        cells = np.arange(schema.ncells, dtype=np.int64) if problem.support is None else np.asarray(problem.support)
    elif relax_parent:
        # Backup feasibility (DAS-2020): a cell is in play if the parent's marginal over the first dimension is > 0.
        rest = schema.ncells // schema.shape[0]
        rests = np.unique(parent.cells % rest)
        cells = (np.arange(schema.shape[0], dtype=np.int64)[:, None] * rest + rests[None, :]).reshape(-1)
    else:
        cells = parent.cells
    mask = np.ones((k, cells.size), dtype=bool)
    for con in problem.constraints:
        if con.sense == ">=" or (con.sense == "<=" and relax_inequalities):
            continue
        _, q = parse_query(problem, con.query, f"constraint {con.name!r}")
        rhs = np.asarray(con.rhs, float)
        zero = np.isfinite(rhs) & (rhs <= 0)
        if zero.any():
            g = q.groups_at(cells)
            inside = g >= 0
            mask[:, inside] &= ~zero[:, g[inside]]
    return cells, mask


def root_totals(problem: ParentProblem) -> np.ndarray:
    """float[n_children]: each child's total where an equality constraint whose answers cover every cell fixes
    it (the sum of its right-hand sides, e.g. an invariant total), inf elsewhere."""
    totals = np.full(problem.n_children, np.inf)
    for con in problem.constraints:
        if con.sense != "==":
            continue
        _, q = parse_query(problem, con.query, f"constraint {con.name!r}")
        if not q.is_partition:
            continue
        rhs = np.asarray(con.rhs, float)
        fixed = np.isfinite(rhs).all(axis=1)
        totals[fixed] = np.minimum(totals[fixed], rhs[fixed].sum(axis=1))
    return totals


def _answer_caps(problem: ParentProblem, cells: np.ndarray, mask: np.ndarray, query: Query | str,
                 relax_parent: bool) -> np.ndarray:
    """float[n_children, n_answers]: the most each child's answer can be given the parent (inf at the root).

    An inequality beyond its cap (or a lower bound <= 0) cannot bind and is left out of the model: the
    hhgq upper bounds 99999 x units (DAS-2020 `calculateRightHandSideHhgqTotal`) are up to 1e10 against tau
    bands of 1e-3 in scaled units, a range that makes the interior-point solver report spurious infeasibility.
    For ``detailed`` (a constraint on every cell) the caps are over all cells, 0 outside ``cells``.
    """
    k = problem.n_children
    parent = problem.parent_sparse()
    if parent is None:  # the root: a child's fixed total (an equality over every cell) caps it
        totals = root_totals(problem)[:, None]
        cell_cap = np.where(mask, totals, 0.0)
    elif relax_parent:  # the exact marginal over the other dimensions still fixes the total
        cell_cap = np.where(mask, float(parent.total()), 0.0)
    else:
        at = np.zeros(cells.size)
        at[positions(cells, parent.cells)] = parent.counts
        cell_cap = np.where(mask, at[None, :], 0.0)
    if query == DETAILED:
        out = np.zeros((k, problem.schema.ncells))
        out[:, cells] = cell_cap
        return out
    g = query.groups_at(cells)
    inside = g >= 0
    c, j = np.nonzero(np.broadcast_to(inside[None, :], cell_cap.shape))  # row-major: cell order per answer
    caps = np.bincount(c * query.n_answers + g[j], weights=cell_cap[c, j], minlength=k * query.n_answers)
    caps = caps.reshape(k, query.n_answers)
    return np.minimum(caps, totals) if parent is None else caps


def _definitions(rows: Rows, key: np.ndarray, members: np.ndarray, ncol: int) -> tuple[np.ndarray, np.ndarray, int]:
    """One aux column and definition row ``a - sum(members) = 0`` per distinct ``key`` (child x answer),
    numbered from ``ncol`` in key order, members in their given order; returns the distinct keys (sorted),
    their columns and the next free column."""
    order = np.argsort(key, kind="stable")
    key, members = key[order], members[order]
    first = np.flatnonzero(np.r_[True, key[1:] != key[:-1]]) if key.size else np.zeros(0, dtype=np.int64)
    n_rows = first.size
    aux = ncol + np.arange(n_rows, dtype=np.int64)
    lengths = np.diff(np.r_[first, key.size]) + 1
    out_cols = np.empty(key.size + n_rows, dtype=np.int64)
    out_coefs = np.full(key.size + n_rows, -1.0)
    head = first + np.arange(n_rows)
    out_cols[head] = aux
    out_coefs[head] = 1.0
    out_cols[np.arange(key.size) + np.repeat(np.arange(n_rows), lengths - 1) + 1] = members
    rows.extend(lengths, out_cols, out_coefs, np.zeros(n_rows), np.zeros(n_rows))
    return key[first], aux, ncol + n_rows


def build_layout(problem: ParentProblem, relax_parent: bool = False, relax_inequalities: bool = False) -> Layout:
    """Columns and rows of the parent's model.

    ``relax_inequalities`` keeps cells that an inequality makes structurally zero (failsafe step 3 may
    relax that inequality); ``relax_parent`` replaces the parent equality by slacks plus the exact
    marginal over the other dimensions (failsafe steps 2 and 3).
    """
    _validate(problem)
    schema, k = problem.schema, problem.n_children
    l2_names: list[str] = []
    for i, names_k in enumerate(problem.l2_passes):
        l2_names += [parse_query(problem, n, f"l2 pass {i}")[0] for n in names_k]
    l2_names += [parse_query(problem, c.query, f"constraint {c.name!r}")[0] for c in problem.constraints]
    names = list(l2_names)
    for i, names_k in enumerate(problem.rounder_passes):
        names += [parse_query(problem, n, f"rounder pass {i}")[0] for n in names_k]
    queries = {n: build_query(schema, n) for n in sorted(set(names)) if n != DETAILED}
    # Identical groupings (e.g. a query listed under two spellings) share one set of aux columns; a
    # grouping that is the identity on cells (e.g. the cross of every dimension) is ``detailed`` itself
    # and gets the count columns, no aux columns.
    by_groups: dict[tuple, str] = {}
    alias: dict[str, str] = {}
    for n, q in queries.items():
        alias[n] = DETAILED if q.is_identity else by_groups.setdefault(q.key, n)
    distinct = sorted({alias[n] for n in queries} - {DETAILED}, key=lambda n: (-queries[n].n_answers, n))
    # Queries the L2 passes need (theirs and the constraints'): defined only from each other or the
    # cells, so the L2 passes can leave the rounder's other queries out (standard.restrict_form).
    core = {alias[n] for n in l2_names if n != DETAILED}

    cells, mask = _in_play(problem, relax_parent, relax_inequalities)
    xcol = np.full(mask.shape, -1, dtype=np.int64)
    mask_c, mask_j = np.nonzero(mask)  # the cells in play, row-major (as ``np.nonzero`` of any sub-mask)
    xcol[mask_c, mask_j] = np.arange(mask_c.size)
    ncol = int(mask.sum())
    families = {name: Rows() for name in ("definitions", "parent", "marginal", "constraints", "group_totals")}

    # Aux columns and definitions, finest query first; each defined from the coarsest finer query
    # that refines it (hierarchical aux: solver_notes pitfall 5), else from the cells.
    acol: dict[str, np.ndarray] = {}
    answers: dict[str, np.ndarray] = {}
    sources: dict[str, str | None] = {}
    defined: list[str] = []
    for n in distinct:
        q = queries[n]
        source, mapping = None, None
        sources_ok = [d for d in defined if n not in core or d in core]
        for f in sorted(sources_ok, key=lambda d: (queries[d].n_answers, d)):
            mapping = _refinement(queries[f], q)
            if mapping is not None:
                source = f
                break
        if source is not None:
            coarse = coarse_answers(queries[source], q, mapping, answers[source])
            cc, jj = np.nonzero((acol[source] >= 0) & (coarse >= 0)[None, :])
            parts, members = coarse[jj], acol[source][cc, jj]
        else:
            g = q.groups_at(cells)
            sel = g[mask_j] >= 0
            cc, jj = mask_c[sel], mask_j[sel]
            parts, members = g[jj], xcol[cc, jj]
        keys, aux, ncol = _definitions(families["definitions"], cc * q.n_answers + parts, members, ncol)
        answers[n] = np.unique(keys % q.n_answers)
        cols = np.full((k, answers[n].size), -1, dtype=np.int64)
        cols[keys // q.n_answers, np.searchsorted(answers[n], keys % q.n_answers)] = aux
        acol[n] = cols
        sources[n] = source
        defined.append(n)
    for n in queries:
        acol[n] = xcol if alias[n] == DETAILED else acol[alias[n]]
        answers[n] = cells if alias[n] == DETAILED else answers[alias[n]]
        sources[n] = None if alias[n] == DETAILED else sources[alias[n]]

    spcol = np.full(cells.size, -1, dtype=np.int64)
    sncol = np.full(cells.size, -1, dtype=np.int64)
    infeasible: list[tuple[str, str]] = []
    parent = problem.parent_sparse()
    if parent is not None:
        at = np.zeros(cells.size, dtype=np.int64)
        at[positions(cells, parent.cells)] = parent.counts
        rows_at = np.flatnonzero(mask.any(axis=0) | (at > 0)) if relax_parent else np.flatnonzero(at > 0)
        if relax_parent:
            spcol[rows_at] = ncol + np.arange(rows_at.size)
            sncol[rows_at] = ncol + rows_at.size + np.arange(rows_at.size)
            ncol += 2 * rows_at.size
        by_cell = xcol[:, rows_at].T
        coef = np.ones(by_cell.shape)
        if relax_parent:
            by_cell = np.column_stack([by_cell, spcol[rows_at], sncol[rows_at]])
            coef = np.column_stack([coef, -np.ones(rows_at.size), np.ones(rows_at.size)])
        ok = by_cell >= 0
        lengths = ok.sum(axis=1)
        some = lengths > 0
        families["parent"].extend(lengths[some], by_cell[ok], coef[ok], at[rows_at[some]], at[rows_at[some]])
        infeasible += [("equality", f"parent cell {i} is positive but every child has a structural zero there")
                       for i in cells[rows_at[~some]]]
        if relax_parent:
            rest = schema.ncells // schema.shape[0]
            marg_of, inverse = np.unique(parent.cells % rest, return_inverse=True)
            marg = np.bincount(inverse.reshape(-1), weights=parent.counts, minlength=marg_of.size)
            cell_rest = cells % rest
            for m, total in zip(marg_of, marg):
                if total <= 0:
                    continue
                members = xcol[:, cell_rest == m].reshape(-1)
                members = np.sort(members[members >= 0])
                if members.size:
                    families["marginal"].add(members, np.ones(members.size), float(total), float(total))
                else:
                    infeasible.append(("equality", f"parent marginal {m} is positive but no cell of it "
                                                   "can be positive"))

    constraint_rows: list[ConstraintRow] = []
    for ci, con in enumerate(problem.constraints):
        name = canonical_name(con.query)
        rhs = np.asarray(con.rhs, float)
        cc, jj = np.nonzero(np.isfinite(rhs))
        where = positions(answers[name] if name != DETAILED else cells, jj)
        cols = xcol if name == DETAILED else acol[name]
        col = np.where(where >= 0, cols[cc, np.maximum(where, 0)], -1) if cols.size else np.full(cc.size, -1)
        r = rhs[cc, jj]
        lo = r if con.sense in ("==", ">=") else np.full(r.size, -np.inf)
        hi = r if con.sense in ("==", "<=") else np.full(r.size, np.inf)
        # cannot bind: x >= 0 and the parent already bound the answer
        if con.sense == "<=":
            most = _answer_caps(problem, cells, mask, DETAILED if name == DETAILED else queries[name], relax_parent)
            loose = hi >= most[cc, jj]
        else:
            loose = (lo <= 0.0) if con.sense == ">=" else np.zeros(r.size, dtype=bool)
        kind = "equality" if con.sense == "==" else "inequality"
        unmet = (col < 0) & ~((lo <= 0.0) & (0.0 <= hi))  # no variable, and 0 breaks the row
        for c, j in zip(cc[unmet], jj[unmet]):
            infeasible.append((kind, f"constraint {con.name!r} child {problem.children[c]!r} answer {j}: "
                                     f"{con.sense} {float(rhs[c, j]):g} but no cell of that answer can be positive"))
        keep = (col >= 0) & ~loose
        n_keep = int(keep.sum())
        families["constraints"].extend(np.ones(n_keep), col[keep], np.ones(n_keep), lo[keep], hi[keep])
        constraint_rows += [ConstraintRow(ci, int(c), int(j), con.sense) for c, j in zip(cc[keep], jj[keep])]
    for g in problem.group_totals:
        members = np.sort(xcol[np.asarray(g.children)].reshape(-1))
        members = members[members >= 0]
        if members.size == 0:
            if g.total != 0:
                infeasible.append(("equality", f"group total of children {list(g.children)} = {g.total} "
                                               "but no cell is in play"))
            continue
        families["group_totals"].add(members, np.ones(members.size), float(g.total), float(g.total))
    return Layout(problem, relax_parent, queries, cells, xcol, answers, acol, sources, spcol, sncol, ncol, families,
                  constraint_rows, infeasible)
