"""Exactness and determinism of the noise samplers and random sources.

Statistical tests use fixed seeds, so they are deterministic; the stated false-alarm rate is what a
correct sampler would fail with over random seeds: p < 1e-4 per chi-square test, |z| > 5 (about 6e-7)
per moment test.
"""
from __future__ import annotations

import math
from decimal import Decimal, getcontext
from fractions import Fraction

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from scipy import stats

from topdown.pipeline.privacy import mechanisms as mech
from topdown.pipeline.privacy.mechanisms import (discrete_gaussian, discrete_gaussian_variance, geometric,
                                         geometric_variance)
from topdown.pipeline.privacy.rng import OSSource, SeededSource, make_source, noise_key

P_THRESHOLD = 1e-4
Z_THRESHOLD = 5.0
#: 1/sigma2 = qprop * gprop * rho with production denominators (Block total query, DAS-2020 strategies.py).
BLOCK_TOTAL_SIGMA2 = 1 / (Fraction(5, 4097) * Fraction(165, 4099) * Fraction(293764, 114921))


def dg_pmf(sigma2: Fraction, support: np.ndarray) -> np.ndarray:
    """Exact discrete Gaussian probabilities on ``support`` (normalised over a support with negligible tail)."""
    s2 = float(sigma2)
    w = np.exp(-support.astype(float) ** 2 / (2 * s2))
    return w / w.sum()


def geo_pmf(lam: float, support: np.ndarray) -> np.ndarray:
    w = np.exp(-lam * np.abs(support.astype(float)))
    return w / w.sum()


def chi_square_p(samples: np.ndarray, support: np.ndarray, pmf: np.ndarray, min_expected: float = 20.0) -> float:
    """Chi-square p-value of ``samples`` against ``pmf`` on ``support``, merging cells (and both tails)
    so every bin expects at least ``min_expected`` draws."""
    assert samples.min() >= support[0] and samples.max() <= support[-1], "sample outside the tested support"
    n = samples.size
    observed = np.bincount(samples - support[0], minlength=support.size).astype(float)
    expected = pmf * n
    obs_bins, exp_bins, o, e = [], [], 0.0, 0.0
    for oi, ei in zip(observed, expected):
        o, e = o + oi, e + ei
        if e >= min_expected:
            obs_bins.append(o)
            exp_bins.append(e)
            o, e = 0.0, 0.0
    obs_bins[-1] += o
    exp_bins[-1] += e
    return float(stats.chisquare(obs_bins, exp_bins).pvalue)


def support_for(sigma2: Fraction) -> np.ndarray:
    k = int(20 * math.sqrt(float(sigma2))) + 10
    return np.arange(-k, k + 1)


# ------------------------------------------------------------------------------------ discrete Gaussian
@pytest.mark.parametrize("sigma2", [Fraction(6, 5), Fraction(20), Fraction(8000), BLOCK_TOTAL_SIGMA2, Fraction(1, 3)])
def test_discrete_gaussian_matches_exact_pmf(sigma2: Fraction) -> None:
    y = discrete_gaussian(SeededSource(11, "chi", str(sigma2)), sigma2, 200_000)
    support = support_for(sigma2)
    assert chi_square_p(y, support, dg_pmf(sigma2, support)) > P_THRESHOLD


@pytest.mark.parametrize("sigma2", [Fraction(6, 5), Fraction(20), Fraction(8000)])
def test_discrete_gaussian_exact_path_matches_pmf(sigma2: Fraction) -> None:
    """margin >= 1 sends every decision through the integer-only exact comparisons."""
    y = discrete_gaussian(SeededSource(12, "exact", str(sigma2)), sigma2, 12_000, margin=2.0)
    support = support_for(sigma2)
    assert chi_square_p(y, support, dg_pmf(sigma2, support)) > P_THRESHOLD


