"""Two-stage solves of parents with many children (solvers/split.py): the group problem's measurements
and constraints, and valid, deterministic results that stay close to the joint solve."""
from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from test_solvers import assert_valid, make_problem, random_truth

from topdown.vocab.queries import build_query
from topdown.pipeline.configuration.census import PERSONS
from topdown.solvers import Constraint, GroupTotal, Measurement, ParentProblem, solve_parent
from topdown.solvers.split import group_problem, group_size, groups_of, member_problem, split_cost, wants_split


def test_group_measurements_sum_children_and_unmeasured_children_unmeasure_the_group():
    values = np.arange(10.0).reshape(5, 2)
    m = Measurement("hispanic", values, np.array([1.0, 2.0, 3.0, np.inf, 5.0]))
    prob = ParentProblem(PERSONS, "p", list("abcde"), np.ones(4, dtype=np.int64), [m], split_above=2, split_group=2)
    groups = groups_of(prob)
    assert [g.tolist() for g in groups] == [[0, 1], [2, 3], [4]]
    g = group_problem(prob, groups).measurements[0]
    np.testing.assert_array_equal(g.values[0], values[0] + values[1])
    np.testing.assert_array_equal(g.variance, [3.0, np.inf, 5.0])
    np.testing.assert_array_equal(g.values[2], values[4])


@pytest.mark.parametrize("sense,expected", [("==", [3.0, np.nan]), ("<=", [3.0, np.nan]), (">=", [3.0, 4.0])])
def test_group_constraints_by_sense(sense, expected):
    rhs = np.array([[1.0], [2.0], [4.0], [np.nan]])
    con = Constraint("c", "total", sense, rhs)
    prob = ParentProblem(PERSONS, "p", list("abcd"), np.ones(4, dtype=np.int64), [], [con], split_group=2)
    got = group_problem(prob, groups_of(prob)).constraints[0].rhs[:, 0]
    np.testing.assert_array_equal(got, expected)


def test_member_problem_takes_its_childrens_rows():
    rng = np.random.default_rng(0)
    prob = make_problem(random_truth(rng, 6, n_cells=15, people=20), rng)
    sub = member_problem(prob, np.array([2, 3]), "g", np.zeros(prob.schema.ncells, dtype=np.int64))
    assert sub.children == ["child2", "child3"] and sub.parent == "g" and sub.split_above == sub.split_cost == 0
    np.testing.assert_array_equal(sub.measurements[0].values, prob.measurements[0].values[2:4])
    np.testing.assert_array_equal(sub.constraints[0].rhs, prob.constraints[0].rhs[2:4])


def test_who_splits():
    rng = np.random.default_rng(1)
    prob = replace(make_problem(random_truth(rng, 6, n_cells=15, people=20), rng), split_above=5)
    assert wants_split(prob)
    assert not wants_split(replace(prob, split_above=6)) and not wants_split(replace(prob, split_above=0))
    assert not wants_split(replace(prob, group_totals=[GroupTotal(np.array([0, 1]), 3)]))


def _sized(children: int, nonzero: int, **split) -> ParentProblem:
    """A problem of ``children`` children under a parent with ``nonzero`` non-zero cells (no data needed
    to decide the split)."""
    parent = np.zeros(PERSONS.ncells, dtype=np.int64)
    parent[:nonzero] = 1
    return ParentProblem(PERSONS, "p", [f"c{i}" for i in range(children)], parent, [], **split)


@pytest.mark.parametrize("children,nonzero,split,expected", [
    (215, 1500, {"split_above": 300, "split_cost": 100_000}, True),  # a California-like State -> County
    (254, 1600, {"split_above": 300, "split_cost": 100_000}, True),  # a Texas-like one
    (60, 1500, {"split_above": 300, "split_cost": 100_000}, False),  # a 60-county state: 90,000
    (141, 70, {"split_above": 300, "split_cost": 100_000}, False),  # Rhode Island's largest county
    (80, 25, {"split_above": 300, "split_cost": 100_000}, False),  # Rhode Island's largest block group
    (2000, 5, {"split_above": 300, "split_cost": 100_000}, True),  # many children, few cells: the count rule
    (215, 1500, {"split_above": 300, "split_cost": 0}, False),  # cost rule off
    (215, 1500, {"split_above": 0, "split_cost": 0}, False),  # both off
    (2, 2016, {"split_above": 0, "split_cost": 4031}, True),
    (2, 2016, {"split_above": 0, "split_cost": 4032}, False),  # the rule is strict
])
def test_who_splits_by_children_and_cost(children, nonzero, split, expected):
    assert wants_split(_sized(children, nonzero, **split)) is expected


@settings(max_examples=200, deadline=None)
@given(children=st.integers(1, 400), nonzero=st.integers(0, 2016), above=st.integers(0, 400),
       cost=st.integers(0, 500_000), group=st.integers(2, 60))
