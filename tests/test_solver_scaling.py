"""Regression tests for a numerical failure of the L2 QPs on dense, populous parents.

On Rhode Island 2010 the State -> County parent (1M persons, 5 counties) needed failsafe step 1:
Clarabel reported "DualInfeasible" for an L2 pass, which a QP with a diagonal PSD objective cannot be.
Cause: the hhgq upper bounds 99999 x units (DAS-2020 `calculateRightHandSideHhgqTotal`) reach 1e10 while the
tau bands are ~1e-3 wide in scaled units. Fixes (solvers/layout.py, solvers/backends.py): inequalities that
cannot bind given the parent are left out of the model, and a dual-infeasibility verdict on such a QP is re-solved with
strict infeasibility tolerances. ``dense_parent`` below failed (failsafe, for seed 4 exhausted) before.
"""
from __future__ import annotations

import numpy as np
import pytest

import topdown.solvers.backends as backends
import topdown.solvers.layout as layout_mod
from topdown.vocab.queries import build_query
from topdown.pipeline.configuration.census import PERSONS
from topdown.solvers import Constraint, Measurement, ParentProblem, solve_parent
from topdown.solvers.backends import (ClarabelHighs, PiqpHighs, has_band, piqp_attempts, piqp_form,
                                      piqp_solve)
from topdown.solvers.direct import compile_direct
from topdown.solvers.layout import build_layout

#: Variances of the 2021 production strategy at the County level of a 1M-person state (RI 2010).
VARIANCE = {"total": 4.7, "cenrace": 1470.0, "hispanic": 1470.0, "votingage": 1470.0, "hhinstlevels": 1470.0,
            "hhgq": 1470.0, "hispanic * cenrace": 525.0, "votingage * cenrace": 525.0,
            "votingage * hispanic": 1470.0, "votingage * hispanic * cenrace": 145.5, "detailed": 19.5}
ROUNDER = [["total"], ["hhgq", "hhgq * hispanic", "hhgq * hispanic * cenrace", "hhgq * votingage * hispanic * cenrace",
                       "detailed"]]


def dense_parent(seed: int, k: int = 5, people: int = 1_000_000, ncells: int = 108) -> ParentProblem:
    """A state-like parent: k uneven children, households only, production passes and variances,
    hhgq_total_ub = 99999 x housing units (2.5 persons per unit)."""
    rng = np.random.default_rng(seed)
    hh = PERSONS.unravel(np.arange(PERSONS.ncells))[0]
    cells = rng.choice(np.flatnonzero(hh == 0), ncells, replace=False)
    share = rng.dirichlet(np.full(k, 0.8))
    weights = rng.dirichlet(np.full(ncells, 0.3))
    truth = np.zeros((k, PERSONS.ncells), dtype=np.int64)
    for c in range(k):
        truth[c, cells] = rng.multinomial(int(people * share[c]), weights)
    meas = []
    for name, var in VARIANCE.items():
        q = build_query(PERSONS, name)
        noisy = q.answer(truth) + rng.normal(0.0, np.sqrt(var), (k, q.n_answers))
        meas.append(Measurement(name, np.round(noisy), np.full(k, var)))
    units = np.zeros((k, 8))
    units[:, 0] = truth.sum(axis=1) // 2.5
    cons = [Constraint("hhgq_total_lb", "hhgq", ">=", np.zeros((k, 8))),
            Constraint("hhgq_total_ub", "hhgq", "<=", units * 99999.0),
            Constraint("nurse_nva_0", "gqNursingTotal * nonvoting", "==", np.zeros((k, 1)))]
    return ParentProblem(PERSONS, "state", [f"county{c}" for c in range(k)], truth.sum(axis=0), meas, cons,
                         l2_passes=[["total"], [q for q in VARIANCE if q != "total"]], rounder_passes=ROUNDER)


def _assert_valid(problem: ParentProblem, hist: np.ndarray) -> None:
    assert (hist >= 0).all()
    np.testing.assert_array_equal(hist.sum(axis=0), problem.parent_hist)
    for con in problem.constraints:
        ans = build_query(PERSONS, con.query).answer(hist).astype(float)
        ok = {"==": ans == con.rhs, "<=": ans <= con.rhs, ">=": ans >= con.rhs}[con.sense]
        assert ok.all(), con.name


@pytest.mark.parametrize("seed", [0, 4])
def test_dense_parent_needs_no_failsafe(seed):
    problem = dense_parent(seed)
    sol = solve_parent(problem)
    assert sol.failsafe == []
    assert [st["status"] for st in sol.stats.l2] == ["Solved", "Solved"]
    _assert_valid(problem, sol.hist)


