"""The Feldman-Cousins interval of a non-negative count (pipeline/evaluation/bounded.py): its defining
equations, exact coverage at every true value (0 included, where the clipped central interval over-covers),
and the integer form the uncertainty table writes."""
from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from topdown.pipeline.evaluation.bounded import count_interval, fc_bounds, log_ratio, table

LEVELS = (0.90, 0.95)


@pytest.mark.parametrize("level", LEVELS)
def test_acceptance_regions_solve_the_construction(level):
    """(FC1)-(FC2) at every tabulated mu: equal likelihood ratio at both ends, probability ``level``."""
    mu, x1, x2 = table(level)
    inner = slice(1, None)
    prob = stats.norm.cdf(x2[inner] - mu[inner]) - stats.norm.cdf(x1[inner] - mu[inner])
    assert np.abs(prob - level).max() < 1e-9
    r1 = np.array([log_ratio(np.array(a), m) for a, m in zip(x1[inner], mu[inner])])
    r2 = np.array([log_ratio(np.array(b), m) for b, m in zip(x2[inner], mu[inner])])
    assert np.abs(r1 - r2).max() < 1e-7
    assert stats.norm.cdf(x2[0]) == pytest.approx(level)  # mu = 0: (-inf, x2(0)]
    assert (np.diff(x1[inner]) > 0).all() and (np.diff(x2) > 0).all()


@pytest.mark.parametrize("level", LEVELS)
def test_coverage_is_exact_at_every_true_value(level):
    """200,000 draws at each mu: coverage within the binomial 99.9 % band of ``level``, at 0 too, where the
    central interval clipped at 0 covers ``(1 + level) / 2``."""
    rng = np.random.default_rng(31)
    n = 200_000
    lo_band, hi_band = stats.binom.ppf([0.0005, 0.9995], n, level) / n
    z = stats.norm.ppf(0.5 + level / 2)
    for mu in (0.0, 0.05, 0.3, 0.8, 1.2, 1.7, 2.5, 4.0, 30.0):
        x = mu + rng.standard_normal(n)
        lo, hi = fc_bounds(x, level)
        cov = ((lo <= mu) & (mu <= hi)).mean()
        assert lo_band <= cov <= hi_band, (mu, cov)
    x = rng.standard_normal(n)
    clipped = (np.maximum(x - z, 0) <= 0) & (0 <= np.maximum(x + z, 0))
    assert clipped.mean() > hi_band  # why the construction: the clipped interval over-covers a true 0


@settings(max_examples=300, deadline=None)
@given(x=st.floats(-50, 50), dx=st.floats(0, 5), level=st.sampled_from(LEVELS))
def test_bounds_are_ordered_monotone_and_central_far_from_zero(x, dx, level):
    z = stats.norm.ppf(0.5 + level / 2)
    (lo, lo2), (hi, hi2) = fc_bounds(np.array([x, x + dx]), level)
    assert 0 <= lo <= hi and hi > 0  # never empty, never below 0
    assert lo <= lo2 + 1e-9 and hi <= hi2 + 1e-9
    if x >= 2 * z:
        assert lo == pytest.approx(x - z) and hi == pytest.approx(x + z)
    if x >= 0:
        assert hi == pytest.approx(x + z)


def test_count_interval_in_counts():
    """Scaled by ``sd``, rounded inward; a count with ``sd = 0`` gets its own value; never below 0."""
    est = np.array([120.4, 3.0, -40.0, 7.0, -2.0])
    sd = np.array([10.0, 35.0, 35.0, 0.0, 0.0])
    lo, hi = count_interval(est, sd, 0.90)
    flo, fhi = fc_bounds(est[:3] / sd[:3], 0.90)
    assert np.array_equal(lo[:3], np.maximum(np.ceil(flo * sd[:3]), 0))
    assert np.array_equal(hi[:3], np.floor(fhi * sd[:3]))
    assert (lo[0], hi[0]) == (np.ceil(120.4 - 16.448536269514722), np.floor(120.4 + 16.448536269514722))
    assert lo[2] == 0 and hi[2] > 0  # an estimate far below 0 still gets [0, a few]
    assert (lo[3], hi[3]) == (7, 7) and (lo[4], hi[4]) == (0, 0)