@pytest.mark.parametrize("sigma2", [Fraction(6, 5), Fraction(20), Fraction(8000)])
def test_discrete_gaussian_mean_variance_symmetry(sigma2: Fraction) -> None:
    n = 1_000_000
    y = discrete_gaussian(SeededSource(13, "moments", str(sigma2)), sigma2, n)
    var = discrete_gaussian_variance(sigma2)
    assert abs(y.mean()) / math.sqrt(var / n) < Z_THRESHOLD
    fourth = float(np.mean(y.astype(float) ** 4))
    se_var = math.sqrt((fourth - var ** 2) / n)
    assert abs(y.astype(float).var() - var) / se_var < Z_THRESHOLD
    pos, neg = int((y > 0).sum()), int((y < 0).sum())
    assert abs(pos - neg) / math.sqrt(pos + neg) < Z_THRESHOLD


def test_discrete_gaussian_exact_tail() -> None:
    """P(|Y| >= 4) for sigma2 = 6/5 (about 1.3e-3) against the exact tail mass."""
    sigma2, n, k = Fraction(6, 5), 1_000_000, 4
    y = discrete_gaussian(SeededSource(14, "tail", "x"), sigma2, n)
    support = support_for(sigma2)
    pmf = dg_pmf(sigma2, support)
    p_tail = float(pmf[np.abs(support) >= k].sum())
    hits = int((np.abs(y) >= k).sum())
    assert abs(hits - n * p_tail) / math.sqrt(n * p_tail * (1 - p_tail)) < Z_THRESHOLD


def test_discrete_gaussian_variance_function() -> None:
    assert discrete_gaussian_variance(Fraction(8000)) == 8000.0
    s2 = 1.2
    k = np.arange(-200, 201, dtype=float)
    w = np.exp(-k ** 2 / (2 * s2))
    assert discrete_gaussian_variance(Fraction(6, 5)) == pytest.approx(float((k ** 2 * w).sum() / w.sum()), rel=1e-12)
    assert discrete_gaussian_variance(Fraction(6, 5)) == pytest.approx(1.2, rel=1e-7)  # DAS-2020 primitives.py
    assert discrete_gaussian_variance(Fraction(1, 10)) < 0.1                            # far below sigma2


def test_samplers_refuse_floats_and_bad_arguments() -> None:
    src = SeededSource(0, "x", "y")
    with pytest.raises(TypeError, match="sigma2"):
        discrete_gaussian(src, 1.2, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sigma2"):
        discrete_gaussian(src, Fraction(0), 10)
    with pytest.raises(TypeError, match="epsilon"):
        geometric(src, 0.5, 2, 10)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="sensitivity"):
        geometric(src, Fraction(1, 2), 0, 10)
    assert discrete_gaussian(src, Fraction(3), 0).shape == (0,)


# ------------------------------------------------------------------------------------------ geometric
@pytest.mark.parametrize("epsilon", [Fraction(1), Fraction(1, 10), Fraction(1, 240)])
def test_geometric_matches_exact_pmf(epsilon: Fraction) -> None:
    y = geometric(SeededSource(21, "geo", str(epsilon)), epsilon, 2, 200_000)
    lam = float(epsilon / 2)
    k = int(30 / lam) + 10
    support = np.arange(-k, k + 1)
    assert chi_square_p(y, support, geo_pmf(lam, support)) > P_THRESHOLD
    var = geometric_variance(epsilon, 2)
    assert abs(y.mean()) / math.sqrt(var / y.size) < Z_THRESHOLD


def test_geometric_exact_path_matches_pmf() -> None:
    epsilon = Fraction(1, 3)
    y = geometric(SeededSource(22, "geo-exact", "x"), epsilon, 2, 12_000, margin=2.0)
    support = np.arange(-200, 201)
    assert chi_square_p(y, support, geo_pmf(1 / 6, support)) > P_THRESHOLD


def test_geometric_variance_function() -> None:
    q = math.exp(-0.5)
    assert geometric_variance(Fraction(1), 2) == pytest.approx(2 * q / (1 - q) ** 2, rel=1e-14)
    y = geometric(SeededSource(23, "var", "x"), Fraction(1), 2, 1_000_000).astype(float)
    var = geometric_variance(Fraction(1), 2)
    se = math.sqrt((np.mean(y ** 4) - var ** 2) / y.size)
    assert abs(y.var() - var) / se < Z_THRESHOLD


