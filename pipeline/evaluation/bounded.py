"""Confidence intervals for a non-negative count from an unbiased Gaussian estimate: the Feldman-Cousins
construction (Feldman and Cousins 1998, "Unified approach to the classical statistical analysis of small
signals", section IV.B: a Gaussian mean with a physical boundary at 0).

With ``x = estimate / sd`` and ``mu = count / sd >= 0``, the acceptance region of ``mu`` holds the ``x`` of
highest likelihood ratio ``R(x) = phi(x - mu) / phi(x - max(x, 0))`` (FC1) until it holds probability
``level`` (FC2); the interval of an observed ``x`` is every ``mu`` whose region holds it (FC3). It contains
the true count with probability exactly ``level`` for every count >= 0, 0 included (the central interval
clipped at 0, ``[max(x - z, 0), max(x + z, 0)]``, covers 0 with probability ``(1 + level) / 2``), is never
empty, and is the central interval ``x -+ z`` once ``x >= 2 z``.
"""
from __future__ import annotations

from functools import lru_cache

import numpy as np
from scipy import stats

#: Points of the table of acceptance regions on ``0 <= mu <= z`` (above it the region is central).
GRID = 4001


def z_value(level: float) -> float:
    """The normal 1 - (1 - level)/2 quantile (1.645 at 0.90): the half-width of the central interval."""
    return float(stats.norm.ppf(1 - (1 - level) / 2))


def log_ratio(x: np.ndarray, mu: float) -> np.ndarray:
    """(FC1) ``log R(x)``: the log likelihood ratio of ``mu`` against the best ``mu' >= 0`` for ``x``."""
    best = np.maximum(x, 0.0)
    return -0.5 * (x - mu) ** 2 + 0.5 * (x - best) ** 2


def left_end(mu: np.ndarray, r: np.ndarray) -> np.ndarray:
    """The left end of the region at ``R = exp(-r^2 / 2)`` (``mu > 0``): ``mu - r`` while it is >= 0, else the
    ``x < 0`` with ``x mu - mu^2 / 2 = -r^2 / 2``."""
    return np.where(r > mu, mu / 2 - r * r / (2 * mu), mu - r)


def acceptance(mu: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(FC2) The acceptance regions ``[x1, x2]`` of ``0 < mu < z``: ``R(x1) = R(x2)`` and
    ``Phi(x2 - mu) - Phi(x1 - mu) = level``, with ``x2 = mu + r`` (the probability grows with ``r``: bisection)."""
    lo = np.zeros_like(mu)
    hi = np.full_like(mu, z_value(level) + 1.0)
    for _ in range(60):
        r = (lo + hi) / 2
        short = stats.norm.cdf(r) - stats.norm.cdf(left_end(mu, r) - mu) < level
        lo = np.where(short, r, lo)
        hi = np.where(short, hi, r)
    r = (lo + hi) / 2
    return left_end(mu, r), mu + r


@lru_cache(maxsize=8)
def table(level: float) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """``mu`` on ``[0, z]`` and the ends ``x1(mu)``, ``x2(mu)`` of its acceptance region (both increasing): at
    ``mu = 0`` ``(-inf, Phi^-1(level)]``, at ``mu >= z`` the central ``mu -+ z``."""
    z = z_value(level)
    mu = np.linspace(0.0, z, GRID)
    x1, x2 = acceptance(mu[1:-1], level)
    x1 = np.concatenate([[-np.inf], x1, [0.0]])
    x2 = np.concatenate([[stats.norm.ppf(level)], x2, [2 * z]])
    return mu, x1, x2


def fc_bounds(x: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(FC3) The interval ``[lower, upper]`` of ``mu >= 0`` for standardized estimates ``x``: ``lower`` =
    the ``mu`` with ``x2(mu) = x`` (0 below ``x2(0)``), ``upper`` = the ``mu`` with ``x1(mu) = x``."""
    x = np.asarray(x, dtype=float)
    z = z_value(level)
    mu, x1, x2 = table(level)
    lower = np.where(x >= x2[-1], x - z, np.interp(x, x2, mu, left=0.0))
    # x1 is -inf at mu = 0: interpolate on the finite part; below it the upper bound tends to 0.
    finite = slice(1, None)
    upper = np.where(x >= x1[-1], x + z, np.interp(x, x1[finite], mu[finite], left=mu[1]))
    return np.maximum(lower, 0.0), upper


#: A standard deviation at most this is that of an exact count (an invariant, or a count the invariants fix): its
#: variance is 0 up to float rounding, and so is its estimate's distance to the count.
EXACT_SD = 1e-6


def exact_count(est: np.ndarray, sd: np.ndarray) -> np.ndarray:
    """Where ``sd`` is at most :data:`EXACT_SD`: the count the estimate is, up to float rounding (``rint``, >= 0);
    elsewhere NaN."""
    est = np.asarray(est, dtype=float)
    return np.where(np.asarray(sd, dtype=float) <= EXACT_SD, np.maximum(np.rint(est), 0.0), np.nan)


def count_interval(est: np.ndarray, sd: np.ndarray, level: float) -> tuple[np.ndarray, np.ndarray]:
    """The integer interval of a non-negative count with unbiased Gaussian estimate ``est`` and standard
    deviation ``sd``: the Feldman-Cousins bounds in counts, rounded inward (``ceil``, ``floor``), which holds an
    integer count exactly when the real interval does. An exact count (:func:`exact_count`) gets ``[v, v]``."""
    est = np.asarray(est, dtype=float)
    sd = np.asarray(sd, dtype=float)
    pos = sd > 0
    x = np.divide(est, sd, out=np.zeros_like(est), where=pos)
    lo, hi = fc_bounds(x, level)
    lo = np.maximum(np.ceil(np.where(pos, lo * sd, est)), 0.0)
    hi = np.maximum(np.floor(np.where(pos, hi * sd, est)), 0.0)
    exact = exact_count(est, sd)
    known = ~np.isnan(exact)
    return np.where(known, exact, lo), np.where(known, exact, hi)
