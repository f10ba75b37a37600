"""Tests of topdown.solvers.solve_parent: exactness without noise, L2 passes against independent solves,
properties on random parents, failsafe, root problem, units schema, determinism, Pyomo = direct build."""
from __future__ import annotations

import numpy as np
import pytest
import highspy
import scipy.sparse as sp
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from topdown.vocab.queries import build_query
from topdown.pipeline.configuration.census import PERSONS, UNITS
from topdown.solvers import (Constraint, FailsafeExhausted, GroupTotal, Measurement, ParentProblem,
                             ProblemError, solve_parent)
from topdown.solvers.backends import DEFAULT_BACKEND
from topdown.solvers.direct import compile_direct
from topdown.solvers.l2 import run_l2
from topdown.solvers.layout import build_layout
from topdown.solvers.model import compile_pyomo
from topdown.solvers.standard import restrict_form

MEASURED = ["total", "hhgq", "votingage * hispanic", "votingage * hispanic * cenrace", "detailed"]
VARIANCE = {"total": 4.0, "hhgq": 15.0, "votingage * hispanic": 12.0, "votingage * hispanic * cenrace": 50.0,
            "detailed": 100.0}
L2_PASSES = [["total"], ["hhgq", "votingage * hispanic", "votingage * hispanic * cenrace", "detailed"]]
ROUNDER_PASSES = [["total"], ["hhgq", "hhgq * hispanic", "hhgq * hispanic * cenrace",
                              "hhgq * votingage * hispanic * cenrace", "detailed"]]


def random_truth(rng: np.random.Generator, k: int, n_cells: int, people: int) -> np.ndarray:
    """k child histograms on a few person cells; no minors in nursing facilities (`nurse_nva_0`)."""
    hh, va, _, _ = PERSONS.unravel(np.arange(PERSONS.ncells))
    allowed = np.flatnonzero(~((hh == 3) & (va == 0)))
    cells = rng.choice(allowed, n_cells, replace=False)
    truth = np.zeros((k, PERSONS.ncells), dtype=np.int64)
    for c in range(k):
        picks = rng.choice(cells, people)
        np.add.at(truth[c], picks, 1)
    return truth


def invariant_constraints(rng: np.random.Generator, truth: np.ndarray) -> list[Constraint]:
    """hhgq_total_lb/ub (DAS-2020 `calculateRightHandSideHhgqTotal`, no state total) from synthetic facility
    counts, and nurse_nva_0."""
    per_type = build_query(PERSONS, "hhgq").answer(truth)
    facilities = np.where(per_type > 0, np.minimum(per_type, rng.integers(1, 3, per_type.shape)), 0)
    facilities[:, 0] = per_type[:, 0] > 0
    lb = np.where(np.arange(8) == 0, 0, facilities).astype(float)
    ub = facilities * 99999.0
    k = truth.shape[0]
    return [Constraint("hhgq_total_lb", "hhgq", ">=", lb), Constraint("hhgq_total_ub", "hhgq", "<=", ub),
            Constraint("nurse_nva_0", "gqNursingTotal * nonvoting", "==", np.zeros((k, 1)))]


def make_problem(truth: np.ndarray, rng: np.random.Generator | None, noise: float = 1.0,
                 schema=PERSONS, measured=MEASURED, constraints=None, l2_passes=L2_PASSES,
                 rounder_passes=ROUNDER_PASSES) -> ParentProblem:
    """A ParentProblem with Gaussian noise of variance noise*VARIANCE (noise 0: exact measurements)."""
    k = truth.shape[0]
    meas = []
    for q in measured:
        ans = build_query(schema, q).answer(truth).astype(float)
        var = VARIANCE.get(q, 10.0)
        if noise > 0:
            ans = ans + rng.normal(0.0, np.sqrt(noise * var), ans.shape)
        meas.append(Measurement(q, ans, np.full(k, var)))
    if constraints is None:
        constraints = invariant_constraints(rng or np.random.default_rng(0), truth) if schema is PERSONS else []
    return ParentProblem(schema, "parent", [f"child{c}" for c in range(k)], truth.sum(axis=0), meas,
                         constraints, l2_passes=l2_passes, rounder_passes=rounder_passes)


