"""The Pyomo path (``[<product>.estimation] compiler = "pyomo"``): every pass solved through Pyomo.

The passes are the same code on both paths (l2.py, tau.py, rounder.py, failsafe.py): each states its
problem in the box form of backends.py (rows ``lo <= A z <= hi`` over the parent's columns, column bounds
``lb <= z <= ub``, a diagonal quadratic or a linear objective). On this path the parent's rows come from
its Pyomo model (``model.compile_pyomo``), and :class:`PyomoBackend` takes the place of the direct
solvers: it writes each pass's problem as a Pyomo ``ConcreteModel`` (one variable per column, one
constraint per row, the objective as one expression) and solves it with a solver that
``pyomo.environ.SolverFactory`` names (its own solvers, ``appsi_*``, and ``pyomo.contrib.solver``'s as
registered there: ``highs``, ``ipopt_v2``, ``gurobi_persistent_v2`` ...). The L2 passes of a parent share
their rows, so a QP on the same rows as the one before reuses that model: only bounds and objective
change, and a persistent solver (``highs``, ``appsi_*``) sends only those.

Problem classes (:data:`PASS_CLASSES`): the L2 passes are QPs, the tau and failsafe LPs are LPs, the
rounder's passes are LPs whose simplex vertex is integral, with a MILP re-solve where it is not, so they
need a solver that takes integer variables. :func:`check_solvers` solves a two-variable problem of each
class a configuration gives a solver, through this same backend, and refuses what fails before a run.
"""
from __future__ import annotations

import logging
import time
from collections import Counter
from contextlib import contextmanager
from typing import Any, Iterator, Mapping

import numpy as np
import pyomo.environ as pyo
import scipy.sparse as sp
from pyomo.common.gc_manager import PauseGC
from pyomo.core.expr.numeric_expr import LinearExpression, MonomialTermExpression
from pyomo.core.expr.relational_expr import EqualityExpression, InequalityExpression, RangedExpression
from pyomo.opt import TerminationCondition

from .backends import Result

#: What each pass asks of its solver: the key of the solver that runs it, the problem class, in words.
PASS_CLASSES = {
    "L2 (NNLS) passes": ("qp", "QPs"),
    "tau LPs": ("lp", "LPs"),
    "failsafe slack LPs": ("lp", "LPs"),
    "rounder passes": ("milp", "LPs whose vertex must be integral, re-solved as MILPs where it is not"),
}

#: Options a solver family gets unless the configuration sets them: one thread (the same result on any
#: machine) and no output. Matched on the solver name.
FAMILY_OPTIONS = {"highs": {"threads": 1, "random_seed": 0, "output_flag": False},
                  "gurobi": {"Threads": 1, "Seed": 0, "OutputFlag": 0},
                  "cplex": {"threads": 1}, "xpress": {"threads": 1}}
#: HiGHS options of an LP: dual simplex, as the direct path (a vertex; the rounder needs one).
HIGHS_LP = {"solver": "simplex", "simplex_strategy": 1}
#: HiGHS option for a MILP: an optimum proven to a zero gap.
HIGHS_MILP = {"mip_rel_gap": 0.0}
#: HiGHS's active-set QP adds ``qp_regularization_value`` (rho) to its Hessian's diagonal: an L2 pass's Hessian is
#: zero on the columns none of the pass's measurements reach, and without it HiGHS may stop on such a QP as
#: "Non-convex" at its first iteration; with it, it stops on others with a "Solve error" that a neighbouring
#: value does not meet. :meth:`PyomoBackend.qp` tries these values in turn (HiGHS's default first) and takes
#: the regularization's pull towards 0 out by proximal re-solves; a value whose re-solves fail or do not settle
#: counts as failed, as a failed solve does (its answer is not the pass's optimum). A ``qp_regularization_value``
#: in the configuration's options is the only value tried.
HIGHS_QP_REGULARIZATION = (1e-7, 1e-6, 0.0)
#: Active-set iterations a HiGHS QP may take per column before it counts as failed (the next regularization is
#: tried): a solved L2 pass took at most 0.54 per column (Rhode Island's largest parent 0.32, the 1940 DHC's
#: 0.54); a stalled one ran past 100,000 on 2,586 columns.
QP_ITERATIONS_PER_COLUMN = 10
#: At most this many proximal re-solves of a regularized QP, and the change of the objective's columns (largest,
#: in scaled units) that ends them: each step shrinks the pull by about rho / curvature, the objective scaled to
#: a largest curvature of 1 (:func:`objective_scaled`), so the answer is then within about 1e-9 of the optimum.
PROXIMAL_STEPS, PROXIMAL_CHANGE = 5, 1e-5


