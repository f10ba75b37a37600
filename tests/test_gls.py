"""The structured two-pass GLS equals the brute-force GLS of the whole tree (estimates, covariances of nodes
and of an off-spine union of nodes), on a small schema with a recode, and one node left unmeasured."""
from __future__ import annotations

import numpy as np
import pytest

from topdown.pipeline.evaluation.gls import KronAlgebra, LevelState, downward, entity_covariance, upward
from topdown.vocab.queries import build_query
from topdown.vocab.schema import Schema
from topdown.pipeline.configuration.census import PERSONS

TOY = Schema("toy", dims=(("hhgq", 3), ("votingage", 2), ("cenrace", 3)),
             recodes={"inst": ("hhgq", ((0,), (1, 2))), "white": ("cenrace", ((0,),))})
QUERIES = ("total", "hhgq", "inst", "votingage * cenrace", "detailed")
# Tree: root -> 2 nodes -> 5 leaves (2 under the first, 3 under the second).
PARENTS = [None, np.array([0, 0]), np.array([0, 0, 1, 1, 1])]
WEIGHTS = [np.array([[0.0, 0.5, 1.0, 0.2, 0.05]]),          # root: total unmeasured
           np.array([[0.0, 0.0, 0.0, 0.0, 0.0],             # first middle node: budget moved away
                     [1.0, 0.3, 0.7, 0.1, 0.2]]),
           np.array([[1.0, 0.4, 0.0, 0.3, 0.5]] * 5) * np.array([[1], [2], [1], [3], [1]])]


def _dense(alg: KronAlgebra, blocks: np.ndarray) -> np.ndarray:
    """The full ncells x ncells matrix of class blocks (C, d, d), by acting on the unit vectors."""
    eye = np.eye(alg.schema.ncells)
    return alg.apply(np.broadcast_to(blocks, (eye.shape[0], *blocks.shape)), eye).T


def _leaf_agg(level: int) -> np.ndarray:
    """Leaves x nodes-of-level incidence."""
    if level == 2:
        return np.eye(5)
    if level == 1:
        return np.eye(2)[PARENTS[2]]
    return np.ones((5, 1))


ZQ = ("inst", "inst * votingage")  # zero queries: "inst * votingage" restricts votingage, which becomes dense
#: Per level, per zero query, the answers constrained to 0 (none at the leaves, as the Bureau's code).
ZEROS = [{"inst * votingage": np.array([[False, False, True, False]])},
         {"inst": np.array([[False, True], [False, False]])},
         {}]


def _solve(zeros, totals, seed=5):
    """The structured two-pass GLS with ``zeros`` and exact ``totals`` (per level, NaN: none), and the dense
    reference: the GLS of the whole tree with the zeros as rows of weight 2^14, conditioned on the totals
    (x* = b - V C'(CVC')^+ (Cb - t), V* = V - V C'(CVC')^+ CV)."""
    from topdown.pipeline.evaluation.gls import ZERO_VARIANCE

    rng = np.random.default_rng(seed)
    alg = KronAlgebra(TOY, QUERIES, ZQ if zeros else ())
    nc = TOY.ncells
    mats = {q: build_query(TOY, q).matrix().toarray() for q in QUERIES + ZQ}
    x_true = rng.integers(0, 20, size=(5, nc)).astype(float)
    rows, ys, ws, cons, ts = [], [], [], [], []
    levels = []
    for lv in range(3):
        agg = _leaf_agg(lv)  # leaves x nodes
        node_true = agg.T @ x_true
        answers, weights = {}, {}
        for qi, q in enumerate(QUERIES):
            w = WEIGHTS[lv][:, qi]
            y = node_true @ mats[q].T + rng.normal(size=(len(w), mats[q].shape[0])) * np.where(w > 0, 1 / np.sqrt(np.maximum(w, 1e-300)), 0)[:, None]
            answers[q], weights[q] = y, w
            for n in np.flatnonzero(w > 0):
                # measurement of node n: M_q (sum of its leaves)
                rows.append(np.kron(agg[:, n][None, :], mats[q]))
                ys.append(y[n])
                ws.append(np.full(mats[q].shape[0], w[n]))
        precision = alg.precision(WEIGHTS[lv])
        if zeros and ZEROS[lv]:
            precision = precision + alg.zero_precision(ZEROS[lv], agg.shape[1])
            for q, za in ZEROS[lv].items():
                for n, a in zip(*np.nonzero(za)):
                    for cell in np.flatnonzero(mats[q][a]):
                        rows.append(np.kron(agg[:, n][None, :], np.eye(nc)[cell][None, :]))
                        ys.append(np.zeros(1))
                        ws.append(np.full(1, 1 / ZERO_VARIANCE))
        t = None
        if totals[lv] is not None:
            t = np.where(totals[lv], node_true.sum(axis=1), np.nan)
            for n in np.flatnonzero(totals[lv]):
                cons.append(np.kron(agg[:, n][None, :], np.ones((1, nc))))
                ts.append(t[n])
        levels.append(LevelState(PARENTS[lv], precision, alg.information(answers, weights), total=t))
    upward(alg, levels, ["root", "middle", "leaf"])
    downward(alg, levels)
    X, y, W = np.vstack(rows), np.concatenate(ys), np.concatenate(ws)
    cov = np.linalg.inv(X.T @ (W[:, None] * X))
    est = cov @ X.T @ (W * y)
    if cons:
        C, t = np.vstack(cons), np.array(ts)
        k = cov @ C.T @ np.linalg.pinv(C @ cov @ C.T)
        est, cov = est - k @ (C @ est - t), cov - k @ C @ cov
    return alg, levels, est, cov