def assert_valid(problem: ParentProblem, hist: np.ndarray) -> None:
    """Non-negative integers, exact parent sums, every constraint and group total (checked independently)."""
    assert hist.dtype == np.int64 and hist.shape == (problem.n_children, problem.schema.ncells)
    assert (hist >= 0).all()
    if problem.parent_hist is not None:
        np.testing.assert_array_equal(hist.sum(axis=0), problem.parent_hist)
    for con in problem.constraints:
        ans = build_query(problem.schema, con.query).answer(hist).astype(float)
        ok = np.isfinite(con.rhs)
        got, rhs = ans[ok], con.rhs[ok]
        assert {"==": np.all(got == rhs), "<=": np.all(got <= rhs), ">=": np.all(got >= rhs)}[con.sense], con.name
    for g in problem.group_totals:
        assert hist[g.children].sum() == g.total


@pytest.mark.parametrize("seed", range(4))
def test_zero_noise_reproduces_truth(seed):
    rng = np.random.default_rng(seed)
    truth = random_truth(rng, k=int(rng.integers(2, 7)), n_cells=12, people=25)
    sol = solve_parent(make_problem(truth, rng, noise=0.0))
    np.testing.assert_array_equal(sol.hist, truth)
    assert sol.failsafe == [] and sol.stats.rounder_milp == 0


def _dense_reference(problem: ParentProblem, queries: list[str], with_detailed: bool, band=None):
    """Independent solve of one L2 pass: the dense QP on parent-positive cells, HiGHS's own QP solver.

    ``band`` = (tol, totals): |child total - totals[c]| <= tol. Returns (x[k, cells], cells, objective fn).
    """
    k = problem.n_children
    cells = np.flatnonzero(problem.parent_hist > 0)
    m = cells.size
    hess, lin, terms = np.zeros((k * m, k * m)), np.zeros(k * m), []
    for meas in problem.measurements:
        if not (meas.query in queries and meas.query != "detailed" or meas.query == "detailed" and with_detailed):
            continue
        mat = build_query(problem.schema, meas.query).matrix()[:, cells].toarray()
        for c in range(k):
            w = 1.0 / meas.variance[c]
            sl = slice(c * m, (c + 1) * m)
            hess[sl, sl] += 2 * w * mat.T @ mat
            lin[sl] += -2 * w * mat.T @ meas.values[c]
            terms.append((c, mat, meas.values[c], w))
    rows, lo, hi = [np.tile(np.eye(m), k)], [problem.parent_hist[cells]], [problem.parent_hist[cells]]
    for con in problem.constraints:
        mat = build_query(problem.schema, con.query).matrix()[:, cells].toarray()
        for c in range(k):
            for j in np.flatnonzero(np.isfinite(con.rhs[c])):
                row = np.zeros((1, k * m))
                row[0, c * m:(c + 1) * m] = mat[j]
                rows.append(row)
                r = con.rhs[c, j]
                lo.append([r if con.sense in ("==", ">=") else -np.inf])
                hi.append([r if con.sense in ("==", "<=") else np.inf])
    if band is not None:
        tol, totals = band
        for c in range(k):
            row = np.zeros((1, k * m))
            row[0, c * m:(c + 1) * m] = 1.0
            rows.append(row)
            lo.append([totals[c] - tol])
            hi.append([totals[c] + tol])
    a = sp.csc_matrix(np.vstack(rows))
    h = highspy.Highs()
    h.setOptionValue("output_flag", False)
    lp = highspy.HighsLp()
    lp.num_col_, lp.num_row_ = k * m, a.shape[0]
    lp.col_cost_, lp.col_lower_, lp.col_upper_ = lin, np.zeros(k * m), np.full(k * m, np.inf)
    lp.row_lower_, lp.row_upper_ = np.concatenate(lo).astype(float), np.concatenate(hi).astype(float)
    lp.a_matrix_.format_ = highspy.MatrixFormat.kColwise
    lp.a_matrix_.start_, lp.a_matrix_.index_, lp.a_matrix_.value_ = a.indptr, a.indices, a.data
    model = highspy.HighsModel()
    model.lp_ = lp
    tri = sp.csc_matrix(np.tril(hess))
    model.hessian_.dim_ = k * m
    model.hessian_.format_ = highspy.HessianFormat.kTriangular
    model.hessian_.start_, model.hessian_.index_, model.hessian_.value_ = tri.indptr, tri.indices, tri.data
    h.passModel(model)
    h.run()
    assert h.getModelStatus() == highspy.HighsModelStatus.kOptimal
    x = np.asarray(h.getSolution().col_value).reshape(k, m)

    def f(v):
        v = v.reshape(k, m)
        return sum(w * np.sum((mat @ v[c] - y) ** 2) for c, mat, y, w in terms)
    return x, cells, f


