"""The parent's Pyomo model and its compilation to a StandardForm: the definition of a parent's problem,
compiled on the Pyomo path (``compiler = "pyomo"``, pyomo_path.py); production runs build the same rows
directly (direct.py), equal entry for entry.

One ConcreteModel per parent (per failsafe level): ``x[i]`` counts (>= 0), ``a[i]`` auxiliary query
answers (free; eq. 7.5's Q x, defined hierarchically), ``sp``/``sn`` parent slacks (failsafe step 3),
and one Constraint component per row family (see layout.py). The objective is not part of the model:
pass objectives are diagonal and are built directly on the compiled columns, and the inter-pass tau
bands are column bounds, so the model is compiled once (``LinearStandardFormCompiler``, mixed form)
and every L2 pass, tau LP and rounder pass of the parent reuses that compilation (solver_notes (a)).

Each row family is one Pyomo ``MatrixConstraint`` (``lb <= A x <= ub`` over the model's variables,
from the layout's CSR arrays): Pyomo's component for large linear constraint sets, which skips building
one expression object per row (constructing per-row ``LinearExpression`` bodies was a third of a
block-level task's time). Compilation reads each component's matrix and variable list directly; any
other constraint component (or a fixed variable) falls back to ``LinearStandardFormCompiler``.
"""
from __future__ import annotations

import weakref

import numpy as np
import pyomo.environ as pyo
import scipy.sparse as sp
from pyomo.core.base.matrix_constraint import MatrixConstraint, _MatrixConstraintData
from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler

from .layout import Layout, Rows
from .standard import FAMILIES, StandardForm, base_bounds, family_slices, stack_families


def build_model(layout: Layout) -> tuple[pyo.ConcreteModel, tuple]:
    """The ConcreteModel and its variables in layout column order."""
    m = pyo.ConcreteModel(name=f"parent {layout.problem.parent}")
    n_x = layout.n_x
    n_slack = int((layout.spcol >= 0).sum())
    n_a = layout.n_cols - n_x - 2 * n_slack
    m.x = pyo.Var(range(n_x), bounds=(0, None))
    m.a = pyo.Var(range(n_a))
    m.sp = pyo.Var(range(n_slack), bounds=(0, None))
    m.sn = pyo.Var(range(n_slack), bounds=(0, None))
    columns = tuple(m.x.values()) + tuple(m.a.values()) + tuple(m.sp.values()) + tuple(m.sn.values())
    for name in FAMILIES:
        rows = layout.families[name]
        if len(rows):
            m.add_component(name, _matrix_constraint(rows, columns))
    return m, columns


class _RowData(_MatrixConstraintData):
    """One row of a :class:`RowFamily`, in the (lb, body, ub) form Pyomo's writers ask for; the family
    keeps its bounds as float arrays (+-inf: none)."""

    __slots__ = ()

    @property
    def lower(self):
        v = self.parent_component()._lower[self._index]
        return float(v) if np.isfinite(v) else None

    @property
    def upper(self):
        v = self.parent_component()._upper[self._index]
        return float(v) if np.isfinite(v) else None

    @property
    def equality(self):
        comp = self.parent_component()
        return bool(comp._lower[self._index] == comp._upper[self._index])

    def to_bounded_expression(self, evaluate_bounds=False):
        return self.lower, self.body, self.upper


class RowFamily(MatrixConstraint):
    """Pyomo's ``MatrixConstraint`` over numpy CSR arrays and bound arrays, with the iteration
    signatures and row form that Pyomo 6.10's writers (``LinearStandardFormCompiler``, the LP writer)
    expect of an indexed constraint."""

    def construct(self, data=None) -> None:
        if self._constructed:
            return
        self._constructed = True
        ref = weakref.ref(self)
        self._data = tuple(_RowData(i, ref) for i in range(len(self._lower)))

    def keys(self, sort=False):
        return iter(range(len(self._data)))

    def values(self, sort=False):
        return iter(self._data)

    def items(self, sort=False):
        return enumerate(self._data)


def _matrix_constraint(rows: Rows, columns: tuple) -> RowFamily:
    """``lo <= A z <= hi`` for one row family."""
    indptr, cols, coefs, lo, hi = rows.csr()
    return RowFamily(coefs, cols, indptr, lo, hi, columns)


def compile_model(layout: Layout, m: pyo.ConcreteModel, columns: tuple) -> StandardForm:
    """Compile the model into layout column order: read each RowFamily's CSR arrays, bounds and variable
    list (``_A_data``/``_A_indices``/``_A_indptr``/``_lower``/``_upper``/``_x``, as Pyomo 6.10 names
    them) directly, else use Pyomo's compiler."""
    position: dict[int, int] | None = None
    checked: set[int] = set()  # variable lists already checked for fixed variables
    parts = []
    for con in m.component_objects(pyo.Constraint, active=True):
        if type(con) is not RowFamily:
            return compile_with_pyomo(layout, m, columns)
    for name in FAMILIES:
        comp = m.component(name)
        if comp is None:
            continue
        if id(comp._x) not in checked:
            if any(v.fixed for v in comp._x):
                return compile_with_pyomo(layout, m, columns)
            checked.add(id(comp._x))
        index = np.asarray(comp._A_indices, dtype=np.int64)
        if comp._x is not columns:  # a family over its own variable list: map it to layout order
            position = position or {id(v): i for i, v in enumerate(columns)}
            perm = np.fromiter((position[id(v)] for v in comp._x), dtype=np.int64, count=len(comp._x))
            index = perm[index]
        parts.append((np.asarray(comp._A_indptr, dtype=np.int64), index, np.asarray(comp._A_data, dtype=float),
                      np.asarray(comp._lower, dtype=float), np.asarray(comp._upper, dtype=float)))
    return stack_families(layout, parts)


def compile_with_pyomo(layout: Layout, m: pyo.ConcreteModel, columns: tuple) -> StandardForm:
    """Compile with Pyomo's LinearStandardFormCompiler (mixed form) into layout column order."""
    info = LinearStandardFormCompiler().write(m, mixed_form=True, column_order=columns)
    position = {id(v): i for i, v in enumerate(columns)}
    perm = np.fromiter((position[id(v)] for v in info.columns), dtype=np.int64, count=len(info.columns))
    a = sp.csc_matrix(info.A)
    a = sp.csc_matrix((a.data, a.indices, a.indptr), shape=a.shape)
    # Place compiled columns (unused ones were dropped by the compiler) at their layout positions.
    full = sp.csr_matrix((a.data, (a.indices, np.repeat(perm, np.diff(a.indptr)))),
                         shape=(a.shape[0], layout.n_cols))
    rhs = np.asarray(info.rhs, float)
    flags = np.fromiter((r.bound_type for r in info.rows), dtype=np.int64, count=len(info.rows))
    lo = np.where(flags <= 0, rhs, -np.inf)
    hi = np.where(flags >= 0, rhs, np.inf)
    slices = family_slices(layout)
    if a.shape[0] != sum(s.stop - s.start for s in slices.values()):
        raise RuntimeError(f"parent {layout.problem.parent!r}: compiled {a.shape[0]} rows, layout has "
                           f"{sum(s.stop - s.start for s in slices.values())}")
    lb, ub = base_bounds(layout)
    return StandardForm(full, lo, hi, lb, ub, slices)


def compile_pyomo(layout: Layout) -> StandardForm:
    """Build the parent's Pyomo model and compile it."""
    m, columns = build_model(layout)
    return compile_model(layout, m, columns)