def _compare(alg, levels, est, cov):
    nc = TOY.ncells
    for lv in range(3):
        agg = _leaf_agg(lv)
        for n in range(agg.shape[1]):
            a = np.kron(agg[:, n][None, :], np.eye(nc))
            np.testing.assert_allclose(levels[lv].b[n], a @ est, atol=1e-7)
            np.testing.assert_allclose(_dense(alg, levels[lv].v[n]), a @ cov @ a.T, atol=1e-7)
            for q in ("total", "inst", "votingage * cenrace", "white", "hhgq * white"):
                m = build_query(TOY, q).matrix().toarray()
                np.testing.assert_allclose(alg.cell_variance(levels[lv].v[n][None], q)[0],
                                           np.diag(m @ a @ cov @ a.T @ m.T), atol=1e-7)
    # An entity made of leaf 0 (first middle node), leaf 3 and the root-level complement: leaves 0, 3, 4 as
    # the cover {leaf 0, leaf 3, leaf 4}, and {middle node 1 minus leaf 2} expressed as leaf 3 + leaf 4.
    sel = np.zeros(5)
    sel[[0, 3, 4]] = 1
    a = np.kron(sel[None, :], np.eye(nc))
    got = entity_covariance(levels, [np.array([], int), np.array([], int), np.array([0, 3, 4])])
    np.testing.assert_allclose(_dense(alg, got), a @ cov @ a.T, atol=1e-7)
    sel[[1, 2]] = 1, 0  # leaves 0, 1 (= middle node 0) and 3, 4
    a = np.kron(sel[None, :], np.eye(nc))
    got = entity_covariance(levels, [np.array([], int), np.array([0]), np.array([3, 4])])
    np.testing.assert_allclose(_dense(alg, got), a @ cov @ a.T, atol=1e-7)


def test_two_pass_gls_equals_brute_force():
    alg, levels, est, cov = _solve(False, [None] * 3)
    assert alg.n_classes == 4 and alg.d == 3  # votingage and cenrace identity-or-sum, hhgq dense
    _compare(alg, levels, est, cov)


@pytest.mark.parametrize("totals", [
    [np.array([True]), np.array([True, False]), None],  # the root and the unmeasured middle node (as State)
    [None, None, np.ones(5, bool)],  # every leaf (as housing units): every node's total is their sum
    [np.array([True]), np.array([False, True]), np.array([False, False, True, False, True])],
], ids=["upper", "leaves", "mixed"])
def test_conditioned_gls_with_structural_zeros_equals_dense_reference(totals):
    """Structural zeros (rows of variance 2^-14) and exact totals (conditioning) at several levels: the
    structured passes equal the dense constrained GLS; exact nodes' totals have their value and no variance."""
    alg, levels, est, cov = _solve(True, totals)
    assert alg.n_classes == 2 and alg.d == 6  # votingage made dense by the zero query
    _compare(alg, levels, est, cov)
    for lv, t in zip(levels, totals):
        if t is not None:
            ex = np.flatnonzero(t)
            np.testing.assert_allclose(lv.b[ex].sum(axis=1), lv.total[ex], rtol=1e-12)
            assert np.abs(alg.cell_variance(lv.v[ex], "total")).max() < 1e-9
    # the zero cells of the root: near-zero estimate and variance (hhgq 1, 2 at votingage 0)
    v = alg.cell_variance(levels[0].v, "hhgq * votingage")[0].reshape(3, 2)
    assert v[1:, 0].max() < 1e-3 < v[0, 0]


