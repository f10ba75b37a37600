"""Solver back ends behind one small interface: ``qp(...)`` for the L2 passes, ``lp(...)`` for the tau
LPs, the failsafe's slack LPs and the rounder.

Problems come in one box form: columns with bounds ``lb <= z <= ub`` and rows ``lo <= A z <= hi``
(equal entries of ``lo`` and ``hi`` mean an equality; infinite entries mean no bound). The default,
``piqp-highs``: PIQP (a proximal interior point method) for the QPs, one thread, its portable build
(the same floating-point results on every x86-64 machine); HiGHS dual simplex, one thread, for the LPs (a
simplex vertex, which the rounder's totally unimodular flow form needs). ``clarabel-highs`` keeps
Clarabel for the QPs (the default before PIQP: about 3x the CPU per QP, solutions within solver
tolerance; DESIGN.md item 27), qdldl below 30k columns and faer above. Gurobi (gurobi.py) implements the
same two methods.
"""
from __future__ import annotations

import ctypes
import importlib
import logging
import os
import sys
import threading
import time
from dataclasses import dataclass
from functools import lru_cache, partial
from typing import Protocol

import clarabel
import highspy
import numpy as np
import scipy.sparse as sp

from .isolated import HelperDied, call as call_isolated

log = logging.getLogger("topdown")

#: Columns above which Clarabel switches from qdldl to faer (solver_notes.md, pitfall 3).
FAER_ABOVE = 30_000


@dataclass
class Result:
    """One solve: ``ok`` when the solver reports an optimum; ``x`` is None otherwise."""

    ok: bool
    status: str
    x: np.ndarray | None
    objective: float
    seconds: float


class Backend(Protocol):
    """What the estimation code needs from a solver."""

    def qp(self, p_diag: np.ndarray, q: np.ndarray, a: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray,
           lb: np.ndarray, ub: np.ndarray) -> Result:
        """min 1/2 z' diag(p_diag) z + q'z subject to the box form."""
        ...

    def lp(self, c: np.ndarray, a: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray, lb: np.ndarray,
           ub: np.ndarray, integer: np.ndarray | None = None, presolve: bool = True) -> Result:
        """min c'z subject to the box form; ``integer`` (bool per column) makes it a MILP. ``presolve=False``
        skips the solver's presolve for an LP already in reduced form (the rounder's), where it costs
        several times the simplex (a MILP is presolved whatever this says)."""
        ...


def _cone_rows(a: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray, lb: np.ndarray, ub: np.ndarray
               ) -> tuple[sp.csc_matrix, np.ndarray, int, int]:
    """Clarabel's ``A z + s = b`` with s in (zero cone)^neq x (nonnegative cone)^nineq: the rows
    ``[A_eq; A_up; -A_down; I_up; -I_down]`` (``I_up``: ``e_j`` for each column with a finite upper
    bound), built from the CSR arrays in one pass (the matrix scipy's row indexing and vstack give,
    entry for entry)."""
    a = sp.csr_matrix(a)
    n = a.shape[1]
    eq = np.isfinite(lo) & np.isfinite(hi) & (lo == hi)
    up = np.isfinite(hi) & ~eq
    down = np.isfinite(lo) & ~eq
    col_up, col_down = np.flatnonzero(np.isfinite(ub)), np.flatnonzero(np.isfinite(lb))
    rows = np.concatenate([np.flatnonzero(eq), np.flatnonzero(up), np.flatnonzero(down)])
    sign = np.repeat([1.0, 1.0, -1.0], [int(eq.sum()), int(up.sum()), int(down.sum())])
    starts, lengths = a.indptr[rows].astype(np.int64), np.diff(a.indptr)[rows].astype(np.int64)
    ends = np.cumsum(lengths)
    take = np.repeat(starts - (ends - lengths), lengths) + np.arange(int(ends[-1]) if ends.size else 0)
    units = np.concatenate([col_up, col_down])
    indptr = np.concatenate([[0], ends, (ends[-1] if ends.size else 0) + np.arange(1, units.size + 1)])
    data = np.concatenate([a.data[take] * np.repeat(sign, lengths), np.ones(col_up.size), -np.ones(col_down.size)])
    mat = sp.csr_matrix((data, np.concatenate([a.indices[take], units]), indptr),
                        shape=(rows.size + units.size, n)).tocsc()
    rhs = [hi[eq], hi[up], -lo[down], ub[col_up], -lb[col_down]]
    return mat, np.concatenate(rhs), int(eq.sum()), mat.shape[0] - int(eq.sum())