@pytest.mark.parametrize("backend", [ClarabelHighs(), PiqpHighs()], ids=["clarabel", "piqp"])
def test_backend_resolves_spurious_dual_infeasibility(monkeypatch, backend):
    """With the non-binding rows kept in the model, the backend alone copes: Clarabel by its strict
    re-solve; PIQP itself or, where it stops at its iteration limit on the banded pass (as with HiGHS
    1.15's tau), by handing the QP to Clarabel."""
    caps = layout_mod._answer_caps
    monkeypatch.setattr(layout_mod, "_answer_caps", lambda *a: np.full_like(caps(*a), np.inf))
    problem = dense_parent(4)
    assert len(build_layout(problem).families["constraints"]) == 5  # the 99999 x units rows are in
    sol = solve_parent(problem, backend)
    assert sol.failsafe == []
    _assert_valid(problem, sol.hist)
    if isinstance(backend, PiqpHighs):
        assert {st["status"] for st in sol.stats.l2} <= {"Solved", "PIQP MaxIterReached, Clarabel Solved"}


def test_piqp_hands_an_unsolved_qp_to_clarabel():
    """A QP PIQP does not solve (here: one iteration allowed) is solved by Clarabel, and the status says so."""
    problem = dense_parent(1, k=3, people=3000, ncells=20)
    layout = build_layout(problem)
    form = compile_direct(layout)
    n = form.shape[1]
    p_diag, q = np.ones(n), -np.arange(n, dtype=float)
    res = PiqpHighs(max_iter=1).qp(p_diag, q, form.a, form.lo, form.hi, form.lb, form.ub)
    ref = ClarabelHighs().qp(p_diag, q, form.a, form.lo, form.hi, form.lb, form.ub)
    assert res.ok and res.status == "PIQP MaxIterReached, Clarabel Solved"
    np.testing.assert_array_equal(res.x, ref.x)
    good = PiqpHighs().qp(p_diag, q, form.a, form.lo, form.hi, form.lb, form.ub)
    assert good.ok and good.status == "Solved" and np.abs(good.x - ref.x).max() < 1e-5


def test_piqp_solves_again_at_its_loose_tolerance_a_qp_it_does_not_solve_at_its_tight_one():
    """A QP PIQP does not solve at its tolerance (here an unreachable one), as is or refined, is solved again
    by PIQP at the loose tolerance, refined (the same answer as PIQP held to that alone), and the status says
    so; no Clarabel."""
    problem = dense_parent(1, k=3, people=3000, ncells=20)
    form = compile_direct(build_layout(problem))
    n = form.shape[1]
    p_diag, q = np.ones(n), -np.arange(n, dtype=float)
    args = (p_diag, q, form.a, form.lo, form.hi, form.lb, form.ub)
    res = PiqpHighs(tol=1e-30, max_iter=30).qp(*args)
    status, x, _ = piqp_solve(*piqp_form(*args), 1e-9, 30, True)
    assert res.ok and res.status == ("PIQP MaxIterReached at 1e-30, PIQP MaxIterReached at 1e-30 refined, "
                                     "Solved at 1e-09 refined")
    assert status == "Solved"
    np.testing.assert_array_equal(res.x, x)
    assert piqp_attempts(1e-11, 1e-9) == [(1e-11, False), (1e-11, True), (1e-9, True)]
    assert piqp_attempts(1e-11, 1e-9, banded=True) == [(1e-11, True), (1e-11, False), (1e-9, True)]


@pytest.mark.parametrize("lb, ub, banded", [((0.0, -np.inf), (np.inf, np.inf), False),
                                            ((0.0, 2.0), (np.inf, 2.0), False),
                                            ((0.0, 1.9), (np.inf, 2.1), True)])
def test_a_qp_is_banded_where_a_column_is_boxed_with_room(lb, ub, banded):
    """A tau band boxes a column on both sides; a free, one-sided or fixed column is no band."""
    assert has_band(np.array(lb), np.array(ub)) == banded


def test_a_banded_qp_is_tried_refined_first_where_asked_and_gets_the_same_optimum(monkeypatch):
    """With ``refine_banded``, a banded QP's first try is refined; it gives the optimum of the plain try, and
    without the setting the plain try comes first (the P.L. 94-171 presets' pinned outputs)."""
    problem = dense_parent(1, k=3, people=300, ncells=8)
    form = compile_direct(build_layout(problem))
    n = form.shape[1]
    p_diag, q = np.ones(n), -np.arange(n, dtype=float)
    lb, ub = form.lb.copy(), form.ub.copy()
    free = np.flatnonzero(~np.isfinite(ub))
    lb[free[0]], ub[free[0]] = -0.1, 0.1
    args = (p_diag, q, form.a, form.lo, form.hi, lb, ub)
    calls = []

    def spy(*a):
        calls.append(a[-1])
        return piqp_solve(*a)

    monkeypatch.setattr(backends, "piqp_solve", spy)
    res = PiqpHighs(refine_banded=True, isolate_above=None).qp(*args)
    plain = PiqpHighs(isolate_above=None).qp(*args)
    unbanded = PiqpHighs(refine_banded=True, isolate_above=None).qp(p_diag, q, form.a, form.lo, form.hi, form.lb,
                                                                   form.ub)
    assert calls == [True, False, False] and res.ok and plain.ok and unbanded.ok
    np.testing.assert_allclose(res.x, plain.x, atol=1e-7)


