"""evaluate() on a hand-made run directory of four blocks (pipeline/evaluation/evaluate.py)."""
from __future__ import annotations

import io
import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from conftest import DATA
from topdown.pipeline.evaluation.evaluate import (EvalOptions, EvaluationError, default_out, entities_on_spine,
                                                  evaluate, load_entities, total_headline)
from topdown.pipeline.runtime.progress import Reporter, reporting
from topdown.pipeline.runtime.rundir import RunDirError, write_table
from topdown.pipeline.configuration.census import PERSONS

LEVELS = ["US", "State", "County", "Tract", "Block_Group", "Block"]
B1, B2, B3, B4 = "440010001001000", "440010001001001", "440010001002000", "440030002001000"
WHITE_NH = PERSONS.cell_index(0, 1, 0, 0)  # household, adult, non-hispanic, white alone
BLACK_H = PERSONS.cell_index(0, 1, 1, 1)  # household, adult, hispanic, black alone

# True persons: B1 3 white NH, B2 none, B3 10 white NH + 2 hispanic black, B4 1 white NH.
TRUTH = {B1: {WHITE_NH: 3}, B2: {}, B3: {WHITE_NH: 10, BLACK_H: 2}, B4: {WHITE_NH: 1}}
# Run A: totals 4, 1, 12, 0 (errors +1, +1, 0, -1); B3 6 white NH + 6 hispanic black.
RUN_A = {B1: {WHITE_NH: 4}, B2: {WHITE_NH: 1}, B3: {WHITE_NH: 6, BLACK_H: 6}, B4: {}}
# Run B: totals 3, 0, 12, 2.
RUN_B = {B1: {WHITE_NH: 3}, B2: {}, B3: {WHITE_NH: 10, BLACK_H: 2}, B4: {WHITE_NH: 2}}


def _spine() -> pd.DataFrame:
    g = pd.Series([B1, B2, B3, B4])
    return pd.DataFrame({"geoid": g, "US": "US", "State": g.str[:2], "County": g.str[:5], "Tract": g.str[:11],
                         "Block_Group": g.str[:12], "Block": g})


def _write_truth(root: Path) -> Path:
    rows = []
    for geoid, cells in TRUTH.items():
        for cell, n in cells.items():
            hhgq, va, hisp, race = (int(v) for v in PERSONS.unravel(cell))
            rows += [{"geoid": geoid, "hhgq": hhgq, "votingage": va, "hispanic": hisp, "cenrace": race}] * n
    root.mkdir(parents=True)
    write_table(pd.DataFrame(rows).astype({c: "int8" for c in PERSONS.dim_names}), root / "persons.parquet")
    units = pd.DataFrame({"geoid": [B1, B2, B3, B4], "unit_type": 0, "occupied": True})
    write_table(units, root / "units.parquet")
    return root


def _write_run(root: Path, blocks: dict, seed: int) -> Path:
    spine = _spine()
    root.mkdir(parents=True)
    (root / "manifest.json").write_text(json.dumps({"status": "complete", "levels": LEVELS, "products": ["persons"],
                                                    "seed": seed}))
    write_table(spine, root / "spine.parquet")
    long = pd.DataFrame([{"geoid": g, "cell": c, "count": n} for g, cells in blocks.items() for c, n in cells.items()])
    for level in LEVELS:
        node = long["geoid"].map(spine.set_index("geoid")[level])
        h = long.assign(geocode=node).groupby(["geocode", "cell"], as_index=False)["count"].sum()
        write_table(h[["geocode", "cell", "count"]].astype({"cell": "int32", "count": "int64"}),
                    root / "histograms" / "persons" / f"level={level}" / "part-00000.parquet")
    return root


@pytest.fixture
def setup(tmp_path: Path):
    truth = _write_truth(tmp_path / "input")
    run_a = _write_run(tmp_path / "run_a", RUN_A, 1)
    run_b = _write_run(tmp_path / "run_b", RUN_B, 2)
    entities = tmp_path / "entities.csv"
    pd.DataFrame({"geoid": [B1, B2, B3], "entity_type": "place", "entity": ["P1", "P1", "P2"]}).to_csv(entities, index=False)
    return truth, run_a, run_b, entities


OPTS = EvalOptions(sampling_rates=(0.5, 1.0), figures=False, suppress=False)


