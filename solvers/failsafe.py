"""The failsafe (the Bureau's backup feasibility step, DAS-2020 `sequential_optimizers.py`): when a parent's
problem is infeasible or a solve fails, relax in a fixed order.

Levels, each tried only if the previous one failed, each recorded in ``ParentSolution.failsafe``:

0. exact: the problem as given.
1. step 1, inside the L2 passes (l2.py): a pass that fails with tau bands of earlier passes is
   re-solved once without them.
2. step 2, ``relax_parent`` (not at the root): the Bureau's backup feasibility step. The parent equality
   is replaced by per-cell slacks sp/sn (sum_c x - sp + sn = parent) while the parent's marginal over the
   other dimensions (for persons: votingage x hispanic x cenrace, the Bureau's ``minimalSchema = hhgq``)
   stays exact; every edit constraint (GQ lower/upper bounds, structural zeros, nurse_nva_0, the
   group totals) stays exact. The slack LP minimizes the parent slack, then the passes keep
   sum(sp + sn) <= optimum + 1 (as the Bureau's ``backupFeasOptimize``) and the rounder prices slack.
3. step 3, ``relax_parent_and_edits`` (not at the root), the last resort the Bureau does not have: as
   step 2, and also cells that an inequality makes structurally zero get variables again,
   constant-infeasible inequalities are dropped, and the slack LP adds the total L1 slack of the
   "<=" / ">=" constraint rows; each violated row's rhs is then moved by its slack (rounded up to an
   integer). ``topdown verify`` then reports the broken bound.
An edit constraint is therefore never relaxed before the parent consistency is. At the root (no parent)
only the exact problem is tried, as in the Bureau's code. If every level fails,
:class:`FailsafeExhausted` names the parent and lists what was tried.
"""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from topdown.vocab.problem import FailsafeAction, FailsafeStep

from .backends import Backend
from .l2 import SolveFailure, problem_scale
from .layout import Layout
from .standard import StandardForm

RELAX_EPS = 1e-6

LEVELS = ("exact", "relax_parent", "relax_parent_and_edits")
#: The level that may relax edit constraints (inequalities and structural zeros).
RELAX_EDITS = LEVELS[2]


class FailsafeExhausted(RuntimeError):
    """Every failsafe level failed for a parent."""


def relax_rows(layout: Layout, form: StandardForm, backend: Backend, edits: bool
               ) -> tuple[StandardForm, list[FailsafeStep]]:
    """Phase-A slack LP and the relaxed StandardForm: the parent (step 2) and, with ``edits``, the
    inequality rows too (step 3)."""
    p = layout.problem
    step, level = (3, RELAX_EDITS) if edits else (2, LEVELS[1])

    def note(action: FailsafeAction, text: str) -> FailsafeStep:
        return FailsafeStep(step, action, f"step {step} ({level}): {text}")

    notes = [note("drop_infeasible", f"dropped constant-infeasible {msg}") for kind, msg in layout.infeasible
             if kind == "inequality" and edits]
    s = problem_scale(layout)
    start = form.rows["constraints"].start
    rows = np.array([start + i for i, r in enumerate(layout.constraint_rows) if r.sense != "==" and edits],
                    dtype=np.int64)
    signs = np.array([-1.0 if layout.constraint_rows[i - start].sense == "<=" else 1.0 for i in rows])
    m, n = form.shape
    slack = sp.csr_matrix((signs, (rows, np.arange(rows.size))), shape=(m, rows.size))
    a = sp.hstack([form.a, slack], format="csr")
    c = np.zeros(n + rows.size)
    c[n:] = 1.0
    parent_cols = np.concatenate([layout.spcol[layout.spcol >= 0], layout.sncol[layout.sncol >= 0]])
    c[parent_cols] = 1.0
    res = backend.lp(c, a, form.lo / s, form.hi / s, np.append(form.lb / s, np.zeros(rows.size)),
                     np.append(form.ub / s, np.full(rows.size, np.inf)))
    if not res.ok:
        raise SolveFailure(f"failsafe slack LP: solver status {res.status}")
    amount = np.ceil(res.x[n:] * s - RELAX_EPS)
    lo, hi = form.lo.copy(), form.hi.copy()
    for row, sign, by in zip(rows, signs, amount):
        if by <= 0:
            continue
        info = layout.constraint_rows[row - start]
        name = p.constraints[info.constraint].name
        if sign < 0:
            hi[row] += by
        else:
            lo[row] -= by
        notes.append(note("relax_constraint", f"relaxed constraint {name!r} child {p.children[info.child]!r} "
                                              f"answer {info.answer} ({info.sense}) by {by:g}"))
    a_out, rows_out = form.a, dict(form.rows)
    if parent_cols.size:
        change = float(res.x[parent_cols].sum() * s)
        cap = sp.csr_matrix((np.ones(parent_cols.size), (np.zeros(parent_cols.size, dtype=np.int64), parent_cols)),
                            shape=(1, n))
        a_out = sp.vstack([form.a, cap], format="csr")
        lo = np.append(lo, -np.inf)
        hi = np.append(hi, np.ceil(change - RELAX_EPS) + 1.0)
        rows_out["slack_cap"] = slice(m, m + 1)
        notes.append(note("relax_parent", f"relaxed the parent equality along {p.schema.dim_names[0]} (other "
                                          f"dimensions' marginal exact): minimal L1 change {change:.6g}"))
    return StandardForm(a_out, lo, hi, form.lb, form.ub, rows_out), notes