@pytest.mark.parametrize("seed", range(3))
def test_l2_passes_match_independent_solve(seed):
    rng = np.random.default_rng(100 + seed)
    truth = random_truth(rng, k=3, n_cells=6, people=15)
    problem = make_problem(truth, rng, noise=4.0)
    layout = build_layout(problem)
    l2 = run_l2(layout, compile_pyomo(layout), DEFAULT_BACKEND)
    # Pass 0 (total only): objective values agree (its optimum is not unique in x).
    ref0, cells, f0 = _dense_reference(problem, ["total"], False)
    assert np.array_equal(layout.cells, cells)  # the layout is over the parent's non-zero cells only
    ours0 = l2.pass_values[0][layout.xcol.clip(0)] * (layout.xcol >= 0)
    assert f0(ours0.ravel()) == pytest.approx(f0(ref0.ravel()), rel=1e-6, abs=1e-6)
    # Pass 1: strictly convex (detailed term), so x itself must agree; keep pass 0's tau band.
    ref1, _, _ = _dense_reference(problem, L2_PASSES[1], True, band=(l2.tolerances[0], ours0.sum(axis=1)))
    ours1 = l2.z[layout.xcol.clip(0)] * (layout.xcol >= 0)
    np.testing.assert_allclose(ours1, ref1, atol=2e-4)


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(2, 6), n_cells=st.integers(1, 15),
       noise=st.sampled_from([0.5, 1.0, 10.0]))
def test_random_parents_properties(seed, k, n_cells, noise):
    rng = np.random.default_rng(seed)
    truth = random_truth(rng, k, n_cells, people=int(rng.integers(1, 40)))
    problem = make_problem(truth, rng, noise=noise)
    sol = solve_parent(problem)
    assert_valid(problem, sol.hist)
    assert sol.failsafe == []
    layout = build_layout(problem)
    l2 = run_l2(layout, compile_pyomo(layout), DEFAULT_BACKEND)
    for kk, tol in enumerate(l2.tolerances):
        cols = l2.band_cols[kk]
        for later in l2.pass_values[kk + 1:]:
            assert np.abs(later[cols] - l2.pass_values[kk][cols]).max() <= tol + 1e-6


def test_pyomo_and_direct_builds_agree():
    rng = np.random.default_rng(7)
    truth = random_truth(rng, k=4, n_cells=20, people=40)
    problem = make_problem(truth, rng, noise=1.0)
    layout = build_layout(problem)
    a, b = compile_pyomo(layout), compile_direct(layout)
    assert (a.a != b.a).nnz == 0
    np.testing.assert_array_equal(a.lo, b.lo)
    np.testing.assert_array_equal(a.hi, b.hi)
    np.testing.assert_array_equal(solve_parent(problem).hist, solve_parent(problem, compiler=compile_direct).hist)


@settings(max_examples=20, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 2**31 - 1), k=st.integers(1, 6), n_cells=st.integers(1, 25),
       relax=st.sampled_from([(False, False), (True, False), (True, True)]))
def test_direct_build_is_the_pyomo_model(seed, k, n_cells, relax):
    """The pipeline's compiler (the direct build, ``solve.DEFAULT_COMPILER``) gives the Pyomo model's
    compiled rows entry for entry, also through Pyomo's own LinearStandardFormCompiler, on random parents
    and at every failsafe layout (relaxed parent, relaxed inequalities): the same problem."""
    from topdown.solvers.model import build_model, compile_with_pyomo
    from topdown.solvers.solve import DEFAULT_COMPILER

    rng = np.random.default_rng(seed)
    truth = random_truth(rng, k, n_cells, people=int(rng.integers(1, 60)))
    layout = build_layout(make_problem(truth, rng), relax_parent=relax[0], relax_inequalities=relax[1])
    fast = DEFAULT_COMPILER(layout)
    for ref in (compile_pyomo(layout), compile_with_pyomo(layout, *build_model(layout))):
        assert fast.a.shape == ref.a.shape and (fast.a != ref.a).nnz == 0
        for name in ("lo", "hi", "lb", "ub"):
            np.testing.assert_array_equal(getattr(fast, name), getattr(ref, name))
        assert fast.rows == ref.rows


