"""The parent's Pyomo model and its compilation to a StandardForm.

One ConcreteModel per parent (per failsafe level): ``x[i]`` counts (>= 0), ``a[i]`` auxiliary query
answers (free; eq. 7.5's Q x, defined hierarchically), ``sp``/``sn`` parent slacks (failsafe step 3),
and one Constraint component per row family (see layout.py). The objective is not part of the model:
pass objectives are diagonal and are built directly on the compiled columns, and the inter-pass tau
bands are column bounds, so the model is compiled once (``LinearStandardFormCompiler``, mixed form)
and every L2 pass, tau LP and rounder pass of the parent reuses that compilation (solver_notes (a)).

Constraint bodies are built as Pyomo ``LinearExpression`` objects from the layout's coefficient
arrays, and compiled by reading their ``linear_vars``/``linear_coefs`` directly: for a purely linear
model this gives the same matrix as ``LinearStandardFormCompiler`` (which stays the fallback for any
other body) at a fraction of the cost, which is what keeps the Pyomo path near the numpy floor.
"""
from __future__ import annotations

import numpy as np
import pyomo.environ as pyo
import scipy.sparse as sp
from pyomo.core.expr.numeric_expr import LinearExpression
from pyomo.repn.plugins.standard_form import LinearStandardFormCompiler

from .layout import Layout, Rows
from .standard import FAMILIES, StandardForm, base_bounds, family_slices


def build_model(layout: Layout) -> tuple[pyo.ConcreteModel, list]:
    """The ConcreteModel and its variables in layout column order."""
    m = pyo.ConcreteModel(name=f"parent {layout.problem.parent}")
    n_x = layout.n_x
    n_slack = int((layout.spcol >= 0).sum())
    n_a = layout.n_cols - n_x - 2 * n_slack
    m.x = pyo.Var(range(n_x), bounds=(0, None))
    m.a = pyo.Var(range(n_a))
    m.sp = pyo.Var(range(n_slack), bounds=(0, None))
    m.sn = pyo.Var(range(n_slack), bounds=(0, None))
    columns = list(m.x.values()) + list(m.a.values()) + list(m.sp.values()) + list(m.sn.values())
    for name in FAMILIES:
        rows = layout.families[name]
        if len(rows):
            m.add_component(name, pyo.Constraint(range(len(rows)), rule=_rule(rows, columns)))
    return m, columns


def _rule(rows: Rows, columns: list):
    def rule(_m, r):
        cols, coefs = rows.cols[r], rows.coefs[r]
        body = LinearExpression(constant=0, linear_coefs=np.asarray(coefs, float).tolist(),
                                linear_vars=[columns[i] for i in cols])
        lo, hi = rows.lo[r], rows.hi[r]
        return (lo if np.isfinite(lo) else None, body, hi if np.isfinite(hi) else None)
    return rule


def compile_model(layout: Layout, m: pyo.ConcreteModel, columns: list) -> StandardForm:
    """Compile the model into layout column order: read linear bodies directly, else use Pyomo's compiler."""
    position = {id(v): i for i, v in enumerate(columns)}
    indptr, cols, coefs, lo, hi = [0], [], [], [], []
    for name in FAMILIES:
        comp = m.component(name)
        if comp is None:
            continue
        for con in comp.values():
            body = con.body
            if type(body) is not LinearExpression or body.constant != 0:
                return compile_with_pyomo(layout, m, columns)
            cols.extend(position[id(v)] for v in body.linear_vars)
            coefs.extend(body.linear_coefs)
            indptr.append(len(cols))
            lo.append(-np.inf if con.lb is None else con.lb)
            hi.append(np.inf if con.ub is None else con.ub)
    a = sp.csr_matrix((np.asarray(coefs, float), np.asarray(cols, np.int64), np.asarray(indptr, np.int64)),
                      shape=(len(lo), layout.n_cols))
    lb, ub = base_bounds(layout)
    return StandardForm(a, np.asarray(lo, float), np.asarray(hi, float), lb, ub, family_slices(layout))


def compile_with_pyomo(layout: Layout, m: pyo.ConcreteModel, columns: list) -> StandardForm:
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
