"""Exact, vectorized noise samplers: the discrete Gaussian and the two-sided geometric distribution.

Distributions (all budgets are exact ``Fraction``s; no float ever decides an outcome on its own):

* ``discrete_gaussian(source, sigma2, size)``: P(Y = y) proportional to exp(-y^2 / (2 sigma2)), y in Z
  (Canonne, Kamath & Steinke 2020, "CKS", Algorithm 3; as the Bureau's
  ``source/programs/engine/discrete_gaussian_utility.py``, GitHub
  uscensusbureau/DAS_2020_Redistricting_Production_Code). With t = floor(sigma)+1, draw Y from the discrete
  Laplace distribution P(Y = y) ~ exp(-|y|/t) and accept it with probability
  exp(-gamma(Y)), gamma(y) = (|y| - sigma2/t)^2 / (2 sigma2) = (|y| t d - n)^2 / (2 t^2 d n) for
  sigma2 = n/d. Accepted values are exactly discrete-Gaussian (CKS section 5).
* ``geometric(source, epsilon, sensitivity, size)``: the two-sided geometric (discrete Laplace)
  distribution P(Y = y) ~ q^|y|, q = exp(-epsilon/sensitivity) (the Bureau's ``primitives.py``,
  ``RationalGeometricMechanism``; the 2018 End-to-End test, Petti & Flaxman 2019).

Discrete Laplace with ratio q = exp(-lam) (lam rational) is drawn by inversion: for a uniform real V in
[0, 1), X = max{x >= 0 : V < q^x} has P(X >= x) = q^x, i.e. P(X = x) = (1 - q) q^x; a fair sign bit B
gives Y = +-X, and the pair (B = 1, X = 0) is rejected, so P(Y = y) ~ q^|y| exactly (CKS Algorithm 2
with the geometric drawn by inversion instead of by repeated Bernoulli trials).

Why the outputs are exact although floating point is used
---------------------------------------------------------
Every random decision has the form "is V < p?" with p = exp(-g) for an exact rational g >= 0 and V a
uniform real in [0, 1) whose binary digits are revealed lazily: the top 53 bits of a 64-bit word give
an integer N with V in [N 2^-53, (N+1) 2^-53); further digits come from fresh words only when needed.

1. Fast path. A float f approximates p. We accept "V < p" only if (N+1) 2^-53 + margin <= f and
   "V >= p" only if N 2^-53 >= f + margin, with margin = 2^-40. The float error |f - p| is below
   2^-48: g is computed from correctly rounded conversions of the exact rationals with a few float
   operations, each of relative error <= 2^-53, which moves exp(-g) by at most
   e^-g (sqrt(2g) + 5g) 2^-53 < 2^-51 (discrete Gaussian) or e^-g g 2^-51 < 2^-52 (geometric);
   numpy's exp/log are accurate to a few ulp (< 2^-50 absolute on [0, 1]); the comparison sums are
   rounded by at most 2^-53. Whenever the fast path decides, the decision is therefore the one the exact
   comparison would make. Candidates with magnitude >= 2^40 (where float integers would lose
   exactness) are never decided on the fast path.
2. Exact path. Undecided draws (probability about 2^-38 each) keep the same V and compare it against
   integer bounds lo <= 2^P exp(-g) <= hi computed with Python integers only (alternating Taylor series
   of exp(-g / 2^m) with a proven truncation/rounding bound, then m exact-bound squarings), revealing
   64 more bits of V and raising P until the interval decides. Since exp(-g) is irrational for rational
   g > 0 (Lindemann), this ends with probability 1.

Because every decision equals the decision of the exact comparison of the same uniform V, the output
distribution is exactly the target distribution; floats only choose which path computes it. Taking the
first ``size`` accepted candidates of an i.i.d. candidate sequence yields i.i.d. draws. The ``margin``
keyword exists for tests: ``margin >= 1`` sends every draw down the exact path.

Consumption of the source depends only on the arguments, so a SeededSource gives reproducible draws.
Each round reads all its fresh words before any exact-path word, so from the same seed the fast and the
exact path give identical draws for the whole first round (up to 65536 outputs; this is tested).
"""
from __future__ import annotations