def test_identity_query_uses_counts_and_l2_drops_rounder_only_columns():
    """A query that is the identity on cells gets the x columns; the L2 passes solve a form without the
    rounder-only queries' aux columns, and their solution extends to the full form."""
    rng = np.random.default_rng(5)
    truth = random_truth(rng, k=4, n_cells=20, people=40)
    problem = make_problem(truth, rng, noise=1.0, constraints=invariant_constraints(rng, truth))
    layout = build_layout(problem)
    identity = build_query(PERSONS, "hhgq * votingage * hispanic * cenrace").name
    assert layout.acol[identity] is layout.xcol
    form = compile_pyomo(layout)
    sub, keep = restrict_form(layout, form, {q for names in L2_PASSES for q in names} | {"hhgq"})
    dropped = np.setdiff1d(np.arange(layout.n_cols), keep)
    rounder_only = build_query(PERSONS, "hhgq * hispanic * cenrace").name
    assert np.isin(layout.acol[rounder_only][layout.acol[rounder_only] >= 0], dropped).all()
    assert sub.shape == (form.shape[0] - dropped.size, keep.size)
    l2 = run_l2(layout, form, DEFAULT_BACKEND)
    assert l2.stats[-1]["columns"] == keep.size
    val = form.a @ l2.z
    assert (val >= form.lo - 1e-6).all() and (val <= form.hi + 1e-6).all()


def test_deterministic():
    rng = np.random.default_rng(11)
    truth = random_truth(rng, k=5, n_cells=30, people=60)
    problem = make_problem(truth, rng, noise=1.0)
    assert solve_parent(problem).hist.tobytes() == solve_parent(problem).hist.tobytes()


def _marginal_over_hhgq(hist: np.ndarray) -> np.ndarray:
    return hist.reshape((-1,) + PERSONS.shape).sum(axis=(0, 1))


def test_failsafe_relaxes_the_parent_before_any_edit_constraint():
    """The parent moves the persons of a GQ type into households: the children cannot meet their GQ lower
    bounds under the exact parent. Relaxing the parent along hhgq (DESIGN.md item 8) is enough and comes first:
    every edit constraint holds exactly (relaxing the bound instead would also have been feasible)."""
    rng = np.random.default_rng(3)
    truth = random_truth(rng, k=3, n_cells=12, people=20)
    problem = make_problem(truth, rng, noise=1.0)
    lb = next(c for c in problem.constraints if c.name == "hhgq_total_lb").rhs
    gq_type = next(t for t in range(1, 8) if lb[:, t].sum() > 0)
    parent = problem.parent_hist.reshape(PERSONS.shape).copy()
    parent[0] += parent[gq_type]
    parent[gq_type] = 0
    problem.parent_hist = parent.reshape(-1)
    sol = solve_parent(problem)
    assert sol.stats.level == "relax_parent"
    assert [(s.step, s.action) for s in sol.failsafe if s.relaxes_parent] == [(2, "relax_parent")]
    assert not any(s.action == "relax_constraint" or s.step == 3 for s in sol.failsafe)
    answers = {c.name: build_query(PERSONS, c.query).answer(sol.hist) for c in problem.constraints}
    assert (answers["hhgq_total_lb"] >= lb).all() and answers["hhgq_total_lb"][:, gq_type].sum() >= lb[:, gq_type].sum()
    ub = next(c for c in problem.constraints if c.name == "hhgq_total_ub").rhs
    assert (answers["hhgq_total_ub"] <= ub).all() and (answers["nurse_nva_0"] == 0).all()
    np.testing.assert_array_equal(_marginal_over_hhgq(sol.hist), _marginal_over_hhgq(problem.parent_hist))