_CLARABEL_OK = {"Solved", "AlmostSolved"}
#: Statuses impossible for a QP that is bounded below; seen only from scaling (solver_notes pitfall 4).
_SPURIOUS = {"DualInfeasible", "AlmostDualInfeasible"}
#: Clarabel's tol_infeas_abs/rel on the re-solve (defaults 1e-8).
STRICT_INFEAS = 1e-14


_BANNER = threading.Lock()
_banner_quiet = False


def _quiet_highs_banner() -> None:
    """Make this process's first ``Highs`` with standard output pointed at /dev/null: HiGHS 1.16 prints
    its banner to stdout when the first one of a process is made, before any option can turn output off
    (a worker's console, the CLI's output); later ones print nothing. Once per process, under a lock
    (two threads swapping file descriptor 1 at once could leave it pointed at /dev/null)."""
    global _banner_quiet
    if _banner_quiet:
        return
    with _BANNER:
        if _banner_quiet:
            return
        libc = ctypes.CDLL(None)
        sys.stdout.flush()
        saved = os.dup(1)
        try:
            with open(os.devnull, "wb") as null:
                os.dup2(null.fileno(), 1)
                highspy.Highs()
                libc.fflush(None)
        finally:
            os.dup2(saved, 1)
            os.close(saved)
        _banner_quiet = True


#: HiGHS's primal feasibility tolerance (its default), for the rows of an LP without columns.
FEASIBILITY_TOL = 1e-7


class HighsLp:
    """HiGHS dual simplex (one thread, a vertex) for LPs, branch and bound for MILPs: the ``lp`` of every
    open-source back end."""

    def lp(self, c, a, lo, hi, lb, ub, integer=None, presolve=True) -> Result:
        t0 = time.perf_counter()
        if a.shape[1] == 0:  # HiGHS answers a model without columns with its own status, "Empty"
            ok = bool(((np.asarray(lo) <= FEASIBILITY_TOL) & (np.asarray(hi) >= -FEASIBILITY_TOL)).all())
            return Result(ok, "Optimal" if ok else "Infeasible", np.zeros(0) if ok else None, 0.0 if ok else np.nan,
                          time.perf_counter() - t0)
        csc = sp.csc_matrix(a)
        csc.sort_indices()
        kind = np.zeros(csc.shape[1], dtype=np.int32)  # HighsVarType per column: 0 continuous, 1 integer
        if integer is not None:
            kind[np.asarray(integer, bool)] = int(highspy.HighsVarType.kInteger)
        _quiet_highs_banner()
        h = highspy.Highs()
        for key, val in (("output_flag", False), ("threads", 1), ("solver", "simplex"),
                         ("simplex_strategy", 1), ("random_seed", 0), ("mip_rel_gap", 0.0),
                         ("presolve", "on" if presolve or integer is not None else "off")):
            h.setOptionValue(key, val)
        # The array form of passModel: the same model as a HighsLp without copying each array through
        # Python lists (a seventh of a Block-level LP's CPU).
        status = h.passModel(csc.shape[1], csc.shape[0], csc.nnz, int(highspy.MatrixFormat.kColwise),
                             int(highspy.ObjSense.kMinimize), 0.0, np.asarray(c, float), np.asarray(lb, float),
                             np.asarray(ub, float), np.asarray(lo, float), np.asarray(hi, float),
                             csc.indptr.astype(np.int32), csc.indices.astype(np.int32), csc.data.astype(float), kind)
        if status == highspy.HighsStatus.kError:
            return Result(False, f"passModel: {status}", None, np.nan, time.perf_counter() - t0)
        h.run()
        status = h.modelStatusToString(h.getModelStatus())
        ok = h.getModelStatus() == highspy.HighsModelStatus.kOptimal
        x = np.asarray(h.getSolution().col_value) if ok else None
        obj = h.getInfo().objective_function_value if ok else np.nan
        return Result(ok, status, x, float(obj), time.perf_counter() - t0)