def test_the_split_rule_depends_only_on_children_and_nonzero_parent_cells(children, nonzero, above, cost, group):
    prob = _sized(children, nonzero, split_above=above, split_cost=cost, split_group=group)
    assert split_cost(prob) == children * nonzero
    rule = children >= 2 and ((0 < above < children) or (0 < cost < children * nonzero))
    assert wants_split(prob) is rule
    size = group_size(prob)
    assert 2 <= size <= group
    if cost > 0 and nonzero > 0 and cost >= 2 * nonzero:  # every group's joint solve stays within the cost
        assert size * nonzero <= cost
    assert not wants_split(replace(prob, parent_hist=None, children=["root"]))


@pytest.mark.parametrize("seed", range(3))
def test_split_solve_is_valid_deterministic_and_close_to_joint(seed):
    rng = np.random.default_rng(50 + seed)
    truth = random_truth(rng, 12, n_cells=40, people=60)
    joint = make_problem(truth, rng, noise=1.0)
    split = replace(joint, split_above=5, split_group=4)
    sol = solve_parent(split)
    assert_valid(split, sol.hist)
    assert sol.stats.split == {"groups": 3, "group_size": 4} and sol.stats.level == "exact"
    assert len(sol.stats.l2) == 4 * 2  # stage 1 and three groups, two L2 passes each
    assert solve_parent(split).hist.tobytes() == sol.hist.tobytes()
    # Both estimators fit the same noisy data: per-child totals differ by a few people at most.
    total = build_query(joint.schema, "total")
    assert np.abs(total.answer(sol.hist) - total.answer(solve_parent(joint).hist)).max() <= 4


def test_stage_one_splits_again_when_groups_are_still_too_many():
    rng = np.random.default_rng(9)
    prob = replace(make_problem(random_truth(rng, 9, n_cells=20, people=30), rng), split_above=2, split_group=2)
    sol = solve_parent(prob)
    assert_valid(prob, sol.hist)
    assert sol.stats.split["groups"] == 5


@settings(max_examples=15, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(seed=st.integers(0, 10_000), k=st.integers(3, 9), group=st.integers(2, 4))
def test_split_solves_are_consistent(seed, k, group):
    rng = np.random.default_rng(seed)
    prob = replace(make_problem(random_truth(rng, k, n_cells=12, people=15), rng, noise=4.0),
                   split_above=2, split_group=group)
    assert_valid(prob, solve_parent(prob).hist)


def _solve_on_worker(problem):
    from topdown.pipeline.execution.tasks import map_on_cluster
    from topdown.solvers.backends import DEFAULT_BACKEND

    spread = map_on_cluster(DEFAULT_BACKEND)
    return spread is not None, solve_parent(problem, map_solve=spread).hist


def test_split_groups_spread_over_the_workers_give_the_same_solution(dask_client):
    """Inside a Dask task the second-stage groups of a split parent run as tasks of the cluster; the
    estimate is byte for byte the one solved in one process."""
    from topdown.pipeline.execution.tasks import map_on_cluster

    rng = np.random.default_rng(11)
    problem = replace(make_problem(random_truth(rng, 9, n_cells=15, people=25), rng), split_above=5, split_group=3)
    assert map_on_cluster(None) is None  # not in a worker: the groups are solved in turn
    spread, hist = dask_client.submit(_solve_on_worker, problem, pure=False).result()
    assert spread
    assert hist.tobytes() == solve_parent(problem).hist.tobytes()


def test_a_parent_split_by_cost_spreads_every_stage_over_the_cluster(dask_client):
    """A single parent forced to split by a tiny ``split_cost`` (as a State -> County parent alone in its
    level): inside a task, every second-stage group, and those of a stage 1 split again, runs as a task of
    the cluster, and the estimate is byte for byte the one of the sequential map."""
    from distributed import get_task_stream

    rng = np.random.default_rng(12)
    problem = make_problem(random_truth(rng, 9, n_cells=15, people=25), rng)
    problem = replace(problem, split_cost=2 * int(np.count_nonzero(problem.parent_hist)))
    assert wants_split(problem) and group_size(problem) == 2
    solved: list[str] = []

    def sequential(problems: list[ParentProblem]) -> list:
        solved.extend(p.parent for p in problems)
        return [solve_parent(p) for p in problems]

    expected = solve_parent(problem, map_solve=sequential).hist
    assert len(solved) > len(groups_of(problem)) == 5  # stage 1 (5 groups) was split again
    with get_task_stream(dask_client) as stream:
        spread, hist = dask_client.submit(_solve_on_worker, problem, pure=False).result()
    assert spread and hist.tobytes() == expected.tobytes() == solve_parent(problem).hist.tobytes()
    assert sum(str(t["key"]).startswith("solve_parent") for t in stream.data) == len(solved)
