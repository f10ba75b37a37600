"""A run directory stands alone: its config.json carries the census declaration itself, not the path the
configuration named it by, so every command that reads a run works on a copy moved elsewhere, from any working
directory. The run here is of a census the project does not ship (the Chile example under another name, read
from a file beside the configuration by a relative path), with its total invariant down to the leaf level.

An older run directory, whose config.json names its census by a relative path, is read where it was read
before (from the folder the path is relative to) and refused elsewhere with one line saying why.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pytest
from cli_subprocess import assert_clean_failure, topdown

from topdown.pipeline.configuration.census import census_dir, load_census
from topdown.pipeline.configuration.config import _digest, load_config
from topdown.pipeline.runtime.rundir import RunDirError, RunReader, sha256_file

LEAF_TOTAL = """include = "chile_2017.toml"
[run]
name = "mine"
census = "mine.toml"
mode = "test"
seed = 5
input = "{input}"
[persons.invariants]
District = ["tot"]
[persons.constraints]
Nation = ["total"]
Region = ["total"]
Province = ["total"]
Commune = ["total"]
District = ["total", "under15_no_marital_status", "over15_marital_status"]
"""


@pytest.fixture(scope="module")
def moved(tmp_path_factory, dask_client) -> tuple[Path, Path]:
    """(the run directory, moved away from where it was made and from its configuration, its input)."""
    from topdown.pipeline import run
    from topdown.pipeline.inputs.synth import write_census

    root = tmp_path_factory.mktemp("standalone")
    write_census(root / "input", load_census("chile_2017"), 20_000, seed=1)
    (root / "cfg").mkdir()
    (root / "cfg" / "mine.toml").write_text((census_dir() / "chile_2017.toml").read_text()
                                            .replace('name = "chile_2017"', 'name = "mine"'))
    (root / "cfg" / "run.toml").write_text(LEAF_TOTAL.format(input=root / "input"))
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)
        run(load_config("cfg/run.toml"), root / "made-here", client=dask_client)  # the workers write it
    shutil.rmtree(root / "cfg")  # nothing of the configuration is left to read
    away = tmp_path_factory.mktemp("elsewhere") / "moved-run"
    shutil.move(root / "made-here", away)
    return away, root / "input"


def test_config_json_carries_the_census(moved):
    run, _ = moved
    config = json.loads((run / "config.json").read_text())
    assert "census" not in config["run"] and config["census"]["name"] == "mine"
    assert config["census"]["hierarchy"]["levels"][-1] == {"name": "District", "column": "distrito"}
    assert RunReader(run).census().name == "mine"


def test_a_leaf_total_is_invariant_and_holds(moved):
    """The total declared invariant at the leaf level is published there and binds the estimates."""
    run, _ = moved
    inv = pd.read_parquet(run / "invariants" / "persons.parquet")
    leaf = inv[inv["level"] == "District"].set_index("geocode")["tot"]
    assert len(leaf) > 1 and leaf.notna().all()
    hist = pd.read_parquet(run / "histograms" / "persons" / "level=District")
    assert hist.groupby("geocode")["count"].sum().reindex(leaf.index).tolist() == leaf.astype(int).tolist()


def test_every_reader_works_on_the_moved_run_from_elsewhere(moved, tmp_path, monkeypatch, dask_client):
    from topdown.pipeline.evaluation.evaluate import evaluate
    from topdown.pipeline.evaluation.replicates import replicates
    from topdown.pipeline.evaluation.uncertainty import uncertainty
    from topdown.pipeline.execution.nmf import write_nmf
    from topdown.pipeline.execution.reprocess import reprocess
    from topdown.pipeline.outputs.verify import verify_run

    run, truth = moved
    monkeypatch.chdir(tmp_path)
    report = verify_run(run)
    assert report.ok, report.failures
    write_nmf(run, tmp_path / "nmf")
    uncertainty(run, tmp_path / "unc.parquet", client=dask_client)
    unc = pd.read_parquet(tmp_path / "unc.parquet")
    assert set(unc["level"]) == {"Nation", "Region", "Province", "Commune", "District"}
    assert (unc["ci90_low"] <= unc["ci90_high"]).all() and (unc["ci95_low"] <= unc["ci95_high"]).all()
    exact = unc[unc["variance"] == 0]  # the invariant totals, down to the leaves
    assert len(exact) and (exact["ci90_low"] == exact["estimate"]).all() and (exact["ci90_high"] == exact["estimate"]).all()
    evaluate([run], truth, out=tmp_path / "evaluation", client=dask_client)
    assert (tmp_path / "evaluation" / "summary.parquet").is_file()
    again = reprocess(run, tmp_path / "again", client=dask_client)
    assert verify_run(again).ok
    record = replicates(run, 1, tmp_path / "reps", client=dask_client)
    assert len(record["replicates"]) == 1


def test_verify_and_nmf_on_the_moved_run_from_elsewhere(moved, tmp_path):
    """As a user runs them: no cluster needed, other working directory."""
    run, _ = moved
    assert topdown("verify", run, cwd=tmp_path).code == 0
    assert topdown("nmf", run, "--out", "nmf", cwd=tmp_path).code == 0


@pytest.mark.slow
@pytest.mark.parametrize("argv", [["uncertainty", "{run}", "--out", "u.parquet"], ["evaluate", "{run}", "--truth",
                                  "{truth}", "--out", "ev"], ["reprocess", "{run}", "--out", "again"],
                                  ["replicates", "{run}", "--n", "1", "--out", "reps"]])
def test_the_cluster_commands_on_the_moved_run_from_elsewhere(moved, tmp_path, argv):
    run, truth = moved
    outcome = topdown(*[a.format(run=run, truth=truth) for a in argv], "--workers", "1", "--quiet", cwd=tmp_path)
    assert outcome.code == 0, str(outcome)


# ---------------------------------------------------------------------------------- a run of an older version
@pytest.fixture
def older(moved, tmp_path) -> Path:
    """A copy of the run as an older version wrote it: config.json names the census by its relative path (the
    manifest's config hash, and the recorded SHA-256 of config.json, those of that form)."""
    run = tmp_path / "older-run"
    shutil.copytree(moved[0], run)
    config = json.loads((run / "config.json").read_text())
    config.pop("census")
    config["run"]["census"] = "mine.toml"
    (run / "config.json").write_text(json.dumps(config, indent=2) + "\n")
    manifest = json.loads((run / "manifest.json").read_text())
    manifest["config_hash"] = _digest(config)
    manifest["output_sha256"]["config.json"] = sha256_file(run / "config.json")
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    return run


def test_an_older_run_is_read_where_it_was_read_before(older, tmp_path, monkeypatch):
    from topdown.pipeline.outputs.verify import verify_run

    there = tmp_path / "where-it-ran"
    there.mkdir()
    (there / "mine.toml").write_text((census_dir() / "chile_2017.toml").read_text()
                                     .replace('name = "chile_2017"', 'name = "mine"'))
    monkeypatch.chdir(there)
    assert RunReader(older).census().name == "mine"
    assert verify_run(older).ok


def test_an_older_run_elsewhere_is_refused_with_one_line(older, tmp_path):
    with pytest.raises(RunDirError, match="older version names its census by the path 'mine.toml'"):
        RunReader(older).census()  # never read as the U.S. census
    for argv in (["verify", older], ["nmf", older, "--out", "nmf"]):
        assert_clean_failure(topdown(*argv, cwd=tmp_path), 4, "config.json", "mine.toml", "older version")
    assert not (tmp_path / "nmf").exists()