def test_failsafe_relaxes_edits_only_when_relaxing_the_parent_fails():
    rng = np.random.default_rng(3)
    truth = random_truth(rng, k=3, n_cells=10, people=20)
    problem = make_problem(truth, rng, noise=1.0)
    lb = next(c for c in problem.constraints if c.name == "hhgq_total_lb")
    lb.rhs[:, 0] = problem.parent_hist.sum()  # every child must hold the whole parent in households
    sol = solve_parent(problem)
    assert sol.stats.level == "relax_parent_and_edits"
    failed = [i for i, step in enumerate(sol.failsafe) if step.action == "level_failed"]
    assert [sol.failsafe[i].message.split(":")[0] for i in failed] == ["level exact failed", "level relax_parent failed"]
    relaxed = [i for i, step in enumerate(sol.failsafe) if step.action == "relax_constraint"]
    assert all("hhgq_total_lb" in sol.failsafe[i].message for i in relaxed)
    assert relaxed and min(relaxed) > max(failed)  # the bound was relaxed only after the parent alone failed
    assert (sol.hist >= 0).all()
    np.testing.assert_array_equal(_marginal_over_hhgq(sol.hist), _marginal_over_hhgq(problem.parent_hist))


def test_failsafe_relaxes_parent_along_hhgq():
    rng = np.random.default_rng(5)
    truth = random_truth(rng, k=3, n_cells=10, people=20)
    problem = make_problem(truth, rng, noise=1.0)
    nursing_minor = PERSONS.cell_index(3, 0, 0, 0)
    problem.parent_hist = problem.parent_hist.copy()
    problem.parent_hist[nursing_minor] += 2  # the parent breaks every child's nurse_nva_0 equality
    sol = solve_parent(problem)
    assert sol.stats.level == "relax_parent"
    assert any(step.relaxes_parent for step in sol.failsafe)
    shape = (problem.n_children,) + PERSONS.shape
    np.testing.assert_array_equal(sol.hist.reshape(shape).sum(axis=(0, 1)),
                                  problem.parent_hist.reshape(PERSONS.shape).sum(axis=0))
    assert sol.hist.reshape(shape)[:, 3, 0].sum() == 0
    assert sol.stats.parent_l1_change >= 4


def test_failsafe_exhausted_raises():
    rng = np.random.default_rng(9)
    truth = random_truth(rng, k=1, n_cells=5, people=10)
    problem = make_problem(truth, rng, noise=1.0, l2_passes=[MEASURED], rounder_passes=[["total", "detailed"]])
    problem.parent_hist = None
    problem.constraints = [Constraint("total", "total", "==", np.array([[10.0]])),
                           Constraint("also_total", "total", "==", np.array([[12.0]]))]
    with pytest.raises(FailsafeExhausted, match="parent 'parent'") as exc:
        solve_parent(problem)
    assert "relax" not in str(exc.value)  # at the root only the exact problem is tried (DESIGN.md item 8)


def test_failsafe_exhausted_exits_with_the_estimation_code(tmp_path, monkeypatch, capsys):
    """FailsafeExhausted is an estimation failure (exit code 5), not an internal error (6)."""
    import topdown.pipeline.execution.runner as runner
    from topdown.pipeline.cli import EXIT_ESTIMATION, main

    def exhausted(*args, **kwargs):
        raise FailsafeExhausted("parent '44007': every failsafe level failed: level exact failed: infeasible")

    monkeypatch.setattr(runner, "run", exhausted)
    assert main(["run", "demo", "--out", str(tmp_path / "run")]) == EXIT_ESTIMATION
    err = capsys.readouterr().err
    assert "estimation failed: parent '44007'" in err and "Traceback" not in err


def test_root_problem_fixes_total():
    rng = np.random.default_rng(2)
    truth = random_truth(rng, k=1, n_cells=40, people=5000)
    problem = make_problem(truth, rng, noise=1.0, l2_passes=[MEASURED], rounder_passes=ROUNDER_PASSES)
    problem.parent_hist = None
    problem.constraints = [Constraint("total", "total", "==", np.array([[float(truth.sum())]]))]
    sol = solve_parent(problem)
    assert sol.hist.shape == (1, PERSONS.ncells) and (sol.hist >= 0).all()
    assert sol.hist.sum() == truth.sum()
    assert np.abs(sol.hist - truth).sum() < 0.2 * truth.sum()


