"""Calibrated intervals for published counts (pipeline/evaluation/calibrated.py): the equations (C1)-(C4)
against hand-computed cases, coverage by true size on a simulated shrinking mechanism (fixed seeds), and the
``calibrated`` rows of the uncertainty table from replicate folders whose differences are known."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from topdown.pipeline.evaluation import amc, calibrated as cal
from topdown.pipeline.evaluation.evaluate import EvaluationError
from topdown.pipeline.evaluation.uncertainty import Source

from test_amc import _fake_replicates, _gls_part


# ---------------------------------------------------------------------------------------- the equations
def test_fit_merges_small_bins_upwards_and_the_last_downwards():
    """(C1): 40 counts of 0 (bias 1, MSE 5: s = 2), 10 of 1 and 25 of 2 (merged: 35 rows), 5 of 500 (merged
    into the bin below, too small to stand alone)."""
    q0 = np.r_[np.zeros(40), np.ones(10), np.full(25, 2.0), np.full(5, 500.0)]
    bias = np.r_[np.ones(40), np.zeros(10), np.full(25, -1.0), np.full(5, -3.0)]
    mse = np.r_[np.full(40, 5.0), np.full(10, 1.0), np.full(25, 2.0), np.full(5, 9.0)]
    model = cal.fit(cal.bin_sums(q0, bias, mse), min_rows=30)
    merged = slice(40, None)
    b2 = bias[merged].mean()
    np.testing.assert_allclose(model.x, [0.0, q0[merged].mean()])
    np.testing.assert_allclose(model.b, [1.0, b2])
    np.testing.assert_allclose(model.s, [2.0, np.sqrt(mse[merged].mean() - b2 ** 2)])
    one = cal.fit(cal.bin_sums(np.array([7.0]), np.array([0.5]), np.array([1.25])))  # fewer rows than a bin
    assert (one.x.tolist(), one.b.tolist(), one.s.tolist()) == ([7.0], [0.5], [1.0])
    with pytest.raises(ValueError, match="no published counts"):
        cal.fit(cal.bin_sums(np.array([]), np.array([]), np.array([])))


def test_interval_without_bias_is_the_symmetric_integer_range():
    """(C3) with b = 0 and s = 3 everywhere: the integers in q0 -+ z s, never below 0; an invariant (s = 0)
    gets [q0, q0]."""
    model = cal.SizeModel(np.array([0.0, 100.0]), np.zeros(2), np.full(2, 3.0))
    q0 = np.array([0.0, 2.0, 10.0, 50.0, 5_000.0])
    lo, hi = cal.interval(q0, model, 0.90)
    z = cal.z_value(0.90)
    np.testing.assert_array_equal(lo, np.maximum(np.ceil(q0 - z * 3), 0))
    np.testing.assert_array_equal(hi, np.floor(q0 + z * 3))
    exact = cal.SizeModel(np.array([1_000.0]), np.zeros(1), np.zeros(1))
    assert [a.tolist() for a in cal.interval(np.array([0.0, 7.0, 1_234.0]), exact, 0.95)] == [[0, 7, 1234]] * 2
    assert round(z, 4) == 1.6449 and round(cal.z_value(0.95), 4) == 1.96


def test_interval_inverts_a_shrinking_bias():
    """(C3) with b(t) = -0.2 (t - 20) (large counts published too low): the bounds are the smallest t whose
    upper bound reaches q0 and the largest whose lower bound does not pass it, so a large published count's
    interval lies above it; the centre solves t + b(t) = q0."""
    x = np.arange(0.0, 501.0, 10.0)
    model = cal.SizeModel(x, -0.2 * (x - 20), np.full(len(x), 2.0))
    z = cal.z_value(0.90)
    upper = lambda t: t - 0.2 * (t - 20) + z * 2  # noqa: E731
    lower = lambda t: t - 0.2 * (t - 20) - z * 2  # noqa: E731
    q0 = np.array([100.0, 300.0])
    lo, hi = cal.interval(q0, model, 0.90)
    for q, a, b in zip(q0, lo, hi):
        assert upper(a) >= q > upper(a - 1) and lower(b) <= q < lower(b + 1)
        assert a > q - 1 or q < 150  # 300 published: the truth is around 370
    centre, var = cal.centre(q0, model)
    np.testing.assert_allclose(centre - 0.2 * (centre - 20), q0, atol=1e-6)
    np.testing.assert_allclose(var, 4.0)


def test_interval_beyond_the_dense_grid():
    """Counts far above DENSE (a national total) use the last knot's b and s in closed form, quickly."""
    model = cal.SizeModel(np.array([10.0, 3.3e8]), np.array([0.0, -4.0]), np.array([1.0, 10.0]))
    lo, hi = cal.interval(np.array([3.4e8, 2.0e8]), model, 0.95)
    z = cal.z_value(0.95)
    assert lo[0] == np.ceil(3.4e8 + 4 - z * 10) and hi[0] == np.floor(3.4e8 + 4 + z * 10)
    assert lo[1] < 2.0e8 < hi[1] and hi[1] - lo[1] < 2 * z * 10 + 2


