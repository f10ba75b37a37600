"""End to end on the demo data: zero-noise reproduction, a production-preset run, verify, determinism."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from topdown.pipeline import load_config, run
from topdown.pipeline.cli import main
from topdown.pipeline.configuration.census import PL94
from topdown.pipeline.inputs.tabulate import tabulate
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
    truth = {p.name: tabulate(p, {"persons": persons, "units": units}) for p in PL94.products}
    for product, block_hist in truth.items():
        for level in manifest["levels"]:
            got = _read(zero_noise_run / "histograms" / product / f"level={level}")
            got = got[got["count"] > 0].sort_values(["geocode", "cell"]).reset_index(drop=True)
            want = _rollup(block_hist, spine, level)
            assert got["geocode"].astype(str).tolist() == want["geocode"].astype(str).tolist(), (product, level)
            assert np.array_equal(got["cell"].to_numpy(), want["cell"].to_numpy()), (product, level)
            assert np.array_equal(got["count"].to_numpy(), want["count"].to_numpy()), (product, level)


@pytest.mark.smoke  # the default selection's run, verified
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


def _copy(run_dir: Path, tmp_path: Path) -> Path:
    import shutil

    copy = tmp_path / "copy"
    shutil.copytree(run_dir, copy)
    return copy


def _flip_byte(path: Path) -> None:
    data = bytearray(path.read_bytes())
    data[len(data) // 2] ^= 0x01
    path.write_bytes(bytes(data))


def _verify_cli(run_dir: Path, capsys) -> tuple[int, str]:
    capsys.readouterr()
    code = main(["verify", str(run_dir)])
    return code, capsys.readouterr().out


def test_verify_passes_an_untouched_copy_and_checks_every_file(tmp_path, demo_run, capsys):
    """A copied run directory verifies, every one of its files (but the manifest) checked by its SHA-256."""
    copy = _copy(demo_run, tmp_path)
    code, out = _verify_cli(copy, capsys)
    assert code == 0, out
    outputs = [f for f in copy.rglob("*") if f.is_file() and f.name != "manifest.json"]
    assert f"SHA-256: {len(outputs)} files checked against the manifest" in out
    assert "not checked" not in out


@pytest.mark.parametrize("target, kind", [
    ("histograms/persons/level=Block/part-00001.parquet", "persons Block histograms"),
    ("mdf/persons/*/part-00000.parquet", "persons MDF"),
    ("noisy_measurements/units/level=County/part-00000.parquet", "units County noisy measurements"),
    ("invariants/units.parquet", "units invariants"),
    ("certificate.json", "privacy certificate"),
])
@pytest.mark.parametrize("damage", ["flip", "delete"])
def test_verify_names_a_changed_or_missing_file(tmp_path, demo_run, capsys, target, kind, damage):
    copy = _copy(demo_run, tmp_path)
    (path,) = copy.glob(target)
    _flip_byte(path) if damage == "flip" else path.unlink()
    code, out = _verify_cli(copy, capsys)
    assert code == 1
    problem = "SHA-256 differs from the manifest" if damage == "flip" else "missing"
    assert f"  - {path.relative_to(copy)} ({kind}): {problem}" in out.splitlines()


def test_verify_detects_swapped_and_added_files(tmp_path, demo_run, capsys):
    """Two histogram parts swapped hold the same rows: every other check passes, their SHA-256 sums fail."""
    copy = _copy(demo_run, tmp_path)
    level = copy / "histograms" / "persons" / "level=Block"
    a, b = level / "part-00000.parquet", level / "part-00001.parquet"
    a.rename(level / "swap")
    b.rename(a)
    (level / "swap").rename(b)
    code, out = _verify_cli(copy, capsys)
    assert code == 1
    assert [line for line in out.splitlines() if line.startswith("  - ")] == [
        f"  - {f.relative_to(copy)} (persons Block histograms): SHA-256 differs from the manifest" for f in (a, b)]
    extra = level / "part-00002.parquet"
    extra.write_bytes(a.read_bytes())
    code, out = _verify_cli(copy, capsys)
    assert code == 1
    assert f"  - {extra.relative_to(copy)} (persons Block histograms): not recorded in the manifest (added since " \
           "the run)" in out.splitlines()


def test_verify_of_a_run_without_recorded_sums_notes_what_it_did_not_check(tmp_path, demo_run, capsys):
    """A run of an older version recorded no SHA-256 of its run-wide outputs: it still verifies, and a note names
    what no sum covers. A completed level whose sums were removed from the manifest fails."""
    copy = _copy(demo_run, tmp_path)
    manifest = json.loads((copy / "manifest.json").read_text())
    del manifest["output_sha256"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, out = _verify_cli(copy, capsys)
    assert code == 0, out
    (note,) = [line for line in out.splitlines() if "not checked" in line]
    for group in ("config.json", "certificate.json", "spine.parquet", "invariants/persons.parquet", "mdf/persons",
                  "mdf/units"):
        assert group in note
    assert "histograms/persons" not in note
    del manifest["sha256"]["units"]
    (copy / "manifest.json").write_text(json.dumps(manifest))
    code, out = _verify_cli(copy, capsys)
    assert code == 1
    assert "  - units Block: a completed level whose SHA-256 sums the manifest does not record (removed from it)" \
        in out.splitlines()


def test_block_by_block_run_records_the_sums_of_its_rolled_up_levels(tmp_path, demo_input, dask_client, capsys):
    """The levels above the blocks, summed up in the driver, are recorded too: verify checks every file."""
    from topdown.pipeline.configuration.config import config_from_dict

    data = load_config("demo").model_dump(mode="json")
    data["run"].update(algorithm="block_by_block", products=["units"])
    out = run(config_from_dict(data, source="demo, block by block, units"), tmp_path / "bbb", input_dir=demo_input,
              client=dask_client)
    manifest = json.loads((out / "manifest.json").read_text())
    assert set(manifest["sha256"]["units"]) == set(manifest["levels"])
    code, text = _verify_cli(out, capsys)
    assert code == 0, text
    assert "not checked" not in text


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