# ------------------------------------------------------------------- fast path agrees with exact path
@pytest.mark.parametrize("sigma2", [Fraction(6, 5), Fraction(20), Fraction(8000), BLOCK_TOTAL_SIGMA2])
def test_fast_and_exact_paths_give_identical_discrete_gaussian_draws(sigma2: Fraction) -> None:
    """From the same seed, every float fast-path decision equals the integer-only exact decision."""
    fast = discrete_gaussian(SeededSource(31, "agree", str(sigma2)), sigma2, 4000)
    exact = discrete_gaussian(SeededSource(31, "agree", str(sigma2)), sigma2, 4000, margin=2.0)
    np.testing.assert_array_equal(fast, exact)


@pytest.mark.parametrize("epsilon", [Fraction(1), Fraction(1, 240)])
def test_fast_and_exact_paths_give_identical_geometric_draws(epsilon: Fraction) -> None:
    fast = geometric(SeededSource(32, "agree", str(epsilon)), epsilon, 2, 4000)
    exact = geometric(SeededSource(32, "agree", str(epsilon)), epsilon, 2, 4000, margin=2.0)
    np.testing.assert_array_equal(fast, exact)


def test_fast_and_exact_bernoulli_decisions_agree() -> None:
    gammas = [Fraction(k, 1300) for k in range(5000)]
    g = np.array([float(x) for x in gammas])
    words = SeededSource(33, "agree", "b").uint64(g.size)
    a = mech._bernoulli_exp(SeededSource(34, "more", "b"), words, g, lambda i: gammas[i], mech.FAST_MARGIN)
    b = mech._bernoulli_exp(SeededSource(34, "more", "b"), words, g, lambda i: gammas[i], 2.0)
    np.testing.assert_array_equal(a, b)
    assert 0.05 < a.mean() < 0.5


@pytest.mark.parametrize("gamma", [Fraction(0), Fraction(1, 3), Fraction(1), Fraction(22, 7), Fraction(1000, 3),
                                   1 / BLOCK_TOTAL_SIGMA2, Fraction(10 ** 30 + 1, 10 ** 29)])
def test_exp_bounds_bracket_the_true_value(gamma: Fraction) -> None:
    getcontext().prec = 200
    truth = (-(Decimal(gamma.numerator) / Decimal(gamma.denominator))).exp()
    for prec in (40, 85, 160):
        lo, hi = mech._exp_neg_bounds(gamma, prec)
        scaled = truth * (Decimal(2) ** prec)
        assert Decimal(lo) <= scaled <= Decimal(hi)
        assert hi - lo <= 2 ** 12


@settings(max_examples=200, deadline=None)
@given(st.integers(0, 10 ** 12), st.integers(1, 10 ** 12), st.integers(1, 200))
def test_exp_bounds_property(num: int, den: int, prec: int) -> None:
    gamma = Fraction(num, den)
    getcontext().prec = 120
    truth = (-(Decimal(num) / Decimal(den))).exp() * (Decimal(2) ** prec)
    lo, hi = mech._exp_neg_bounds(gamma, prec)
    assert 0 <= lo <= truth <= hi


def test_lazy_uniform_reveals_more_bits_when_needed() -> None:
    """A V that sits exactly on the first 53 bits of exp(-1) must read further words to decide."""
    lo, _ = mech._exp_neg_bounds(Fraction(1), 53)
    v = mech._LazyUniform(SeededSource(0, "lazy", "x"), lo, 53)
    v.below_exp(Fraction(1))
    assert v.k > 53


# ------------------------------------------------------------------------------------- random sources
def test_seeded_source_is_deterministic_and_keyed() -> None:
    a = SeededSource(7, "44007", "detailed").uint64(100)
    np.testing.assert_array_equal(a, SeededSource(7, "44007", "detailed").uint64(100))
    assert not np.array_equal(a, SeededSource(7, "44007", "total").uint64(100))
    assert not np.array_equal(a, SeededSource(7, "44009", "detailed").uint64(100))
    assert not np.array_equal(a, SeededSource(8, "44007", "detailed").uint64(100))
    # ambiguous concatenations get different keys
    assert not np.array_equal(SeededSource(1, "12", "3").uint64(4), SeededSource(1, "1", "23").uint64(4))