def test_person_histogram_is_eight_blocks_of_eight():
    from topdown.pipeline.configuration.config import load_config

    queries = tuple(load_config("demo").product("persons").budget.queries["Block"])
    alg = KronAlgebra(PERSONS, queries)
    assert (alg.n_classes, alg.d) == (8, 8)
    p = alg.precision(np.ones(len(queries)))
    eye = np.eye(PERSONS.ncells)[:50]
    full = sum(build_query(PERSONS, q).matrix().toarray().T @ build_query(PERSONS, q).matrix().toarray()
               for q in queries)
    np.testing.assert_allclose(alg.apply(np.broadcast_to(p, (50, *p.shape)), eye), eye @ full, atol=1e-9)


def test_person_structural_zeros_are_cell_masks():
    """P.L. 94-171's zeros (hhgq upper bounds of 0; nursing facility x under 18 equal to 0) make votingage dense
    (4 classes of 16) and add 2^14 on exactly the cells they cover (the Bureau's ``make_nonzeros_mask_vec``)."""
    from topdown.pipeline.configuration.config import load_config
    from topdown.pipeline.evaluation.gls import ZERO_VARIANCE

    queries = tuple(load_config("demo").product("persons").budget.queries["Block"])
    nurse = "gqNursingTotal * nonvoting"
    alg = KronAlgebra(PERSONS, queries, ("hhgq", nurse))
    assert (alg.n_classes, alg.d) == (4, 16)
    hhgq = np.zeros((1, 8), bool)
    hhgq[0, [1, 7]] = True
    p = alg.zero_precision({"hhgq": hhgq, nurse: np.ones((1, build_query(PERSONS, nurse).n_answers), bool)}, 1)
    m = build_query(PERSONS, "hhgq").matrix().toarray()
    mask = (m[1] + m[7] + build_query(PERSONS, nurse).matrix().toarray().sum(axis=0)) > 0
    assert 0 < mask.sum() < PERSONS.ncells
    cells = np.r_[np.flatnonzero(mask)[:40], np.flatnonzero(~mask)[:40]]
    eye = np.eye(PERSONS.ncells)[cells]
    np.testing.assert_allclose(alg.apply(np.broadcast_to(p, (len(cells), *p.shape[1:])), eye),
                               eye * mask / ZERO_VARIANCE, atol=1e-6)


def test_zeros_that_would_make_large_blocks_are_left_out():
    """The 2017 Chile example's age x marital zeros would make blocks of 126 (18x the memory): left out;
    P.L. 94-171's are kept (blocks of 16)."""
    from topdown.pipeline.configuration.config import load_config
    from topdown.pipeline.evaluation.gls import MAX_ZERO_BLOCK, with_zeros

    for name, kept in (("chile_2017", 0), ("demo", 2)):
        config = load_config(name)
        product = config.census.products[0]
        queries = tuple(sorted({q for lv in config.product(product.name).budget.queries.values() for q in lv}))
        zeros = tuple(sorted({s.query for s in product.constraints.values() if s.rhs in ("zero", "unit_upper")}))
        alg, left = with_zeros(product.schema, queries, zeros)
        assert len(alg.zeros) == kept and len(left) == len(zeros) - kept and alg.d <= MAX_ZERO_BLOCK


@pytest.mark.parametrize("preset, product, fits", [("dhc2020", "persons", False), ("dhc2020", "households", False),
                                                   ("dhc2020", "units", True), ("dhc_1940", "persons", True),
                                                   ("ri2010", "persons", True)])
def test_an_algebra_whose_blocks_are_too_large_is_refused_before_it_is_made(preset, product, fits):
    """The 2020 DHC's persons and households keep axes of 4,872 and 1,566 levels whole (age with relgq,
    household type with tenure): one covariance would be over a gigabyte, refused with a GLSError naming the
    product and the axes, without making any array of that size; the other shipped products fit."""
    from topdown.pipeline.configuration.config import load_config
    from topdown.pipeline.evaluation.gls import MAX_MATRIX_BYTES, GLSError

    config = load_config(preset)
    queries = tuple(sorted({q for level in config.products[product].budget.queries.values() for q in level}))
    alg = KronAlgebra(config.census.product(product).schema, queries)
    if fits:
        alg.check_size()
        assert alg.n_classes * alg.d ** 2 * 8 <= MAX_MATRIX_BYTES
        return
    with pytest.raises(GLSError, match=rf"product '{product}': GLS is not computed for it: .* group the axes "
                                       r"(relgq, age|tenure, hhtype) .* MiB; at most 64 MiB"):
        alg.check_size()
    with pytest.raises(GLSError):
        alg.precision(np.ones(len(queries)))  # the algebra's arrays are never made