class ClarabelHighs(HighsLp):
    """Clarabel for QPs, HiGHS for LPs and MILPs; single-threaded and deterministic."""

    def __init__(self, tol: float = 1e-9, max_iter: int = 200) -> None:
        self.tol = tol
        self.max_iter = max_iter

    def qp(self, p_diag, q, a, lo, hi, lb, ub) -> Result:
        """Clarabel on the box form. A diagonal QP whose linear term lives on columns with a positive
        weight is bounded below, so a dual-infeasibility verdict is numerical (an ill-scaled row or a
        narrow band): it is re-solved once with infeasibility tolerances tightened to ``STRICT_INFEAS``."""
        t0 = time.perf_counter()
        n = a.shape[1]
        mat, b, neq, nineq = _cone_rows(a, lo, hi, lb, ub)
        p = sp.diags(p_diag, format="csc")
        q = np.asarray(q, float)
        cones = []
        if neq:
            cones.append(clarabel.ZeroConeT(neq))
        if nineq:
            cones.append(clarabel.NonnegativeConeT(nineq))
        s = clarabel.DefaultSettings()
        s.verbose = False
        s.max_threads = 1
        s.direct_solve_method = "faer" if n > FAER_ABOVE else "qdldl"
        s.tol_feas = s.tol_gap_abs = s.tol_gap_rel = self.tol
        s.max_iter = self.max_iter
        sol = clarabel.DefaultSolver(p, q, mat, b, cones, s).solve()
        status = str(sol.status).split(".")[-1]
        if status in _SPURIOUS and not np.any(q[np.asarray(p_diag) <= 0]):
            s.tol_infeas_abs = s.tol_infeas_rel = STRICT_INFEAS
            sol = clarabel.DefaultSolver(p, q, mat, b, cones, s).solve()
            status = str(sol.status).split(".")[-1]
        ok = status in _CLARABEL_OK
        x = np.asarray(sol.x) if ok else None
        return Result(ok, status, x, float(sol.obj_val) if ok else np.nan, time.perf_counter() - t0)


#: PIQP's build without AVX instructions: its results do not depend on the CPU's instruction sets (the
#: package's ``import piqp`` picks an AVX-512 or AVX2 build where the CPU has one, whose last digits differ).
_PIQP = "piqp.piqp_python"


@lru_cache(maxsize=1)
def _piqp():
    """PIQP's portable extension module."""
    return importlib.import_module(_PIQP)


#: Columns from which a QP is solved by PIQP in a helper process (isolated.py): PIQP keeps the GIL while it
#: solves, which in a Dask worker stops the worker's heartbeats. Below it a QP holds the GIL for about a second
#: of CPU at most (a County -> Tract parent of 30 tracts: 31,537 columns, 0.7-1.0 s; a State -> County parent
#: of 60 counties: 102,486 columns, 17-45 s; benchmarks/RESULTS_national.md, "Long solves and heartbeats").
ISOLATE_COLUMNS = 50_000


def piqp_solve(p: sp.csc_matrix, c: np.ndarray, a: sp.csc_matrix, b: np.ndarray, g: sp.csc_matrix | None,
               h_l: np.ndarray | None, h_u: np.ndarray | None, x_l: np.ndarray, x_u: np.ndarray, tol: float,
               max_iter: int, refine: bool = False) -> tuple[str, np.ndarray | None, float]:
    """PIQP's sparse solver on its own form, one thread: its status (``Solved``, ...), and x and the objective
    when solved; ``refine``: iterative refinement of every KKT solve (PIQP's default refines only when the
    regularization is at its floor). A module-level function: :func:`isolated.call` runs it in a helper process."""
    solver = _piqp().SparseSolver()
    st = solver.settings
    st.verbose = False
    st.num_threads = 1
    st.iterative_refinement_always_enabled = refine
    st.eps_abs = st.eps_rel = st.eps_duality_gap_abs = st.eps_duality_gap_rel = tol
    st.max_iter = max_iter
    solver.setup(p, c, a, b, g, h_l, h_u, x_l, x_u)
    status = "".join(w.capitalize() for w in solver.solve().name.split("_")[1:])  # PIQP_SOLVED -> Solved
    if status != "Solved":
        return status, None, np.nan
    return status, np.array(solver.result.x), float(solver.result.info.primal_obj)


def piqp_form(p_diag, q, a, lo, hi, lb, ub) -> tuple:
    """The box form's QP as :func:`piqp_solve`'s arguments before the tolerance: equality rows apart from
    two-sided ones."""
    a = sp.csr_matrix(a)
    lo, hi, lb, ub = (np.asarray(v, float) for v in (lo, hi, lb, ub))
    eq = np.isfinite(lo) & np.isfinite(hi) & (lo == hi)
    ineq = ~eq & (np.isfinite(lo) | np.isfinite(hi))
    g = a[ineq].tocsc() if ineq.any() else None
    return (sp.diags(np.asarray(p_diag, float), format="csc"), np.asarray(q, float),
            a[eq].tocsc() if eq.any() else sp.csc_matrix((0, a.shape[1])), hi[eq],
            g, None if g is None else lo[ineq], None if g is None else hi[ineq], lb, ub)


