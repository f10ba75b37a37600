"""The Bureau's approximate Monte Carlo (AMC) rule (pipeline/evaluation/amc.py): its equations against
hand-computed cases and summary rows of the Bureau's example, and the streaming statistics of the
uncertainty table against replicate folders whose differences from the run are known."""
from __future__ import annotations

import json
import shutil

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from topdown.pipeline.configuration.census import PERSONS
from topdown.pipeline.evaluation import amc
from topdown.pipeline.evaluation.evaluate import EvaluationError
from topdown.pipeline.evaluation.uncertainty import Source
from topdown.vocab.queries import build_query


def test_t_quantiles_with_five_degrees_of_freedom():
    assert amc.t_value(0.90) == pytest.approx(2.015048, abs=1e-6)
    assert amc.t_value(0.95) == pytest.approx(2.570582, abs=1e-6)


def test_moments_from_sums():
    """Replicates 3, 5, 7 of a published 4: d = -1, 1, 3; bias 1, MSE 11/3, sample sd 2."""
    q = np.array([3.0, 5.0, 7.0])
    d = q - 4
    bias, mse, sd = amc.replicate_moments(3, d.sum(), (d * d).sum())
    assert bias == 1 and mse == pytest.approx(11 / 3) and sd == pytest.approx(np.std(q, ddof=1)) and sd == 2
    with pytest.raises(ValueError, match="at least 2"):
        amc.replicate_moments(1, np.zeros(1), np.zeros(1))


@pytest.mark.parametrize("q0, bias, sd, corrected", [
    (5, -3.0, 1.0, False),    # q0 must exceed 5
    (6, -1.0, 2.0, True),     # |bias|/sd = 0.5 is enough, negative bias
    (6, -0.9, 2.0, False),    # ratio 0.45
    (6, 1.0, 2.0, False),     # positive bias needs q0 >= 25
    (24, 5.0, 1.0, False),
    (25, 1.0, 2.0, True),
    (30, 0.0, 0.0, False),    # 0/0: no correction (all replicates equal the published count)
    (30, 1.0, 0.0, True),     # x/0 = inf passes, as in pandas
])
def test_conditional_bias_correction(q0, bias, sd, corrected):
    got = amc.bias_corrected(np.array([q0], float), np.array([bias]), np.array([sd]))
    assert got.tolist() == [corrected]
    point = amc.point_estimate(np.array([q0], float), np.array([bias]), np.array([sd]))
    assert point.tolist() == [q0 - bias if corrected else q0]


def test_interval_floor_ceil_and_clip():
    lo, hi = amc.amc_interval(np.array([19.8, 2.0, 7.0]), np.array([np.sqrt(20.08), 3.0, 0.0]), 0.90)
    assert lo.tolist() == [10, 0, 7] and hi.tolist() == [29, 9, 7]  # 19.8 -+ 9.03; 2 - 6.05 < 0 -> 0
    lo, hi = amc.amc_interval(np.array([19.8]), np.array([np.sqrt(20.08)]), 0.95)
    assert lo.tolist() == [8] and hi.tolist() == [32]  # 19.8 -+ 11.52


# Summary rows of the Bureau's example (uncertainty jupyter_data.csv of uscensusbureau/AMC_Confidence_Intervals,
# 25 replicates): PPMF0 count, MEAN, MSE, STD and the 90 % interval its notebook's rule gives.
BUREAU_ROWS = [
    (17, 14.20, 20.08, 3.570714, True, (10, 29)),          # H0040003 block group: negative bias, corrected
    (744, 795.76, 3226.56, 23.880396, True, (577, 807)),   # PCT0080003 state: positive bias, q0 >= 25
    (13, 11.72, 32.08, 5.631163, False, (1, 25)),          # PCT0080021 county: |bias|/sd = 0.23
    (1313, 1313.00, 0.00, 0.0, False, (1313, 1313)),      # H0010001: an invariant
]


@pytest.mark.parametrize("q0, mean, mse, std, corrected, ci90", BUREAU_ROWS)
def test_bureau_example_rows(q0, mean, mse, std, corrected, ci90):
    n = 25
    s1, s2 = n * (mean - q0), n * mse
    bias, got_mse, sd = amc.replicate_moments(n, np.array([s1]), np.array([s2]))
    assert sd[0] == pytest.approx(std, abs=1e-5) and got_mse[0] == pytest.approx(mse)
    q = np.array([float(q0)])
    assert amc.bias_corrected(q, bias, sd).tolist() == [corrected]
    lo, hi = amc.amc_interval(amc.point_estimate(q, bias, sd), np.sqrt(got_mse), 0.90)
    assert (lo[0], hi[0]) == ci90


