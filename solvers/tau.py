"""The tau LP of eq. 7.6: the smallest uniform band around pass k's query answers that stays feasible."""
from __future__ import annotations

import time

import numpy as np
import scipy.sparse as sp

from .backends import FEASIBILITY_TOL, Backend, Result

#: The largest violation of a row or column bound (scaled counts) by pass k's own solution for which that
#: solution is taken as the witness that its band, fixed at its answers, is feasible: a hundredth of the
#: feasibility tolerance the LP would be solved to, so that the LP would find the band feasible as well.
WITNESS_TOL = FEASIBILITY_TOL / 100


def tau_lp(backend: Backend, a: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray, lb: np.ndarray,
           ub: np.ndarray, band_cols: np.ndarray, answers: np.ndarray, near: float = 0.0,
           solution: np.ndarray | None = None) -> Result:
    """min t s.t. the structural rows, the current column bounds and |z[band_cols] - answers| <= t.

    ``answers`` are pass k's values of the band columns (``Q x*_k``). Returns the LP result; its
    objective is t* (DAS-2020 ``findOptimalTol``), or an upper bound ``near`` on it. Pass k's solution
    meets the rows, so t* is 0 up to the QP's tolerance. Where that ``solution`` (all columns) meets them
    within :data:`WITNESS_TOL` it is itself the point that shows the band fixed at ``answers`` feasible:
    t* = 0 with no LP (:func:`witness_holds`). Otherwise two feasibility LPs are tried before the LP with
    t: the band fixed at ``answers`` (:func:`zero_band`; t* = 0 where it is feasible, and presolve
    removes the fixed columns), then, where ``near`` > 0, the band within ``near`` of them (t* <= ``near``,
    which is returned). Either costs a small part of the LP with t, whose band rows cover every (child,
    answer): benchmarks/RESULTS_dhc.md (e), (h) and (j).
    """
    t0 = time.perf_counter()
    if solution is not None and witness_holds(a, lo, hi, lb, ub, solution):
        return Result(True, "Witness", np.append(solution, 0.0), 0.0, time.perf_counter() - t0)
    for width in (0.0, near) if near > 0 else (0.0,):
        band = zero_band(backend, a, lo, hi, lb, ub, band_cols, answers, width)
        if band is not None and band.ok:
            return Result(True, band.status, np.append(band.x, width), width, time.perf_counter() - t0)
    m, n = a.shape
    nb = band_cols.size
    rows = np.repeat(np.arange(nb), 2)
    band = sp.csr_matrix((np.tile([1.0, -1.0], nb), (rows, np.ravel(np.column_stack((band_cols, np.full(nb, n)))))),
                         shape=(nb, n + 1))
    band_hi = sp.csr_matrix((np.tile([1.0, 1.0], nb), (rows, np.ravel(np.column_stack((band_cols, np.full(nb, n)))))),
                            shape=(nb, n + 1))
    full = sp.vstack([sp.hstack([a, sp.csr_matrix((m, 1))]), band, band_hi], format="csr")
    c = np.zeros(n + 1)
    c[n] = 1.0
    row_lo = np.concatenate([lo, np.full(nb, -np.inf), answers])
    row_hi = np.concatenate([hi, answers, np.full(nb, np.inf)])
    res = backend.lp(c, full, row_lo, row_hi, np.append(lb, 0.0), np.append(ub, np.inf))
    return Result(res.ok, res.status, res.x, res.objective, time.perf_counter() - t0)


def zero_band(backend: Backend, a: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray, lb: np.ndarray,
              ub: np.ndarray, band_cols: np.ndarray, answers: np.ndarray, t: float = 0.0) -> Result | None:
    """The feasibility LP of the tau LP at a given t (0 by default): the rows and bounds with each band column
    within t of its answer (None where that leaves a column no values, so t is too small)."""
    band_lb = np.maximum(lb[band_cols], answers - t)
    band_ub = np.minimum(ub[band_cols], answers + t)
    if (band_lb > band_ub).any():
        return None
    fixed_lb, fixed_ub = lb.copy(), ub.copy()
    fixed_lb[band_cols], fixed_ub[band_cols] = band_lb, band_ub
    return backend.lp(np.zeros(a.shape[1]), a, lo, hi, fixed_lb, fixed_ub)


def witness_holds(a: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray, lb: np.ndarray, ub: np.ndarray,
                  z: np.ndarray) -> bool:
    """Whether ``z`` meets the rows ``lo <= a z <= hi`` and the bounds ``lb <= z <= ub`` within
    :data:`WITNESS_TOL`: then every band around ``z``'s own answers holds a feasible point, ``z``."""
    act = a @ z
    tol = WITNESS_TOL
    return bool((act >= lo - tol).all() and (act <= hi + tol).all() and (z >= lb - tol).all()
                and (z <= ub + tol).all())
