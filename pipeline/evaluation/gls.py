"""Generalized least squares over the noisy measurements: each node's histogram estimate and its covariance
(the two-pass estimator of Cumings-Menon et al., arXiv 2404.13164; DESIGN.md, uncertainty).

Structure exploited. Every measured query is a marginal, so its Gram matrix M'M is a Kronecker product over
the schema's axes of per-axis factors G'G. On an axis where every measured query's factor is a combination
a I + b J (identity: the axis is kept; J: the axis is summed over) the factors are diagonal in one fixed
basis: the constant vector and its orthogonal complement. The remaining ("dense") axes are kept as they are
(persons: hhgq, because of the hhinstlevels recode). So every precision and covariance matrix of the GLS
is block diagonal, one d x d block per *class* (a choice of constant/complement per identity-or-sum axis),
acting as the identity within the class: an array ``(..., C, d, d)``. For the person histogram, C = 8 and
d = 8: 512 numbers stand for a 2016 x 2016 matrix, exactly. Sums, products, inverses and transposes act
class by class; a query cell's variance is a sum over classes of a quadratic form (``cell_variance``).

The two passes (uncertainty_notes.md section 1), in information form so that a node without measurements
(its budget moved away) simply has precision 0:

* own measurements: precision ``P_g = sum_q w_q M_q'M_q``, information ``z = sum_q w_q M_q' y_q``;
* bottom-up: ``S(u) = sum_c V_-(c)``, ``s(u) = sum_c b_-(c)``, ``V_-(u) = (P_g + S^-1)^-1``,
  ``b_-(u) = V_-(u) (z + S^-1 s)``; at a leaf ``V_- = P_g^-1``, ``b_- = V_- z``;
* top-down: ``A(c) = V_-(c) S(u)^-1``, ``b~(c) = b_-(c) + A(c)(b~(u) - s(u))``,
  ``V~(c) = V_-(c) + A(c) V~(u) A(c)' - A(c) V_-(c)``.

The estimates ignore the invariants and edit constraints (as the Bureau's GLS product does); they are linear
in the noisy measurements and unbiased.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import product as cartesian

import numpy as np

from topdown.vocab.queries import CROSS, build_query, canonical_name
from topdown.vocab.schema import Schema


class GLSError(ValueError):
    """The measurements do not identify a node's histogram (a leaf without a full-rank set of queries)."""


def _axis_groups(schema: Schema, name: str) -> list[list[tuple[int, ...]]]:
    """Per schema axis, the groups of levels of a query's factor (one group of all levels: summed over)."""
    name = canonical_name(name)
    every = [[tuple(range(n))] for _, n in schema.dims]
    if name == "total":
        return every
    if name == "detailed":
        return [[(k,) for k in range(n)] for _, n in schema.dims]
    out = list(every)
    for term in name.split(CROSS):
        if term in schema.dim_names:
            axis = schema.axis(term)
            out[axis] = [(k,) for k in range(schema.dims[axis][1])]
        else:
            dim, groups = schema.recodes[term]
            out[schema.axis(dim)] = [tuple(g) for g in groups]
    return out


def _indicator(groups: list[tuple[int, ...]], n: int) -> np.ndarray:
    g = np.zeros((len(groups), n))
    for i, levels in enumerate(groups):
        g[i, list(levels)] = 1.0
    return g


def _identity_or_sum(f: np.ndarray) -> tuple[float, float] | None:
    """(a, b) with f = a I + b J, or None."""
    n = f.shape[0]
    b = f[0, 1] if n > 1 else 0.0
    a = f[0, 0] - b
    return (a, b) if np.allclose(f, a * np.eye(n) + b * np.ones((n, n))) else None


