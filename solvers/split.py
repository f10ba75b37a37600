"""Two-stage estimation of a parent with a very large fan-out (a county of thousands of tracts).

One joint solve costs, per interior-point iteration, about children x r x cells^2 (every child's
update to the dense block of parent cells; r ~ 20 aggregate rows per child) and its memory grows the
same way, so a 2,000-tract county does not finish in minutes, and a State -> County parent of 215
counties (1,500 non-zero parent cells) needs 2.3 GB on one worker while the others idle. Such a parent
(more than ``problem.split_above`` children, or a :func:`split_cost` above ``problem.split_cost``; no
group totals) is solved through an intermediate level that costs no privacy budget:

1. Stage 1: consecutive children (in the given geocode order) are grouped ``split_group`` at a time
   (fewer where the cost rule asks: :func:`group_size`).
   Each group is a pseudo-child whose measurement of a query is the sum of its children's noisy
   answers (variance: the sum of theirs; unmeasured if any child is unmeasured), and whose constraint
   right-hand sides are the sums of its children's (``==`` / ``<=``: only where every child has one;
   ``>=``: the sum of those given). The parent is solved against the groups as usual.
2. Stage 2: each group's integer histogram is the parent of its own children, solved as usual.

The result has every property a joint solve has (non-negative integers, children summing exactly to
the parent, every constraint row checked), but it is a different estimator: the joint least-squares
fit is replaced by a fit through group sums (benchmarks/RESULTS.md measures the accuracy cost). It is
post-processing of the same noisy measurements, so privacy is unchanged.
"""
from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from topdown.vocab.problem import Constraint, Measurement, ParentProblem, ParentSolution, SolveStats, SparseHist

Solve = Callable[[ParentProblem], ParentSolution]
#: Solves independent problems and returns their solutions in order (stage 2's groups): sequentially
#: here, or spread over a cluster's workers by the caller (tasks.py) so that a huge parent does not run
#: alone while other workers idle. Each problem is solved the same way wherever it runs.
MapSolve = Callable[[list[ParentProblem]], list[ParentSolution]]


def split_cost(problem: ParentProblem) -> int:
    """Children x non-zero cells of the parent: the number of count variables of the joint solve (a
    child has a variable only where its parent is non-zero), which its memory and per-iteration time
    grow with. Public: the parent's histogram is already estimated. 0 at the root (no parent)."""
    parent = problem.parent_sparse()
    return 0 if parent is None else problem.n_children * int(parent.cells.size)


def wants_split(problem: ParentProblem) -> bool:
    """Whether ``solve_parent`` goes through groups: more than ``split_above`` children or a
    :func:`split_cost` above ``split_cost`` (each rule off at 0), a parent, no group totals."""
    if problem.parent_hist is None or problem.group_totals or problem.n_children < 2:
        return False
    return ((problem.split_above > 0 and problem.n_children > problem.split_above)
            or (problem.split_cost > 0 and split_cost(problem) > problem.split_cost))