@settings(max_examples=200, deadline=None)
@given(st.integers(min_value=-2**70, max_value=2**70), st.lists(st.text(), min_size=1, max_size=5))
def test_key_material_is_the_json_encoding(seed: int, parts: list[str]) -> None:
    """The hand-spelled key material is byte for byte json.dumps of the key (any text, any int seed), so
    every stream keeps its words."""
    import json

    from topdown.pipeline.privacy.rng import key_material

    assert key_material(seed, tuple(parts)) == json.dumps(["census-topdown/rng/v2", seed, *parts]).encode()


def test_noise_streams_are_separated_by_product_and_level() -> None:
    """Domain separation: the same geocode and query under another product or level (a 15-character
    custom block group code equal to a block GEOID) is another stream."""
    code = "440070001001001"
    keys = [noise_key("persons", "Block", code, "total"), noise_key("persons", "Block_Group", code, "total"),
            noise_key("units", "Block", code, "total"), noise_key("persons", "Block", code, "detailed")]
    words = [make_source("test", 3, *k).uint64(8).tobytes() for k in keys]
    assert len(set(words)) == len(keys)
    np.testing.assert_array_equal(make_source("test", 3, *keys[0]).uint64(8), SeededSource(3, *keys[0]).uint64(8))


def test_seeded_stream_does_not_depend_on_chunking() -> None:
    whole = SeededSource(3, "g", "q").uint64(1000)
    src = SeededSource(3, "g", "q")
    parts = np.concatenate([src.uint64(k) for k in (1, 7, 64, 300, 628)])
    np.testing.assert_array_equal(whole, parts)


def test_sampler_draws_are_reproducible() -> None:
    a = discrete_gaussian(make_source("test", 5, "4400", "detailed"), Fraction(20), 70_000)
    b = discrete_gaussian(make_source("test", 5, "4400", "detailed"), Fraction(20), 70_000)
    np.testing.assert_array_equal(a, b)
    c = geometric(make_source("test", 5, "4400", "hhgq"), Fraction(1, 4), 2, 1000)
    np.testing.assert_array_equal(c, geometric(make_source("test", 5, "4400", "hhgq"), Fraction(1, 4), 2, 1000))


def test_os_source_and_factory() -> None:
    words = OSSource().uint64(1000)
    assert words.dtype == np.uint64 and words.shape == (1000,)
    assert np.unique(words).size == 1000
    y = discrete_gaussian(make_source("production", None, "44", "total"), Fraction(20), 1000)
    assert y.dtype == np.int64 and y.shape == (1000,)
    assert isinstance(make_source("test", 0, "44", "total"), SeededSource)
    with pytest.raises(ValueError, match="needs an integer seed"):
        make_source("test", None, "44", "total")
    with pytest.raises(ValueError, match="refuses a seed"):
        make_source("production", 0, "44", "total")
    with pytest.raises(ValueError, match="unknown mode"):
        make_source("debug", 0, "44", "total")