def highs_qp_options(columns: int) -> dict:
    """HiGHS options of a QP of ``columns`` columns: the first of :data:`HIGHS_QP_REGULARIZATION`, and no limit
    on its active-set solver's nullspace (HiGHS gives up at 4,000 by default; a large parent's QP needs more:
    Rhode Island's largest County -> Tract parent, 36k columns, about 5,300 at its optimum, and failed there
    after minutes; the nullspace cannot exceed the number of columns), and an iteration limit of
    :data:`QP_ITERATIONS_PER_COLUMN` per column (HiGHS has none: it cycles on some regularized L2 passes)."""
    return {"qp_regularization_value": HIGHS_QP_REGULARIZATION[0], "qp_nullspace_limit": max(int(columns), 1),
            "qp_iteration_limit": QP_ITERATIONS_PER_COLUMN * max(int(columns), 1)}


class SolverUnusable(ValueError):
    """A solver name Pyomo does not know, a solver not available here, or one that cannot solve a pass."""


@contextmanager
def _quiet_pyomo() -> Iterator[None]:
    """Pyomo's warnings while a solver is looked up (an unknown name, a solver not found): the caller words
    the error."""
    log = logging.getLogger("pyomo")
    level = log.level
    log.setLevel(logging.ERROR + 1)
    try:
        yield
    finally:
        log.setLevel(level)


def make_solver(name: str):
    """The solver ``pyomo.environ.SolverFactory(name)`` makes, checked to be known and available."""
    with _quiet_pyomo():
        try:
            opt = pyo.SolverFactory(name)
        except Exception as exc:  # a plugin that fails to start
            raise SolverUnusable(f"Pyomo could not make solver {name!r}: {exc}") from None
        if opt is None or type(opt).__name__ == "UnknownSolver":
            raise SolverUnusable(f"Pyomo knows no solver {name!r} (pyomo.environ.SolverFactory names; appsi "
                                 f"solvers as appsi_NAME)")
        try:
            ok = opt.available(exception_flag=False)
        except Exception:  # noqa: BLE001 - any failure to start means not available
            ok = False
        if not ok:
            raise SolverUnusable(f"solver {name!r} is not available on this machine (not installed or no licence)")
    return opt


def _bound(v: float) -> float | None:
    return float(v) if np.isfinite(v) else None


def _is_persistent_v1(opt) -> bool:
    """A legacy persistent interface (``gurobi_persistent``, ``cplex_persistent``...): it holds an instance
    given by ``set_instance`` and is not told of later changes to the model."""
    from pyomo.solvers.plugins.solvers.persistent_solver import PersistentSolver

    return isinstance(opt, PersistentSolver)