def group_size(problem: ParentProblem) -> int:
    """Children per group: ``split_group``, fewer if needed so that a group's solve (at most its size x
    the parent's non-zero cells variables) stays within ``split_cost``; at least 2."""
    size = max(1, problem.split_group)
    parent = problem.parent_sparse()
    nonzero = 0 if parent is None else int(parent.cells.size)
    if problem.split_cost > 0 and nonzero > 0:
        size = min(size, max(2, problem.split_cost // nonzero))
    return size


def groups_of(problem: ParentProblem) -> list[np.ndarray]:
    """Consecutive runs of children, :func:`group_size` each (the last one may be shorter)."""
    size = group_size(problem)
    return [np.arange(s, min(s + size, problem.n_children)) for s in range(0, problem.n_children, size)]


def _group_measurement(m: Measurement, groups: list[np.ndarray]) -> Measurement:
    values = np.asarray(m.values, float)
    var = np.asarray(m.variance, float)
    measured = [np.isfinite(var[g]).all() for g in groups]
    return Measurement(m.query, np.array([values[g].sum(axis=0) if ok else np.zeros(values.shape[1])
                                          for g, ok in zip(groups, measured)]),
                       np.array([var[g].sum() if ok else np.inf for g, ok in zip(groups, measured)]), m.answers)


def _group_constraint(con: Constraint, groups: list[np.ndarray]) -> Constraint:
    rhs = np.asarray(con.rhs, float)
    rows = []
    for g in groups:
        given = np.isfinite(rhs[g])
        total = np.where(given, rhs[g], 0.0).sum(axis=0)
        # ">=": children without a bound have 0 (counts are >= 0); "==" / "<=": every child needs one.
        complete = given.any(axis=0) if con.sense == ">=" else given.all(axis=0)
        rows.append(np.where(complete, total, np.nan))
    return Constraint(con.name, con.query, con.sense, np.array(rows))


def group_problem(problem: ParentProblem, groups: list[np.ndarray]) -> ParentProblem:
    """Stage 1: the parent with one pseudo-child per group (split again if there are still too many)."""
    return replace(problem, children=[f"{problem.parent} group {i + 1}/{len(groups)}" for i in range(len(groups))],
                   measurements=[_group_measurement(m, groups) for m in problem.measurements],
                   constraints=[_group_constraint(c, groups) for c in problem.constraints])


def member_problem(problem: ParentProblem, members: np.ndarray, name: str, group_hist: SparseHist
                   ) -> ParentProblem:
    """Stage 2: one group's children under the group's estimated histogram."""
    return replace(problem, parent=name, children=[problem.children[i] for i in members], parent_hist=group_hist,
                   measurements=[Measurement(m.query, np.asarray(m.values)[members], np.asarray(m.variance)[members],
                                             m.answers) for m in problem.measurements],
                   constraints=[Constraint(c.name, c.query, c.sense, np.asarray(c.rhs)[members])
                                for c in problem.constraints], split_above=0, split_cost=0)


def solve_split(problem: ParentProblem, solve: Solve, levels: tuple[str, ...], map_solve: MapSolve | None = None
                ) -> ParentSolution:
    """Both stages with ``solve`` (``solve_parent`` with the caller's back end; stage 2's groups through
    ``map_solve`` when given); the solution's stats sum the stages' sizes and list their L2 and rounder
    passes; ``level`` is the most relaxed failsafe level any stage needed (``levels`` in order)."""
    groups = groups_of(problem)
    stage1 = group_problem(problem, groups)
    top = solve(stage1)
    failsafe = [step.within("groups") for step in top.failsafe]
    parts = [top.stats]
    members_of = [member_problem(problem, members, name, top.row(i))
                  for i, (name, members) in enumerate(zip(stage1.children, groups))]
    solutions = map_solve(members_of) if map_solve is not None else [solve(p) for p in members_of]
    cells = np.unique(np.concatenate([top.cells] + [sol.cells for sol in solutions]))  # a relaxed group may add some
    counts = np.zeros((problem.n_children, cells.size), dtype=np.int64)
    for name, members, sol in zip(stage1.children, groups, solutions):
        counts[np.ix_(members, np.searchsorted(cells, sol.cells))] = sol.counts
        failsafe += [step.within(name) for step in sol.failsafe]
        parts.append(sol.stats)
    rank = {name: i for i, name in enumerate(levels)}
    stats = SolveStats(split={"groups": len(groups), "group_size": int(max(len(g) for g in groups))},
                       level=max((st.level for st in parts), key=rank.__getitem__),
                       l2=[p for st in parts for p in st.l2], rounder=[p for st in parts for p in st.rounder],
                       largest_n_cols=max(st.n_cols for st in parts))
    for key in ("build_s", "n_x", "n_cols", "n_rows", "nnz", "rounder_milp"):
        setattr(stats, key, sum(getattr(st, key) for st in parts))
    return ParentSolution(cells, counts, problem.schema.ncells, failsafe=failsafe, stats=stats)