@pytest.mark.parametrize("m", [1, 2, 10, 3 * 2 ** 62, 2 ** 64])
def test_integers_are_uniform_without_modulo_bias(m: int) -> None:
    x = SeededSource(41, "int", str(m)).integers(m, 60_000)
    assert x.dtype == np.uint64 and x.size == 60_000
    if m == 1:
        assert (x == 0).all()
        return
    assert int(x.max()) < m
    # small ranges: every value; large ranges: the top two bits, where modulo bias would show
    idx = x.astype(np.int64) if m <= 16 else (x >> np.uint64(62)).astype(np.int64)
    counts = np.bincount(idx, minlength=m if m <= 16 else -(-m // 2 ** 62))
    assert stats.chisquare(counts).pvalue > P_THRESHOLD


def test_bits_are_fair() -> None:
    b = SeededSource(42, "bits", "x").bits(100_001)
    assert b.size == 100_001 and set(np.unique(b)) <= {0, 1}
    assert abs(int(b.sum()) - 50_000.5) / math.sqrt(100_001 / 4) < Z_THRESHOLD


# ------------------------------------------------------------------------- many streams in one pass
def test_draws_are_pinned_to_the_one_stream_sampler() -> None:
    """The draws of the one-stream-at-a-time sampler this repository had before the vectorized rounds
    (digest computed with that code): same words, same decisions, same values, both paths."""
    import hashlib

    h = hashlib.sha256()
    cases = [(Fraction(6, 5), 2016, mech.FAST_MARGIN), (Fraction(8000), 70000, mech.FAST_MARGIN),
             (Fraction(20), 300, 2.0), (Fraction(12345, 7), 1, mech.FAST_MARGIN)]
    for i, (sigma2, size, margin) in enumerate(cases):
        h.update(discrete_gaussian(SeededSource(5, "pin", str(i)), sigma2, size, margin=margin).tobytes())
        h.update(geometric(SeededSource(6, "pin", str(i)), Fraction(1, 1 + i), 2, size, margin=margin).tobytes())
    assert h.hexdigest() == "bea2125d7a8ca4135987a3505fbbe206f8041f3e01e77793b5d847740f93ba5e"


@settings(max_examples=30, deadline=None)
@given(n=st.integers(0, 6), size=st.sampled_from([0, 1, 2, 5, 63, 700]), num=st.integers(1, 9000),
       den=st.integers(1, 40), exact=st.booleans())
def test_many_streams_equal_one_stream_at_a_time(n: int, size: int, num: int, den: int, exact: bool) -> None:
    """Row i of the batched samplers is what stream i gives alone, also when every decision takes the
    exact path (which reads more words from the stream of that draw only)."""
    margin = 2.0 if exact else mech.FAST_MARGIN
    keys = [("many", str(num), str(i)) for i in range(n)]
    sigma2, epsilon = Fraction(num, den), Fraction(den, num)
    many = mech.discrete_gaussian_many([SeededSource(3, *k) for k in keys], sigma2, size, margin=margin)
    assert many.shape == (n, size) and many.dtype == np.int64
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(many[i], discrete_gaussian(SeededSource(3, *k), sigma2, size, margin=margin))
    geo = mech.geometric_many([SeededSource(4, *k) for k in keys], epsilon, 2, size, margin=margin)
    for i, k in enumerate(keys):
        np.testing.assert_array_equal(geo[i], geometric(SeededSource(4, *k), epsilon, 2, size, margin=margin))


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.sampled_from([0, 1, 2, 3, 4, 5, 7, 130, 1000])), min_size=1, max_size=12))
def test_seeded_source_is_a_fresh_philox_stream_under_interleaved_reads(reads) -> None:
    """The shared generator (rng.SeededSource: set to a stream's key and position) gives every stream
    exactly the words of its own ``Philox(key=SHA-256(...)[:16])``, whatever the order in which streams
    are read and however many words each read takes."""
    import hashlib
    import json

    keys = [(7, "p", "Block", str(i)) for i in range(4)]
    streams = [SeededSource(*k) for k in keys]
    own = [np.random.Philox(key=np.frombuffer(hashlib.sha256(json.dumps(["census-topdown/rng/v2", *k]).encode())
                                              .digest()[:16], dtype="<u8").astype(np.uint64)) for k in keys]
    for i, n in reads:
        assert np.array_equal(streams[i].uint64(n), own[i].random_raw(n))


@settings(max_examples=40, deadline=None)
@given(seed=st.integers(0, 2**63), product=st.text(max_size=6), level=st.text(max_size=6),
       geocodes=st.lists(st.text(max_size=16), max_size=5), query=st.text(max_size=12))
def test_noise_sources_are_the_streams_of_noise_key(seed, product, level, geocodes, query) -> None:
    """rng.noise_sources (one query's streams at many nodes, key material spelled once) gives every node the
    stream ``make_source(mode, seed, *noise_key(...))`` gives it alone: the same key, the same words."""
    from topdown.pipeline.privacy.rng import make_source, noise_key, noise_sources

    many = noise_sources("test", seed, product, level, geocodes, query)
    assert len(many) == len(geocodes)
    for g, source in zip(geocodes, many):
        alone = make_source("test", seed, *noise_key(product, level, g, query))
        assert source.parts == alone.parts
        np.testing.assert_array_equal(source.uint64(7), alone.uint64(7))
    assert all(isinstance(s, OSSource) for s in noise_sources("production", None, product, level, geocodes, query))