def test_a_measurement_with_no_answer_in_play_adds_no_term():
    """A root whose in-play cells no measured answer counts (an in-play measurement of no answers, cells held
    by a constraint alone) is solved: the measurement adds nothing to the objective."""
    rng = np.random.default_rng(2)
    truth = random_truth(rng, k=1, n_cells=40, people=500)
    problem = make_problem(truth, rng, noise=1.0, l2_passes=[MEASURED], rounder_passes=ROUNDER_PASSES)
    problem.parent_hist = None
    problem.measurements = [Measurement("detailed", np.zeros((1, 0)), np.ones(1), np.zeros(0, np.int64))]
    problem.l2_passes, problem.rounder_passes = [["detailed"]], [["detailed"]]
    problem.support = np.flatnonzero(truth[0])
    problem.constraints = [Constraint("total", "total", "==", np.array([[float(truth.sum())]]))]
    sol = solve_parent(problem)
    assert sol.hist.sum() == truth.sum() and (sol.hist >= 0).all()


def test_group_total_and_units_schema():
    rng = np.random.default_rng(4)
    truth = rng.integers(0, 30, size=(4, UNITS.ncells))
    problem = make_problem(truth, rng, noise=1.0, schema=UNITS, measured=["total", "occupancy"],
                           l2_passes=[["total"], ["occupancy"]], rounder_passes=[["total"], ["detailed"]])
    problem.group_totals = [GroupTotal(np.array([0, 1]), int(truth[:2].sum()))]
    sol = solve_parent(problem)
    assert_valid(problem, sol.hist)


def test_shortcuts_and_validation():
    rng = np.random.default_rng(1)
    truth = random_truth(rng, k=1, n_cells=3, people=5)
    one = make_problem(truth, rng)
    np.testing.assert_array_equal(solve_parent(one).hist, truth)
    zero = make_problem(np.zeros((3, PERSONS.ncells), dtype=np.int64), rng)
    assert not solve_parent(zero).hist.any()
    bad = make_problem(random_truth(rng, k=2, n_cells=3, people=5), rng, l2_passes=[["total", "hhgq * nosuch"]])
    with pytest.raises(ProblemError, match="l2 pass 0"):
        solve_parent(bad)


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 40), st.integers(1, 40), st.integers(0, 2 ** 31 - 1))
def test_restricted_rows_and_columns_equal_scipy_indexing(m: int, n: int, seed: int) -> None:
    """standard.select (restrict_form's row and column selection) gives scipy's ``a[rows][:, cols]``
    entry for entry and in the same order within each row, also when a row's entries are not sorted."""
    from topdown.solvers.standard import select

    rng = np.random.default_rng(seed)
    a = sp.random(m, n, density=float(rng.uniform(0, 0.6)), format="csr", random_state=seed)
    order = np.concatenate([rng.permutation(np.arange(a.indptr[r], a.indptr[r + 1])) for r in range(m)]).astype(int)
    a = sp.csr_matrix((a.data[order], a.indices[order], a.indptr), shape=a.shape)
    keep_row, keep_col = rng.random(m) < 0.7, rng.random(n) < 0.7
    want, got = a[keep_row][:, np.flatnonzero(keep_col)], select(a, keep_row, keep_col)
    assert got.shape == want.shape
    for x, y in ((got.indptr, want.indptr), (got.indices, want.indices), (got.data, want.data)):
        assert np.array_equal(x, y)


def test_huge_budget_solves():
    """rho = 10000 shared among five queries: the discrete Gaussian variances underflow (1e-304 and subnormal),
    and the L2 weights stay finite, so the parent solves to the truth its near-exact measurements give."""
    from fractions import Fraction

    from topdown.pipeline.privacy.budget import NEIGHBOURS
    from topdown.pipeline.privacy.mechanisms import discrete_gaussian_variance

    shares = dict(zip(MEASURED, (Fraction(7, 50), Fraction(29, 200), Fraction(37, 250), Fraction(143, 1000),
                                 Fraction(147, 1000))))
    variance = {q: discrete_gaussian_variance(NEIGHBOURS.sigma2(10000 * share)) for q, share in shares.items()}
    assert 0 < min(variance.values()) < 1e-320 and max(variance.values()) < 1e-300
    assert np.isinf(1.0 / min(variance.values()))
    rng = np.random.default_rng(5)
    truth = random_truth(rng, k=4, n_cells=12, people=30)
    problem = make_problem(truth, rng, noise=0.0)
    problem.measurements = [Measurement(m.query, m.values, np.full(truth.shape[0], variance[m.query]))
                            for m in problem.measurements]
    sol = solve_parent(problem)
    np.testing.assert_array_equal(sol.hist, truth)
    assert sol.failsafe == []


