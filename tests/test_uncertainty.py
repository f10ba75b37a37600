"""``topdown uncertainty``: the GLS intervals hold at their nominal rate over seeded measurement draws, the
estimates are unbiased, the command's output depends on the noisy measurements only, and off-spine entities
get the covariance-aware variance."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from topdown.geo.spine import build_spine
from topdown.pipeline.cli import EXIT_OK, main
from topdown.pipeline.execution.cluster import credential_flags
from topdown.pipeline.configuration.config import load_config
from topdown.pipeline.execution.levels import build_levels
from topdown.pipeline.privacy.measure import measure
from topdown.vocab.queries import build_query
from topdown.pipeline.runtime.rundir import RunDir, write_table
from topdown.pipeline.execution.runner import _write_invariants
from topdown.pipeline.configuration.census import PERSONS, PERSONS_PRODUCT
from topdown.pipeline.inputs.tabulate import block_histograms, block_units
from topdown.pipeline.evaluation.uncertainty import Z90, uncertainty
from conftest import DATA

VHC = "votingage * hispanic * cenrace"


def _small_input(tracts: int = 12, seed: int = 0) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Persons and units of ``tracts`` tracts x 2 block groups x 3 blocks, 0-60 persons per block."""
    rng = np.random.default_rng(seed)
    persons, units = [], []
    for t in range(tracts):
        for bg in (1, 2):
            for b in range(3):
                geoid = f"44007{t + 1:04d}00{bg}{b:03d}"
                n = int(rng.integers(0, 60))
                persons.append(pd.DataFrame({"geoid": geoid, "hhgq": 0, "votingage": rng.integers(0, 2, n),
                                             "hispanic": rng.integers(0, 2, n),
                                             "cenrace": rng.choice([0, 1, 2, 3, 6, 20], n)}))
                units.append(pd.DataFrame({"geoid": [geoid] * 40, "unit_type": 0, "occupied": True}))
    return pd.concat(persons, ignore_index=True), pd.concat(units, ignore_index=True)


@pytest.fixture(scope="module")
def small_levels():
    persons, units = _small_input()
    config = load_config("demo").with_overrides(spine="standard")
    cfg = config.product("persons")
    spine = build_spine("standard", pd.Series(sorted(persons["geoid"].unique()), name="geoid"))
    levels = build_levels(PERSONS_PRODUCT, cfg, spine, block_histograms(persons, PERSONS),
                          block_units(units).set_index("geoid"))
    return config, spine, levels


