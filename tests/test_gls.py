"""The structured two-pass GLS equals the brute-force GLS of the whole tree (estimates, covariances of nodes
and of an off-spine union of nodes), on a small schema with a recode, and one node left unmeasured."""
from __future__ import annotations

import numpy as np

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


def test_two_pass_gls_equals_brute_force():
    rng = np.random.default_rng(5)
    alg = KronAlgebra(TOY, QUERIES)
    assert alg.n_classes == 4 and alg.d == 3  # votingage and cenrace identity-or-sum, hhgq dense
    nc = TOY.ncells
    mats = {q: build_query(TOY, q).matrix().toarray() for q in QUERIES}
    x_true = rng.integers(0, 20, size=(5, nc)).astype(float)
    rows, ys, ws = [], [], []
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
        levels.append(LevelState(PARENTS[lv], alg.precision(WEIGHTS[lv]), alg.information(answers, weights)))
    upward(alg, levels, ["root", "middle", "leaf"])
    downward(alg, levels)
    X, y, W = np.vstack(rows), np.concatenate(ys), np.concatenate(ws)
    cov = np.linalg.inv(X.T @ (W[:, None] * X))
    est = cov @ X.T @ (W * y)
    for lv in range(3):
        agg = _leaf_agg(lv)
        for n in range(agg.shape[1]):
            a = np.kron(agg[:, n][None, :], np.eye(nc))
            np.testing.assert_allclose(levels[lv].b[n], a @ est, atol=1e-8)
            np.testing.assert_allclose(_dense(alg, levels[lv].v[n]), a @ cov @ a.T, atol=1e-8)
            for q in ("total", "inst", "votingage * cenrace", "white", "hhgq * white"):
                m = build_query(TOY, q).matrix().toarray()
                np.testing.assert_allclose(alg.cell_variance(levels[lv].v[n][None], q)[0],
                                           np.diag(m @ a @ cov @ a.T @ m.T), atol=1e-8)
    # An entity made of leaf 0 (first middle node), leaf 3 and the root-level complement: leaves 0, 3, 4 as
    # the cover {leaf 0, leaf 3, leaf 4}, and {middle node 1 minus leaf 2} expressed as leaf 3 + leaf 4.
    sel = np.zeros(5)
    sel[[0, 3, 4]] = 1
    a = np.kron(sel[None, :], np.eye(nc))
    got = entity_covariance(levels, [np.array([], int), np.array([], int), np.array([0, 3, 4])])
    np.testing.assert_allclose(_dense(alg, got), a @ cov @ a.T, atol=1e-8)
    sel[[1, 2]] = 1, 0  # leaves 0, 1 (= middle node 0) and 3, 4
    a = np.kron(sel[None, :], np.eye(nc))
    got = entity_covariance(levels, [np.array([], int), np.array([0]), np.array([3, 4])])
    np.testing.assert_allclose(_dense(alg, got), a @ cov @ a.T, atol=1e-8)


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
