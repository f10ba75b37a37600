"""The sparse core: queries as per-axis factors, and a parent's solve over its cells in play, whatever the
declared size of the histogram (DESIGN.md, "Sparse to the core")."""
from __future__ import annotations

import itertools
import tracemalloc
from dataclasses import replace

import numpy as np
import scipy.sparse as sp
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from test_solvers import make_problem, random_truth
from topdown.solvers import Measurement, ParentProblem, solve_parent
from topdown.solvers.layout import build_layout
from topdown.vocab.problem import SparseHist
from topdown.vocab.queries import build_query, coarse_answers, refinement
from topdown.vocab.schema import Schema
from topdown.vocab.support import SupportError, answers_above, support


def _dense_refinement(fine, coarse):
    """The cell-by-cell comparison of two queries' groupings (what the per-axis refinement must equal)."""
    gf, gc = fine.groups, coarse.groups
    if ((gc >= 0) & (gf < 0)).any():
        return None
    inside = gf >= 0
    mapping = np.full(fine.n_answers, -2, dtype=np.int64)
    mapping[gf[inside]] = gc[inside]
    if (mapping[gf[inside]] != gc[inside]).any():
        return None
    mapping[mapping == -2] = -1
    return mapping


@st.composite
def schemas(draw) -> Schema:
    """Up to three small dimensions and up to four recodes (partial groupings, any order of levels)."""
    nd = draw(st.integers(1, 3))
    dims = tuple((f"d{i}", draw(st.integers(1, 4))) for i in range(nd))
    recodes = {}
    for r in range(draw(st.integers(0, 4))):
        i = draw(st.integers(0, nd - 1))
        levels = draw(st.permutations(list(range(dims[i][1]))))[:draw(st.integers(1, dims[i][1]))]
        groups = []
        while levels:
            cut = draw(st.integers(1, len(levels)))
            groups.append(tuple(levels[:cut]))
            levels = levels[cut:]
        recodes[f"r{r}"] = (f"d{i}", tuple(groups))
    return Schema("s", dims, recodes)


def _names(schema: Schema) -> list[str]:
    terms = list(schema.dim_names) + list(schema.recodes)
    axis = {t: schema.axis(t if t in schema.dim_names else schema.recodes[t][0]) for t in terms}
    names = ["total", "detailed"]
    for k in (1, 2):
        names += [" * ".join(c) for c in itertools.combinations(terms, k) if len({axis[t] for t in c}) == k]
    return names


@settings(max_examples=150, deadline=None)
@given(schemas(), st.data())
def test_per_axis_refinement_equals_the_cell_by_cell_comparison(schema, data):
    names = _names(schema)
    fine = build_query(schema, data.draw(st.sampled_from(names)))
    coarse = build_query(schema, data.draw(st.sampled_from(names)))
    expected = _dense_refinement(fine, coarse)
    got = refinement(fine, coarse)
    assert (got is None) == (expected is None)
    if got is not None:
        present = np.unique(fine.groups[fine.groups >= 0])
        np.testing.assert_array_equal(coarse_answers(fine, coarse, got, present), expected[present])
    # identical groupings <=> identical per-axis factors (the layout's and the budget check's key)
    assert (fine.key == coarse.key) == np.array_equal(fine.groups, coarse.groups)
    assert fine.is_identity == np.array_equal(fine.groups, np.arange(schema.ncells))
    cells = data.draw(st.lists(st.integers(0, schema.ncells - 1), max_size=8))
    np.testing.assert_array_equal(fine.groups_at(np.array(cells, dtype=np.int64)), fine.groups[cells])


#: 500 x 500 x 512 = 128,000,000 declared cells.
HUGE = Schema("huge", (("a", 500), ("b", 500), ("c", 512)),
              {"a_half": ("a", (tuple(range(250)), tuple(range(250, 500))))})