def _measured_run(root: Path, config, spine, levels, seed: int) -> Path:
    """A run directory holding only what ``uncertainty`` reads: manifest, configuration, spine, the published
    invariants (structural zeros and exact totals) and the noisy measurements of seed."""
    cfg = config.product("persons")
    rundir = RunDir(root)
    root.mkdir(parents=True)
    write_table(spine.to_arrow(), root / "spine.parquet")
    (root / "config.json").write_text(json.dumps(config.model_dump(mode="json")))
    _write_invariants(None, rundir, PERSONS_PRODUCT, levels)
    for level in levels:
        parents = level.parent if level.parent is not None else np.zeros(len(level), dtype=int)
        groups = np.unique(parents // 12) if level.name == "Block" else [None]  # several block parts
        for k, g in enumerate(groups):
            rows = np.flatnonzero(parents // 12 == g) if g is not None else np.arange(len(level))
            _, table = measure(PERSONS_PRODUCT, cfg.budget, level.name, level.nodes[rows],
                               [level.plb[r] for r in rows], level.hist[rows], "test", seed)
            write_table(table, rundir.measurements("persons", level.name) / f"part-{k:05d}.parquet")
    (root / "manifest.json").write_text(json.dumps({"status": "complete", "products": ["persons"], "spine": "standard",
                                                    "levels": spine.levels, "config_hash": config.digest()}))
    return root


def _truth(levels, query: str) -> pd.DataFrame:
    q = build_query(PERSONS, query)
    frames = []
    for level in levels:
        ans = q.answer(np.asarray(level.hist.todense()))
        frames.append(pd.DataFrame({"level": level.name, "geocode": np.repeat(np.asarray(level.nodes), q.n_answers),
                                    "query": query, "cell": np.tile(np.arange(q.n_answers), len(level)),
                                    "truth": ans.ravel()}))
    return pd.concat(frames, ignore_index=True)


def _coverage(small_levels, dask_client, tmp_path, seeds) -> pd.DataFrame:
    config, spine, levels = small_levels
    truth = pd.concat([_truth(levels, "total"), _truth(levels, VHC)], ignore_index=True)
    frames = []
    for seed in seeds:
        run = _measured_run(tmp_path / f"run{seed}", config, spine, levels, seed)
        out = tmp_path / f"unc{seed}.parquet"
        uncertainty(run, out, levels=["County", "Tract", "Block_Group", "Block"], client=dask_client,
                    queries={"persons": ("total", VHC)})
        frames.append(pd.read_parquet(out).assign(seed=seed))
        shutil.rmtree(run)
    rows = pd.concat(frames, ignore_index=True).merge(truth, on=["level", "geocode", "query", "cell"], validate="m:1")
    half = Z90 * np.sqrt(rows["variance"])  # the central GLS interval; the written one respects count >= 0
    rows["covered"] = (rows["estimate"] - half <= rows["truth"]) & (rows["truth"] <= rows["estimate"] + half)
    rows["covered_published"] = (rows["ci90_low"] <= rows["truth"]) & (rows["truth"] <= rows["ci90_high"])
    rows["z"] = (rows["estimate"] - rows["truth"]) / np.sqrt(rows["variance"])
    return rows


def _check(rows: pd.DataFrame, seeds: int) -> pd.DataFrame:
    table = []
    for (level, query), g in rows[rows["level"].isin(["Tract", "Block_Group", "Block"])].groupby(["level", "query"]):
        if query == VHC and level != "Tract":
            continue
        n = len(g)
        lo, hi = stats.binom.ppf([0.005, 0.995], n, 0.90) / n
        table.append({"level": level, "query": query, "intervals": n, "coverage": g["covered"].mean(), "band_lo": lo,
                      "band_hi": hi, "published": g["covered_published"].mean(), "mean_z": g["z"].mean()})
        # Unbiased: every node's (cell's) mean error over the seeds within its standard error, Bonferroni at 1 %.
        per_node = g.groupby(["geocode", "cell"])["z"].mean() * np.sqrt(seeds)
        assert per_node.abs().max() < stats.norm.ppf(1 - 0.005 / len(per_node)), (level, query)
    table = pd.DataFrame(table)
    print("\n" + table.to_string(index=False))
    assert ((table["coverage"] >= table["band_lo"]) & (table["coverage"] <= table["band_hi"])).all(), table
    # The written interval (Feldman-Cousins for a count >= 0, integer bounds) is nominal as well, also over
    # the cells whose true count is 0 (the central interval clipped at 0 covered 0.95 of them at 90 %).
    assert ((table["published"] >= table["band_lo"]) & (table["published"] <= table["band_hi"])).all(), table
    zeros = rows[(rows["truth"] == 0) & rows["level"].isin(["Tract", "Block_Group", "Block"])]
    lo, hi = stats.binom.ppf([0.005, 0.995], len(zeros), 0.90) / len(zeros)
    assert len(zeros) > 100 and lo <= zeros["covered_published"].mean() <= hi, zeros["covered_published"].mean()
    return table


@pytest.mark.slow
def test_gls_intervals_cover_at_the_nominal_rate(small_levels, dask_client, tmp_path):
    """20 seeded draws of the measurements of a 72-block input: 90 % coverage within the binomial 99 % band
    (about 2 minutes on 2 cores)."""
    _check(_coverage(small_levels, dask_client, tmp_path, range(20)), 20)


def test_gls_intervals_cover_fast(small_levels, dask_client, tmp_path):
    """The same check with 4 seeded draws (other seeds than the slow test's)."""
    _check(_coverage(small_levels, dask_client, tmp_path, range(100, 104)), 4)


def test_invariant_totals_are_exact_and_structural_zeros_narrow(small_levels, dask_client, tmp_path):
    """The US and State persons totals (invariant) get their exact value, variance 0.0
    and the interval [t, t], while the counties' are estimated; GQ types without facilities (every person of
    the input is in a household: upper bounds of 0) and nursing-facility x non-voting persons (an equality of
    0) are structural zeros above the blocks: estimates and variances near 0, while the blocks' are free."""
    config, spine, levels = small_levels
    run = _measured_run(tmp_path / "run", config, spine, levels, 7)
    out = tmp_path / "u.parquet"
    uncertainty(run, out, client=dask_client, queries={"persons": ("total", "hhgq", "gqNursingTotal * nonvoting")})
    t = pd.read_parquet(out)
    truth = _truth(levels, "total").set_index(["level", "geocode"])["truth"]
    tot = t[t["query"] == "total"].set_index(["level", "geocode"])
    for level in ("US", "State"):
        row = tot.loc[level].iloc[0]
        value = truth.loc[level].iloc[0]
        assert row["estimate"] == value and row["variance"] == 0.0
        assert row["ci90_low"] == row["ci90_high"] == row["ci95_low"] == row["ci95_high"] == value
    assert (tot.loc["Tract", "variance"] > 1).all()
    # the one county is the whole state: conditioned through the top-down pass, it has the state's total
    assert tot.loc["County", "variance"].max() < 1e-6
    assert tot.loc["County", "estimate"].iloc[0] == pytest.approx(truth.loc["State"].iloc[0], abs=1e-6)
    hh = t[t["query"] == "hhgq"]
    gq = hh[hh["cell"] > 0]
    upper = gq[gq["level"] != "Block"]
    assert upper["variance"].max() < 0.05 and upper["estimate"].abs().max() < 1
    assert (gq.loc[gq["level"] == "Block", "variance"] > 1).all()  # no zeros at the blocks (the Bureau's levels)
    nurse = t[(t["query"] == "gqNursingTotal * nonvoting") & (t["level"] != "Block")]
    assert nurse["variance"].max() < 0.05
    # consistency with the exact State total: its tracts add up to it
    assert tot.loc["Tract", "estimate"].sum() == pytest.approx(truth.loc["State"].iloc[0], abs=1e-6)


def test_output_depends_on_noisy_measurements_only(demo_run, dask_client, tmp_path):
    """The same table from a copy of the run holding only the spine, manifest and noisy measurements (no
    histogram, MDF or input; the public invariants stay), and a sane example: the county total's interval is
    narrow (invariant state)."""
    slim = tmp_path / "slim"
    slim.mkdir()
    for name in ("spine.parquet", "manifest.json", "config.json"):
        shutil.copy(demo_run / name, slim / name)
    for name in ("noisy_measurements", "invariants"):
        shutil.copytree(demo_run / name, slim / name)
    a, b = tmp_path / "a.parquet", tmp_path / "b.parquet"
    tls = credential_flags(dask_client.security, tmp_path / "tls")  # the session cluster is TLS, as a run's own
    assert main(["uncertainty", str(demo_run), "--out", str(a), "--levels", "Tract", "Block_Group",
                 "--scheduler", dask_client.scheduler.address, *tls, "--entities", str(DATA / "ri_baf2020")]) == EXIT_OK
    uncertainty(slim, b, levels=["Tract", "Block_Group"], client=dask_client)
    ta, tb = pd.read_parquet(a), pd.read_parquet(b)
    assert set(ta["method"]) == set(tb["method"]) == {"gls"}
    # The published count comes from the run's histograms (the slim copy has none: null); all else is equal.
    assert ta["published"].notna().all() and tb["published"].isna().all()
    assert ta[["rep_n", "rep_bias", "rep_rmse"]].isna().all().all()
    pd.testing.assert_frame_equal(ta[ta["level"].isin(["Tract", "Block_Group"])].reset_index(drop=True)
                                  .drop(columns="published"), tb.drop(columns="published"))
    tot = ta[(ta["product"] == "persons") & (ta["query"] == "total") & (ta["level"] == "Tract")]
    tot = tot.set_index("geocode")["published"]
    hist = pd.read_parquet(demo_run / "histograms" / "persons" / "level=Tract").groupby("geocode")["count"].sum()
    np.testing.assert_array_equal(tot.to_numpy(), hist.reindex(tot.index).to_numpy())
    assert set(ta["level"]) >= {"Tract", "Block_Group", "place", "mcd"}
    # Consistency: the tracts' estimates add up to the county's, and block groups to their tract.
    bg = tb[(tb["product"] == "persons") & (tb["query"] == "total") & (tb["level"] == "Block_Group")]
    tr = tb[(tb["product"] == "persons") & (tb["query"] == "total") & (tb["level"] == "Tract")].set_index("geocode")
    sums = bg.groupby(bg["geocode"].str[:11])["estimate"].sum()
    np.testing.assert_allclose(sums.to_numpy(), tr.loc[sums.index, "estimate"].to_numpy(), rtol=1e-9)
    assert (ta["ci90_low"] <= ta["ci95_high"]).all() and (ta["ci95_low"] <= ta["ci90_low"]).all()
    # The housing units of every node are invariant (declared at the blocks): exact, variance 0, [t, t].
    hu = tb[(tb["product"] == "units") & (tb["query"] == "total")].set_index("geocode")
    inv = pd.read_parquet(demo_run / "invariants" / "units.parquet")
    inv = inv[inv["level"].isin(["Tract", "Block_Group"])].set_index("geocode")["u0"]
    np.testing.assert_array_equal(hu["estimate"].to_numpy(), inv.reindex(hu.index).to_numpy(dtype=float))
    assert (hu["variance"] == 0.0).all() and (hu["ci90_low"] == hu["ci90_high"]).all()


# ------------------------------------------------------------------------------------------ replicates
def test_replicate_input_is_the_runs_mdf_with_public_gq_counts(demo_run, tmp_path):
    """The replicate input tabulates back to the run's published block histograms, and its units to the
    run's invariants (housing units and GQ facilities by type) - published data only."""
    from topdown.pipeline.evaluation.replicates import mdf_input
    from topdown.pipeline.inputs.tabulate import block_units

    inp = mdf_input(demo_run, tmp_path / "input")
    persons = pd.read_parquet(inp / "persons.parquet")
    got = block_histograms(persons, PERSONS).sort_values(["geocode", "cell"]).reset_index(drop=True)
    pub = pd.read_parquet(demo_run / "histograms" / "persons" / "level=Block")
    pub = pub[pub["count"] > 0].sort_values(["geocode", "cell"]).reset_index(drop=True)
    np.testing.assert_array_equal(got[["cell", "count"]].to_numpy(), pub[["cell", "count"]].to_numpy())
    assert list(got["geocode"].astype(str)) == list(pub["geocode"].astype(str))
    units = block_units(pd.read_parquet(inp / "units.parquet")).set_index("geoid").sort_index()
    inv = pd.read_parquet(demo_run / "invariants" / "persons.parquet")
    inv = inv[inv["level"] == "Block"].set_index("geocode").sort_index()
    cols = [f"u{k}" for k in range(8)]
    np.testing.assert_array_equal(units.reindex(inv.index).fillna(0)[cols].to_numpy(), inv[cols].to_numpy())


@pytest.mark.slow
def test_replicates_add_amc_rows(demo_run, dask_client, tmp_path):
    """Two replicates of the demo run (about 1-3 minutes): every GLS row gets an ``amc`` row with the published
    count, the replicates' bias and RMSE, and the Bureau's interval around its point estimate (t, 5 df)."""
    from topdown.pipeline.evaluation.amc import t_value
    from topdown.pipeline.evaluation.replicates import replicates

    record = replicates(demo_run, 2, tmp_path / "reps", client=dask_client)
    assert [r["seed"] for r in record["replicates"]] == [1_000_003, 1_000_004]
    out = tmp_path / "u.parquet"
    uncertainty(demo_run, out, levels=["Tract"], client=dask_client, replicates=tmp_path / "reps")
    t = pd.read_parquet(out)
    gls, amc = t[t["method"] == "gls"].reset_index(drop=True), t[t["method"] == "amc"].reset_index(drop=True)
    assert len(gls) == len(amc) and (gls["published"] == amc["published"]).all()
    assert (amc["rep_n"] == 2).all() and (amc["rep_rmse"] >= amc["rep_bias"].abs() - 1e-9).all()
    tot = amc[(amc["product"] == "persons") & (amc["query"] == "total")].set_index("geocode")
    hist = pd.read_parquet(demo_run / "histograms" / "persons" / "level=Tract").groupby("geocode")["count"].sum()
    np.testing.assert_array_equal(tot["published"].to_numpy(), hist.reindex(tot.index).to_numpy())
    assert (amc["ci90_high"] == np.ceil(amc["estimate"] + t_value(0.90) * amc["rep_rmse"])).all()
    assert (amc["ci95_low"] == np.floor(np.maximum(amc["estimate"] - t_value(0.95) * amc["rep_rmse"], 0))).all()
    np.testing.assert_allclose(amc["variance"], amc["rep_rmse"] ** 2)


def test_report_shows_intervals_and_coverage_summary_only(demo_run, demo_input, dask_client, tmp_path):
    """`evaluate --uncertainty`: report.html gets the interval figure and a per-level coverage summary; the
    figure's table carries no true count (the report shows summaries only)."""
    from topdown.pipeline.evaluation.evaluate import EvalOptions, evaluate
    from topdown.pipeline.evaluation.intervals import interval_table

    unc = tmp_path / "u.parquet"
    uncertainty(demo_run, unc, levels=["Tract", "Block_Group"], client=dask_client)
    out = evaluate([demo_run], demo_input, out=tmp_path / "ev", client=dask_client,
                   options=EvalOptions(uncertainty=unc, sampling_rates=(), queries={"persons": ("total",), "units": ("total",)}))
    html = (out / "report.html").read_text()
    assert 'alt="intervals"' in html and "covers the true TOTAL" in html
    cov = pd.read_parquet(out / "intervals_coverage.parquet").set_index("level")
    assert cov.loc["Block_Group", "geounits"] == 28 and 0.5 <= cov.loc["Block_Group", "gls_covers"] <= 1
    assert "truth" not in interval_table(pd.read_parquet(unc), PERSONS_PRODUCT, ("Tract", "place")).columns
