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

The two passes (arXiv 2404.13164), in information form so that a node without measurements
(its budget moved away) simply has precision 0:

* own measurements: precision ``P_g = sum_q w_q M_q'M_q``, information ``z = sum_q w_q M_q' y_q``;
* bottom-up: ``S(u) = sum_c V_-(c)``, ``s(u) = sum_c b_-(c)``, ``V_-(u) = (P_g + S^-1)^-1``,
  ``b_-(u) = V_-(u) (z + S^-1 s)``; at a leaf ``V_- = P_g^-1``, ``b_- = V_- z``;
* top-down: ``A(c) = V_-(c) S(u)^-1``, ``b~(c) = b_-(c) + A(c)(b~(u) - s(u))``,
  ``V~(c) = V_-(c) + A(c) V~(u) A(c)' - A(c) V_-(c)``.

Structural zeros, as the Bureau's GLS code derives them (uscensusbureau/DAS_2020_GLS_Uncertainty_Evaluation,
``GLS/main_two_pass_alg.py``: ``convert_constr_to_query``, ``make_nonzeros_mask_vec``, ``init_bottom_up_pass``,
``VAR_FOR_CONSTR_QUERY = 1 / 2 ** 14``): a constraint row is a zero when it is an upper bound (``<=``) or an
equality whose right-hand side is 0 (the total invariants' rows, ``total_con``/``pl94_con``, and lower bounds are
not zeros; upper bounds keep only their zero answers). Counts are non-negative, so every histogram cell in the
support of a zero row is 0; each such cell gets one measurement ``e_i' x = 0`` of variance 2^-14, an extra row of
the (weighted) strategy matrix, i.e. ``2^14 diag(mask)`` added to the node's precision. The Bureau does this at
every geolevel but the block ("In this version of the code we do not include constraints for the block
geolevel"): here at every level above the leaves. In this algebra a cell mask is ``diag(m)`` on the dense axes
times the identity on the others, so an axis a zero query does not sum over (persons: ``nurse_nva_0`` restricts
votingage) is made dense too (``zeros``): persons then have C = 4 classes of d = 16 (1024 numbers a matrix,
twice the 512 without; the inversions cost about 2x, the action on histograms less, fewer classes). A zero
query that would make d exceed :data:`MAX_ZERO_BLOCK` is left out (``with_zeros``; its cells keep their
measured variance).

Invariant totals are exact (unlike the Bureau, who adds a state total as a measurement of variance 2^-14 only
when asked, ``TOTAL_INVARIANTS_GEOLEVELS``, empty in production): the GLS is *conditioned* on ``1'x = t`` at every
node whose total is invariant, and at every node all of whose children's totals are (their sum is public). The
all-ones direction lies in class 0 (constant along every identity-or-sum axis) as the vector 1_d, so conditioning
acts on that block alone, with ``Pi = I - 11'/d`` its projector off the total: ``cinv(K) = Pi (Pi K Pi + I - Pi)^-1
Pi`` (= N (N'KN)^-1 N', N a basis of the complement) is the inverse on the free directions. With ``x0`` a
histogram meeting the total (``s`` or 0 moved along 1), the exact limit of a measurement of variance -> 0 is

* ``V_-(u) = cinv(P_g + S^+)``, ``b_-(u) = x0 + V_-(u) (z + S^+ s - (P_g + S^+) x0)``, with ``S^+ = cinv(S)``
  where every child is exact (S is then singular along 1, exactly) and ``S^-1`` otherwise; at a leaf S^+ = 0.
  For a node without exact totals (x0 = 0) these are the formulas above; for one whose children are free this is
  ``b - V c (c'Vc)^-1 (c'b - t)``, ``V - V c (c'Vc)^-1 c'V`` on the unconditioned ``b``, ``V``;
* the top-down pass is unchanged with ``S^-1`` read as ``S^+`` (the terms along 1 vanish: ``b~(u) - s(u)`` and
  ``V~(u)`` have no component along it), so every descendant and entity is consistent with the invariants.

The other constraints (lower and nonzero upper bounds) are not used, as in the Bureau's code. The estimates are
linear in the noisy measurements and unbiased.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache
from itertools import product as cartesian

import numpy as np

from topdown.vocab.queries import CROSS, build_query, canonical_name
from topdown.vocab.schema import Schema


#: The largest matrix of class blocks computed (GLSError beyond): the 2020 DHC's persons make 8 blocks of 4,872 x
#: 4,872 (1.4 GiB), its households 32 of 1,566 x 1,566 (599 MiB); the 1940 DHC's persons 32 of 116 x 116 (3.3 MiB).
MAX_MATRIX_BYTES = 64 * 2**20

#: The variance of a structural zero's measurement (the Bureau's ``VAR_FOR_CONSTR_QUERY``).
ZERO_VARIANCE = 2.0 ** -14


class GLSError(ValueError):
    """The measurements do not identify a node's histogram (a leaf without a full-rank set of queries)."""


class BlocksTooLarge(GLSError):
    """A product's covariances would exceed :data:`MAX_MATRIX_BYTES` (:meth:`KronAlgebra.check_size`)."""


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
    zeros: tuple[str, ...] = ()  # the queries of structural-zero constraints (an axis they restrict is dense)

    @cached_property
    def _axes(self):
        """Each query's per-axis factors, the dense axes, and each other axis's (a, b) per query: nothing of the
        block size, so :attr:`d` is known before anything of that size is made."""
        dims = [n for _, n in self.schema.dims]
        factors = {q: [_indicator(g, n) for g, n in zip(_axis_groups(self.schema, q), dims)] for q in self.queries}
        restricted = {a for z in self.zeros for a, groups in enumerate(_axis_groups(self.schema, z))
                      if any(len(g) < dims[a] for g in groups)}
        dense, coef = [], {}
        for axis, n in enumerate(dims):
            ab = [_identity_or_sum(factors[q][axis].T @ factors[q][axis]) for q in self.queries]
            if n > 1 and (axis in restricted or any(x is None for x in ab)):
                dense.append(axis)
            else:
                coef[axis] = ab
        return dims, factors, dense, coef

    @cached_property
    def _layout(self):
        dims, factors, dense, coef = self._axes
        ij = [a for a in range(len(dims)) if a not in dense]
        classes = list(cartesian((True, False), repeat=len(ij)))  # True: constant vector of that axis
        d = self.d
        self.check_size()
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

    def check_size(self) -> None:
        """Raise :class:`BlocksTooLarge` where one matrix of this algebra (its class blocks) would exceed
        :data:`MAX_MATRIX_BYTES`: the GLS holds several a node."""
        dims, _, dense, _ = self._axes
        classes, d = 2 ** (len(dims) - len(dense)), self.d
        size = classes * d * d * 8
        if size > MAX_MATRIX_BYTES:
            names = ", ".join(self.schema.dims[a][0] for a in dense)
            raise BlocksTooLarge(f"product {self.schema.name!r}: GLS is not computed for it: its measured "
                                 f"queries group the axes {names} other than whole or summed, so one covariance "
                                 f"would be {classes} blocks of {d:,} x {d:,} ({size / 2**20:,.0f} MiB; at most "
                                 f"{MAX_MATRIX_BYTES // 2**20} MiB)")

    @property
    def n_classes(self) -> int:
        return len(self._layout[3])

    @property
    def d(self) -> int:
        """The size of a class block: the product of the dense axes' sizes."""
        dims, _, dense, _ = self._axes
        return int(np.prod([dims[a] for a in dense], dtype=np.int64)) if dense else 1

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

    @cached_property
    def _zero_cells(self) -> dict[str, np.ndarray]:
        """Per zero query, its answers' cells on the dense axes ``(n_answers, d)`` (they span the other axes)."""
        dims, dense, ij, _, d, _ = self._layout
        out = {}
        for q in self.zeros:
            m = build_query(self.schema, q).matrix().toarray()
            t = m.reshape(len(m), *dims).transpose(0, *[a + 1 for a in dense], *[a + 1 for a in ij]).reshape(len(m), d, -1)
            assert (t == t[:, :, :1]).all(), q  # restricted axes are dense (_layout)
            out[q] = t[:, :, 0] > 0
        return out

    def zero_precision(self, zeros: dict[str, np.ndarray], n: int) -> np.ndarray:
        """``2^14 diag(mask)`` ``(n, C, d, d)``: every cell in an answer of ``zeros[q]`` ``(n, n_answers)`` (True: the
        constraint's right-hand side is 0) is measured as 0 with variance :data:`ZERO_VARIANCE`."""
        mask = np.zeros((n, self.d), dtype=bool)
        for q, answers in zeros.items():
            mask |= (answers.astype(float) @ self._zero_cells[q]) > 0
        out = np.zeros((n, self.n_classes, self.d, self.d))
        idx = np.arange(self.d)
        out[:, :, idx, idx] = mask[:, None, :] / ZERO_VARIANCE
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


def cinv(m: np.ndarray, exact: np.ndarray | None = None) -> np.ndarray:
    """``m^-1``; on rows where ``exact``, the inverse on the directions free of the total instead,
    ``Pi (Pi m Pi + I - Pi)^-1 Pi`` in class 0 (module docstring): zero along the total."""
    if exact is None or not np.any(exact):
        return inv(m)
    exact = np.asarray(exact, dtype=bool)
    out = np.empty_like(m)
    if not exact.all():
        out[~exact] = inv(m[~exact])
    pi = _free(m.shape[-1])
    k = m[exact].copy()
    k[:, 0] = pi @ k[:, 0] @ pi + (np.eye(len(pi)) - pi)
    r = inv(k)
    r[:, 0] = pi @ r[:, 0] @ pi
    out[exact] = r
    return out


def _free(d: int) -> np.ndarray:
    """The projector off the total direction (1_d) within class 0."""
    return np.eye(d) - np.full((d, d), 1.0 / d)


def anchor(base: np.ndarray, total: np.ndarray | None) -> np.ndarray:
    """Histograms meeting the exact totals: ``base`` moved along the all-ones vector where ``total`` is finite,
    0 elsewhere."""
    out = np.zeros_like(base)
    if total is None:
        return out
    ex = np.isfinite(total)
    out[ex] = base[ex] + ((total[ex] - base[ex].sum(axis=1)) / base.shape[1])[:, None]
    return out


def snap(v: np.ndarray, b: np.ndarray, total: np.ndarray | None, v_exact: np.ndarray | None = None) -> None:
    """Remove the float rounding along the total of exact nodes, in place: ``b`` sums to the total, ``v`` (rows
    ``v_exact``, default those of ``total``) has no variance along it."""
    if total is None:
        return
    ex = np.isfinite(total)
    b[ex] += ((total[ex] - b[ex].sum(axis=1)) / b.shape[1])[:, None]
    vex = ex if v_exact is None else v_exact
    if np.any(vex):
        pi = _free(v.shape[-1])
        v[vex, 0] = pi @ v[vex, 0] @ pi


def leaf_covariance(precision: np.ndarray, where: str = "leaf", exact: np.ndarray | None = None) -> np.ndarray:
    """``V_- = P_g^-1`` at the leaves (conditioned on the total where ``exact``); a singular precision (queries
    that do not identify the histogram) is an error naming ``where``."""
    try:
        v = cinv(precision, exact)
    except np.linalg.LinAlgError:
        raise GLSError(f"{where}: the measured queries do not identify the histogram (a leaf needs "
                       "'detailed' or an equivalent full-rank set of measured queries)") from None
    return v


def leaf_estimate(alg: KronAlgebra, precision: np.ndarray, v: np.ndarray, z: np.ndarray,
                  total: np.ndarray | None) -> np.ndarray:
    """``b_- = x0 + V_- (z - P_g x0)`` at the leaves (``x0`` = 0 where the total is not exact: ``V_- z``);
    ``precision`` and ``v`` per row."""
    x0 = anchor(np.zeros_like(z), total)
    if total is not None and np.isfinite(total).any():
        ex = np.isfinite(total)
        z = z.copy()
        z[ex] -= alg.apply(precision[ex], x0[ex])
    return x0 + alg.apply(v, z)


def bottom_up(alg: KronAlgebra, precision: np.ndarray, z: np.ndarray, s_cov: np.ndarray, s_est: np.ndarray,
              s_total: np.ndarray | None = None, total: np.ndarray | None = None):
    """``V_-`` and ``b_-`` of internal nodes from their own precision/information and their children's sums
    (``s_total``: the children's exact totals summed, NaN unless all are; ``total``: the node's exact total)."""
    s_inv = cinv(s_cov, None if s_total is None else np.isfinite(s_total))
    k = precision + s_inv
    v = cinv(k, None if total is None else np.isfinite(total))
    h = z + alg.apply(s_inv, s_est)
    x0 = anchor(s_est, total)
    if total is not None and np.isfinite(total).any():
        ex = np.isfinite(total)
        h[ex] -= alg.apply(k[ex], x0[ex])
    b = x0 + alg.apply(v, h)
    return v, b, s_inv


def gain(v_minus: np.ndarray, s_inv_parent: np.ndarray) -> np.ndarray:
    """``A(c) = V_-(c) S(u)^-1`` (``S^+`` where the children are exact)."""
    return mul(v_minus, s_inv_parent)


def top_down_cov(v_minus: np.ndarray, a: np.ndarray, v_parent: np.ndarray) -> np.ndarray:
    """``V~(c) = V_-(c) + A V~(u) A' - A V_-(c)``, symmetrised."""
    v = v_minus + mul(mul(a, v_parent), tr(a)) - mul(a, v_minus)
    return (v + tr(v)) / 2


def top_down_est(alg: KronAlgebra, b_minus: np.ndarray, a: np.ndarray, b_parent: np.ndarray,
                 s_parent: np.ndarray) -> np.ndarray:
    """``b~(c) = b_-(c) + A(c) (b~(u) - s(u))``."""
    return b_minus + alg.apply(a, b_parent - s_parent)


#: The largest dense block (d) structural zeros may make: a zero query that would make it larger is left out
#: (memory and time grow as d^2 and d^3: P.L. 94-171's zeros make 16; the 2017 Chile example's age x marital
#: zeros would make 126, 18x the memory of its blocks of 21).
MAX_ZERO_BLOCK = 64


def with_zeros(schema: Schema, queries: tuple[str, ...], zeros: tuple[str, ...]) -> tuple[KronAlgebra, tuple[str, ...]]:
    """The algebra of ``queries`` with the zero queries, in order, that keep d within :data:`MAX_ZERO_BLOCK`
    (or the blocks the measured queries make anyway), and the zero queries left out."""
    limit = max(MAX_ZERO_BLOCK, KronAlgebra(schema, queries).d)
    kept: list[str] = []
    left: list[str] = []
    for z in zeros:
        (kept if KronAlgebra(schema, queries, (*kept, z)).d <= limit else left).append(z)
    return KronAlgebra(schema, queries, tuple(kept)), tuple(left)


@lru_cache(maxsize=None)
def algebra(schema: Schema, queries: tuple[str, ...], zeros: tuple[str, ...] = ()) -> KronAlgebra:
    return KronAlgebra(schema, queries, zeros)


# ------------------------------------------------------------------------------------------- the passes
@dataclass
class LevelState:
    """One level's nodes through the two passes (rows in node order; ``parent`` rows in the level above)."""

    parent: np.ndarray | None
    precision: np.ndarray  # P_g (N, C, d, d), structural zeros included
    info: np.ndarray | None  # z (N, ncells); None once no longer needed
    total: np.ndarray | None = None  # exact (invariant) totals, NaN where none; after upward(), also derived ones
    v_minus: np.ndarray | None = None
    b_minus: np.ndarray | None = None
    s_cov: np.ndarray | None = None  # S: sum of the children's V_- (internal nodes)
    s_est: np.ndarray | None = None  # s: sum of the children's b_-
    s_total: np.ndarray | None = None  # sum of the children's exact totals (NaN unless every child's is exact)
    s_inv: np.ndarray | None = None
    gain: np.ndarray | None = None  # A (N, C, d, d), below the root
    v: np.ndarray | None = None  # V~
    b: np.ndarray | None = None  # b~


def exact_totals(own: np.ndarray | None, s_total: np.ndarray | None, n: int, where: str) -> np.ndarray:
    """The nodes' exact totals: their own invariant, else the sum of their children's where all are exact;
    an invariant that differs from its children's sum is an error naming ``where``."""
    own = np.full(n, np.nan) if own is None else np.asarray(own, dtype=float)
    if s_total is None:
        return own
    both = np.isfinite(own) & np.isfinite(s_total)
    if (np.abs(own - s_total)[both] > 0.5).any():
        raise GLSError(f"{where}: node row {np.flatnonzero(both & (np.abs(own - s_total) > 0.5))[0]}: an invariant "
                       "total differs from the sum of its children's invariant totals (inconsistent invariants)")
    return np.where(np.isfinite(own), own, s_total)


def upward(alg: KronAlgebra, levels: list[LevelState], where: list[str]) -> None:
    """The bottom-up pass over whole levels (``levels`` top-down; the last one's nodes are leaves unless it
    already carries ``s_cov``/``s_est``/``s_total`` from its children)."""
    for i in range(len(levels) - 1, -1, -1):
        lv = levels[i]
        lv.total = exact_totals(lv.total, lv.s_total, len(lv.precision), where[i])
        if lv.s_cov is None:  # leaves
            lv.v_minus = leaf_covariance(lv.precision, where[i], np.isfinite(lv.total))
            lv.b_minus = leaf_estimate(alg, lv.precision, lv.v_minus, lv.info, lv.total)
        else:
            lv.v_minus, lv.b_minus, lv.s_inv = bottom_up(alg, lv.precision, lv.info, lv.s_cov, lv.s_est,
                                                         lv.s_total, lv.total)
        if i:
            n_up = len(levels[i - 1].precision)
            levels[i - 1].s_cov = segment_sum(lv.v_minus, lv.parent, n_up)
            levels[i - 1].s_est = segment_sum(lv.b_minus, lv.parent, n_up)
            levels[i - 1].s_total = segment_sum(lv.total, lv.parent, n_up)


def downward(alg: KronAlgebra, levels: list[LevelState], root_given: bool = False) -> None:
    """The top-down pass; the first level is the root unless ``root_given`` (its ``v``/``b`` already set)."""
    if not root_given:
        levels[0].v, levels[0].b = levels[0].v_minus.copy(), levels[0].b_minus.copy()
        snap(levels[0].v, levels[0].b, levels[0].total)
    for up, lv in zip(levels, levels[1:]):
        lv.gain = gain(lv.v_minus, up.s_inv[lv.parent])
        lv.v = top_down_cov(lv.v_minus, lv.gain, up.v[lv.parent])
        lv.b = top_down_est(alg, lv.b_minus, lv.gain, up.b[lv.parent], up.s_est[lv.parent])
        snap(lv.v, lv.b, lv.total)


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