import math
from fractions import Fraction
from functools import lru_cache
from typing import Callable

import numpy as np

from .rng import RandomSource

#: Absolute margin between a uniform draw and the float value of exp(-g) needed to decide on the fast path.
FAST_MARGIN = 2.0 ** -40
_FAST_LIMIT = float(2 ** 40)     # candidates at or above this magnitude always take the exact path
_GUARD_BITS = 32                 # extra precision of exp bounds beyond the revealed bits of V
_BLOCK = 1 << 16                 # outputs produced per vectorized round
_TWO53 = 2.0 ** -53


def _as_fraction(value: Fraction | int, name: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (Fraction, int)):
        raise TypeError(f"{name} must be an exact Fraction or int (no floats in noise parameters), got {value!r}")
    value = Fraction(value)
    if value <= 0:
        raise ValueError(f"{name} must be positive, got {value}")
    return value


def _check_size(size: int) -> int:
    if isinstance(size, bool) or not isinstance(size, (int, np.integer)) or size < 0:
        raise ValueError(f"size must be a non-negative integer, got {size!r}")
    return int(size)


# ----------------------------------------------------------------------------------------- exact path
@lru_cache(maxsize=1 << 16)
def _exp_neg_bounds(gamma: Fraction, prec: int) -> tuple[int, int]:
    """Integers ``lo <= 2**prec * exp(-gamma) <= hi`` for rational ``gamma >= 0``, by integer arithmetic.

    With x = gamma / 2^m <= 1 and scale 2^w, the Taylor terms T_i = floor(T_{i-1} x / i) satisfy
    0 <= t_i - T_i <= i (t_i the true terms); the series alternates with decreasing terms, so stopping
    at the first T_n = 0 leaves a tail <= t_n <= n and an accumulated rounding error <= n(n-1)/2:
    |2^w exp(-x) - S| <= n^2. Squaring m times with floor/ceil keeps a valid bracket.
    """
    if gamma == 0:
        return 1 << prec, 1 << prec
    m, x = 0, gamma
    while x > 1:
        x /= 2
        m += 1
    w = prec + 2 * m + _GUARD_BITS
    a, b = x.numerator, x.denominator
    term, total, i = 1 << w, 1 << w, 0
    while term:
        i += 1
        term = term * a // (b * i)
        total = total - term if i & 1 else total + term
    one = 1 << w
    lo, hi = max(total - i * i, 0), min(total + i * i, one)
    for _ in range(m):
        lo, hi = (lo * lo) >> w, -((-hi * hi) >> w)
    shift = w - prec
    return lo >> shift, -((-hi) >> shift)


class _LazyUniform:
    """A uniform real V in [0, 1) known to lie in [n 2^-k, (n+1) 2^-k); more bits come from the source."""

    __slots__ = ("n", "k", "source")

    def __init__(self, source: RandomSource, n: int, k: int) -> None:
        self.source, self.n, self.k = source, n, k

    def below_exp(self, gamma: Fraction) -> bool:
        """Exactly decide V < exp(-gamma)."""
        while True:
            lo, hi = _exp_neg_bounds(gamma, self.k + _GUARD_BITS)
            if (self.n + 1) << _GUARD_BITS <= lo:
                return True
            if self.n << _GUARD_BITS >= hi:
                return False
            self.n = (self.n << 64) | int(self.source.uint64(1)[0])
            self.k += 64


def _exact_geometric(v: _LazyUniform, lam: Fraction, start: int) -> int:
    """X = max{x >= 0 : V < exp(-x lam)} exactly, searching outward from the float guess ``start``."""
    x = max(start, 0)
    if v.below_exp(x * lam):
        lo, step = x, 1
        while v.below_exp((lo + step) * lam):
            lo += step
            step *= 2
        hi = lo + step
    else:
        hi, step = x, 1
        while True:
            cand = hi - step
            if cand <= 0:
                lo = 0
                break
            if v.below_exp(cand * lam):
                lo = cand
                break
            hi, step = cand, step * 2
    while hi - lo > 1:
        mid = (lo + hi) // 2
        if v.below_exp(mid * lam):
            lo = mid
        else:
            hi = mid
    return lo