def test_extrapolate_one_generation_back():
    """(C4): biases halving from one generation to the next (second = first / 2) are doubled, spreads by their
    ratio; a knot whose biases differ in sign keeps the first's; ratios are clipped at MAX_RATIO."""
    x = np.array([0.0, 10.0, 100.0, 1_000.0])
    first = cal.SizeModel(x, np.array([2.0, 0.5, -4.0, -9.0]), np.array([3.0, 4.0, 6.0, 5.0]))
    second = cal.SizeModel(x, np.array([1.0, -0.5, -2.0, -1.0]), np.array([2.0, 4.0, 5.0, 1.0]))
    out = cal.extrapolate(first, second)
    np.testing.assert_allclose(out.b, [4.0, 0.5, -8.0, -9.0 * cal.MAX_RATIO])
    np.testing.assert_allclose(out.s, [4.5, 4.0, 7.2, 5.0 * cal.MAX_RATIO])
    np.testing.assert_array_equal(out.x, x)


# ------------------------------------------------------------------------- coverage on a simulated mechanism
def _mechanism(rng, truth):
    """A stand-in for TopDown: small counts pulled up (+2 at 0), large ones down (-4 from about 100), noise
    growing with size, rounded and clipped at 0."""
    noisy = truth + 2 - 6 * np.tanh(truth / 50) + (1 + 0.25 * np.sqrt(truth)) * rng.standard_normal(len(truth))
    return np.maximum(np.round(noisy), 0)


@pytest.mark.parametrize("seed", [3, 8])
def test_coverage_is_nominal_for_every_true_size(seed):
    """Truth -> published -> 20 replicates by the same mechanism (its replicates' world is the real one: (C4)
    is not needed): the calibrated 90 % intervals cover the truth at 0.90 +- 0.025 in each true-size bin and
    within the binomial 99 % band overall; the same width about the published count without the size-dependent
    bias (``q0 -+ z RMSE``) falls short."""
    from scipy import stats

    rng = np.random.default_rng(seed)
    truth = np.round(np.exp(rng.uniform(0, np.log(400), 20_000)))
    published = _mechanism(rng, truth)
    reps = np.stack([_mechanism(rng, published) for _ in range(20)])
    bias, mse = (reps - published).mean(0), ((reps - published) ** 2).mean(0)
    lo, hi = cal.interval(published, cal.fit(cal.bin_sums(published, bias, mse)), 0.90)
    covered = (lo <= truth) & (truth <= hi)
    bins = np.digitize(truth, [10, 50, 100, 250])
    for k in range(5):
        assert abs(covered[bins == k].mean() - 0.90) <= 0.025, (k, covered[bins == k].mean())
    lo_band, hi_band = stats.binom.ppf([0.005, 0.995], len(truth), 0.90) / len(truth)
    assert lo_band <= covered.mean() <= hi_band
    plain = np.abs(truth - published) <= cal.z_value(0.90) * np.sqrt(mse)
    assert plain.mean() < lo_band


# ---------------------------------------------------------------------------------------- the table's rows
def _second_generation(run, reps, root, shifts):
    """Replicates of ``reps``/rep-000 (given the run's spine and a config with seed 0), seeds 0, 1, ..."""
    base = reps / "rep-000"
    shutil.copy(run / "spine.parquet", base / "spine.parquet")
    (base / "config.json").write_text(json.dumps({"run": {"seed": 0}}))
    _fake_replicates(base, root, shifts)