# ------------------------------------------------------------------------------ the streaming statistics
def _fake_replicates(run, root, shifts):
    """Replicate folders holding the run's block histograms (odd ones its spine too; the others share the
    run's), replicate i with ``shifts[i]`` added to the persons count of the first row of the first part."""
    root.mkdir()
    record = {"run": str(run), "replicates": []}
    for i, shift in enumerate(shifts):
        rep = root / f"rep-{i:03d}"
        rep.mkdir()
        if i % 2:  # the others share the run's spine
            shutil.copy(run / "spine.parquet", rep / "spine.parquet")
        shutil.copytree(run / "histograms", rep / "histograms")
        part = sorted((rep / "histograms" / "persons" / "level=Block").glob("*.parquet"))[0]
        t = pd.read_parquet(part)
        t.loc[0, "count"] += shift
        t.to_parquet(part, index=False)
        record["replicates"].append({"dir": rep.name, "seed": i})
    (root / "replicates.json").write_text(json.dumps(record))
    first = pd.read_parquet(sorted((run / "histograms" / "persons" / "level=Block").glob("*.parquet"))[0])
    return str(first.loc[0, "geocode"]), int(first.loc[0, "cell"])


def _gls_part(src, path, level, geocodes):
    """A stand-in GLS part: total and hispanic rows of ``geocodes`` at ``level``."""
    frames = [pd.DataFrame({"product": "persons", "level": level, "geocode": np.repeat(geocodes, k), "query": q,
                            "cell": np.tile(np.arange(k, dtype=np.int32), len(geocodes)), "method": "gls",
                            "published": np.nan, "estimate": 1.0, "variance": 1.0, "ci90_low": 0.0,
                            "ci90_high": 2.0, "ci95_low": 0.0, "ci95_high": 3.0})
              for q, k in (("total", 1), ("hispanic", 2))]
    pd.concat(frames, ignore_index=True).to_parquet(path, index=False)
    return path


