"""`topdown replicates`: replicates side by side from one reading of the replicate input,
the same files as a replicate run alone, resumable after a failure, clean refusals, published data only."""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from cli_subprocess import assert_clean_failure, snapshot, topdown
from topdown.pipeline import load_config, run
from topdown.pipeline.execution import runner
from topdown.pipeline.runtime.outdir import MARKER, new_marker
from topdown.pipeline.runtime.rundir import RunReader
from topdown.pipeline.configuration.census import load_census
from topdown.pipeline.evaluation.replicates import SEED_BASE, detailed_units, padding_code, replicates

EXIT_CONFIG, EXIT_RUNDIR = 2, 4


def _outputs(path: Path) -> dict[str, bytes]:
    """Every file of a run directory but its manifest (wall times) and its lock."""
    return {k: v for k, v in snapshot(path).items() if k not in ("manifest.json", ".lock")}


def test_side_by_side_replicates_are_those_run_alone_and_read_published_data_only(demo_input, dask_client,
                                                                                    tmp_path):
    """Two replicates side by side of a run whose confidential input and noisy measurements are gone: each the
    same files as a run of its seed alone on the replicate input (about 1 minute)."""
    shutil.copytree(demo_input, tmp_path / "input")
    demo_run = run(load_config("demo"), tmp_path / "run", input_dir=tmp_path / "input", client=dask_client)
    shutil.rmtree(tmp_path / "input")
    shutil.rmtree(demo_run / "noisy_measurements")
    record = replicates(demo_run, 2, tmp_path / "reps", client=dask_client, parallel=2)
    assert [(r["dir"], r["seed"]) for r in record["replicates"]] == [("rep-000", SEED_BASE), ("rep-001", SEED_BASE + 1)]
    assert json.loads((tmp_path / "reps" / "replicates.json").read_text()) == record
    assert sorted(p.name for p in (tmp_path / "reps").iterdir()) == [MARKER, "input", "rep-000", "rep-001",
                                                                      "replicates.json"]

    config = RunReader(demo_run).config()
    alone = config.with_overrides(mode="test", seed=SEED_BASE + 1, name=f"{config.run.name}-rep001")
    run(alone, tmp_path / "alone", input_dir=tmp_path / "reps" / "input", client=dask_client)
    got, want = _outputs(tmp_path / "reps" / "rep-001"), _outputs(tmp_path / "alone")
    assert sorted(got) == sorted(want) and any(k.startswith("histograms/") for k in got)
    assert [k for k in got if got[k] != want[k]] == []
    manifests = [json.loads((d / "manifest.json").read_text()) for d in (tmp_path / "reps" / "rep-001", tmp_path / "alone")]
    assert manifests[0]["output_sha256"] == manifests[1]["output_sha256"]
    assert _outputs(tmp_path / "reps" / "rep-000")["histograms/persons/level=Block/part-00000.parquet"] != \
        got["histograms/persons/level=Block/part-00000.parquet"]  # another seed, other noise


def test_a_failed_replicate_is_redone_and_complete_ones_kept(demo_run, dask_client, tmp_path, monkeypatch):
    """Fault injection: the second replicate fails after writing its partial folder; the record keeps the
    first only. Run again: only the second runs (the first's files untouched), and a recorded replicate
    whose folder was damaged since is run again."""
    real, calls = runner.run_prepared, []

    def failing(config, out, prep, client):
        calls.append(config.run.seed)
        real(config, out, prep, client)
        if config.run.seed == SEED_BASE + 1:
            (Path(out) / "manifest.json").unlink()  # as if killed before its end
            raise RuntimeError("injected failure")
        return out

    monkeypatch.setattr(runner, "run_prepared", failing)
    out = tmp_path / "reps"
    with pytest.raises(RuntimeError, match="injected"):
        replicates(demo_run, 2, out, client=dask_client, parallel=1)
    assert calls == [SEED_BASE, SEED_BASE + 1]
    assert [r["dir"] for r in json.loads((out / "replicates.json").read_text())["replicates"]] == ["rep-000"]
    assert (out / ".rep-001.partial").is_dir() and not (out / "rep-001").exists()
    first = snapshot(out / "rep-000")

    monkeypatch.setattr(runner, "run_prepared", lambda *a: (calls.append(a[0].run.seed), real(*a))[1])
    calls.clear()
    record = replicates(demo_run, 2, out, client=dask_client)
    assert calls == [SEED_BASE + 1] and snapshot(out / "rep-000") == first
    assert [r["dir"] for r in record["replicates"]] == ["rep-000", "rep-001"]
    assert not (out / ".rep-001.partial").exists()
    assert RunReader(out / "rep-001").manifest().status == "complete"

    (out / "rep-000" / "manifest.json").unlink()  # damaged since it was recorded
    calls.clear()
    record = replicates(demo_run, 2, out, client=dask_client)
    assert calls == [SEED_BASE] and [r["dir"] for r in record["replicates"]] == ["rep-000", "rep-001"]
    assert _outputs(out / "rep-000") == {k: v for k, v in first.items() if k not in ("manifest.json", ".lock")}
    calls.clear()
    assert replicates(demo_run, 2, out, client=dask_client) == record and calls == []  # all complete: nothing runs