class PyomoBackend:
    """The ``qp``/``lp`` of backends.py through Pyomo: ``solver`` for every pass, ``qp_solver`` (default:
    ``solver``) for the L2 passes' QPs; ``options`` go to every solve (over :data:`FAMILY_OPTIONS`).

    Solver objects are made on first use in the process that solves (a backend sent to another worker goes
    without them). ``clock`` adds up seconds by where they go: ``build`` (the Pyomo model), ``solve`` (the
    solver call: Pyomo's hand-over to the solver, the solver, the solution loaded into the model) and
    ``read`` (the values read back), in CPU seconds of the solving thread.
    """

    def __init__(self, solver: str = "highs", qp_solver: str | None = None,
                 options: Mapping[str, Any] | None = None) -> None:
        self.solver = solver
        self.qp_solver = qp_solver or solver
        self.options = dict(options or {})
        self.clock: Counter = Counter()
        self._opts: dict[tuple[str, bool], Any] = {}
        self._last: tuple | None = None  # (rows, model, columns) of the last QP: the next may reuse them

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_opts": {}, "_last": None, "clock": Counter()}

    def _opt(self, name: str, kind: str):
        """The solver object of ``name`` for the QPs or for the LPs: one each, so that a persistent one keeps
        the L2 passes' model while the tau LPs between them are solved."""
        key = (name, kind == "qp")
        if key not in self._opts:
            self._opts[key] = make_solver(name)
            _only_bounds_and_objective_change(self._opts[key])
        return self._opts[key]

    def _options(self, name: str, kind: str, presolve: bool, columns: int, extra: dict | None = None) -> dict:
        out: dict[str, Any] = {}
        for family, opts in FAMILY_OPTIONS.items():
            if family in name:
                out.update(opts)
        if "highs" in name:
            out.update(highs_qp_options(columns) if kind == "qp" else HIGHS_LP)
            if kind == "milp":
                out.update(HIGHS_MILP)
            if not presolve and kind == "lp":
                out["presolve"] = "off"
        out.update(self.options)
        out.update(extra or {})
        return out

    def qp(self, p_diag, q, a, lo, hi, lb, ub) -> Result:
        with PauseGC():  # Pyomo's many small objects would set off collections of the whole heap
            return self._qp(p_diag, q, a, lo, hi, lb, ub)

    def lp(self, c, a, lo, hi, lb, ub, integer=None, presolve=True) -> Result:
        with PauseGC():
            return self._lp(c, a, lo, hi, lb, ub, integer, presolve)

    def _qp(self, p_diag, q, a, lo, hi, lb, ub) -> Result:
        t0, c0 = time.perf_counter(), time.thread_time()
        rows = (a, lo, hi)
        reuse = self._last is not None and _same_rows(self._last[0], rows)
        if reuse:
            m, z = self._last[1], self._last[2]
            m.del_component(m.obj)
        else:
            m, z = box_model(a, lo, hi)
        set_bounds(z, lb, ub)
        p_pass, q_pass = np.asarray(p_diag, float), np.asarray(q, float)

        def objective(x):  # the pass's objective, which the Result reports
            return 0.5 * x @ (p_pass * x) + q_pass @ x

        p_diag, q = objective_scaled(p_pass, q_pass)  # the solver's
        m.obj = pyo.Objective(expr=quadratic(z, p_diag, q))
        self.clock["build"] += time.thread_time() - c0
        self._last = (rows, m, z)

        highs = "highs" in self.qp_solver
        tried = [None]
        if highs and "qp_regularization_value" not in self.options:
            tried = [{"qp_regularization_value": rho} for rho in HIGHS_QP_REGULARIZATION]
        watched = p_diag > 0 if (p_diag > 0).any() else np.ones(p_diag.size, dtype=bool)  # the objective's columns
        failed = []
        for n, extra in enumerate(tried):
            if n:  # the proximal re-solves of the last try changed the objective
                m.del_component(m.obj)
                m.obj = pyo.Objective(expr=quadratic(z, p_diag, q))
            rho = float({**self.options, **(extra or {})}.get("qp_regularization_value", 0.0)) if highs else 0.0
            res = self._solve(self.qp_solver, m, z, "qp", True, t0, objective, extra)
            if res.ok and rho > 0:
                res = self._proximal(m, z, p_diag, q, rho, res, watched, t0, objective, extra)
            if res.ok:
                return res
            failed.append(f"{res.status} (regularization {rho:g})" if highs else res.status)
        return Result(False, "; ".join(failed), None, np.nan, time.perf_counter() - t0)

    def _proximal(self, m, z, p_diag, q, rho, res, watched, t0, objective, extra) -> Result:
        """Proximal re-solves of a QP whose solver added ``rho`` to its Hessian's diagonal, from its answer
        ``res``, until the objective's columns move by at most :data:`PROXIMAL_CHANGE`: the pass's optimum. A
        re-solve that fails, or answers still moving after :data:`PROXIMAL_STEPS`, make a failed Result (the
        regularized answer is not the pass's optimum)."""
        change = np.inf
        for _ in range(PROXIMAL_STEPS):
            # A solver that adds rho to the Hessian's diagonal, given q - rho x_k, minimises the pass's objective
            # plus rho/2 |x - x_k|^2: the proximal point method, whose answers converge to the pass's optimum.
            c0 = time.thread_time()
            m.del_component(m.obj)
            m.obj = pyo.Objective(expr=quadratic(z, p_diag, q - rho * res.x))
            self.clock["build"] += time.thread_time() - c0
            step = self._solve(self.qp_solver, m, z, "qp", True, t0, objective, extra)
            if not step.ok:
                return Result(False, f"proximal re-solve {step.status}", None, np.nan, time.perf_counter() - t0)
            change = float(np.abs(step.x - res.x)[watched].max())
            res = step
            if change <= PROXIMAL_CHANGE:
                return res
        return Result(False, f"proximal re-solves still moving ({change:.2g})", None, np.nan,
                      time.perf_counter() - t0)

    def _lp(self, c, a, lo, hi, lb, ub, integer, presolve) -> Result:
        t0, c0 = time.perf_counter(), time.thread_time()
        m, z = box_model(a, lo, hi)
        set_bounds(z, lb, ub)
        if integer is not None:
            for i in np.flatnonzero(integer).tolist():
                z[i].domain = pyo.Integers
        m.obj = pyo.Objective(expr=linear(z, c))
        self.clock["build"] += time.thread_time() - c0
        c = np.asarray(c, float)
        return self._solve(self.solver, m, z, "milp" if integer is not None else "lp", presolve, t0, lambda x: c @ x)

    def _solve(self, name: str, m: pyo.ConcreteModel, z: tuple, kind: str, presolve: bool, t0: float,
               objective, extra: dict | None = None) -> Result:
        """Solve ``m`` with solver ``name`` (``extra``: options over the backend's); a solver error or a status
        other than optimal is a failed Result (the failsafe's signal), with the solver's words as its status."""
        opt = self._opt(name, kind)
        options = self._options(name, kind, presolve, len(z), extra)
        c1 = time.thread_time()
        try:
            if _is_persistent_v1(opt):
                opt.set_instance(m)  # it would not see changed bounds on a reused model
                results = opt.solve(options=options, load_solutions=False)
                if results.solver.termination_condition == TerminationCondition.optimal:
                    opt.load_vars()
            else:
                if _is_persistent_v2(opt) and getattr(opt, "_model", None) is not m:
                    hand_over(opt, m, z)
                results = opt.solve(m, options=options)  # loads the solution where there is one
            cond = results.solver.termination_condition
        except Exception as exc:  # noqa: BLE001 - the failsafe decides what a failed solve means
            self.clock["solve"] += time.thread_time() - c1
            self._opts.pop((name, kind == "qp"), None)  # a fresh solver object, and no model reused, next time
            self._last = None
            return Result(False, _failure(exc), None, np.nan, time.perf_counter() - t0)
        c2 = time.thread_time()
        self.clock["solve"] += c2 - c1
        if cond != TerminationCondition.optimal:
            return Result(False, str(cond), None, np.nan, time.perf_counter() - t0)
        x = values(z)
        self.clock["read"] += time.thread_time() - c2
        return Result(True, "Optimal", x, float(objective(x)), time.perf_counter() - t0)


