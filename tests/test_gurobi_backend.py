"""The optional Gurobi back end agrees with the default one (skipped without gurobipy; the pip
package's size-limited licence is enough for these small parents)."""
import numpy as np
import pytest

from topdown.solvers import solve_parent
from topdown.solvers.backends import DEFAULT_BACKEND

pytest.importorskip("gurobipy")
from topdown.solvers.gurobi import Gurobi, GurobiUnavailable  # noqa: E402

from test_solvers import assert_valid, make_problem, random_truth  # noqa: E402


@pytest.fixture(scope="module")
def backend():
    try:
        return Gurobi()
    except GurobiUnavailable as exc:
        pytest.skip(str(exc))


def test_gurobi_reproduces_truth_without_noise(backend):
    rng = np.random.default_rng(5)
    truth = random_truth(rng, k=3, n_cells=6, people=12)
    sol = solve_parent(make_problem(truth, rng, noise=0.0), backend)
    np.testing.assert_array_equal(sol.hist, truth)


def test_gurobi_solution_is_valid_and_close_to_default(backend):
    rng = np.random.default_rng(6)
    truth = random_truth(rng, k=3, n_cells=6, people=12)
    problem = make_problem(truth, np.random.default_rng(1), noise=1.0)
    ours, theirs = solve_parent(problem, backend), solve_parent(problem, DEFAULT_BACKEND)
    assert_valid(problem, ours.hist)
    # Same optimum up to ties in the rounder: totals per child agree within one person.
    assert np.abs(ours.hist.sum(axis=1) - theirs.hist.sum(axis=1)).max() <= 1