def piqp_attempts(tol: float, loose_tol: float, banded: bool = False) -> list[tuple[float, bool]]:
    """PIQP's tries at a QP, (tolerance, refine) in order: as is; with iterative refinement, which solves the
    L2 passes after a tau band that PIQP as is calls primal infeasible or leaves at its iteration limit (the
    1940 DHC's banded passes: benchmarks/RESULTS_dhc.md (g)); then at the loose tolerance, refined. A
    ``banded`` QP (:func:`has_band`) is tried refined first: as is, PIQP takes several times the iterations
    on the narrow boxes (a DHC-P Block parent's last pass: 139 against 30, RESULTS_dhc.md (h))."""
    first = ((tol, True), (tol, False)) if banded else ((tol, False), (tol, True))
    return list(dict.fromkeys((*first, (loose_tol, True))))


def has_band(lb: np.ndarray, ub: np.ndarray) -> bool:
    """Whether a column is boxed on both sides with room between (a tau band; a column fixed at one value
    is not)."""
    lb, ub = np.asarray(lb, float), np.asarray(ub, float)
    return bool((np.isfinite(lb) & np.isfinite(ub) & (lb < ub)).any())


class PiqpHighs(HighsLp):
    """PIQP for QPs, HiGHS for LPs and MILPs; single-threaded and deterministic.

    PIQP takes the box form as it is: equality rows ``A z = b``, two-sided rows ``lo <= G z <= hi`` and
    column bounds (no cone rows to build), and factors its KKT system by a sparse LDL'. Residuals and the
    duality gap are held to ``tol``, absolute and relative, as Clarabel's are. ``tol`` is tight (1e-11):
    an L2 pass's objective is nearly flat along measurements of large variance, where a looser tolerance
    leaves answers a hundredth of a person from the optimum, and every later pass's tau bands are placed
    around them (benchmarks/RESULTS_pyomo.md). A QP that PIQP does not solve at ``tol`` is solved again with
    iterative refinement (with ``refine_banded``, a QP with a tau band: first with it, then without), then at
    ``loose_tol`` (:func:`piqp_attempts`); one it does not solve at that either (seen only on badly scaled
    rows: 1e10 bounds beside 1e-3 tau bands) goes to Clarabel, at ``loose_tol``, with its strict re-solve
    before the failsafe hears of it; the status then names the verdicts. A QP of ``isolate_above`` columns or
    more is solved in a helper process (same result; None: never); where that process ends during a solve (PIQP
    crashed: a root of 211,909 cells in play, whose rows of one to seven thousand columns PIQP's ordering fills
    past its index range, benchmarks/RESULTS_dhc.md (k)), Clarabel solves the QP.
    """

    def __init__(self, tol: float = 1e-11, max_iter: int = 250, isolate_above: int | None = ISOLATE_COLUMNS,
                 loose_tol: float = 1e-9, refine_banded: bool = False) -> None:
        self.tol, self.loose_tol = tol, loose_tol
        self.refine_banded = refine_banded
        self.max_iter = max_iter
        self.isolate_above = isolate_above
        self.fallback = ClarabelHighs(loose_tol)

    def qp(self, p_diag, q, a, lo, hi, lb, ub) -> Result:
        t0 = time.perf_counter()
        args = piqp_form(p_diag, q, a, lo, hi, lb, ub)
        isolate = self.isolate_above is not None and a.shape[1] >= self.isolate_above
        solve = partial(call_isolated, piqp_solve) if isolate else piqp_solve
        verdicts = []
        banded = self.refine_banded and has_band(lb, ub)
        for tol, refine in piqp_attempts(self.tol, self.loose_tol, banded):
            try:
                status, x, objective = solve(*args, tol, self.max_iter, refine)
            except HelperDied as died:  # it would end so again on the same matrices: Clarabel's turn
                status = f"crashed ({died.how})"
                log.warning("PIQP's helper process ended with %s on a QP of %d columns and %d rows; solving it "
                            "with Clarabel", died.how, a.shape[1], a.shape[0])
                break
            how = f" at {tol:g}" + (" refined" if refine else "")
            if status == "Solved":
                said = "".join(f"PIQP {v}{h}, " for h, v in verdicts)
                return Result(True, said + status + (how if verdicts else ""), x, objective, time.perf_counter() - t0)
            verdicts.append((how, status))
        res = self.fallback.qp(p_diag, q, a, lo, hi, lb, ub)
        return Result(res.ok, f"PIQP {status}, Clarabel {res.status}", res.x, res.objective, time.perf_counter() - t0)


#: The default back end.
DEFAULT_BACKEND: Backend = PiqpHighs()

#: The default back end with ``refine_banded`` (``[<product>.estimation] refine_banded = true``).
REFINED_BANDS: Backend = PiqpHighs(refine_banded=True)

#: The open-source back ends by their ``[<product>.estimation] backend`` names (stateless: one each).
BACKENDS: dict[str, Backend] = {"piqp-highs": DEFAULT_BACKEND, "clarabel-highs": ClarabelHighs()}