# ------------------------------------------------------------------------------------------ fast path
def _bernoulli_exp(source: RandomSource | Callable[[int], RandomSource], words: np.ndarray, g: np.ndarray,
                   exact_gamma: Callable[[int], Fraction], margin: float) -> np.ndarray:
    """Independent Bernoulli(exp(-gamma_i)) from one fresh word each; ``g`` approximates gamma_i (NaN
    forces the exact path), which reads further words from ``source`` (or from ``source(i)``)."""
    source_of = source if callable(source) else (lambda i: source)
    top = words >> np.uint64(11)
    u = top.astype(np.float64) * _TWO53
    f = np.exp(-g)
    yes = u + (_TWO53 + margin) <= f
    decided = yes | (u >= f + margin)
    for i in np.flatnonzero(~decided):
        yes[i] = _LazyUniform(source_of(int(i)), int(top[i]), 53).below_exp(exact_gamma(int(i)))
    return yes


def _discrete_laplace(source: RandomSource | Callable[[int], RandomSource], words: np.ndarray, lam: Fraction,
                      margin: float) -> tuple[np.ndarray, np.ndarray]:
    """Draws with P(Y = y) ~ exp(-lam |y|), one per fresh word (the values and which words are kept: a
    rejected (-, 0) pair is not). ``source`` may map a word's index to the source it came from."""
    source_of = source if callable(source) else (lambda i: source)
    top = words >> np.uint64(11)
    negative = (words & np.uint64(1)).astype(bool)          # bit 0 is disjoint from the 53 bits of V
    u = top.astype(np.float64)
    u *= _TWO53
    lam_f = float(lam)
    x = u + 0.5 * _TWO53                                    # a float guess of X: floor(-log(V) / lam)
    np.log(x, out=x)
    x *= -1.0 / lam_f
    np.floor(x, out=x)
    np.minimum(x, _FAST_LIMIT, out=x)
    f_hi = x * -lam_f
    np.exp(f_hi, out=f_hi)                                  # ~ q^x
    f_lo = f_hi * math.exp(-lam_f)                          # ~ q^(x+1)
    f_lo += margin
    ok = u + (_TWO53 + margin) <= f_hi
    ok &= u >= f_lo
    ok &= x < _FAST_LIMIT
    mags = x.astype(np.int64)
    for i in np.flatnonzero(~ok):
        mags[i] = _exact_geometric(_LazyUniform(source_of(int(i)), int(top[i]), 53), lam, int(mags[i]))
    keep = ~(negative & (mags == 0))
    np.negative(mags, out=mags, where=negative)
    return mags, keep


# ------------------------------------------------------------------- many streams, one vectorized round
#: Draws per vectorized batch: a round takes the sources a batch at a time, so that its arrays stay in the
#: processor's cache (one round over all the nodes of a task, megabytes per array, cost 1.5-2x more per
#: draw). Each source reads the same words whatever the batches.
_BATCH_DRAWS = 1 << 13


def _batches(needs: np.ndarray) -> list[slice]:
    """Consecutive runs of sources of about :data:`_BATCH_DRAWS` draws each (a source is never cut)."""
    group = (np.cumsum(needs) - needs) // _BATCH_DRAWS
    cuts = np.r_[0, np.flatnonzero(group[1:] != group[:-1]) + 1, needs.size]
    return [slice(a, b) for a, b in zip(cuts[:-1].tolist(), cuts[1:].tolist())]


