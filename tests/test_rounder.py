"""Tests of the multi-pass rounder (eq. 7.7): integral simplex vertices on laminar query chains, closeness
to the L2 answers, and the MILP fallback."""
from __future__ import annotations

import numpy as np
import pytest
from test_solvers import assert_valid, make_problem, random_truth

from topdown.vocab.queries import build_query
from topdown.solvers import solve_parent
from topdown.solvers.backends import ClarabelHighs, Result
from topdown.solvers.l2 import run_l2
from topdown.solvers.layout import build_layout
from topdown.solvers.model import compile_pyomo
from topdown.solvers.rounder import l2_histograms, run_rounder


@pytest.mark.parametrize("seed", range(8))
def test_laminar_chain_is_integral_without_milp(seed):
    rng = np.random.default_rng(1000 + seed)
    k = int(rng.integers(2, 13))
    truth = random_truth(rng, k, n_cells=int(rng.integers(20, 150)), people=int(rng.integers(20, 200)))
    problem = make_problem(truth, rng, noise=20.0)
    layout = build_layout(problem)
    form = compile_pyomo(layout)
    l2 = run_l2(layout, form, ClarabelHighs())
    hist, stats = run_rounder(layout, form, l2.z, ClarabelHighs())
    assert [s["milp"] for s in stats] == [False, False]
    assert max(s["max_fraction"] for s in stats) < 1e-6
    assert_valid(problem, dense(layout, hist))
    # Pass 0 rounds each child's total to within one person of its L2 total.
    l2_total = l2_histograms(layout, l2.z).sum(axis=1)
    assert np.abs(hist.sum(axis=1) - l2_total).max() < 1.0
    # The rounded histogram stays within one person of the L2 histogram in every cell.
    assert np.abs(hist - l2_histograms(layout, l2.z)).max() < 1.0



def dense(layout, hist: np.ndarray) -> np.ndarray:
    """The rounder's histograms over the layout's cells in play as [children, declared cells]."""
    out = np.zeros((hist.shape[0], layout.problem.schema.ncells), dtype=hist.dtype)
    out[:, layout.cells] = hist
    return out

def test_later_pass_keeps_earlier_rounded_answers():
    rng = np.random.default_rng(77)
    truth = random_truth(rng, 6, n_cells=60, people=80)
    problem = make_problem(truth, rng, noise=20.0,
                           l2_passes=[["total"], ["hhgq", "votingage * hispanic * cenrace", "detailed"]],
                           rounder_passes=[["total"], ["hhgq"], ["hhgq * votingage * hispanic * cenrace", "detailed"]])
    layout = build_layout(problem)
    form = compile_pyomo(layout)
    l2 = run_l2(layout, form, ClarabelHighs())
    hist, stats = run_rounder(layout, form, l2.z, ClarabelHighs())
    assert len(stats) == 3 and not any(s["milp"] for s in stats)
    # The rounder's LPs are over the cells in play only (rounder.projection): no aux column and no definition
    # row. Pass 0: the other structural rows and at most one flow row (three columns) per total answer; pass 1
    # also carries pass 0's rounded totals as rows.
    structural = form.shape[0] - len(layout.families["definitions"])
    totals = int((layout.cols("total") >= 0).sum())
    assert stats[0]["columns"] <= layout.n_x + 3 * totals
    assert stats[0]["rows"] <= structural + totals
    assert stats[1]["rows"] >= structural + totals
    hhgq = build_query(problem.schema, "hhgq")
    l2_hist = l2_histograms(layout, l2.z)
    assert np.abs(hhgq.answer(dense(layout, hist)) - hhgq.answer(dense(layout, l2_hist))).max() < 1.0
    assert_valid(problem, dense(layout, hist))


class FractionalFirst(ClarabelHighs):
    """A back end whose LPs come back fractional (as a non-TU problem could), to force the MILP fallback."""

    def lp(self, c, a, lo, hi, lb, ub, integer=None, presolve=True) -> Result:
        res = super().lp(c, a, lo, hi, lb, ub, integer, presolve)
        if integer is None and res.ok:
            res.x = res.x + 0.25
        return res


def test_milp_fallback_when_vertex_is_fractional():
    rng = np.random.default_rng(5)
    truth = random_truth(rng, 4, n_cells=25, people=50)
    problem = make_problem(truth, rng, noise=5.0, l2_passes=[["total", "hhgq", "detailed"]])
    sol = solve_parent(problem, backend=FractionalFirst())
    assert sol.stats.rounder_milp == 2
    assert_valid(problem, sol.hist)


BLOCK_ROUNDER = [["total", "hhgq", "hhgq * hispanic", "hhgq * hispanic * cenrace", "detailed"]]


def _l1(problem, layout, l2_z, hist) -> float:
    """The rounder pass's objective: sum over its queries of |Q hist - Q hist_L2| (cellwise for detailed)."""
    l2_hist, hist = dense(layout, l2_histograms(layout, l2_z)), dense(layout, hist)
    names = BLOCK_ROUNDER[0]
    return sum(float(np.abs(build_query(problem.schema, n).answer(hist) - build_query(problem.schema, n).answer(l2_hist)).sum())
               if n != "detailed" else float(np.abs(hist - l2_hist).sum()) for n in names)


@pytest.mark.parametrize("seed", range(6))
def test_folded_rows_keep_the_lp_optimum(seed, monkeypatch):
    """Answers with at most one cell in play get no flow row (rounder.fold_single_cell_rows): the LP has
    fewer rows and the same optimum as with every row (a tie may pick another vertex of equal cost)."""
    import topdown.solvers.rounder as rounder_mod

    rng = np.random.default_rng(300 + seed)
    truth = random_truth(rng, int(rng.integers(3, 30)), n_cells=int(rng.integers(10, 80)),
                         people=int(rng.integers(20, 300)))
    problem = make_problem(truth, rng, noise=3.0, l2_passes=[["total", "hhgq", "detailed"]],
                           rounder_passes=BLOCK_ROUNDER)
    layout = build_layout(problem)
    form = compile_pyomo(layout)
    z = run_l2(layout, form, ClarabelHighs()).z
    folded, stats = run_rounder(layout, form, z, ClarabelHighs())
    monkeypatch.setattr(rounder_mod, "fold_single_cell_rows", lambda cols, *a: cols[np.asarray(a[0])[cols] >= 0])
    full, full_stats = run_rounder(layout, form, z, ClarabelHighs())
    assert stats[0]["rows"] < full_stats[0]["rows"]
    assert not stats[0]["milp"] and not full_stats[0]["milp"]
    assert _l1(problem, layout, z, folded) == pytest.approx(_l1(problem, layout, z, full), abs=1e-9)
    assert_valid(problem, dense(layout, folded))