def test_published_and_amc_from_replicate_folders(demo_run, tmp_path):
    """Two replicates, one equal to the run and one with +2 persons in one block's cell: that block and its
    ancestors get bias 1, MSE 2, sample sd sqrt(2) (no correction: q0 small or bias positive), everything else
    bias 0 and a zero-width interval at the published count; published = the histograms' sums."""
    src = Source.open(demo_run)
    block, cell = _fake_replicates(demo_run, tmp_path / "reps", [0, 2])
    row = src.spine[src.spine["geoid"] == block].iloc[0]
    tract = row["Tract"]
    parts = [_gls_part(src, tmp_path / "a.parquet", "Tract", np.asarray(src.nodes[src.levels.index("Tract")])),
             _gls_part(src, tmp_path / "b.parquet", "Block", np.asarray([block]))]
    staging = tmp_path / "staging"
    staging.mkdir()
    out, _ = amc.published_and_amc(parts, src, staging, None, tmp_path / "reps")
    t = pd.concat([pq.read_table(p).to_pandas() for p in out], ignore_index=True)
    assert pq.read_schema(out[0]).equals(amc.SCHEMA)
    assert t.groupby("method").size().to_dict() == {"amc": len(t) // 2, "gls": len(t) // 2}
    gls, rep = t[t["method"] == "gls"], t[t["method"] == "amc"]
    assert gls["rep_n"].isna().all() and gls["rep_bias"].isna().all() and (rep["rep_n"] == 2).all()
    hist = pd.read_parquet(demo_run / "histograms" / "persons" / "level=Tract")
    tot = gls[(gls["level"] == "Tract") & (gls["query"] == "total")].set_index("geocode")["published"]
    np.testing.assert_array_equal(tot.to_numpy(), hist.groupby("geocode")["count"].sum().reindex(tot.index))
    assert (gls["published"] == rep["published"].to_numpy()).all()
    tot_moved = rep[rep["geocode"].isin([block, tract]) & (rep["query"] == "total")]
    assert len(tot_moved) == 2 and (tot_moved["rep_bias"] == 1).all()
    assert np.allclose(tot_moved["rep_rmse"], np.sqrt(2)) and np.allclose(tot_moved["variance"], 2)
    t90 = amc.t_value(0.90)
    for _, r in tot_moved.iterrows():
        corrected = r["published"] >= 25  # bias 1 > 0, |bias|/sd = 0.71: corrected only from 25 persons
        point = r["published"] - 1 if corrected else r["published"]
        assert r["estimate"] == point
        assert (r["ci90_low"], r["ci90_high"]) == (np.floor(max(point - t90 * np.sqrt(2), 0)),
                                                   np.ceil(point + t90 * np.sqrt(2)))
    still = rep[~rep["geocode"].isin([block, tract])]
    assert (still["rep_bias"] == 0).all() and (still["rep_rmse"] == 0).all()
    assert (still["ci90_low"] == still["published"]).all() and (still["ci95_high"] == still["published"]).all()
    his = rep[rep["geocode"].isin([block, tract]) & (rep["query"] == "hispanic")]
    answer = build_query(PERSONS, "hispanic").matrix().tocsc()[:, cell].nonzero()[0][0]
    assert (his["rep_bias"] == (his["cell"] == answer)).all()  # the shifted cell's answer only


def test_parts_rewritten_in_slices_are_the_parts_rewritten_whole(demo_run, tmp_path, monkeypatch):
    """A part is rewritten REWRITE_ROWS rows at a time (memory): slices of 7 rows give the same rows, in the
    same order, as one slice (the GLS rows, then the amc rows key by key)."""
    src = Source.open(demo_run)
    _fake_replicates(demo_run, tmp_path / "reps", [0, 2, 5])
    part = _gls_part(src, tmp_path / "a.parquet", "Tract", np.asarray(src.nodes[src.levels.index("Tract")]))
    tables = []
    for rows in (10 ** 9, 7):
        monkeypatch.setattr(amc, "REWRITE_ROWS", rows)
        staging = tmp_path / f"staging-{rows}"
        staging.mkdir()
        (out,), _ = amc.published_and_amc([part], src, staging, None, tmp_path / "reps")
        tables.append(pq.read_table(out).to_pandas())
    assert len(tables[0]) == 2 * len(pd.read_parquet(part)) > 2 * 7
    pd.testing.assert_frame_equal(tables[0], tables[1], check_exact=True)


def test_a_parts_tabulation_reads_only_the_histogram_parts_of_its_nodes(demo_run):
    """Restricted to the blocks of one histogram part (an output part of the block level), a Tabulator reads
    that part only and its arrays are the unrestricted ones' rows of those nodes; the upper levels' nodes
    need every part."""
    src = Source.open(demo_run)
    parts = sorted((demo_run / "histograms" / "persons" / "level=Block").glob("*.parquet"))
    assert len(parts) == 2
    blocks = np.sort(pd.read_parquet(parts[1])["geocode"].astype(str).unique())
    keys = [("persons", "Block", "total"), ("persons", "Block", "hispanic")]
    whole = amc.Tabulator(src, None, keys)
    some = amc.Tabulator(src, None, keys, {"Block": blocks})
    assert whole._needed(parts, whole.block_rows(demo_run)) == parts
    assert some._needed(parts, some.block_rows(demo_run)) == [parts[1]]
    a, b = whole.tabulate(demo_run, "persons"), some.tabulate(demo_run, "persons")
    rows = whole.aggs["Block"][0].get_indexer(blocks)
    assert list(some.aggs["Block"][0]) == list(blocks) and a[keys[0]][rows].sum() > 0
    for k in keys:
        np.testing.assert_array_equal(b[k], a[k][rows])
    tract = amc.Tabulator(src, None, [("persons", "Tract", "total")],
                          {"Tract": np.asarray(src.nodes[src.levels.index("Tract")])})
    assert tract._needed(parts, tract.block_rows(demo_run)) == parts


def test_rewrite_tasks_on_the_cluster_are_the_rewrite_here(demo_run, dask_client, tmp_path):
    """The parts rewritten as Dask tasks (one per part, each tabulating its own nodes) are those rewritten in
    this process, the amc rows included."""
    src = Source.open(demo_run)
    _fake_replicates(demo_run, tmp_path / "reps", [0, 2, 5])
    blocks = np.asarray(src.nodes[-1])
    parts = [_gls_part(src, tmp_path / "a.parquet", "Tract", np.asarray(src.nodes[src.levels.index("Tract")])),
             _gls_part(src, tmp_path / "b.parquet", "Block", blocks[: len(blocks) // 3]),
             _gls_part(src, tmp_path / "c.parquet", "Block", blocks[len(blocks) // 3:])]
    tables = []
    for client in (None, dask_client):
        staging = tmp_path / f"staging-{client is None}"
        staging.mkdir()
        out, cpu = amc.published_and_amc(parts, src, staging, None, tmp_path / "reps", client)
        assert cpu > 0
        tables.append(pd.concat([pq.read_table(p).to_pandas() for p in out], ignore_index=True))
    assert len(tables[0]) == 2 * sum(len(pd.read_parquet(p)) for p in parts)
    assert tables[0]["published"].notna().all() and (tables[0]["rep_bias"] != 0).any()
    pd.testing.assert_frame_equal(tables[0], tables[1], check_exact=True)


def test_replicates_folder_needs_two(demo_run, tmp_path):
    src = Source.open(demo_run)
    _fake_replicates(demo_run, tmp_path / "reps", [0])
    part = _gls_part(src, tmp_path / "a.parquet", "Tract", np.asarray(src.nodes[src.levels.index("Tract")]))
    with pytest.raises(EvaluationError, match="1 replicate"):
        amc.published_and_amc([part], src, tmp_path, None, tmp_path / "reps")
    with pytest.raises(EvaluationError, match="not a `topdown replicates` folder"):
        amc.published_and_amc([part], src, tmp_path, None, tmp_path / "nothing")


# ---------------------------------------------------------------------------------- the coverage harness
def _harness():
    import importlib.util

    from conftest import REPO as ROOT

    spec = importlib.util.spec_from_file_location("coverage_bench", ROOT / "benchmarks" / "coverage.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_coverage_table_arithmetic():
    """10 block rows, 9 of them covered at 90 % and all at 95 %; the band is the binomial 99 % one."""
    from scipy import stats

    cov = _harness()
    rows = pd.DataFrame({"method": "amc", "level": "Block", "bin": "1-9", "query": "total",
                         "truth": np.arange(10.0), "ci90_low": np.arange(10.0), "ci90_high": np.arange(10.0) + 2,
                         "ci95_low": 0.0, "ci95_high": 20.0, "published": np.arange(10.0) + 1,
                         "estimate": np.arange(10.0)})
    rows.loc[3, "ci90_low"] = 4  # 3 not in [4, 5]
    (rec,) = cov.coverage_table(rows, ["method", "level", "bin"]).to_dict("records")
    lo, hi = stats.binom.ppf([0.005, 0.995], 10, 0.9) / 10
    assert rec["n"] == 10 and rec["cov90"] == 0.9 and rec["cov95"] == 1.0 and rec["ok90"]
    assert rec["band90"] == f"{lo:.3f}-{hi:.3f}" and cov.band(10, 0.9) == (lo, hi)
    gls = rows.assign(method="gls", ci90_high=rows["ci90_high"] + 2)
    (w,) = cov.width_table(pd.concat([gls, rows], ignore_index=True)).to_dict("records")
    assert w["geounits"] == 10 and w["gls_w90"] == 3.9 and w["amc_w90"] == 1.9 and w["amc_w95"] == 20
    assert w["published_mae"] == 1 and w["gls_estimate_mae"] == 0
    assert "| amc | Block | 1-9 | 10 | 0.900 |" in cov.markdown(cov.coverage_table(rows, ["method", "level", "bin"]))


def test_central_rows_are_the_bureaus_form_from_the_same_estimates():
    """``--central``: each gls row again as ``gls_central``, ``[max(ceil(est - z sd), 0), max(floor(est + z sd),
    0)]`` (an estimate far below 0 gets [0, 0], where the gls row's interval of a count >= 0 does not)."""
    cov = _harness()
    rows = pd.DataFrame({"method": ["gls", "gls", "amc"], "estimate": [10.0, -5.0, 3.0], "variance": [4.0, 1.0, 1.0],
                         "ci90_low": [7.0, 0.0, 1.0], "ci90_high": [13.0, 1.0, 5.0], "ci95_low": 0.0, "ci95_high": 20.0})
    out = cov.with_central(rows)
    central = out[out["method"] == "gls_central"].reset_index(drop=True)
    assert len(out) == 5 and len(central) == 2
    assert central["ci90_low"].tolist() == [7.0, 0.0] and central["ci90_high"].tolist() == [13.0, 0.0]
    assert central["ci95_low"].tolist() == [7.0, 0.0] and central["ci95_high"].tolist() == [13.0, 0.0]


def test_coverage_harness_on_a_tiny_run_with_three_replicates(demo_run, demo_input, dask_client, tmp_path):
    """The harness end to end: the demo run's uncertainty with 3 (copied) replicates and the BAF's entities;
    every level and entity kind gets a coverage row per method, and the published MAE is the histograms'."""
    import subprocess
    import sys

    from conftest import DATA, REPO as ROOT
    from topdown.pipeline.evaluation.uncertainty import uncertainty

    _fake_replicates(demo_run, tmp_path / "reps", [0, 1, -1])
    unc = tmp_path / "u.parquet"
    uncertainty(demo_run, unc, levels=["Tract", "Block_Group"], client=dask_client, replicates=tmp_path / "reps",
                entities=DATA / "ri_baf2020", queries={"persons": ("total", "hispanic"), "units": ("total",)})
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "coverage.py"), str(demo_run), "--truth",
                          str(demo_input), "--uncertainty", str(unc), "--entities", str(DATA / "ri_baf2020"),
                          "--json", str(tmp_path / "c.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    assert "### Coverage of the true total" in out.stdout and "| amc | Tract |" in out.stdout
    tables = json.loads((tmp_path / "c.json").read_text())
    total = pd.DataFrame(tables["coverage_total"])
    assert set(total["method"]) == {"gls", "amc"} and {"Tract", "Block_Group", "place"} <= set(total["level"])
    assert total.groupby("method")["n"].sum().nunique() == 1  # every gls row has its amc row
    widths = pd.DataFrame(tables["widths"]).set_index("level")
    assert (widths["published_mae"] >= 0).all() and (widths["amc_w90"] >= 0).all()
    assert set(pd.DataFrame(tables["coverage_cells"])["query"]) == {"hispanic"}
    # --draws pools another draw (here the same file again: every count twice), --central adds gls_central
    out = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "coverage.py"), str(demo_run), "--truth",
                          str(demo_input), "--uncertainty", str(unc), "--draws", f"{demo_run}:{unc}", "--central",
                          "--json", str(tmp_path / "c2.json")], capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr[-2000:]
    pooled = pd.DataFrame(json.loads((tmp_path / "c2.json").read_text())["coverage_total"])
    assert set(pooled["method"]) == {"gls", "gls_central", "amc"}
    one = total[total["level"].isin(["Tract", "Block_Group"])].groupby(["method", "level", "bin"])[["n", "cov90"]]
    two = pooled[pooled["method"] != "gls_central"].groupby(["method", "level", "bin"])[["n", "cov90"]]
    assert (two.sum()["n"] == 2 * one.sum()["n"]).all() and np.allclose(two.sum()["cov90"], one.sum()["cov90"])


def test_cli_refuses_a_bad_replicates_folder_before_any_work(demo_run, tmp_path):
    """`uncertainty --replicates` of a folder without replicates.json, or with one replicate: exit 3, one line,
    nothing written."""
    from cli_subprocess import assert_clean_failure, topdown

    out = tmp_path / "u.parquet"
    outcome = topdown("uncertainty", demo_run, "--out", out, "--replicates", tmp_path / "none", "--workers", "1")
    assert_clean_failure(outcome, 3, "replicates.json", "not a `topdown replicates` folder")
    _fake_replicates(demo_run, tmp_path / "one", [0])
    outcome = topdown("uncertainty", demo_run, "--out", out, "--replicates", tmp_path / "one", "--workers", "1")
    assert_clean_failure(outcome, 3, "1 replicate(s); at least 2 are needed")
    assert not out.exists() and not list(tmp_path.glob(".u.parquet*"))


def test_a_product_without_gls_gets_the_same_amc_rows(demo_run, dask_client, tmp_path, monkeypatch, caplog):
    """A product whose GLS is not computed (its covariance blocks too large) still gets with --replicates the
    amc rows of every cell of its queries at every node and entity: the same rows as alongside its gls rows."""
    from conftest import DATA
    from topdown.pipeline.evaluation import gls
    from topdown.pipeline.evaluation.uncertainty import uncertainty

    _fake_replicates(demo_run, tmp_path / "reps", [0, 2, -1])
    args = dict(levels=["Tract", "Block_Group", "Block"], client=dask_client, replicates=tmp_path / "reps",
                entities=DATA / "ri_baf2020", queries={"persons": ("total", "hispanic"), "units": ("total",)})
    uncertainty(demo_run, tmp_path / "both.parquet", **args)
    monkeypatch.setattr(gls, "MAX_MATRIX_BYTES", 0)  # no product's GLS fits
    uncertainty(demo_run, tmp_path / "amc.parquet", **args)
    assert sum("its gls rows are left out, its amc rows are written" in r.getMessage() for r in caplog.records) == 2
    key = ["product", "level", "geocode", "query", "cell"]
    both = pq.read_table(tmp_path / "both.parquet").to_pandas()
    only = pq.read_table(tmp_path / "amc.parquet").to_pandas()
    assert set(only["method"]) == {"amc"} and {"place", "Block", "Tract"} <= set(only["level"])
    expected = both[both["method"] == "amc"].sort_values(key, ignore_index=True)
    pd.testing.assert_frame_equal(only.sort_values(key, ignore_index=True), expected, check_exact=True,
                                  check_dtype=False)  # rep_n: int32 here, float beside gls rows (their nulls)
    assert (expected["rep_bias"] != 0).any()
