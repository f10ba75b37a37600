"""Chunking of a level (pipeline/execution/engine.py): whole parents per chunk, fixed cost rule, costliest first."""
from __future__ import annotations

from fractions import Fraction

import numpy as np
import pandas as pd
import scipy.sparse as sp

from topdown.pipeline.configuration.config import load_config
from topdown.pipeline.configuration.census import PERSONS_PRODUCT
from topdown.pipeline.execution.engine import CHUNK_CHILDREN, make_chunks
from hypothesis import given, settings
from hypothesis import strategies as st

from topdown.pipeline.execution.tasks import BATCH_CHUNKS, TASKS_PER_WORKER, batch_chunks, shared_values, taken
from topdown.pipeline.execution.levels import Level


class NoConstraints:
    def take(self, rows):
        return []


def _level(name: str, n: int, parent: np.ndarray | None) -> Level:
    nodes = pd.Index([f"{name}{i:05d}" for i in range(n)])
    return Level(name, nodes, parent, sp.csr_matrix((n, 4), dtype=np.int64), pd.DataFrame(index=nodes),
                 NoConstraints(), [Fraction(1)] * n, np.array(["44"] * n))


def test_chunks_hold_whole_parents_and_the_huge_parent_costs_most(tmp_path):
    # Parent 0 has 400 children on 3 non-zero cells; parents 1..60 have 5 children on 4 cells.
    sizes = np.array([400] + [5] * 60)
    parent_of = np.repeat(np.arange(sizes.size), sizes)
    nnz = np.array([3] + [4] * 60)
    parent_hist = sp.csr_matrix(np.array([[1] * k + [0] * (4 - k) for k in nnz], dtype=np.int64))
    chunks, order = make_chunks(PERSONS_PRODUCT, load_config("demo"), _level("Tract", parent_of.size, parent_of),
                                _level("County", sizes.size, None), parent_hist, str(tmp_path))
    assert sorted(np.concatenate([[int(c[-5:]) for c in ch.children] for ch in chunks]).tolist()) == \
        list(range(parent_of.size))
    for ch in chunks:
        assert ch.cost == sum(len(p.children) * p.parent_hist.cells.size for p in ch.parents)
        assert len(ch.parents) == 1 or len(ch.children) <= CHUNK_CHILDREN + 5
    huge = next(ch for ch in chunks if any(len(p.children) == 400 for p in ch.parents))
    assert len(huge.parents) == 1 and huge.cost == 1200
    assert huge.cost == max(ch.cost for ch in chunks)  # submitted first (engine.estimate_level)


def test_batches_are_runs_of_consecutive_chunks_under_the_target_cost():
    costs = [1200] + [20] * 100 + [900] + [20] * 50
    todo = [i for i in range(len(costs)) if i not in (3, 40)]  # chunks 3 and 40 finished by an earlier run
    batches = batch_chunks(costs, todo, workers=2)
    assert [i for b in batches for i in b] == todo  # every chunk once, in order
    target = sum(costs[i] for i in todo) / (TASKS_PER_WORKER * 2)
    for b in batches:
        assert b == list(range(b[0], b[-1] + 1))  # consecutive: neighbouring geography, few shards read
        assert len(b) <= BATCH_CHUNKS
        assert len(b) == 1 or sum(costs[i] for i in b) <= target
    assert [0] in batches and [101] in batches  # a chunk above the target cost runs alone
    assert len(batches) < len(todo) / 4  # far fewer tasks than chunks
    assert len(batch_chunks(costs, todo, workers=1000)) == len(todo)  # a large cluster: a task per chunk


class Keyed:
    """A stand-in for a Dask future: equal keys name the same value."""

    def __init__(self, key: str) -> None:
        self.key = key


@settings(max_examples=200, deadline=None)
@given(st.lists(st.one_of(st.none(), st.lists(st.integers(0, 6), max_size=8)), max_size=12))
def test_a_tasks_futures_are_named_once_and_each_group_gets_its_own_back(groups):
    """tasks.shared_values: a batch names each shard's future once in a flat list; every chunk's list comes back
    from its positions (in order, repeats kept), None stays None; objects without a key are kept by identity."""
    futures = {k: Keyed(f"shard-{k}") for k in range(7)}
    given_groups = [None if g is None else [futures[k] for k in g] for g in groups]
    values, where = shared_values(given_groups)
    assert len({v.key for v in values}) == len(values)
    assert [taken(values, w) for w in where] == given_groups
    objects = [object(), object()]
    values, where = shared_values([objects, objects[::-1]])
    assert values == objects and where == [[0, 1], [1, 0]]