def _failure(exc: Exception) -> str:
    """A solve's exception as a short status: the persistent interfaces raise one when they find no feasible
    solution to load."""
    text = str(exc)
    if "feasible solution was not found" in text:
        return "no feasible solution"
    first = text.splitlines()[0] if text else ""
    return f"{type(exc).__name__}: {first[:200]}"


def _is_persistent_v2(opt) -> bool:
    """An interface of ``pyomo.contrib.solver`` or ``pyomo.contrib.appsi`` that keeps its instance and
    updates it from the model on each solve (``highs``, ``appsi_highs``, ``gurobi_persistent_v2`` ...)."""
    return all(hasattr(opt, f) for f in ("set_instance", "add_variables", "add_constraints", "set_objective")) \
        and not _is_persistent_v1(opt)


def _only_bounds_and_objective_change(opt) -> None:
    """Tell a persistent interface (``_is_persistent_v2``) that a model solved again has the same variables and
    rows (the backend reuses a model only then): it then compares only bounds and the objective."""
    config = getattr(getattr(opt, "config", None), "auto_updates", None)  # pyomo.contrib.solver
    if config is None:
        config = getattr(opt, "update_config", None)  # pyomo.contrib.appsi
    if config is None:
        return
    for key in ("check_for_new_or_removed_constraints", "check_for_new_or_removed_vars",
                "check_for_new_or_removed_params", "update_constraints", "update_named_expressions"):
        if key in config:
            setattr(config, key, False)
    for key in ("update_parameters", "update_params"):
        if key in config:
            setattr(config, key, False)


