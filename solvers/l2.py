"""Multi-pass weighted non-negative least squares (eq. 7.5) with tau bands between passes (eq. 7.6).

Pass k minimizes sum over its queries q and children c with finite variance of
(1/var_qc) ||Q_q x_c - y_qc||^2; the ``detailed`` term enters only the last pass (DAS-2020
``l2_dataIndep_npass_optimizer.py``). After
pass k < K-1 the tau LP gives t*, and every later pass keeps |Q x - Q x*_k| <= t* + tau_slack for
pass k's queries (accumulating). Since Q x is an auxiliary column, a band is a column bound.
Counts are solved as z = x / s with s = max(1, magnitude / 1e4) (solver_notes pitfall 4).
"""
from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from topdown.vocab.problem import FailsafeStep
from topdown.vocab.queries import canonical_name, positions

from .backends import Backend
from .layout import DETAILED, Layout
from .standard import StandardForm, restrict_for_passes
from .tau import tau_lp

#: Target magnitude of a scaled count.
SCALE_TARGET = 1e4

#: The smallest variance a weight 1/var is taken from. A very large budget gives a discrete Gaussian variance
#: that underflows (about 1e-304 at rho 1,400 per query, subnormal or 0 above), whose reciprocal overflows the
#: QP; below this floor a measurement is as good as exact (its noise is non-zero with probability < 1e-6), so
#: its weight is capped at 1e6. Every variance of a budget below about rho 14 per query is above it.
VARIANCE_FLOOR = 1e-6

#: The tau LP's near band as a fraction of ``tau_slack``: where the rows hold with pass k's answers moved by
#: at most this much of the slack (and not with them fixed), that is taken for t*, an upper bound that widens
#: the band by at most a tenth of the slack and spares the LP with t (solvers/tau.py).
TAU_NEAR = 0.1


class SolveFailure(RuntimeError):
    """A pass, LP or check that failed; the failsafe catches it and relaxes."""


@dataclass
class L2Result:
    """The continuous solution (unscaled column values) and what each pass did."""

    z: np.ndarray
    pass_values: list[np.ndarray] = field(default_factory=list)  # column values after each pass
    band_cols: list[np.ndarray] = field(default_factory=list)  # banded columns after pass k
    tolerances: list[float] = field(default_factory=list)  # t*_k + tau_slack, count units
    stats: list[dict] = field(default_factory=list)
    steps: list[FailsafeStep] = field(default_factory=list)  # failsafe step 1 events


def problem_scale(layout: Layout) -> float:
    """s of the rescaling: the parent total (root: the largest equality or lower-bound rhs or measured row sum)
    / 1e4."""
    p = layout.problem
    parent = p.parent_sparse()
    if parent is not None:
        magnitude = float(parent.total())
    else:
        magnitude = 0.0
        for con in p.constraints:
            if con.sense == "<=":  # an upper bound says how large an answer may be, not how large it is
                continue
            rhs = np.asarray(con.rhs, float)
            if np.isfinite(rhs).any():
                magnitude = max(magnitude, float(np.abs(rhs[np.isfinite(rhs)]).max()))
        for m in p.measurements:
            magnitude = max(magnitude, float(np.abs(m.values).sum(axis=1).max()))
    return max(1.0, magnitude / SCALE_TARGET)


def measurement_variance(variance: np.ndarray) -> np.ndarray:
    """The variances the L2 weights are taken from: the measurement's, floored at ``VARIANCE_FLOOR``."""
    return np.maximum(np.asarray(variance, float), VARIANCE_FLOOR)


def objective(layout: Layout, queries: list[str], with_detailed: bool, scale: float
              ) -> tuple[np.ndarray, np.ndarray]:
    """Diagonal P and linear q of 1/2 z'Pz + q'z for the pass, in scaled columns (z = x / s)."""
    p_diag = np.zeros(layout.n_cols)
    q = np.zeros(layout.n_cols)
    wanted = set(queries) - {DETAILED}
    if with_detailed:
        wanted.add(DETAILED)
    for meas in layout.problem.measurements:
        name = canonical_name(meas.query)
        if name not in wanted:
            continue
        cols = layout.cols(name)
        answers = layout.answers_of(name)
        at = answers if meas.answers is None else positions(np.asarray(meas.answers), answers)
        var = measurement_variance(meas.variance)
        have = (cols >= 0) & np.isfinite(var)[:, None] & (at >= 0)[None, :]  # an answer not measured: no term
        if not have.any():  # no answer in play was measured (none may have been: an empty root support)
            continue
        idx = cols[have]  # distinct columns: one per (child, answer)
        w = np.broadcast_to((1.0 / var)[:, None], cols.shape)[have]
        p_diag[idx] += 2.0 * w * scale * scale
        q[idx] += -2.0 * w * scale * np.asarray(meas.values, float)[:, np.maximum(at, 0)][have]
    return p_diag, q