def test_evaluate_tables(setup, tmp_path: Path):
    truth, run_a, run_b, entities = setup
    out = evaluate([run_a, run_b], truth, entities, out=tmp_path / "eval", options=OPTS)
    names = {p.name for p in out.iterdir()}
    for table in ("summary", "errors_by_bin", "blau", "homogeneity", "entities", "epl", "sampling", "replicates"):
        assert f"{table}.parquet" in names
    assert "report.html" in names

    summary = pd.read_parquet(out / "summary.parquet").set_index(["run", "level", "query"])
    for col in ("seed", "n", "n_answers", "mean_abs_error", "median_abs_error", "q0.005", "q0.995"):
        assert col in summary.columns
    # P.L. 94-171's queries, as evaluate named them before the census declared its studies
    assert list(dict.fromkeys(summary.reset_index()["query"])) == [
        "total", "votingage", "hispanic", "hhgq", "cenrace", "hispanic * cenrace", "majorRaces * hispanic", "detailed",
        "votingage * hispanic * cenrace"]
    assert set(pd.read_parquet(out / "sampling.parquet")["query"]) == {"total", "votingage * hispanic * cenrace"}
    assert summary.loc[("run_a", "Block", "total"), "mean_abs_error"] == 0.75
    assert summary.loc[("run_a", "Block", "total"), "n"] == 4
    assert summary.loc[("run_a", "County", "total"), "mean_abs_error"] == 1.5  # 44001: 17 vs 15, 44003: 0 vs 1
    # US hispanic: true [14, 2], run A [11, 6] -> L1 = 7
    assert summary.loc[("run_a", "US", "hispanic"), "mean_abs_error"] == 7
    assert summary.loc[("run_b", "Block", "total"), "mean_abs_error"] == 0.25

    bins = pd.read_parquet(out / "errors_by_bin.parquet")
    block = bins[(bins["run"] == "run_a") & (bins["level"] == "Block")].set_index("bin")
    assert block.loc["0", "n"] == 1 and block.loc["0", "mean_signed_error"] == 1
    assert block.loc["1-9", "n"] == 2 and block.loc["1-9", "mean_abs_error"] == 1
    assert block.loc["1-9", "mean_signed_error"] == 0
    assert block.loc["10-99", "n"] == 1 and block.loc["10-99", "mean_abs_error"] == 0
    county = bins[(bins["run"] == "run_a") & (bins["level"] == "County")].set_index("bin")
    assert county.loc["0-1000", "n"] == 2

    # Blau at blocks: B1 0, B3 40/144, B4 0 (B2 has no persons) -> quintiles 2, 5, 4 (ties by position)
    blau = pd.read_parquet(out / "blau.parquet")
    b = blau[(blau["run"] == "run_a") & (blau["level"] == "Block")].set_index("quintile")
    assert list(b["n"]) == [0, 1, 0, 1, 1]
    assert b.loc[2, "mean_signed_error"] == 1 and b.loc[4, "mean_signed_error"] == -1
    assert b.loc[5, "blau_max"] == pytest.approx(40 / 144)

    hom = pd.read_parquet(out / "homogeneity.parquet")
    h = hom[(hom["run"] == "run_a") & (hom["level"] == "Block")].set_index("homogeneity")
    assert h.loc[2015, "n"] == 2 and h.loc[2015, "bias"] == 0 and h.loc[2016, "bias"] == 1

    # Entities: P1 = B1 + B2 (true 3, est 5), P2 = B3 (true 12, est 12; largest share 0.5 vs 10/12)
    ent = pd.read_parquet(out / "entities.parquet")
    e = ent[(ent["run"] == "run_a") & (ent["entity_type"] == "place")].set_index("bin")
    assert e.loc["0-99", "n"] == 2 and e.loc["0-99", "mean_abs_error"] == 1
    assert e.loc["0-99", "share_within_5pp"] == 0.5
    e_b = ent[ent["run"] == "run_b"].set_index("bin")
    assert e_b.loc["all", "share_within_5pp"] == 1.0

    epl = pd.read_parquet(out / "epl.parquet")
    assert {"run", "level", "query", "status", "epl", "epl_lo", "epl_hi", "n_residuals", "epsilon_query",
            "epsilon_total"} <= set(epl.columns)
    assert len(epl) == len(summary)
    # four blocks give a handful of residuals: never a number from them, never inf or NaN for a status
    assert set(epl["status"]) <= {"invariant", "too few residuals"} and epl["status"].notna().all()
    assert epl["epl"].isna().all()

    sampling = pd.read_parquet(out / "sampling.parquet")
    full = sampling[sampling["rate"] == 1.0]
    assert (full["mean_abs_error"] == 0).all() and (full["status"] == "invariant").all()  # a 100% sample is exact
    assert set(sampling["level"]) == set(LEVELS)

    rep = pd.read_parquet(out / "replicates.parquet")
    r = rep[(rep["level"] == "Block") & (rep["query"] == "total")].set_index("geocode")
    assert r.loc[B1, "n_runs"] == 2 and r.loc[B1, "mean_estimate"] == 3.5
    assert r.loc[B4, "std_estimate"] == pytest.approx(np.sqrt(2))
    assert r.loc[B3, "std_estimate"] == 0


