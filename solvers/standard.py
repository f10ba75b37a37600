"""The compiled form every pass works on: ``lo <= A z <= hi``, ``lb <= z <= ub``, in layout column order."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from topdown.vocab.queries import canonical_name

from .layout import Layout, concat

#: Row families in the order the builders emit them.
FAMILIES = ("definitions", "parent", "marginal", "constraints", "group_totals")


@dataclass
class StandardForm:
    """A parent's structural rows and base column bounds (x, sp, sn >= 0; aux columns free)."""

    a: sp.csr_matrix
    lo: np.ndarray
    hi: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    rows: dict[str, slice]  # family -> its rows

    @property
    def shape(self) -> tuple[int, int]:
        return self.a.shape


def base_bounds(layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Column bounds before any pass: counts and parent slacks are non-negative, aux columns free."""
    lb = np.full(layout.n_cols, -np.inf)
    lb[layout.xcol[layout.xcol >= 0]] = 0.0
    for s in (layout.spcol, layout.sncol):
        lb[s[s >= 0]] = 0.0
    return lb, np.full(layout.n_cols, np.inf)


def stack_families(layout: Layout, parts: list[tuple[np.ndarray, ...]]) -> StandardForm:
    """The StandardForm of the row families given as ``(indptr, cols, coefs, lo, hi)`` in ``FAMILIES``
    order (families without rows may be left out), with the base column bounds."""
    offsets = np.cumsum([0] + [p[0][-1] for p in parts[:-1]])
    indptr = np.concatenate([np.zeros(1, dtype=np.int64)] + [p[0][1:] + off for p, off in zip(parts, offsets)])
    lo, hi = concat([p[3] for p in parts], float), concat([p[4] for p in parts], float)
    a = sp.csr_matrix((concat([p[2] for p in parts], float), concat([p[1] for p in parts], np.int64), indptr),
                      shape=(lo.size, layout.n_cols))
    lb, ub = base_bounds(layout)
    return StandardForm(a, lo, hi, lb, ub, family_slices(layout))


def family_slices(layout: Layout) -> dict[str, slice]:
    out, start = {}, 0
    for name in FAMILIES:
        n = len(layout.families[name])
        out[name] = slice(start, start + n)
        start += n
    return out


def restrict_form(layout: Layout, form: StandardForm, queries: set[str]) -> tuple[StandardForm, np.ndarray]:
    """The form without the aux columns (and their definition rows) that neither ``queries`` nor the
    queries those are defined from use; returns it and the kept columns (sorted layout indices).

    A dropped aux column appears only in its own definition row and in those of coarser queries defined
    from it, which are dropped too, so every solution of the restricted form extends to the full one.
    """
    needed: set[str] = set()
    stack = [n for n in queries if n in layout.acol]
    while stack:
        n = stack.pop()
        if n not in needed:
            needed.add(n)
            if layout.sources[n] is not None:
                stack.append(layout.sources[n])
    keep = np.ones(layout.n_cols, dtype=bool)
    for n, cols in layout.acol.items():
        if n not in needed:
            keep[cols[cols >= 0]] = False
    for n in needed:
        keep[layout.acol[n][layout.acol[n] >= 0]] = True
    keep[layout.xcol[layout.xcol >= 0]] = True
    if keep.all():
        return form, np.arange(layout.n_cols)
    defs = form.rows["definitions"]
    block = form.a[defs].tocoo()
    defined = np.full(defs.stop - defs.start, -1, dtype=np.int64)
    plus = block.data > 0  # each definition row has one +1 entry: the aux column it defines
    defined[block.row[plus]] = block.col[plus]
    keep_row = np.ones(form.a.shape[0], dtype=bool)
    keep_row[defs.start:defs.stop] = keep[defined]
    before = np.concatenate(([0], np.cumsum(keep_row)))
    rows = {name: slice(int(before[sl.start]), int(before[sl.stop])) for name, sl in form.rows.items()}
    cols = np.flatnonzero(keep)
    return StandardForm(select(form.a, keep_row, keep), form.lo[keep_row], form.hi[keep_row], form.lb[cols],
                        form.ub[cols], rows), cols


def select(a: sp.csr_matrix, keep_row: np.ndarray, keep_col: np.ndarray) -> sp.csr_matrix:
    """``a[keep_row][:, flatnonzero(keep_col)]`` with each row's entries in their order in ``a`` (as
    scipy's indexing gives them), by one pass over the entries instead of scipy's fancy indexing."""
    sub = a[keep_row]
    new_col = np.cumsum(keep_col) - 1
    ok = keep_col[sub.indices]
    row = np.repeat(np.arange(sub.shape[0]), np.diff(sub.indptr))
    indptr = np.concatenate(([0], np.cumsum(np.bincount(row[ok], minlength=sub.shape[0])))).astype(sub.indptr.dtype)
    return sp.csr_matrix((sub.data[ok], new_col[sub.indices[ok]].astype(sub.indices.dtype), indptr),
                         shape=(sub.shape[0], int(keep_col.sum())))


def restrict_for_passes(layout: Layout, form: StandardForm, passes: list[list[str]]
                        ) -> tuple[StandardForm, np.ndarray, np.ndarray]:
    """The form restricted to the queries of ``passes`` and of the problem's constraints (canonical
    names); returns it, the kept layout columns and each layout column's position in it (-1: dropped)."""
    needed = {n for names in passes for n in names}
    needed |= {canonical_name(c.query) for c in layout.problem.constraints}
    form, keep = restrict_form(layout, form, needed)
    pos = np.full(layout.n_cols, -1, dtype=np.int64)
    pos[keep] = np.arange(keep.size)
    return form, keep, pos