def _huge_problem(rng: np.random.Generator, k: int = 4, cells: int = 40, people: int = 60) -> ParentProblem:
    """k children of a parent on ``cells`` random cells of HUGE; the detailed measurement holds only the
    parent's non-zero cells (``Measurement.answers``), the marginals all their answers."""
    support = np.sort(rng.choice(HUGE.ncells, cells, replace=False))
    truth = np.zeros((k, cells), dtype=np.int64)
    for c in range(k):
        np.add.at(truth[c], rng.integers(0, cells, people), 1)
    parent = truth.sum(axis=0)
    support, truth = support[parent > 0], truth[:, parent > 0]
    meas = [Measurement("detailed", truth + rng.normal(0, 2, truth.shape), np.full(k, 4.0), answers=support)]
    for name in ("total", "a_half", "c"):
        q = build_query(HUGE, name)
        true = np.stack([q.answer_sparse(support, truth[c]) for c in range(k)])
        meas.append(Measurement(name, true + rng.normal(0, 1, true.shape), np.full(k, 2.0)))
    return ParentProblem(HUGE, "p", [f"c{i}" for i in range(k)], SparseHist(support, truth.sum(axis=0), HUGE.ncells),
                         meas, l2_passes=[["total"], ["a_half", "c", "detailed"]],
                         rounder_passes=[["total", "a_half"], ["c", "detailed"]])


def test_a_parent_of_a_128_million_cell_histogram_solves_in_its_cells_in_play():
    """A dense array of the declared cells would take 1 GB (int64) per child; the whole solve stays far below."""
    problem = _huge_problem(np.random.default_rng(3))
    tracemalloc.start()
    solution = solve_parent(problem)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    parent = problem.parent_sparse()
    assert np.isin(solution.cells, parent.cells).all() and solution.counts.min() >= 0
    hist = solution.csr()
    assert hist.shape == (4, HUGE.ncells)
    total = np.asarray(hist.sum(axis=0)).ravel()
    assert np.array_equal(np.flatnonzero(total), parent.cells) and np.array_equal(total[parent.cells], parent.counts)
    assert solution.stats.n_x <= problem.n_children * parent.cells.size


def test_a_measurement_of_the_cells_in_play_estimates_as_the_full_one():
    """A detailed measurement held on the parent's non-zero cells only gives the same estimate, byte for
    byte, as the same measurement given on every declared cell (the layout reads only the cells in play)."""
    rng = np.random.default_rng(11)
    problem = make_problem(random_truth(rng, k=5, n_cells=12, people=30), rng, noise=2.0)
    support = np.flatnonzero(problem.parent_hist)
    sparse = replace(problem, parent_hist=SparseHist.of(problem.parent_hist), measurements=[
        replace(m, values=m.values[:, support], answers=support) if m.query == "detailed" else m
        for m in problem.measurements])
    assert build_layout(sparse).cells.tolist() == support.tolist()
    full, held = solve_parent(problem), solve_parent(sparse)
    assert full.hist.tobytes() == held.hist.tobytes()
    assert (full.csr() != held.csr()).nnz == 0


def test_measurement_answers_are_checked():
    rng = np.random.default_rng(1)
    problem = _huge_problem(rng)
    bad = replace(problem.measurements[0], answers=problem.measurements[0].answers[::-1])
    with pytest.raises(ValueError, match="answers must be sorted"):
        build_layout(replace(problem, measurements=[bad] + problem.measurements[1:]))


def _in_play_config(config):
    from topdown.pipeline.configuration.config import config_from_dict

    data = config.model_dump(mode="json")
    for product in config.run.products:
        data[product]["budget"]["measure"] = "in_play"
    return config_from_dict(data, source=config.source)


def test_in_play_leaves_the_certificate_and_the_configuration_of_declared_runs_as_they_were():
    """The certificate depends on the budget only, not on which answers are held; a declared run's
    configuration serialises as before the key existed (its hash in the pinned outputs)."""
    from topdown.pipeline import load_config
    from topdown.pipeline.privacy.certificate import certificate

    config = load_config("demo")
    held = _in_play_config(config)
    assert held.products["persons"].budget.measure == "in_play"
    differs = {k for k in certificate(held) if certificate(held)[k] != certificate(config)[k]}
    assert differs == {"config_sha256"}
    assert "measure" not in config.model_dump(mode="json")["persons"]["budget"]
    assert held.digest() != config.digest()