@pytest.mark.parametrize("case", ["n0", "parallel0", "file", "other_run", "damaged_record", "other_seed"])
def test_bad_replicates_arguments_fail_cleanly(demo_run, tmp_path, case):
    """Refused with the documented exit code and one message line, before any replicate runs."""
    out = tmp_path / "reps"
    args, code, fragment = ["--n", "2"], EXIT_RUNDIR, str(out)
    if case == "n0":
        args, code, fragment = ["--n", "0"], EXIT_CONFIG, "--n 0"
    elif case == "parallel0":
        args, code, fragment = ["--n", "2", "--parallel", "0"], EXIT_CONFIG, "--parallel 0"
    elif case == "file":
        out.write_text("mine")
        fragment = "a file is in the way"
    elif case == "other_run":
        out.mkdir()
        (out / "replicates.json").write_text(json.dumps({"run": "/elsewhere", "replicates": []}))
        fragment = "holds replicates of /elsewhere"
    elif case == "damaged_record":
        out.mkdir()
        (out / "replicates.json").write_text("{not json")
        fragment = "not a readable replicates record"
    else:  # rep-000 recorded (and complete) with another seed than --n 2 gives it
        out.mkdir()
        shutil.copytree(demo_run, out / "rep-000")
        (out / "replicates.json").write_text(json.dumps({"run": str(demo_run),
                                                         "replicates": [{"dir": "rep-000", "seed": 7}]}))
        fragment = "a replicate of seed 7, not 1000003"
    if case in ("other_run", "damaged_record", "other_seed"):  # an earlier output of replicates, by its marker
        (out / MARKER).write_text(json.dumps(new_marker("replicates")))
    before = snapshot(out)
    outcome = topdown("replicates", demo_run, "--out", out, "--workers", "1", *args)
    assert_clean_failure(outcome, code, fragment)
    assert snapshot(out) == before


DHC = load_census("dhc2020")
LEAVES = np.array(["440010001001000", "440010001001001", "440010001001002"], dtype=object)
HH_COLUMNS = ["hh_sex", "hh_age", "hh_hispanic", "hh_race", "hh_elderly", "hh_type"]


@settings(max_examples=60, deadline=None)
@given(counts=st.lists(st.integers(0, 4), min_size=24, max_size=24),
       households=st.lists(st.tuples(st.integers(0, 2), st.sampled_from([0, 1, 2]), st.integers(1, 521)), max_size=20),
       units=st.lists(st.tuples(st.integers(0, 2), st.integers(0, 34)), max_size=30))
def test_unit_records_rebuilt_from_two_mdfs_hold_exactly_the_published_units(counts, households, units):
    """dhc2020's unit records from its households and units MDFs (replicates' input): each leaf holds exactly its
    published units of each type; the households MDF's records first (in order, up to the housing units), the
    unit histogram's other records next, then padding of one code per type; occupancy and type from the code."""
    counts = np.array(counts, dtype=np.int64).reshape(3, 8)
    hh = pd.DataFrame({"geoid": LEAVES[[h[0] for h in households]], "tenvacgq": [h[1] for h in households],
                       **{c: np.arange(len(households)) + 1 + i for i, c in enumerate(HH_COLUMNS[:-1])},
                       "hh_type": [h[2] for h in households]})
    un = pd.DataFrame({"geoid": LEAVES[[u[0] for u in units]], "tenvacgq": [u[1] for u in units]})
    products = {p.name: p for p in DHC.products}
    out = detailed_units(DHC, [(products["units"], un), (products["households"], hh)], LEAVES, counts,
                         lambda leaves: {"geoid": leaves.to_numpy()})
    detail = DHC.units.detail
    code = out["tenvacgq"].to_numpy()
    assert (out["unit_type"].to_numpy() == detail.type_of(code)).all()
    assert (out["occupied"].to_numpy() == ~np.isin(code, detail.vacant)).all()
    held = pd.crosstab(out["geoid"], out["unit_type"]).reindex(index=LEAVES, columns=range(8), fill_value=0)
    assert (held.to_numpy() == counts).all()
    for i, leaf in enumerate(LEAVES):
        mine = out[out["geoid"] == leaf]
        kept = hh[hh["geoid"] == leaf].head(counts[i, 0])  # the households MDF's, in order, up to the housing units
        occupied = mine[mine["occupied"] & (mine["unit_type"] == 0)]
        assert occupied[["tenvacgq", *HH_COLUMNS]].to_numpy().tolist() == kept[["tenvacgq", *HH_COLUMNS]].to_numpy().tolist()
        assert (mine.loc[~(mine["occupied"] & (mine["unit_type"] == 0)), HH_COLUMNS] == 0).all().all()
    free = un[~un["tenvacgq"].isin([0, 1, 2, 3])]
    for k in range(8):  # a type's records beyond the unit histogram's are one padding code
        extra = out[(out["unit_type"] == k) & (out["tenvacgq"] > 3)]["tenvacgq"].value_counts().sub(
            free["tenvacgq"][detail.type_of(free["tenvacgq"]) == k].value_counts(), fill_value=0)
        assert (extra[extra > 0].index == padding_code(free["tenvacgq"].to_numpy(), detail.types[k], {0, 1, 2, 3})).all()


def test_the_padding_code_is_the_most_frequent_unselected_code_of_the_type():
    """Ties go to the lowest code; a type without such records gets its lowest unselected code."""
    assert padding_code(np.array([5, 7, 7, 5, 4, 0, 0, 0]), tuple(range(11)), {0, 1, 2, 3}) == 5
    assert padding_code(np.array([0, 0, 12]), tuple(range(11)), {0, 1, 2, 3}) == 4
    assert padding_code(np.array([12, 13, 13]), (11, 12, 13), set()) == 13