def test_calibrated_rows_from_two_generations(demo_run, tmp_path):
    """First generation: +0 and +2 persons in one block's cell (bias 1, s 1 on that block's total); second:
    seed 0 (+7, the same seed as its base: left out), +0, +4 (bias 2, s 2): (C4) halves both, so the block's
    90 % interval is the integers in q0 - 0.5 -+ z 0.5. One calibrated row per amc row, in the same order."""
    src = Source.open(demo_run)
    block, _ = _fake_replicates(demo_run, tmp_path / "reps", [0, 2])
    _second_generation(demo_run, tmp_path / "reps", tmp_path / "reps2", [7, 0, 4])
    parts = [_gls_part(src, tmp_path / "a.parquet", "Tract", np.asarray(src.nodes[src.levels.index("Tract")])),
             _gls_part(src, tmp_path / "b.parquet", "Block", np.asarray([block]))]
    staging = tmp_path / "staging"
    staging.mkdir()
    parts, _ = amc.published_and_amc(parts, src, staging, None, tmp_path / "reps")
    out = cal.calibrated_parts(parts, src, staging, None, tmp_path / "reps", tmp_path / "reps2")
    assert len(out) == 2 and pq.read_schema(out[0]).equals(amc.SCHEMA)
    rows = pd.concat([pq.read_table(p).to_pandas() for p in out], ignore_index=True)
    ref = pd.concat([pq.read_table(p).to_pandas() for p in parts], ignore_index=True)
    ref = ref[ref["method"] == "amc"].reset_index(drop=True)
    assert (rows["method"] == cal.METHOD).all()
    key = ["level", "geocode", "query", "cell", "published"]
    pd.testing.assert_frame_equal(rows[key], ref[key])
    (b,) = rows[(rows["geocode"] == block) & (rows["query"] == "total")].itertuples()
    z = cal.z_value(0.90)
    assert (b.ci90_low, b.ci90_high) == (max(np.ceil(b.published - 0.5 - 0.5 * z), 0),
                                         np.floor(b.published - 0.5 + 0.5 * z))
    assert b.estimate == b.published - 0.5 and b.variance == pytest.approx(0.25)
    assert ((rows["ci95_low"] <= rows["ci90_low"]) & (rows["ci90_low"] <= rows["ci90_high"])
            & (rows["ci90_high"] <= rows["ci95_high"]) & (rows["ci95_low"] >= 0)).all()
    still = rows[rows["rep_rmse"] == 0]  # the key's pooled spread, not their own (0), sets their width
    assert len(still) and ((still["ci90_low"] <= still["published"]) & (still["published"] <= still["ci90_high"])).all()


def test_second_generation_must_be_of_a_replicate_with_other_seeds(demo_run, tmp_path):
    _fake_replicates(demo_run, tmp_path / "reps", [0, 2])
    _fake_replicates(demo_run, tmp_path / "other", [0, 1])  # replicates of the run, not of a replicate
    with pytest.raises(EvaluationError, match="not of a replicate in"):
        cal.second_generation(tmp_path / "reps", tmp_path / "other")
    _second_generation(demo_run, tmp_path / "reps", tmp_path / "same", [1, 2])
    with pytest.raises(EvaluationError, match="1 replicate.s. with a seed other than rep-000's own"):
        cal.second_generation(tmp_path / "reps", tmp_path / "same")


def test_cli_calibrate_needs_replicates_and_a_second_generation(demo_run, tmp_path):
    """`uncertainty --calibrate` without --replicates: exit 2; with replicates of the run instead of one of
    its replicates: exit 3; one line each, nothing written."""
    from cli_subprocess import assert_clean_failure, topdown

    out = tmp_path / "u.parquet"
    _fake_replicates(demo_run, tmp_path / "reps", [0, 2])
    outcome = topdown("uncertainty", demo_run, "--out", out, "--calibrate", tmp_path / "reps", "--workers", "1")
    assert_clean_failure(outcome, 2, "--calibrate needs --replicates")
    outcome = topdown("uncertainty", demo_run, "--out", out, "--replicates", tmp_path / "reps", "--calibrate",
                      tmp_path / "reps", "--workers", "1")
    assert_clean_failure(outcome, 3, "not of a replicate in")
    assert not out.exists() and not list(tmp_path.glob(".u.parquet*"))