@pytest.mark.slow
def test_in_play_run_measures_the_parents_published_cells_with_the_declared_noise(tmp_path, demo_input, dask_client):
    """The privacy argument's conditions (DESIGN.md item 30), checked on a whole run: below the root, every
    child's rows of a query are exactly the answers that count a cell of its parent's *published* histogram
    (a choice from released output), each an answer of the declared query with the declared query's variance;
    the root is measured on every answer; and the run verifies."""
    import pyarrow.parquet as pq

    from topdown.pipeline import load_config, run
    from topdown.pipeline.outputs.verify import verify_run
    from topdown.pipeline.privacy.accounting import allocate

    config = _in_play_config(load_config("demo"))
    out = tmp_path / "run"
    run(config, out, input_dir=demo_input, client=dask_client)
    assert verify_run(out).ok
    spine = pq.read_table(out / "spine.parquet").to_pandas()
    product = config.census.product("persons")
    budget = config.products["persons"].budget
    levels = list(budget.levels)
    for above, level in zip(levels, levels[1:]):
        hist = pq.read_table(out / "histograms" / "persons" / f"level={above}").to_pandas()
        noisy = pq.read_table(out / "noisy_measurements" / "persons" / f"level={level}").to_pandas()
        parent_of = spine.drop_duplicates(level).set_index(level)[above]
        cells = hist.groupby("geocode")["cell"].apply(lambda c: np.sort(c.to_numpy()))
        for (child, query), rows in noisy.groupby(["geocode", "query"]):
            q = build_query(product.schema, query)
            parent_cells = cells.get(parent_of[child], np.zeros(0, dtype=np.int64))
            assert np.array_equal(np.sort(rows["answer"].to_numpy()), q.answers_of(parent_cells)), (level, child, query)
            assert (rows["variance"] == allocate(budget, level, query).variance).all(), (level, child, query)
    root = pq.read_table(out / "noisy_measurements" / "persons" / f"level={levels[0]}").to_pandas()
    for query, rows in root.groupby("query"):
        assert len(rows) == build_query(product.schema, query).n_answers


def test_the_answers_held_depend_on_the_parents_estimate_only():
    """Two neighbouring inputs (one person moved to another cell) under the same published parent estimate
    hold the same answers with the same variances: which answers are released is not a function of the
    children's data; and each is an answer of the declared query, measured with the declared noise."""
    import scipy.sparse as sp

    from topdown.pipeline import load_config
    from topdown.pipeline.privacy.measure import measure
    from topdown.pipeline.configuration.census import PERSONS, PERSONS_PRODUCT

    budget = load_config("demo").products["persons"].budget
    level = list(budget.levels)[-1]
    rng = np.random.default_rng(7)
    hist = sp.csr_matrix(rng.poisson(0.02, (6, PERSONS.ncells)).astype(np.int64))
    moved = hist.toarray()
    src = int(np.flatnonzero(moved[2])[0])
    moved[2, src] -= 1
    moved[2, (src + 700) % PERSONS.ncells] += 1  # a cell the parent's estimate may not hold
    held = np.sort(rng.choice(PERSONS.ncells, 150, replace=False))
    nodes, plb = [f"n{i}" for i in range(6)], [budget.levels[level]] * 6
    tables = [measure(PERSONS_PRODUCT, budget, level, nodes, plb, h, "test", 3, held=held)
              for h in (hist, sp.csr_matrix(moved))]
    keys = [t.select(["geocode", "query", "answer", "variance"]).to_pandas() for _, t in tables]
    assert keys[0].equals(keys[1])
    declared, _ = measure(PERSONS_PRODUCT, budget, level, nodes, plb, hist, "test", 3)
    for m, full in zip(tables[0][0], declared):
        q = build_query(PERSONS, m.query)
        assert np.array_equal(m.answers, q.answers_of(held)) and m.values.shape == (6, m.answers.size)
        assert np.array_equal(m.variance, full.variance)


@settings(max_examples=150, deadline=None)
@given(schemas(), st.data())
def test_a_support_is_the_cells_whose_every_counting_answer_is_allowed(schema, data):
    """``vocab.support`` (axis by axis) equals the cell-by-cell rule on the schema's every cell."""
    names = _names(schema)
    chosen = data.draw(st.lists(st.sampled_from(names), min_size=1, max_size=3))
    given_ = []
    keep = np.ones(schema.ncells, dtype=bool)
    for name in chosen:
        q = build_query(schema, name)
        allowed = np.array(sorted(data.draw(st.sets(st.integers(0, q.n_answers - 1)))), dtype=np.int64)
        given_.append((q, allowed))
        keep &= (q.groups < 0) | np.isin(q.groups, allowed)
    np.testing.assert_array_equal(support(given_, limit=10**6), np.flatnonzero(keep))


#: 2,048 x 1,024 x 1,024 = 2^31 declared cells.
VAST = Schema("vast", (("a", 2048), ("b", 1024), ("c", 1024)), {})