@dataclass(frozen=True, eq=False)
class KronAlgebra:
    """Class-block representation of the matrices spanned by a schema's measured marginal queries."""

    schema: Schema
    queries: tuple[str, ...]  # the measured queries, in the order weights are given

    @cached_property
    def _layout(self):
        dims = [n for _, n in self.schema.dims]
        factors = {q: [_indicator(g, n) for g, n in zip(_axis_groups(self.schema, q), dims)] for q in self.queries}
        dense, coef = [], {}
        for axis, n in enumerate(dims):
            ab = [_identity_or_sum(factors[q][axis].T @ factors[q][axis]) for q in self.queries]
            if n > 1 and any(x is None for x in ab):
                dense.append(axis)
            else:
                coef[axis] = ab
        ij = [a for a in range(len(dims)) if a not in dense]
        classes = list(cartesian((True, False), repeat=len(ij)))  # True: constant vector of that axis
        d = int(np.prod([dims[a] for a in dense])) if dense else 1
        grams = np.zeros((len(self.queries), len(classes), d, d))
        for qi, q in enumerate(self.queries):
            block = np.ones((1, 1))
            for a in dense:
                block = np.kron(block, factors[q][a].T @ factors[q][a])
            for ci, cls in enumerate(classes):
                lam = 1.0
                for a, const in zip(ij, cls):
                    a_, b_ = coef[a][qi]
                    lam *= a_ + b_ * dims[a] if const else a_
                grams[qi, ci] = lam * block
        return dims, dense, ij, classes, d, grams

    @property
    def n_classes(self) -> int:
        return len(self._layout[3])

    @property
    def d(self) -> int:
        return self._layout[4]

    # -- construction -------------------------------------------------------------------------------
    def precision(self, weights: np.ndarray) -> np.ndarray:
        """``sum_q w_q M_q'M_q`` for weights ``(..., n_queries)`` (1/variance; 0 for unmeasured)."""
        return np.einsum("...q,qcij->...cij", weights, self._layout[5])

    def information(self, answers: dict[str, np.ndarray], weights: dict[str, np.ndarray]) -> np.ndarray:
        """``sum_q w_q M_q' y_q``: answers[q] ``(N, n_answers)``, weights[q] ``(N,)``; returns ``(N, ncells)``."""
        out = None
        for q, y in answers.items():
            groups = build_query(self.schema, q).groups
            term = np.where(groups >= 0, y[:, np.maximum(groups, 0)], 0.0) * weights[q][:, None]
            out = term if out is None else out + term
        return out

    # -- action on histograms ------------------------------------------------------------------------
    def apply(self, mat: np.ndarray, x: np.ndarray) -> np.ndarray:
        """``mat @ x`` for class blocks ``mat (N, C, d, d)`` and histograms ``x (N, ncells)``."""
        dims, dense, ij, classes, d, _ = self._layout
        n = x.shape[0]
        t = x.reshape(n, *dims).transpose(0, *[a + 1 for a in dense], *[a + 1 for a in ij])
        t = t.reshape(n, d, *[dims[a] for a in ij])
        out = np.zeros_like(t, dtype=np.result_type(t.dtype, mat.dtype))
        for ci, cls in enumerate(classes):
            y = t
            for k, const in enumerate(cls):
                mean = y.mean(axis=2 + k, keepdims=True)
                y = np.broadcast_to(mean, y.shape) if const else y - mean
            out += np.einsum("nij,nj...->ni...", mat[:, ci], y)
        shape = [dims[a] for a in dense] + [dims[a] for a in ij]
        out = out.reshape(n, *shape).transpose(0, *np.argsort(dense + ij) + 1)
        return out.reshape(n, -1)

    def cell_variance(self, mat: np.ndarray, query: str) -> np.ndarray:
        """Variance of every answer of ``query`` under covariance ``mat (N, C, d, d)``: ``(N, n_answers)``."""
        dims, dense, ij, classes, d, _ = self._layout
        groups = _axis_groups(self.schema, query)
        h = np.ones((1, 1))
        for a in dense:
            h = np.kron(h, _indicator(groups[a], dims[a]))
        quad = np.einsum("kd,ncde,ke->nck", h, mat, h)  # (N, C, answers over the dense axes)
        sizes = [[len(g) for g in groups[a]] for a in ij]
        n = mat.shape[0]
        out = np.zeros((n, quad.shape[2], *[len(s) for s in sizes]))
        for ci, cls in enumerate(classes):
            w = np.ones([1] * len(ij))
            for k, (const, s) in enumerate(zip(cls, sizes)):
                s = np.asarray(s, dtype=float)
                norm = s * s / dims[ij[k]] if const else s - s * s / dims[ij[k]]
                shape = [1] * len(ij)
                shape[k] = len(s)
                w = w * norm.reshape(shape)
            out += quad[:, ci][(..., *[None] * len(ij))] * w[None, None]
        dense_shape = [len(groups[a]) for a in dense]
        out = out.reshape(n, *dense_shape, *[len(s) for s in sizes]).transpose(0, *np.argsort(dense + ij) + 1)
        return out.reshape(n, -1)