def test_evaluate_default_out_and_figures(setup):
    pytest.importorskip("matplotlib")
    truth, run_a, _, _ = setup
    out = evaluate([run_a], truth, options=EvalOptions(sampling_rates=(0.5,)))
    assert out == default_out(run_a) == run_a.with_name(run_a.name + "-evaluation-CONFIDENTIAL")
    assert (out / "mae_by_level.png").exists()
    # four blocks give no estimated EPL: the trade-off figure would be empty axes, so it is left out, saying why
    assert not (out / "epl_tradeoff.png").exists()
    body = (out / "report.html").read_text()
    assert "data:image/png;base64" in body and "trade-off figure is left out" in body
    assert pd.read_parquet(out / "replicates.parquet").empty  # one run: no spread


def test_evaluate_shows_progress_until_it_ends(setup, tmp_path: Path):
    """After the groups' tasks the driver merges every level's tables (errors, empirical privacy loss) and writes
    the tables, figures and report: each phase has a bar, so the command is never silent for long."""
    truth, run_a, run_b, _ = setup
    bars = io.StringIO()
    with reporting(Reporter(file=bars)):
        evaluate([run_a, run_b], truth, out=tmp_path / "eval", options=EvalOptions(sampling_rates=(0.5,)))
    text = bars.getvalue()
    merged = 2 * len(LEVELS) + len(LEVELS)  # two runs' levels and one sampling replicate's
    assert "merge the groups' tables: 100%" in text and f"{merged}/{merged} levels" in text, text
    assert "write the evaluation: 100%" in text and "3/3 steps" in text
    assert all(step in text for step in ("tables]", "figures]", "report]"))


def test_evaluate_is_confidential_and_suppresses_small_statistics(setup, tmp_path: Path):
    """The report says CONFIDENTIAL at the top; statistics over fewer than 3 geounits (US: 1,
    State: 1, County: 2 here) are blank unless suppression is turned off; the others are untouched."""
    truth, run_a, _, _ = setup
    out = evaluate([run_a], truth, out=tmp_path / "sup", options=EvalOptions(sampling_rates=(0.5,), figures=False))
    body = (out / "report.html").read_text()
    assert body.index("CONFIDENTIAL") < body.index("<h2>") and "are suppressed" in body
    summary = pd.read_parquet(out / "summary.parquet").set_index(["run", "level", "query"])
    for level in ("US", "State", "County"):
        row = summary.loc[("run_a", level, "total")]
        assert row["suppressed"] and pd.isna(row["mean_abs_error"]) and pd.isna(row["q0.5"]), level
    assert summary.loc[("run_a", "County", "total"), "n"] == 2  # the row stays, its numbers go
    block = summary.loc[("run_a", "Block", "total")]
    assert not block["suppressed"] and block["mean_abs_error"] == 0.75
    bins = pd.read_parquet(out / "errors_by_bin.parquet")
    small = bins[bins["n"].between(1, 2)]
    assert len(small) and small["mean_abs_error"].isna().all() and small["suppressed"].all()
    epl = pd.read_parquet(out / "epl.parquet")
    assert epl.loc[epl["level"] == "US", "status"].str.startswith("suppressed").all()
    sampling = pd.read_parquet(out / "sampling.parquet")
    assert sampling.loc[sampling["level"] == "US", "mean_abs_error"].isna().all()
    blau = pd.read_parquet(out / "blau.parquet")
    assert blau.loc[blau["n"] == 1, "mean_signed_error"].isna().all()
    # --no-suppress keeps them, and the report says so
    full = evaluate([run_a], truth, out=tmp_path / "full", options=EvalOptions(sampling_rates=(0.5,), figures=False,
                                                                             suppress=False))
    summary = pd.read_parquet(full / "summary.parquet").set_index(["run", "level", "query"])
    assert summary.loc[("run_a", "County", "total"), "mean_abs_error"] == 1.5
    assert "NOT suppressed" in (full / "report.html").read_text()