def band_columns(layout: Layout, queries: list[str]) -> np.ndarray:
    """The columns of a pass's queries (its ``B^(k)``), sorted, unique."""
    used = np.zeros(layout.n_cols + 1, dtype=bool)  # the last entry takes the -1s (no column)
    for q in queries:
        used[layout.cols(q).reshape(-1)] = True
    return np.flatnonzero(used[:-1])


def _full(layout: Layout, keep: np.ndarray, z: np.ndarray) -> np.ndarray:
    """Layout column values from restricted ones: dropped aux columns get their queries' answers (summed
    from the count columns, cell by cell in cell order)."""
    out = np.zeros(layout.n_cols)
    out[keep] = z
    if keep.size == layout.n_cols:
        return out
    answers = layout.answers_of_x @ out[:layout.n_x]  # count columns are the first n_x
    dropped = np.ones(layout.n_cols, dtype=bool)
    dropped[keep] = False
    for cols in layout.acol.values():
        ok = cols[cols >= 0]
        if dropped[ok].any():
            out[ok] = answers[ok]
    return out


def run_l2(layout: Layout, form: StandardForm, backend: Backend) -> L2Result:
    """Run all L2 passes; on an infeasible pass with bands, drop the earlier bands once (failsafe step 1).

    The passes solve a form restricted to the aux columns of the L2 and constraint queries (the
    rounder's other queries' columns are free and defined by their own rows, so they change nothing).
    """
    p = layout.problem
    passes = [[canonical_name(n) for n in names] for names in p.l2_passes] or [[DETAILED]]
    form, keep, pos = restrict_for_passes(layout, form, passes)
    s = problem_scale(layout)
    lo, hi = form.lo / s, form.hi / s
    base_lb, base_ub = form.lb / s, form.ub / s
    lb, ub = base_lb.copy(), base_ub.copy()
    banded = False
    out = L2Result(z=np.zeros(layout.n_cols))
    last = len(passes) - 1
    for k, names in enumerate(passes):
        p_diag, q = (v[keep] for v in objective(layout, names, k == last, s))
        res = backend.qp(p_diag, q, form.a, lo, hi, lb, ub)
        stat = {"pass": k, "status": res.status, "qp_s": round(res.seconds, 6), "columns": form.shape[1],
                "rows": form.shape[0]}
        if not res.ok and banded:
            out.steps.append(FailsafeStep(1, "drop_tau", f"step 1 (drop tau): L2 pass {k} returned {res.status}; "
                                                         f"dropped the tau bands of passes 0..{k - 1} and re-solved"))
            lb, ub = base_lb.copy(), base_ub.copy()
            banded = False
            res = backend.qp(p_diag, q, form.a, lo, hi, lb, ub)
            stat.update(status=res.status, qp_s=round(stat["qp_s"] + res.seconds, 6), dropped_tau=True)
        if not res.ok:
            out.stats.append(stat)
            raise SolveFailure(f"L2 pass {k} ({', '.join(names)}): solver status {res.status}")
        z = res.x
        full_cols = band_columns(layout, names)
        cols = pos[full_cols]
        out.pass_values.append(_full(layout, keep, z * s))
        out.band_cols.append(full_cols)
        if k < last and cols.size:
            t = tau_lp(backend, form.a, lo, hi, lb, ub, cols, z[cols], near=TAU_NEAR * p.tau_slack / s,
                       solution=z)
            if not t.ok:
                raise SolveFailure(f"tau LP after L2 pass {k}: solver status {t.status}")
            tol = max(t.objective, 0.0) + p.tau_slack / s
            lb[cols] = np.maximum(lb[cols], z[cols] - tol)
            ub[cols] = np.minimum(ub[cols], z[cols] + tol)
            banded = True
            stat.update(tau=t.objective * s, tau_lp_s=round(t.seconds, 6))
            out.tolerances.append(tol * s)
        out.stats.append(stat)
    out.z = out.pass_values[-1]
    return out