def hand_over(opt, m: pyo.ConcreteModel, z: tuple) -> None:
    """Give a persistent interface a new model: the columns in one call, then the rows, then the objective
    (its ``set_instance`` alone adds the columns row by row, one call to the solver each)."""
    rows, obj = m.rows, m.obj
    rows.deactivate()
    obj.deactivate()
    try:
        opt.set_instance(m)
        opt.add_variables(list(z))
    finally:
        rows.activate()
        obj.activate()
    opt.add_constraints(list(rows.values()))
    opt.set_objective(obj)


def _same_rows(a: tuple, b: tuple) -> bool:
    """Whether two ``(A, lo, hi)`` are the same rows (the L2 passes of a parent pass the same arrays)."""
    (a1, lo1, hi1), (a2, lo2, hi2) = a, b
    if a1 is not a2 and (a1.shape != a2.shape or (a1 != a2).nnz):
        return False
    return np.array_equal(lo1, lo2) and np.array_equal(hi1, hi2)


def box_model(a: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray) -> tuple[pyo.ConcreteModel, tuple]:
    """A ConcreteModel of the rows ``lo <= A z <= hi`` (``rows``, one linear expression each, built from the
    CSR arrays) over free columns ``z``."""
    a = sp.csr_matrix(a)
    m = pyo.ConcreteModel(name="pass")
    m.z = pyo.Var(range(a.shape[1]))
    z = tuple(m.z.values())
    data, cols, ptr = a.data.tolist(), a.indices.tolist(), a.indptr.tolist()
    low = [_bound(v) for v in np.asarray(lo, float).tolist()]
    up = [_bound(v) for v in np.asarray(hi, float).tolist()]

    def row(_, r):
        s, e = ptr[r], ptr[r + 1]
        return relation(low[r], linear_sum(z, data[s:e], cols[s:e]), up[r])

    m.rows = pyo.Constraint(range(a.shape[0]), rule=row)
    return m, z


def relation(low: float | None, body, up: float | None):
    """``low <= body <= up`` as a Pyomo relational expression (equal bounds: an equality)."""
    if low is not None and low == up:
        return EqualityExpression((body, low))
    if low is None:
        return InequalityExpression((body, up), False)
    if up is None:
        return InequalityExpression((low, body), False)
    return RangedExpression((low, body, up), (False, False))


def set_bounds(z: tuple, lb: np.ndarray, ub: np.ndarray) -> None:
    """Column bounds (infinite: none)."""
    for v, low, up in zip(z, np.asarray(lb, float).tolist(), np.asarray(ub, float).tolist()):
        v.setlb(_bound(low))
        v.setub(_bound(up))


def linear_sum(z: tuple, coefs: list[float], cols: list[int]) -> LinearExpression:
    """``sum coefs[k] z[cols[k]]`` as one LinearExpression of its terms (a unit coefficient: the variable)."""
    return LinearExpression([z[j] if c == 1.0 else MonomialTermExpression((c, z[j])) for c, j in zip(coefs, cols)])


def linear(z: tuple, c: np.ndarray) -> LinearExpression:
    """``c'z`` over the columns with a non-zero cost."""
    c = np.asarray(c, float)
    nz = np.flatnonzero(c)
    return linear_sum(z, c[nz].tolist(), nz.tolist())


