"""Optional Gurobi back end (``[<product>.estimation] backend = "gurobi"``), for sites with a licence.

It implements the same two methods as :class:`topdown.solvers.backends.PiqpHighs` on the same box
form, single-threaded: barrier for the QPs, dual simplex for the LPs (a vertex, as the rounder's
totally unimodular flow form needs), branch and bound when integrality is asked for.
"""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .backends import Result


class GurobiUnavailable(RuntimeError):
    """gurobipy is not installed or has no licence."""


class Gurobi:
    """Gurobi for QPs, LPs and MILPs (one thread, deterministic)."""

    def __init__(self) -> None:
        try:
            import gurobipy as gp
        except ImportError as exc:  # pragma: no cover - depends on the site
            raise GurobiUnavailable("backend = \"gurobi\" needs the gurobipy package and a licence") from exc
        self._gp = gp
        try:
            self._env = gp.Env(params={"OutputFlag": 0, "Threads": 1})
        except gp.GurobiError as exc:  # pragma: no cover - depends on the site
            raise GurobiUnavailable(f"Gurobi could not start: {exc}") from exc

    def _solve(self, a, lo, hi, lb, ub, set_objective, method: int, integer=None, presolve: bool = True) -> Result:
        gp = self._gp
        t0 = time.perf_counter()
        m = gp.Model(env=self._env)
        m.Params.Method = method
        if not presolve and integer is None:
            m.Params.Presolve = 0
        n = a.shape[1]
        vtype = np.where(integer, gp.GRB.INTEGER, gp.GRB.CONTINUOUS) if integer is not None else gp.GRB.CONTINUOUS
        z = m.addMVar(n, lb=np.where(np.isfinite(lb), lb, -gp.GRB.INFINITY),
                      ub=np.where(np.isfinite(ub), ub, gp.GRB.INFINITY), vtype=vtype)
        a = sp.csr_matrix(a)
        for mask, sense, rhs in ((np.isfinite(lo) & (lo == hi), "=", lo), (np.isfinite(hi) & (lo != hi), "<", hi),
                                 (np.isfinite(lo) & (lo != hi), ">", lo)):
            if mask.any():
                m.addMConstr(a[mask], z, sense, rhs[mask])
        set_objective(m, z)
        m.optimize()
        ok = m.Status == gp.GRB.OPTIMAL
        status = {gp.GRB.OPTIMAL: "Optimal", gp.GRB.INFEASIBLE: "Infeasible", gp.GRB.UNBOUNDED: "Unbounded",
                  gp.GRB.INF_OR_UNBD: "InfeasibleOrUnbounded"}.get(m.Status, f"status {m.Status}")
        x = np.asarray(z.X) if ok else None
        return Result(ok, status, x, float(m.ObjVal) if ok else np.nan, time.perf_counter() - t0)

    def qp(self, p_diag, q, a, lo, hi, lb, ub) -> Result:
        def objective(m, z):
            m.setObjective(0.5 * (z @ sp.diags(p_diag) @ z) + np.asarray(q, float) @ z)
        return self._solve(a, lo, hi, lb, ub, objective, method=2)

    def lp(self, c, a, lo, hi, lb, ub, integer=None, presolve=True) -> Result:
        def objective(m, z):
            m.setObjective(np.asarray(c, float) @ z)
        return self._solve(a, lo, hi, lb, ub, objective, method=1, integer=integer, presolve=presolve)