def test_a_support_of_a_2_to_the_31_cell_histogram_is_found_from_its_marginals():
    """Axis by axis: no array of the declared cells; the limit is a clear error, not an allocation."""
    rng = np.random.default_rng(5)
    picks = {d: np.sort(rng.choice(n, 6, replace=False)) for d, n in VAST.dims}
    qs = [(build_query(VAST, d), picks[d]) for d in ("a", "b", "c")]
    tracemalloc.start()
    cells = support(qs, limit=10**5)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 16 * 2**20 and cells.size == 6 ** 3
    a, b, c = VAST.unravel(cells)
    assert set(a) == set(picks["a"]) and set(b) == set(picks["b"]) and set(c) == set(picks["c"])
    assert (np.diff(cells) > 0).all()
    with pytest.raises(SupportError, match="above the limit of 100"):
        support([(build_query(VAST, "c"), picks["c"])], limit=100)
    assert support([(build_query(VAST, "total"), np.zeros(0, np.int64))] + qs, limit=10).size == 0
    np.testing.assert_array_equal(answers_above(np.array([0.4, 3.0, -2.0, 1.5]), 1.0), [1, 3])


def _root_problem(rng: np.random.Generator, cells: int = 40, people: int = 200) -> ParentProblem:
    """The root of HUGE with its cells in play given (``support``): the detailed measurement holds those
    cells only, the marginals all their answers."""
    cells_in_play = np.sort(rng.choice(HUGE.ncells, cells, replace=False))
    truth = np.zeros(cells, dtype=np.int64)
    np.add.at(truth, rng.integers(0, cells, people), 1)
    meas = [Measurement("detailed", (truth + rng.normal(0, 2, cells))[None, :], np.full(1, 4.0),
                        answers=cells_in_play)]
    for name in ("total", "a_half", "c"):
        q = build_query(HUGE, name)
        true = q.answer_sparse(cells_in_play, truth)[None, :]
        meas.append(Measurement(name, true + rng.normal(0, 1, true.shape), np.full(1, 2.0)))
    return ParentProblem(HUGE, "US", ["US"], None, meas, l2_passes=[["total"], ["a_half", "c", "detailed"]],
                         rounder_passes=[["total", "a_half"], ["c", "detailed"]], support=cells_in_play)


def test_a_root_of_a_128_million_cell_histogram_solves_over_its_support():
    """Without a support the root's layout alone holds the declared cells (1 GB per int64 array)."""
    problem = _root_problem(np.random.default_rng(8))
    tracemalloc.start()
    solution = solve_parent(problem)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 64 * 2**20, f"peak {peak / 2**20:.1f} MiB"
    assert np.isin(solution.cells, problem.support).all() and solution.counts.min() >= 0
    assert build_layout(problem).cells.tolist() == problem.support.tolist()
    total = solution.counts.sum()
    assert abs(total - problem.measurements[1].values[0, 0]) < 10
    for bad in (problem.support[::-1], np.array([HUGE.ncells])):
        with pytest.raises(ValueError, match="support must be sorted"):
            build_layout(replace(problem, support=bad))


def test_aggregate_is_the_sparse_product_without_its_column_sized_work_arrays():
    from topdown.pipeline.execution.levels import aggregate

    rng = np.random.default_rng(2)
    for t in range(50):
        nb, nn, nc = int(rng.integers(1, 30)), int(rng.integers(1, 6)), int(rng.integers(1, 50))
        hist = sp.random(nb, nc, density=rng.uniform(0, 0.5), random_state=t, format="csr")
        hist.data = rng.integers(1, 9, hist.data.size).astype(np.int64)
        agg = sp.csr_matrix((np.ones(nb, np.int64), (rng.integers(0, nn, nb), np.arange(nb))), shape=(nn, nb))
        got, want = aggregate(agg, hist), (agg @ hist).tocsr()
        want.sort_indices()
        assert got.dtype == want.dtype and got.has_sorted_indices
        for a in ("indptr", "indices", "data"):
            np.testing.assert_array_equal(getattr(got, a), getattr(want, a))
    huge = sp.csr_matrix((np.ones(3, np.int64), ([0, 1, 2], [5, HUGE.ncells - 1, 5])), shape=(3, HUGE.ncells))
    tracemalloc.start()
    out = aggregate(sp.csr_matrix(np.ones((1, 3), np.int64)), huge)
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    assert peak < 2**20 and out.indices.tolist() == [5, HUGE.ncells - 1] and out.data.tolist() == [2, 1]