def test_evaluate_cli_no_suppress(setup, tmp_path: Path, capsys):
    from topdown.pipeline.cli import main

    truth, run_a, _, _ = setup
    assert main(["evaluate", str(run_a), "--truth", str(truth)]) == 0
    out = capsys.readouterr().out
    assert "CONFIDENTIAL" in out
    summary = pd.read_parquet(default_out(run_a) / "summary.parquet")
    assert summary.loc[summary["level"] == "US", "mean_abs_error"].isna().all()
    assert "TOTAL by level" in out and "Block" in out
    assert main(["evaluate", str(run_a), "--truth", str(truth), "--out", str(tmp_path / "ns"), "--no-suppress"]) == 0
    assert "TOTAL by level" in capsys.readouterr().out
    summary = pd.read_parquet(tmp_path / "ns" / "summary.parquet")
    assert summary.loc[summary["level"] == "US", "mean_abs_error"].notna().all()


def test_the_headline_says_when_every_total_is_suppressed():
    summary = pd.DataFrame({"run": "r", "product": "persons", "query": ["total", "total", "detailed"],
                            "level": ["US", "County", "County"], "mean_abs_error": [np.nan, np.nan, 1.5]})
    line = total_headline(summary)
    assert "every level suppressed" in line and "--no-suppress" in line and "Empty DataFrame" not in line
    summary.loc[1, "mean_abs_error"] = 2.0
    assert total_headline(summary).splitlines()[0] == "mean absolute error of persons TOTAL by level:"
    assert "2.000" in total_headline(summary) and "1.500" not in total_headline(summary)


def test_evaluate_dask_client(setup, tmp_path: Path):
    distributed = pytest.importorskip("distributed")
    truth, run_a, run_b, _ = setup
    with distributed.Client(processes=False, n_workers=1, threads_per_worker=2, dashboard_address=None) as client:
        out = evaluate([run_a, run_b], truth, out=tmp_path / "eval", client=client, options=OPTS)
    summary = pd.read_parquet(out / "summary.parquet").set_index(["run", "level", "query"])
    assert summary.loc[("run_a", "Block", "total"), "mean_abs_error"] == 0.75


def test_evaluate_errors(setup, tmp_path: Path):
    truth, run_a, _, _ = setup
    manifest = json.loads((run_a / "manifest.json").read_text())
    (run_a / "manifest.json").write_text(json.dumps({**manifest, "status": "running"}))
    with pytest.raises(RunDirError, match="holds no complete run"):
        evaluate([run_a], truth, options=OPTS)
    (run_a / "manifest.json").write_text(json.dumps(manifest))
    bad = tmp_path / "dup.csv"
    pd.DataFrame({"geoid": [B1, B1], "entity_type": "place", "entity": ["P1", "P2"]}).to_csv(bad, index=False)
    with pytest.raises(EvaluationError, match="two 'place' entities"):
        load_entities(bad)


def test_entities_from_baf_dir(tmp_path: Path):
    baf = tmp_path / "baf"
    baf.mkdir()
    (baf / "BlockAssign_ST44_RI_INCPLACE_CDP.txt").write_text(f"BLOCKID|PLACEFP\n{B1}|12345\n{B2}|\n")
    (baf / "BlockAssign_ST44_RI_MCD.txt").write_text(f"BLOCKID|COUNTYFP|COUSUBFP\n{B1}|001|00100\n{B2}|001|00100\n")
    table = load_entities(baf)
    assert set(map(tuple, table[["geoid", "entity_type", "entity"]].to_numpy())) == {
        (B1, "place", "P4412345"), (B1, "mcd", "M4400100100"), (B2, "mcd", "M4400100100")}


def test_every_kind_of_block_assignment_file_gives_entities():
    table = load_entities(DATA / "ri_baf2020")
    kinds = table.groupby("entity_type")["entity"].nunique().to_dict()
    assert kinds == {"aiannh": 1, "cd": 2, "mcd": 39, "place": 36, "place_mcd": 39, "vtd": 422}
    assert set(table.loc[table["entity_type"] == "cd", "entity"]) == {"D4401", "D4402"}