# ---------------------------------------------------------------------------------------- block algebra
def inv(m: np.ndarray) -> np.ndarray:
    return np.linalg.inv(m)


def mul(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    return a @ b


def tr(a: np.ndarray) -> np.ndarray:
    return np.swapaxes(a, -1, -2)


def segment_sum(values: np.ndarray, index: np.ndarray, n: int) -> np.ndarray:
    """Sum rows of ``values`` into ``n`` groups by ``index``."""
    out = np.zeros((n, *values.shape[1:]), dtype=values.dtype)
    np.add.at(out, index, values)
    return out


def leaf_covariance(precision: np.ndarray, where: str = "leaf") -> np.ndarray:
    """``V_- = P_g^-1`` at the leaves; a singular precision (queries that do not identify the histogram)
    is an error naming ``where``."""
    try:
        v = inv(precision)
    except np.linalg.LinAlgError:
        raise GLSError(f"{where}: the measured queries do not identify the histogram (a leaf needs "
                       "'detailed' or an equivalent full-rank set of measured queries)") from None
    return v


def bottom_up(alg: KronAlgebra, precision: np.ndarray, z: np.ndarray, s_cov: np.ndarray, s_est: np.ndarray):
    """``V_-`` and ``b_-`` of internal nodes from their own precision/information and their children's sums."""
    s_inv = inv(s_cov)
    v = inv(precision + s_inv)
    b = alg.apply(v, z + alg.apply(s_inv, s_est))
    return v, b, s_inv


def gain(v_minus: np.ndarray, s_inv_parent: np.ndarray) -> np.ndarray:
    """``A(c) = V_-(c) S(u)^-1``."""
    return mul(v_minus, s_inv_parent)


def top_down_cov(v_minus: np.ndarray, a: np.ndarray, v_parent: np.ndarray) -> np.ndarray:
    """``V~(c) = V_-(c) + A V~(u) A' - A V_-(c)``, symmetrised."""
    v = v_minus + mul(mul(a, v_parent), tr(a)) - mul(a, v_minus)
    return (v + tr(v)) / 2


def top_down_est(alg: KronAlgebra, b_minus: np.ndarray, a: np.ndarray, b_parent: np.ndarray,
                 s_parent: np.ndarray) -> np.ndarray:
    """``b~(c) = b_-(c) + A(c) (b~(u) - s(u))``."""
    return b_minus + alg.apply(a, b_parent - s_parent)


@lru_cache(maxsize=None)
def algebra(schema: Schema, queries: tuple[str, ...]) -> KronAlgebra:
    return KronAlgebra(schema, queries)


# ------------------------------------------------------------------------------------------- the passes
@dataclass
class LevelState:
    """One level's nodes through the two passes (rows in node order; ``parent`` rows in the level above)."""

    parent: np.ndarray | None
    precision: np.ndarray  # P_g (N, C, d, d)
    info: np.ndarray | None  # z (N, ncells); None once no longer needed
    v_minus: np.ndarray | None = None
    b_minus: np.ndarray | None = None
    s_cov: np.ndarray | None = None  # S: sum of the children's V_- (internal nodes)
    s_est: np.ndarray | None = None  # s: sum of the children's b_-
    s_inv: np.ndarray | None = None
    gain: np.ndarray | None = None  # A (N, C, d, d), below the root
    v: np.ndarray | None = None  # V~
    b: np.ndarray | None = None  # b~


def upward(alg: KronAlgebra, levels: list[LevelState], where: list[str]) -> None:
    """The bottom-up pass over whole levels (``levels`` top-down; the last one's nodes are leaves unless it
    already carries ``s_cov``/``s_est`` from its children)."""
    for i in range(len(levels) - 1, -1, -1):
        lv = levels[i]
        if lv.s_cov is None:  # leaves
            lv.v_minus = leaf_covariance(lv.precision, where[i])
            lv.b_minus = alg.apply(lv.v_minus, lv.info)
        else:
            lv.v_minus, lv.b_minus, lv.s_inv = bottom_up(alg, lv.precision, lv.info, lv.s_cov, lv.s_est)
        if i:
            n_up = len(levels[i - 1].precision)
            levels[i - 1].s_cov = segment_sum(lv.v_minus, lv.parent, n_up)
            levels[i - 1].s_est = segment_sum(lv.b_minus, lv.parent, n_up)


def downward(alg: KronAlgebra, levels: list[LevelState], root_given: bool = False) -> None:
    """The top-down pass; the first level is the root unless ``root_given`` (its ``v``/``b`` already set)."""
    if not root_given:
        levels[0].v, levels[0].b = levels[0].v_minus, levels[0].b_minus
    for up, lv in zip(levels, levels[1:]):
        lv.gain = gain(lv.v_minus, up.s_inv[lv.parent])
        lv.v = top_down_cov(lv.v_minus, lv.gain, up.v[lv.parent])
        lv.b = top_down_est(alg, lv.b_minus, lv.gain, up.b[lv.parent], up.s_est[lv.parent])


def entity_covariance(levels: list[LevelState], cover: list[np.ndarray]) -> np.ndarray:
    """Covariance (C, d, d) of the sum of the estimates of the nodes ``cover[i]`` (rows at level i; the nodes
    must be disjoint): with ``L(c) = [c in cover] I + sum_children L(d) A(d)``,
    ``Var = L(root) V~(root) L(root)' + sum_u [sum_c L_c V_-(c) L_c' - (sum_c L_c V_-(c)) S_u^-1 (...)']``,
    the innovations r(c) = e~(c) - A(c) e~(u) of different parents being uncorrelated (DESIGN.md)."""
    eye = np.broadcast_to(np.eye(levels[0].precision.shape[-1]), levels[0].precision.shape[1:])
    carried: dict[int, np.ndarray] = {}  # row -> L at the current level
    total = np.zeros(levels[0].precision.shape[1:])
    for i in range(len(levels) - 1, -1, -1):
        lv = levels[i]
        ell = dict(carried)
        for r in cover[i]:
            ell[int(r)] = ell.get(int(r), 0) + eye
        if i == 0:
            for r, m in ell.items():
                total += m @ lv.v[r] @ tr(m)
            break
        up: dict[int, np.ndarray] = {}
        spread: dict[int, np.ndarray] = {}
        for r, m in ell.items():
            lvm = m @ lv.v_minus[r]
            total += lvm @ tr(m)
            p = int(lv.parent[r])
            spread[p] = spread.get(p, 0) + lvm
            up[p] = up.get(p, 0) + m @ lv.gain[r]
        for p, g in spread.items():
            total -= g @ levels[i - 1].s_inv[p] @ tr(g)
        carried = up
    return (total + tr(total)) / 2
