"""End to end on the demo data: zero-noise reproduction, a production-preset run, verify, determinism."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from topdown.pipeline import load_config, run
from topdown.pipeline.cli import main
from topdown.pipeline.inputs.tabulate import block_histograms, units_histograms
from topdown.pipeline.outputs.verify import verify_run


def _read(path: Path) -> pd.DataFrame:
    return pd.read_parquet(path)


def _rollup(block_hist: pd.DataFrame, spine: pd.DataFrame, level: str) -> pd.DataFrame:
    m = block_hist.merge(spine[["geoid", level]], left_on="geocode", right_on="geoid")
    out = m.groupby([level, "cell"])["count"].sum().reset_index().rename(columns={level: "geocode"})
    return out[out["count"] > 0].sort_values(["geocode", "cell"]).reset_index(drop=True)


def test_zero_noise_reproduces_every_level(zero_noise_run, demo_input):
    manifest = json.loads((zero_noise_run / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    spine = _read(zero_noise_run / "spine.parquet")
    assert list(spine.columns) == ["geoid", *manifest["levels"]]
    persons = _read(demo_input / "persons.parquet")
    units = _read(demo_input / "units.parquet")
    truth = {"persons": block_histograms(persons), "units": units_histograms(units)}
    for product, block_hist in truth.items():
        for level in manifest["levels"]:
            got = _read(zero_noise_run / "histograms" / product / f"level={level}")
            got = got[got["count"] > 0].sort_values(["geocode", "cell"]).reset_index(drop=True)
            want = _rollup(block_hist, spine, level)
            assert got["geocode"].astype(str).tolist() == want["geocode"].astype(str).tolist(), (product, level)
            assert np.array_equal(got["cell"].to_numpy(), want["cell"].to_numpy()), (product, level)
            assert np.array_equal(got["count"].to_numpy(), want["count"].to_numpy()), (product, level)


def test_demo_run_verifies(demo_run, demo_input):
    report = verify_run(demo_run)
    assert report.ok, report.failures
    manifest = json.loads((demo_run / "manifest.json").read_text())
    assert manifest["levels"] == ["US", "State", "County", "Tract", "Block_Group", "Block"]
    solved = manifest["parents_solved"]["persons"]
    assert solved["Block"]["parents"] == 28 and solved["Block_Group"]["parents"] == 7
    mdf = _read(demo_run / "mdf" / "persons")
    persons = _read(demo_input / "persons.parquet")
    assert len(mdf) == len(persons)  # the state total is invariant
    cert = json.loads((demo_run / "certificate.json").read_text())
    assert cert["persons"]["rho"] == "293764/114921"
    nm = _read(demo_run / "noisy_measurements" / "persons" / "level=Block")
    assert set(nm.columns) >= {"geocode", "query", "answer", "value", "variance"}
    assert nm["geocode"].nunique() == spine_blocks(demo_run)


def spine_blocks(run_dir: Path) -> int:
    return _read(run_dir / "spine.parquet")["Block"].nunique()


def test_noise_changes_the_answer(demo_run, zero_noise_run):
    a = _read(demo_run / "histograms" / "persons" / "level=Block")
    b = _read(zero_noise_run / "histograms" / "persons" / "level=Block")
    assert not a.sort_values(["geocode", "cell"]).reset_index(drop=True).equals(
        b.sort_values(["geocode", "cell"]).reset_index(drop=True))


def test_verify_detects_tampering(tmp_path, zero_noise_run):
    import shutil

    copy = tmp_path / "tampered"
    shutil.copytree(zero_noise_run, copy)
    part = sorted((copy / "histograms" / "persons" / "level=Block").glob("*.parquet"))[0]
    df = _read(part)
    df.loc[0, "count"] += 1
    df.to_parquet(part, index=False)
    report = verify_run(copy)
    assert not report.ok
    assert any("sum" in f for f in report.failures)
    assert main(["verify", str(copy)]) == 1


def test_complete_run_is_not_recomputed_without_force(zero_noise_run, demo_input, dask_client):
    from topdown.pipeline.execution.runner import AlreadyComplete

    with pytest.raises(AlreadyComplete, match="--force"):
        run(load_config("zero_noise"), zero_noise_run, input_dir=demo_input, client=dask_client)


def test_two_stage_solves_through_the_pipeline_verify(tmp_path, demo_input, dask_client):
    """With split_above = 2 (units) every Block_Group -> Block parent (four blocks) is solved in two
    stages, and with split_cost = 1 (persons) every parent of two or more children, each level's single
    parent included, its groups run as tasks of the cluster; the run is complete and passes verify
    (exact sums, invariants, constraints at every level)."""
    from distributed import get_task_stream

    from topdown.pipeline.configuration.config import config_from_dict

    data = load_config("demo").model_dump(mode="json")
    data["units"]["estimation"].update(split_above=2, split_group=2)
    data["persons"]["estimation"].update(split_above=0, split_cost=1, split_group=2)
    cfg = config_from_dict(data, source="demo with two-stage solves")
    out = tmp_path / "split"
    with get_task_stream(dask_client) as stream:
        run(cfg, out, input_dir=demo_input, client=dask_client)
    assert any(str(t["key"]).startswith("solve_parent") for t in stream.data)  # groups spread as tasks
    report = verify_run(out)
    assert report.ok, report.failures
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete"