def test_an_unknown_block_assignment_file_is_an_entity_kind_too(tmp_path: Path):
    baf = tmp_path / "baf"
    baf.mkdir()
    (baf / "BlockAssign_ST44_RI_SLDL.txt").write_text(f"BLOCKID|DISTRICT\n{B1}|007\n{B2}|\n")
    table = load_entities(baf)
    assert list(map(tuple, table.to_numpy())) == [(B1, "sldl", "X44007")]


def test_entities_off_the_spine_are_counted_or_refused(tmp_path: Path, caplog):
    baf = tmp_path / "baf"
    baf.mkdir()
    (baf / "BlockAssign_ST44_RI_CD.txt").write_text(f"BLOCKID|DISTRICT\n{B1}|01\n{B2}|02\n")
    entities = load_entities(baf)
    other = "440010101001999"
    with caplog.at_level("WARNING", logger="topdown"):
        kept = entities_on_spine(entities, pd.Index([B1, other]), baf)
    assert list(kept["geoid"]) == [B1]
    assert "1 of the run's 2 blocks are not in these block assignment files" in caplog.text
    caplog.clear()
    with caplog.at_level("WARNING", logger="topdown"):
        entities_on_spine(entities, pd.Index([B1, B2]), baf)  # a BAF's blocks off the spine: unpopulated, silent
        assert entities_on_spine(entities, pd.Index([B1]), tmp_path / "t.csv")["geoid"].tolist() == [B1]
    assert "1 of its 2 blocks are not blocks of the run" in caplog.text and "assignment" not in caplog.text
    with pytest.raises(EvaluationError, match="none of its 2 blocks is a block of the run"):
        entities_on_spine(entities, pd.Index([other]), baf)


def test_epl_table_shows_both_estimators_beside_theory():
    from topdown.pipeline.evaluation.eval_report import EPL_CAPTION, epl_table

    epl = pd.DataFrame([
        {"run": "r", "product": "persons", "level": "Block", "query": "total", "status": "estimated", "epl": 0.2,
         "epl_lo": 0.1, "epl_hi": 0.3, "epsilon_query": 0.5, "epsilon_total": 17.14},
        {"run": "r", "product": "persons", "level": "State", "query": "total", "status": "invariant", "epl": None,
         "epl_lo": None, "epl_hi": None, "epsilon_query": None, "epsilon_total": 17.14}])
    audit = pd.DataFrame({"product": "persons", "level": ["Block", "Block"], "query": "total",
                          "epl_lower": [0.05, 0.07]})
    table = epl_table(epl, audit)
    assert table.loc[("persons", "Block", "total"), "residual EPL, r"] == "0.200 [0.100, 0.300]"
    assert table.loc[("persons", "Block", "total"), "audit lower bound"] == "0.070"
    assert table.loc[("persons", "Block", "total"), "epsilon (query)"] == "0.500"
    assert table.loc[("persons", "State", "total"), "residual EPL, r"] == "invariant"
    assert table.loc[("persons", "State", "total"), "epsilon (query)"] == "not measured"
    assert "lower confidence bound" in EPL_CAPTION and "theoretical epsilon" in EPL_CAPTION


def test_truth_from_a_partitioned_input_equals_the_single_file_truth(demo_input: Path, tmp_path: Path) -> None:
    """The truth may be a partitioned input (directories persons/ and units/, hive by state or any split,
    a block even spread over two files), as a run's input may: the same block tables as one file each."""
    from topdown.pipeline.evaluation.evaluate import load_truth

    for kind in ("persons", "units"):
        frame = pd.read_parquet(demo_input / f"{kind}.parquet")
        half = len(frame) // 2  # cuts through a block: its records lie in two files
        for i, part in enumerate((frame.iloc[:half], frame.iloc[half:])):
            write_table(part.reset_index(drop=True), tmp_path / kind / f"part={i}" / "part-00000.parquet")
    single, split = load_truth(demo_input), load_truth(tmp_path)
    assert single.blocks.keys() == split.blocks.keys()
    for name in single.blocks:
        pd.testing.assert_frame_equal(single.blocks[name].reset_index(drop=True), split.blocks[name].reset_index(drop=True))
    with pytest.raises(FileNotFoundError, match="persons"):
        load_truth(tmp_path / "nowhere")