def objective_scaled(p_diag: np.ndarray, q: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A QP's objective divided by its largest curvature (``p_diag``'s largest entry), the same optimum: a
    solver's absolute tolerances on the gradient then mean the same on every pass. An L2 pass's curvatures are
    its measurements' weights (5.8e-4 at a 1940 DHC Enumdist parent's last pass, where HiGHS's active-set QP
    fails at every regularization unscaled and solves at every one scaled: benchmarks/RESULTS_pyomo.md)."""
    top = float(p_diag.max(initial=0.0))
    return (p_diag / top, q / top) if top > 0 else (p_diag, q)


def quadratic(z: tuple, p_diag: np.ndarray, q: np.ndarray):
    """``1/2 z' diag(p_diag) z + q'z``."""
    p_diag = np.asarray(p_diag, float)
    quad = np.flatnonzero(p_diag)
    return linear(z, q) + pyo.quicksum((0.5 * p) * z[i] ** 2 for i, p in zip(quad.tolist(), p_diag[quad].tolist()))


def values(z: tuple) -> np.ndarray:
    """The columns' values; a column the solver never saw (in no row, no cost) gets 0 clipped to its bounds."""
    out = np.empty(len(z))
    for i, v in enumerate(z):
        val = v.value
        if val is None:
            low, up = v.lb, v.ub
            val = min(max(0.0, -np.inf if low is None else low), np.inf if up is None else up)
        out[i] = val
    return out


# Two-variable problems of each class, with their optima (check_solvers).
_PROBE_A = sp.csr_matrix(np.array([[1.0, 2.0], [2.0, 1.0]]))
_PROBE_LO, _PROBE_HI = np.full(2, -np.inf), np.full(2, 2.0)
_PROBE_LB, _PROBE_UB = np.zeros(2), np.full(2, np.inf)


def _probe(backend: PyomoBackend, kind: str) -> str | None:
    """Why ``backend`` fails a two-variable problem of class ``kind`` (None: solved right)."""
    if kind == "qp":  # min (z0 - 1/2)^2 + (z1 - 1/4)^2: z = (1/2, 1/4), inside the rows
        res, want = backend.qp(np.full(2, 2.0), np.array([-1.0, -0.5]), _PROBE_A, _PROBE_LO, _PROBE_HI,
                               _PROBE_LB, _PROBE_UB), np.array([0.5, 0.25])
    else:  # max z0 + z1: (2/3, 2/3) as an LP; (1, 0) or (0, 1) with integers
        integer = np.ones(2, dtype=bool) if kind == "milp" else None
        res = backend.lp(-np.ones(2), _PROBE_A, _PROBE_LO, _PROBE_HI, _PROBE_LB, _PROBE_UB, integer=integer)
        want = None if kind == "milp" else np.full(2, 2.0 / 3.0)
    if not res.ok:
        return f"it returned {res.status}"
    if want is not None and not np.allclose(res.x, want, atol=1e-5):
        return f"it returned {np.round(res.x, 6).tolist()}, not the optimum {np.round(want, 6).tolist()}"
    if want is None and not (np.allclose(res.x, np.round(res.x), atol=1e-6) and abs(res.objective + 1.0) < 1e-6):
        return f"it returned {np.round(res.x, 6).tolist()}, not an integer optimum"
    return None


def check_solvers(solver: str, qp_solver: str | None = None, options: Mapping[str, Any] | None = None) -> None:
    """Raise :class:`SolverUnusable` (one line naming the solver and the pass) unless every pass's solver is
    known, available and solves a small problem of the pass's class."""
    backend = PyomoBackend(solver, qp_solver, options)
    tried: dict[tuple[str, str], str | None] = {}
    for what, (kind, words) in PASS_CLASSES.items():
        name = backend.qp_solver if kind == "qp" else backend.solver
        if (name, kind) not in tried:
            tried[(name, kind)] = _probe(backend, kind)
        if tried[(name, kind)] is not None:
            raise SolverUnusable(f"solver {name!r} cannot solve the {what} ({words}): on a two-variable "
                                 f"{kind.upper()} {tried[(name, kind)]}")