def test_layout_leaves_out_only_rows_that_cannot_bind():
    problem = dense_parent(1, k=3, people=3000, ncells=20)
    total = problem.parent_hist.sum()
    # A binding upper bound (below the parent's household count) and a binding lower bound stay.
    problem.constraints = [Constraint("ub", "hhgq", "<=", np.tile([total - 1.0] + [0.0] * 7, (3, 1))),
                           Constraint("ub_loose", "hhgq", "<=", np.tile([float(total)] + [0.0] * 7, (3, 1))),
                           Constraint("lb", "hhgq", ">=", np.tile([1.0] + [0.0] * 7, (3, 1)))]
    lay = build_layout(problem)
    kept = {(problem.constraints[r.constraint].name, r.child, r.answer) for r in lay.constraint_rows}
    assert kept == {("ub", c, 0) for c in range(3)} | {("lb", c, 0) for c in range(3)}
    # The root has no parent to bound an answer: nothing is left out there.
    root = ParentProblem(PERSONS, "us", ["us"], None, [Measurement("total", np.array([[total]]), np.ones(1))],
                         [Constraint("ub", "hhgq", "<=", np.array([[1e10] + [0.0] * 7]))], l2_passes=[["total"]],
                         rounder_passes=[["total"]])
    assert len(build_layout(root).constraint_rows) == 1


def national_root(seed: int, people: int = 334_870_478, ncells: int = 400) -> ParentProblem:
    """The US root of a national run: one child of 335 M persons, its total an invariant, the
    production measurements' variances at the US level, and hhgq_total_ub = 99999 x 145 M housing units
    (1.4e13). Were the upper bound to set the root's scale (1.4e13 / 1e4), the L2 solution would be 13,740
    persons off the invariant total and the rounder infeasible."""
    rng = np.random.default_rng(seed)
    cells = rng.choice(PERSONS.ncells, ncells, replace=False)
    truth = np.zeros((1, PERSONS.ncells), dtype=np.int64)
    truth[0, cells] = rng.multinomial(people, rng.dirichlet(np.full(ncells, 0.5)))
    meas = []
    for name, var in {"total": 2429.6, "hhgq": 2429.6, "votingage * hispanic * cenrace": 142.9,
                      "detailed": 19.7}.items():
        q = build_query(PERSONS, name)
        meas.append(Measurement(name, np.round(q.answer(truth) + rng.normal(0.0, np.sqrt(var), (1, q.n_answers))),
                                np.full(1, var)))
    hhgq = build_query(PERSONS, "hhgq").answer(truth).astype(float)
    units = np.maximum(hhgq / 2.3, 1.0)
    cons = [Constraint("hhgq_total_lb", "hhgq", ">=", np.minimum(units, hhgq)),
            Constraint("hhgq_total_ub", "hhgq", "<=", units * 99999.0),
            Constraint("total", "total", "==", np.array([[float(people)]]))]
    return ParentProblem(PERSONS, "", ["US"], None, meas, cons,
                         l2_passes=[["total", "hhgq"], ["votingage * hispanic * cenrace", "detailed"]],
                         rounder_passes=[["total", "hhgq", "detailed"]])


def test_root_of_national_size_meets_its_invariant_total():
    problem = national_root(1)
    layout = build_layout(problem)
    assert layout_mod.root_totals(problem).tolist() == [334_870_478.0]
    assert not [r for r in layout.constraint_rows if r.sense == "<="]  # no upper bound can bind under the total
    sol = solve_parent(problem)
    assert sol.failsafe == []
    assert sol.hist.sum() == 334_870_478
    assert (sol.hist >= 0).all()
    hhgq = build_query(PERSONS, "hhgq").answer(sol.hist)
    assert (hhgq >= problem.constraints[0].rhs).all()


def test_refine_banded_is_a_setting_of_piqp_on_the_direct_path_and_unwritten_when_off():
    """Off, the key is not written (config.json and the config hash of earlier runs stay theirs); on, the
    run's back end refines banded passes first; with another back end or the Pyomo path it is refused."""
    from topdown.pipeline.configuration.config import EstimationConfig
    from topdown.pipeline.execution.tasks import estimation_solvers
    from topdown.solvers.backends import DEFAULT_BACKEND, REFINED_BANDS

    off = EstimationConfig(l2_passes={}, rounder_passes={})
    on = EstimationConfig(l2_passes={}, rounder_passes={}, refine_banded=True)
    assert "refine_banded" not in off.model_dump() and on.model_dump()["refine_banded"] is True
    assert estimation_solvers(off)[0] is DEFAULT_BACKEND and estimation_solvers(on)[0] is REFINED_BANDS
    assert REFINED_BANDS.refine_banded and not DEFAULT_BACKEND.refine_banded
    for other in ({"backend": "clarabel-highs"}, {"compiler": "pyomo"}):
        with pytest.raises(ValueError, match="refine_banded = true is a setting of PIQP on the direct path"):
            EstimationConfig(l2_passes={}, rounder_passes={}, refine_banded=True, **other)