def _firsts(rows: np.ndarray, mask: np.ndarray, limits: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Of the entries where ``mask`` holds (``rows`` sorted, non-decreasing), the first ``limits[row]`` of
    every row: (their indices, their rows, their rank among the row's entries where ``mask`` holds)."""
    idx = np.flatnonzero(mask)
    r = rows[idx]
    per_row = np.bincount(r, minlength=limits.size)
    rank = np.arange(idx.size) - (np.cumsum(per_row) - per_row)[r]
    take = rank < limits[r]
    return idx[take], r[take], rank[take]


def _fresh_words(sources: list[RandomSource], counts: np.ndarray, parts: int = 1) -> tuple[np.ndarray, np.ndarray,
                                                                                            np.ndarray]:
    """``parts * counts[i]`` fresh words from every source i, read in one call per source: (all the words end
    to end, the row (source index) of each word of one part, ``starts``). Source i's part j begins at index
    ``parts * starts[i] + j * counts[i]``."""
    words = np.concatenate([s.uint64(parts * c) for s, c in zip(sources, counts.tolist())])
    return words, np.repeat(np.arange(len(sources)), counts), np.cumsum(counts) - counts


def _gaussian_round(sources: list[RandomSource], needs: np.ndarray, sigma2: Fraction, margin: float
                    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One round of CKS Algorithm 3 for every source: ``count = need + need // 2 + 64`` Laplace words, then
    as many acceptance words, all read before any exact-path word; up to ``needs[i]`` draws per source
    (their rows, ranks in the row and values). The k-th kept Laplace draw of a source meets its k-th
    acceptance word."""
    n, d = sigma2.numerator, sigma2.denominator
    t = math.isqrt(n // d) + 1                              # floor(sqrt(sigma2)) + 1
    c_f, inv2s2 = float(sigma2 / t), float(1 / (2 * sigma2))
    counts = needs + needs // 2 + 64
    words, lap_rows, starts = _fresh_words(sources, counts, parts=2)
    lap = words[np.arange(lap_rows.size) + starts[lap_rows]]   # part 0 of each source
    y, keep = _discrete_laplace(lambda i: sources[lap_rows[i]], lap, Fraction(1, t), margin)
    kept, y_rows, rank = _firsts(lap_rows, keep, counts)
    y = y[kept]
    acc = words[(2 * starts + counts)[y_rows] + rank]        # word ``rank`` of the source's part 1
    ay = np.abs(y)
    g = ay.astype(np.float64)
    g -= c_f
    g *= g
    g *= inv2s2
    g[ay >= _FAST_LIMIT] = np.nan
    accept = _bernoulli_exp(lambda i: sources[y_rows[i]], acc, g,
                            lambda i: Fraction((int(ay[i]) * t * d - n) ** 2, 2 * t * t * d * n), margin)
    idx, rows, ranks = _firsts(y_rows, accept, needs)
    return rows, ranks, y[idx]


def _geometric_round(sources: list[RandomSource], needs: np.ndarray, lam: Fraction, margin: float
                     ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """One round of two-sided geometric draws for every source: up to ``needs[i]`` draws per source (their
    rows, ranks in the row and values)."""
    keep_rate = 0.5 + 0.5 * math.exp(-float(lam))          # 1 - P(B = 1, X = 0)
    counts = (needs / keep_rate * 1.05).astype(np.int64) + 64
    words, rows, _ = _fresh_words(sources, counts)
    y, keep = _discrete_laplace(lambda i: sources[rows[i]], words, lam, margin)
    idx, rows, ranks = _firsts(rows, keep, needs)
    return rows, ranks, y[idx]


def _fill(sources: list[RandomSource], size: int, one_round: Callable) -> np.ndarray:
    """``size`` draws per source (int64[len(sources), size]) by rounds of at most ``_BLOCK`` draws per source,
    each round a batch of sources at a time; each source reads exactly the words it would read alone."""
    out = np.empty((len(sources), size), dtype=np.int64)
    filled = np.zeros(len(sources), dtype=np.int64)
    active = np.flatnonzero(filled < size)
    while active.size:
        needs = np.minimum(size - filled[active], _BLOCK)
        for batch in _batches(needs):
            members = active[batch]
            rows, ranks, values = one_round([sources[i] for i in members], needs[batch])
            dest = members[rows]
            out[dest, filled[dest] + ranks] = values
            filled[members] += np.bincount(rows, minlength=members.size)
        active = active[filled[active] < size]
    return out


# ------------------------------------------------------------------------------------------ public API
def discrete_gaussian_many(sources: list[RandomSource], sigma2: Fraction, size: int, *,
                           margin: float = FAST_MARGIN) -> np.ndarray:
    """Row i: ``discrete_gaussian(sources[i], sigma2, size)``, the same draws from the same words, for all
    sources in one vectorized pass (int64[len(sources), size])."""
    sigma2 = _as_fraction(sigma2, "sigma2")
    return _fill(list(sources), _check_size(size), lambda srcs, needs: _gaussian_round(srcs, needs, sigma2, margin))


def discrete_gaussian(source: RandomSource, sigma2: Fraction, size: int, *, margin: float = FAST_MARGIN) -> np.ndarray:
    """``size`` i.i.d. exact discrete Gaussian draws N_Z(0, sigma2) (int64), CKS 2020 Algorithm 3."""
    return discrete_gaussian_many([source], sigma2, size, margin=margin)[0]


def _check_sensitivity(sensitivity: int) -> int:
    if isinstance(sensitivity, bool) or not isinstance(sensitivity, int) or sensitivity <= 0:
        raise ValueError(f"sensitivity must be a positive integer, got {sensitivity!r}")
    return sensitivity


def geometric_many(sources: list[RandomSource], epsilon: Fraction, sensitivity: int, size: int, *,
                   margin: float = FAST_MARGIN) -> np.ndarray:
    """Row i: ``geometric(sources[i], epsilon, sensitivity, size)``, all sources in one vectorized pass."""
    lam = _as_fraction(epsilon, "epsilon") / _check_sensitivity(sensitivity)
    return _fill(list(sources), _check_size(size), lambda srcs, needs: _geometric_round(srcs, needs, lam, margin))


def geometric(source: RandomSource, epsilon: Fraction, sensitivity: int, size: int, *,
              margin: float = FAST_MARGIN) -> np.ndarray:
    """``size`` i.i.d. two-sided geometric draws, P(Y = y) ~ exp(-epsilon |y| / sensitivity) (int64)."""
    return geometric_many([source], epsilon, sensitivity, size, margin=margin)[0]


def discrete_gaussian_variance(sigma2: Fraction) -> float:
    """Variance of N_Z(0, sigma2): sum n^2 e^(-n^2/2s2) / sum e^(-n^2/2s2) over |n| <= 50 sigma, and
    sigma2 itself above 100 where the two agree to double precision (the Bureau's ``primitives.py``,
    ``computeDiscreteGaussianVariance``)."""
    sigma2 = _as_fraction(sigma2, "sigma2")
    s2 = float(sigma2)
    if s2 > 100:
        return s2
    bound = int(50 * math.sqrt(s2)) + 1
    k = np.arange(-bound, bound + 1, dtype=np.float64)
    w = np.exp(-k * k / (2 * s2))
    return math.fsum(k * k * w) / math.fsum(w)


def geometric_variance(epsilon: Fraction, sensitivity: int) -> float:
    """Variance 2q / (1 - q)^2 of the two-sided geometric distribution, q = exp(-epsilon/sensitivity)."""
    lam = float(_as_fraction(epsilon, "epsilon") / sensitivity)
    q = math.exp(-lam)
    return 2 * q / math.expm1(-lam) ** 2


def discrete_gaussian_zero_probability(sigma2: Fraction) -> float:
    """P(Y = 0) for Y ~ N_Z(0, sigma2): 1 / sum e^(-n^2/2s2) over |n| <= 50 sigma, and 1 / sqrt(2 pi sigma2)
    above 100 where the two agree to double precision (Poisson summation)."""
    s2 = float(_as_fraction(sigma2, "sigma2"))
    if s2 > 100:
        return 1 / math.sqrt(2 * math.pi * s2)
    if s2 < 1e-3:  # e^(-1/2s2) < e^-500: the noise is 0 with probability 1 to double precision
        return 1.0
    bound = int(50 * math.sqrt(s2)) + 1
    k = np.arange(-bound, bound + 1, dtype=np.float64)
    return 1 / math.fsum(np.exp(-k * k / (2 * s2)))


def geometric_zero_probability(epsilon: Fraction, sensitivity: int) -> float:
    """P(Y = 0) = (1 - q) / (1 + q) = tanh(epsilon / (2 sensitivity)) of the two-sided geometric distribution."""
    return math.tanh(float(_as_fraction(epsilon, "epsilon") / sensitivity) / 2)
