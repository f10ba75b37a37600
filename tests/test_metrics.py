"""Accuracy and empirical-privacy metrics on hand-computable cases (pipeline/evaluation/metrics.py)."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pytest
import scipy.special
import scipy.stats
from hypothesis import given, settings
from hypothesis import strategies as st

from topdown.pipeline.evaluation import metrics as M
from topdown.vocab.queries import build_query
from topdown.pipeline.configuration.census import PERSONS


def test_mean_abs_error():
    assert M.mean_abs_error([1, 2, 3], [1, 1, 1]) == 1.0
    assert M.mean_abs_error([0, 0], [2, -2]) == 2.0


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(-20, 20), min_size=1, max_size=40),
       st.sampled_from(M.QUANTILES))
def test_weighted_quantiles_match_numpy_inverted_cdf(data, q):
    values, counts = np.unique(data, return_counts=True)
    got = M.weighted_quantiles(values, counts, [q])[0]
    assert got == np.quantile(np.array(data), q, method="inverted_cdf")


def test_weighted_quantiles_hand():
    # 1, 2, 2, 3: F(1)=.25, F(2)=.75, F(3)=1
    assert list(M.weighted_quantiles([3, 1, 2], [1, 1, 2], [0.25, 0.5, 0.75, 0.995])) == [1, 2, 2, 3]


def test_bins_and_labels():
    assert M.bin_labels(M.BLOCK_BINS) == ["0", "1-9", "10-99", "100-999", "1000+"]
    assert M.bin_labels(M.COUNTY_BINS) == ["0-1000", "1001-9999", "10000-99999", "100000-999999", "1000000+"]
    assert list(M.assign_bins([0, 1, 9, 10, 999, 1000, 5000], M.BLOCK_BINS)) == [0, 1, 1, 2, 3, 4, 4]
    assert list(M.assign_bins([1000, 1001], M.COUNTY_BINS)) == [0, 1]


def test_errors_by_bin_hand():
    frame = M.errors_by_bin(np.array([0, 0, 5, 50]), np.array([1, 3, -2, 4]), M.BLOCK_BINS).set_index("bin")
    assert list(frame.index) == ["0", "1-9", "10-99", "100-999", "1000+", "all"]
    assert frame.loc["0", "n"] == 2 and frame.loc["0", "mean_abs_error"] == 2.0
    assert frame.loc["0", "q0.5"] == 1 and frame.loc["0", "q0.995"] == 3
    assert frame.loc["1-9", "mean_signed_error"] == -2.0
    assert frame.loc["1-9", "mean_rel_abs_error"] == pytest.approx(2 / 5)
    assert frame.loc["100-999", "n"] == 0 and np.isnan(frame.loc["100-999", "mean_abs_error"])
    assert frame.loc["all", "n"] == 4 and frame.loc["all", "mean_abs_error"] == 2.5
    assert frame.loc["all", "mean_signed_error"] == 1.5


def _sparse(rows, n_units):
    unit, cell, count = (np.array(c) for c in zip(*rows)) if rows else (np.zeros(0, int),) * 3
    return M.SparseHist(unit.astype(np.int64), cell.astype(np.int64), count.astype(float), n_units)


def test_query_errors_hand():
    hisp = PERSONS.cell_index(0, 1, 1, 0)  # household, adult, hispanic, white
    nonh = PERSONS.cell_index(0, 1, 0, 0)
    true = _sparse([(0, nonh, 3), (0, hisp, 1), (2, nonh, 2)], 3)
    est = _sparse([(0, nonh, 2), (0, hisp, 2), (1, hisp, 1), (2, nonh, 2)], 3)
    qe = M.query_errors(true, est, build_query(PERSONS, "hispanic"))
    # answers [non-hispanic, hispanic]; errors unit0 [-1, +1], unit1 [0, +1], unit2 [0, 0]
    assert list(qe.l1) == [2, 1, 0]
    assert qe.mean_abs_error == 1.0
    assert dict(zip(qe.values, qe.counts)) == {-1.0: 1, 0.0: 3, 1.0: 2}
    np.testing.assert_array_equal(qe.true, [[3, 1], [0, 0], [2, 0]])
    np.testing.assert_array_equal(qe.est, [[2, 2], [0, 1], [2, 0]])
    total = M.query_errors(true, est, build_query(PERSONS, "total"), dense_limit=0)
    assert total.true is None and list(total.l1) == [0, 1, 0]
    assert M.nonzero_cells(true).tolist() == [2, 0, 1]


def test_blau_index_and_quintiles():
    b = M.blau_index(np.array([[5, 5], [10, 0], [0, 0], [1, 1]]))
    assert b[0] == 0.5 and b[1] == 0 and np.isnan(b[2]) and b[3] == 0.5
    assert list(M.quintiles(np.arange(10.0))) == [1, 1, 2, 2, 3, 3, 4, 4, 5, 5]
    # ties are split by position: three equal values of five go to quintiles 1, 2, 3
    assert list(M.quintiles(np.array([0.0, 0.0, 0.0, 0.5, 0.4]))) == [1, 2, 3, 5, 4]


def test_blau_quintile_errors():
    blau = np.array([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, np.nan])
    err = np.array([1, 3, 0, 0, -1, -1, 2, 2, -4, 0, 100])
    frame = M.blau_quintile_errors(blau, err).set_index("quintile")
    assert list(frame["n"]) == [2] * 5  # the NaN (zero-population) unit is left out
    assert list(frame["mean_signed_error"]) == [2.0, 0.0, -1.0, 2.0, -2.0]
    assert list(frame["mean_abs_error"]) == [2.0, 0.0, 1.0, 2.0, 2.0]
    assert frame.loc[1, "blau_min"] == 0.1 and frame.loc[5, "blau_max"] == 1.0


def test_homogeneity():
    idx = M.homogeneity_index(np.array([1, 0, 2, 1]), 2016)
    assert list(idx) == [2015, 2016, 2014, 2015]
    frame = M.bias_by_homogeneity(idx, np.array([1, 1, 0, -1])).set_index("homogeneity")
    assert frame.loc[2015, "n"] == 2 and frame.loc[2015, "bias"] == 0 and frame.loc[2015, "mean_abs_error"] == 1
    assert frame.loc[2016, "bias"] == 1 and frame.loc[2014, "bias"] == 0


def test_largest_share_error():
    est = np.array([[6, 4], [0, 0], [0, 0], [3, 3]])
    true = np.array([[5, 5], [0, 0], [1, 0], [2, 4]])
    got = M.largest_share_error(est, true)
    assert got[0] == pytest.approx(0.1) and got[1] == 0 and np.isnan(got[2])
    assert got[3] == pytest.approx(0.5 - 2 / 6)  # tie: the first answer is the largest


def test_entity_metrics():
    frame = M.entity_metrics(np.array([50, 60, 500, 0]), np.array([2, -4, 10, 0]),
                             np.array([0.01, 0.2, 0.05, np.nan])).set_index("bin")
    assert frame.loc["0-99", "n"] == 3 and frame.loc["0-99", "mean_abs_error"] == 2.0
    assert frame.loc["0-99", "n_share"] == 2 and frame.loc["0-99", "share_within_5pp"] == 0.5
    assert frame.loc["100-999", "share_within_5pp"] == 1.0  # exactly 5 points is within
    assert frame.loc["all", "n"] == 4 and frame.loc["all", "share_within_5pp"] == pytest.approx(2 / 3)
    assert frame.loc["10000+", "n"] == 0


def test_kde_matches_scipy():
    data = np.array([-3, -1, 0, 0, 0, 1, 2, 2, 5], dtype=float)
    values, counts = np.unique(data, return_counts=True)
    x = np.arange(-6, 7, dtype=float)
    logp, h = M.kde_log_density(values, counts, x, 0.1)
    kde = scipy.stats.gaussian_kde(data, bw_method=0.1)
    np.testing.assert_allclose(logp, kde.logpdf(x), rtol=1e-9, atol=1e-9)
    assert h == pytest.approx(np.sqrt(kde.covariance[0, 0]))


@settings(max_examples=80, deadline=None)
@given(st.integers(1, 12), st.lists(st.floats(-1e4, 1e4), min_size=1, max_size=30), st.integers(0, 2**32 - 1))
def test_weighted_logsumexp_is_scipys(rows, row, seed):
    """Each row's log sum w exp(a), far tails included, equals scipy's logsumexp with weights b."""
    rng = np.random.default_rng(seed)
    a = np.array([rng.permutation(row) for _ in range(rows)])
    w = rng.integers(1, 10_000, a.shape[1]).astype(float)
    np.testing.assert_allclose(M.weighted_logsumexp(a, w), scipy.special.logsumexp(a, b=w[None, :], axis=1),
                               rtol=1e-12, atol=1e-9)


def test_epl_statuses_and_support_rule():
    # every residual 0: the count is published exactly
    inv = M.empirical_privacy_loss(np.zeros(7))
    assert inv.status == M.EPL_INVARIANT and inv.epl is None and inv.lo is None
    # a few dozen residuals, none of two adjacent integers holding 50: no number, never inf or NaN
    few = M.empirical_privacy_loss(np.array([-40, -3, 0, 0, 1, 2, 90] * 7))
    assert few.status == M.EPL_TOO_FEW and few.epl is None and few.n_residuals == 49
    # uniform residuals on -2..2 with 1000 each, except 2 with 40: the rule keeps x = -2, -1, 0 only
    values, counts = np.arange(-2, 3), np.array([1000, 1000, 1000, 1000, 40])
    res = M.empirical_privacy_loss(values, counts, factor=0)
    assert res.status == M.EPL_ESTIMATED and list(res.x) == [-2, -1, 0]
    assert np.allclose(res.epl_x, 0.0) and res.lo <= 0.1 and 0 <= res.lo <= res.epl <= res.hi < 0.2
    # factor 0: the log-ratio of the raw counts
    res = M.empirical_privacy_loss(np.arange(-1, 3), np.array([100, 200, 400, 400]), factor=0)
    np.testing.assert_allclose(res.epl_x, [np.log(0.5), np.log(0.5), 0.0])
    assert res.lo <= np.log(2) <= res.hi and res.lo <= res.epl <= res.hi
    again = M.empirical_privacy_loss(np.arange(-1, 3), np.array([100, 200, 400, 400]), factor=0)
    assert (again.epl, again.lo, again.hi) == (res.epl, res.lo, res.hi)  # seeded: reproducible
    # scaled (non-integer) residuals are put on the integer grid
    grid, cnt = M.integer_residuals(np.array([-0.4, 0.2, 0.6, 1.4]), np.array([1, 2, 3, 0]))
    assert grid.tolist() == [0, 1] and cnt.tolist() == [3, 3]


@pytest.mark.parametrize("eps", [0.25, 0.5, 1.0, 2.0])
def test_epl_of_geometric_mechanism_is_epsilon(eps):
    """Two-sided geometric noise with parameter epsilon: |log p(x)/p(x+1)| = epsilon at every x, so the
    EPL is epsilon (Flaxman 2019; Petti & Flaxman Table SA1), and epsilon lies in the bootstrap interval."""
    rng = np.random.default_rng(20200406)
    p = 1 - np.exp(-eps)
    x = rng.geometric(p, 200_000) - rng.geometric(p, 200_000)
    res = M.empirical_privacy_loss(x)
    assert res.status == M.EPL_ESTIMATED
    assert res.lo <= eps <= res.hi
    assert res.hi - res.lo < 2 * eps  # informative: the tails at 50 residuals make it wide for small epsilon


def test_epl_of_discrete_gaussian_at_the_edge_matches_the_analytic_ratio():
    """Discrete Gaussian with sigma: log p(x)/p(x+1) = (2x + 1) / (2 sigma^2), largest at the edge of the
    supported range, where the estimate must match it within 3 standard errors of a log-ratio of counts."""
    rng = np.random.default_rng(7)
    sigma = 4.0
    support = np.arange(-60, 61)
    pmf = np.exp(-support**2 / (2 * sigma**2))
    x = rng.choice(support, size=300_000, p=pmf / pmf.sum())
    res = M.empirical_privacy_loss(x)
    grid, cnt = M.integer_residuals(x)
    count = dict(zip(grid.tolist(), cnt.tolist()))
    for edge, value in ((res.x.max(), res.epl_x[-1]), (res.x.min(), res.epl_x[0])):
        analytic = (2 * edge + 1) / (2 * sigma**2)
        se = np.sqrt(1 / count[edge] + 1 / count[edge + 1])
        assert abs(value - analytic) < 3 * se + 0.02 * abs(analytic)  # 2%: the KDE's smoothing (h = 0.1 sigma)
        assert count[edge] >= M.EPL_MIN_COUNT and count[edge + 1] >= M.EPL_MIN_COUNT
    assert count.get(res.x.max() + 2, 0) < M.EPL_MIN_COUNT or res.x.max() + 1 in res.x  # the range ends by the rule
    assert res.epl == pytest.approx(np.abs(res.epl_x).max(), abs=0.1)  # cross-fitted vs plain maximum
    assert res.lo <= max(abs(2 * e + 1) for e in (res.x.min(), res.x.max())) / (2 * sigma**2) <= res.hi


def test_simple_random_sample():
    a = M.simple_random_sample(1000, 0.25, (0, 2500, 0))
    assert a.size == 250 and np.unique(a).size == 250 and a.min() >= 0 and a.max() < 1000
    assert np.array_equal(a, M.simple_random_sample(1000, 0.25, (0, 2500, 0)))
    assert not np.array_equal(a, M.simple_random_sample(1000, 0.25, (0, 2500, 1)))
    assert M.simple_random_sample(10, 1.0, 0).tolist() == list(range(10))
    with pytest.raises(ValueError, match="not in"):
        M.simple_random_sample(10, 0.0, 0)


# -- mergeable summaries (a level evaluated group by group) ------------------------------

@settings(max_examples=40, deadline=None)
@given(st.lists(st.floats(-1e300, 1e300, allow_nan=False, allow_infinity=False), max_size=60), st.integers(0, 60))
def test_exact_sum_is_the_exact_sum_in_any_split(values, cut):
    import math

    v = np.asarray(values, dtype=float)
    whole, split = M.ExactSum.of(v), M.ExactSum.of(v[:cut]) + M.ExactSum.of(v[cut:])
    assert whole.scaled == split.scaled
    assert whole.value() == math.fsum(v)


def test_exact_sum_mean_of_whole_numbers_is_numpys_mean():
    rng = np.random.default_rng(3)
    err = rng.integers(-40, 40, size=100_001).astype(float)
    assert M.ExactSum.of(err).mean(err.size) == err.mean()
    assert M.ExactSum.of(np.array([5e-324, 5e-324, 1.0, -1.0])).value() == 1e-323  # subnormals are exact too
    assert np.isnan(M.ExactSum().mean(0))
    with pytest.raises(ValueError, match="not finite"):
        M.ExactSum.of(np.array([1.0, np.inf]))


def test_error_stats_of_groups_merge_into_the_whole():
    rng = np.random.default_rng(4)
    true = rng.integers(0, 3000, size=900)
    err = rng.integers(-30, 30, size=900).astype(float)
    whole = M.errors_by_bin(true, err, M.COUNTY_BINS)
    parts = [M.bin_stats(true[s], err[s], M.COUNTY_BINS) for s in (slice(0, 100), slice(100, 101), slice(101, None))]
    merged = M.bin_rows([M.ErrorStats.merge([p[b] for p in parts]) for b in range(len(M.COUNTY_BINS))], M.COUNTY_BINS)
    pd.testing.assert_frame_equal(merged, whole, check_exact=True)
    assert whole.loc[whole["bin"] == "all", "q0.5"].item() == np.quantile(err, 0.5, method="inverted_cdf")
    index = rng.integers(2000, 2016, size=900)
    halves = [M.homogeneity_stats(index[s], err[s]) for s in (slice(0, 450), slice(450, None))]
    keys = sorted(set(halves[0]) | set(halves[1]))
    merged_h = M.homogeneity_rows({k: M.ErrorStats.merge([h[k] for h in halves if k in h]) for k in keys})
    pd.testing.assert_frame_equal(merged_h, M.bias_by_homogeneity(index, err), check_exact=True)


def test_residual_summaries_of_groups_merge_into_the_whole_levels():
    """Geounits split into two groups: the merged summary has the whole level's residual distribution, L1
    sum and geounit count, so its quantiles and EPL input are those of the whole."""
    rng = np.random.default_rng(5)
    n, rows = 40, 600
    unit, cell = rng.integers(0, n, rows), rng.integers(0, PERSONS.ncells, rows)
    true = M.SparseHist(unit, cell, rng.integers(1, 9, rows), n)
    est = M.SparseHist(unit, cell, rng.integers(0, 12, rows), n)
    query = build_query(PERSONS, "votingage * hispanic")
    whole = M.query_errors(true, est, query)
    parts = []
    for sel in (unit < 15, unit >= 15):
        local = np.unique(unit[sel], return_inverse=True)[1]
        n_g = len(np.unique(unit[sel]))
        parts.append(M.query_errors(M.SparseHist(local, cell[sel], true.count[sel], n_g),
                                    M.SparseHist(local, cell[sel], est.count[sel], n_g), query).summary())
    merged = M.ResidualSummary.merge(parts)
    assert merged.n_units == n and merged.n_answers == whole.n_answers
    assert np.array_equal(merged.values, whole.values) and np.array_equal(merged.counts, whole.counts)
    assert merged.mean_abs_error == whole.mean_abs_error
    assert np.array_equal(merged.signed_quantiles(M.QUANTILES), whole.signed_quantiles(M.QUANTILES))
    scaled = M.query_errors(true, est, query, rate=0.5)  # a sample's answers scaled up: est / rate - true
    assert (scaled.values * scaled.counts).sum() == 2 * est.count.sum() - true.count.sum()
