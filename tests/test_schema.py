"""Schema cell order, cenrace order and marginal queries (DAS-2020 `schemamaker.py`, `cenrace.py`, `querybase.py`)."""
import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topdown.vocab.queries import QueryError, build_query
from topdown.pipeline.configuration.census import PERSONS, UNITS
from topdown.pipeline.inputs.ingest import CENRACE_COMBOS, cenrace_index


def test_cell_order_is_row_major():
    assert PERSONS.ncells == 2016
    for hhgq, va, hisp, race in [(0, 0, 0, 0), (7, 1, 1, 62), (3, 0, 1, 17), (5, 1, 0, 40)]:
        assert PERSONS.cell_index(hhgq, va, hisp, race) == ((hhgq * 2 + va) * 2 + hisp) * 63 + race
    assert PERSONS.unravel(np.array([1000]))[0][0] == 1000 // 252


@pytest.mark.parametrize("index,bits", [
    (0, (1, 0, 0, 0, 0, 0)), (5, (0, 0, 0, 0, 0, 1)), (6, (1, 1, 0, 0, 0, 0)), (20, (0, 0, 0, 0, 1, 1)),
    (21, (1, 1, 1, 0, 0, 0)), (40, (0, 0, 0, 1, 1, 1)), (41, (1, 1, 1, 1, 0, 0)), (56, (1, 1, 1, 1, 1, 0)),
    (61, (0, 1, 1, 1, 1, 1)), (62, (1, 1, 1, 1, 1, 1)),
])
def test_cenrace_order_matches_census(index, bits):
    assert CENRACE_COMBOS[index] == bits
    assert cenrace_index(bits) == index


def test_cenrace_sizes():
    sizes = [sum(c) for c in CENRACE_COMBOS]
    assert sizes == sorted(sizes)
    assert [sizes.count(k) for k in range(1, 7)] == [6, 15, 20, 15, 6, 1]


@pytest.mark.parametrize("name,n", [
    ("total", 1), ("detailed", 2016), ("hhgq", 8), ("votingage", 2), ("hispanic", 2), ("cenrace", 63),
    ("hhinstlevels", 3), ("hispanic * cenrace", 126), ("votingage * cenrace", 126), ("votingage * hispanic", 4),
    ("votingage * hispanic * cenrace", 252), ("hhgq * hispanic", 16), ("hhgq * hispanic * cenrace", 1008),
    ("hhgq * votingage * hispanic * cenrace", 2016), ("majorRaces", 7), ("cenrace_7lev_two_comb", 7),
])
def test_query_sizes_and_partitions(name, n):
    q = build_query(PERSONS, name)
    assert q.n_answers == n
    assert q.is_partition
    m = q.matrix()
    assert np.array_equal(np.asarray(m.sum(axis=0)).ravel(), np.ones(2016))


def test_answer_order_follows_schema_not_name():
    a, b = build_query(PERSONS, "cenrace * hispanic"), build_query(PERSONS, "hispanic * cenrace")
    assert np.array_equal(a.groups, b.groups)
    assert a.groups[PERSONS.cell_index(2, 1, 1, 5)] == 1 * 63 + 5


def test_answers_match_matrix_and_sparse():
    rng = np.random.default_rng(1)
    hist = rng.integers(0, 4, size=(3, 2016))
    for name in ["hhgq", "votingage * hispanic * cenrace", "hhinstlevels", "gqNursingTotal * nonvoting"]:
        q = build_query(PERSONS, name)
        dense = q.answer(hist)
        assert np.array_equal(dense, (q.matrix() @ hist.T).T)
        cells = np.flatnonzero(hist[0])
        assert np.array_equal(q.answer_sparse(cells, hist[0, cells]), dense[0])


def test_partial_query_is_not_a_partition():
    q = build_query(PERSONS, "gqNursingTotal * nonvoting")
    assert q.n_answers == 1 and not q.is_partition
    assert np.flatnonzero(q.groups >= 0).tolist() == list(range(756, 756 + 126))


def test_units_schema():
    assert UNITS.ncells == 2
    assert build_query(UNITS, "occupancy").n_answers == 2


@pytest.mark.parametrize("bad", ["race", "hhgq * hhinstlevels", "total * hhgq", "cenrace * "])
def test_bad_query_names_are_errors(bad):
    with pytest.raises(QueryError):
        build_query(PERSONS, bad)


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**32 - 1), nodes=st.integers(0, 6), density=st.sampled_from([0.0, 0.002, 0.05, 1.0]),
       query=st.sampled_from(["total", "detailed", "hhgq", "votingage * hispanic * cenrace", "cenrace",
                              "hhinstlevels", "hispanic * cenrace"]))
def test_true_answers_from_the_sparse_cells_equal_the_query_answers(seed, nodes, density, query):
    """Query.answer_rows (the noise step's exact answers, from the non-zero cells) equals Query.answer on
    the dense histograms, also for queries that leave cells out."""
    import scipy.sparse as sp

    rng = np.random.default_rng(seed)
    dense = rng.integers(0, 10**6, size=(nodes, PERSONS.ncells)) * (rng.random((nodes, PERSONS.ncells)) < density)
    q = build_query(PERSONS, query)
    got = q.answer_rows(sp.csr_matrix(dense))
    assert got.dtype == np.int64 and got.shape == (nodes, q.n_answers)
    np.testing.assert_array_equal(got, q.answer(dense))