@pytest.mark.parametrize("answers, t_star, shortcut", [((5.0, 5.0), 0.0, True), ((6.0, 6.0), 1.0, False),
                                                       ((-1.0, 11.0), 1.0, False)])
def test_tau_lp_zero_band_shortcut(answers, t_star, shortcut):
    """t* = 0 from the feasibility LP with the band fixed; otherwise the LP with t gives the smallest band."""
    from topdown.solvers.tau import tau_lp, zero_band

    a = sp.csr_matrix(np.array([[1.0, 1.0]]))
    args = (a, np.array([10.0]), np.array([10.0]), np.zeros(2), np.full(2, np.inf), np.arange(2), np.array(answers))
    zero = zero_band(DEFAULT_BACKEND, *args)
    assert (zero is not None and zero.ok) == shortcut
    res = tau_lp(DEFAULT_BACKEND, *args)
    assert res.ok and res.objective == pytest.approx(t_star, abs=1e-9)


@pytest.mark.parametrize("answers, near, t_star, expected", [((5.0, 5.0 + 2e-5), 1e-4, 1e-5, 1e-4),
                                                            ((5.0, 5.0 + 2e-5), 1e-6, 1e-5, 1e-5),
                                                            ((6.0, 6.0), 1e-4, 1.0, 1.0)])
def test_tau_lp_near_band_gives_an_upper_bound_only_where_it_is_feasible(answers, near, t_star, expected):
    """Answers off the rows by more than HiGHS's tolerance (as a QP's can be, by its own): the band within
    ``near`` of them, where feasible, gives t = near >= t*; where not, the LP with t gives t* itself."""
    from topdown.solvers.tau import tau_lp, zero_band

    a = sp.csr_matrix(np.array([[1.0, 1.0]]))
    args = (a, np.array([10.0]), np.array([10.0]), np.zeros(2), np.full(2, np.inf), np.arange(2), np.array(answers))
    assert not zero_band(DEFAULT_BACKEND, *args).ok
    res = tau_lp(DEFAULT_BACKEND, *args, near=near)
    assert res.ok and res.objective == pytest.approx(expected, rel=1e-6, abs=1e-9) and res.objective >= t_star - 1e-9
    z = res.x[:2]
    assert z.sum() == pytest.approx(10.0, abs=1e-7) and np.abs(z - np.array(answers)).max() <= res.objective + 1e-7


class _CountingLp:
    """The default back end, counting its LP calls."""

    def __init__(self) -> None:
        self.lps = 0

    def lp(self, *args, **kwargs):
        self.lps += 1
        return DEFAULT_BACKEND.lp(*args, **kwargs)


@pytest.mark.parametrize("solution, t_star, lps", [((5.0, 5.0), 0.0, 0), ((4.0, 6.0), 0.0, 0),
                                                   ((5.0, 5.0 + 1e-8), 0.0, 1), ((-1.0, 11.0), 1.0, 1)])
def test_tau_lp_takes_the_pass_solution_as_its_witness(solution, t_star, lps):
    """Pass k's solution meeting the rows and bounds within WITNESS_TOL is a point of the band fixed at its own
    answers: t* = 0 with no LP. Off by more (1e-8 here: within HiGHS's tolerance, so the fixed band's LP finds
    it feasible; or a bound broken), the LPs decide as before."""
    from topdown.solvers.tau import WITNESS_TOL, tau_lp, witness_holds

    z = np.array(solution)
    a = sp.csr_matrix(np.array([[1.0, 1.0]]))
    args = (a, np.array([10.0]), np.array([10.0]), np.zeros(2), np.full(2, np.inf))
    assert witness_holds(*args, z) == (lps == 0)
    assert witness_holds(*args, z + np.array([0.0, WITNESS_TOL / 2])) == (lps == 0)
    backend = _CountingLp()
    res = tau_lp(backend, *args, np.arange(2), z, solution=z)
    assert res.ok and res.objective == pytest.approx(t_star, abs=1e-9) and backend.lps == lps
    assert (res.status == "Witness") == (lps == 0)
    without = tau_lp(_CountingLp(), *args, np.arange(2), z)  # no solution given: the LPs, with the same t*
    assert without.objective == pytest.approx(res.objective, abs=1e-9)
