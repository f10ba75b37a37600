"""Nothing silent: a changed source, a user's folder as --out, a half-written ingest and
GEOIDs of no state are refused with one line and the documented exit code, before anything is written.

The CLI cases run ``topdown`` in a subprocess (tests/cli_subprocess.py), as a user or a scheduler does.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from cli_subprocess import assert_clean_failure, snapshot, topdown
from test_bad_inputs import PL_GEO, _block_row, _ingest_pl94

from topdown.pipeline.runtime.outdir import MARKER
from topdown.pipeline.runtime.rundir import RunDirError, RunReader
from topdown.pipeline.inputs.ingest import IngestError, ingest_blocks
from topdown.pipeline.privacy.measure import MEASUREMENT_PARQUET

EXIT_CONFIG, EXIT_INPUT, EXIT_RUNDIR = 2, 3, 4


def block_csv(path: Path, geoids: tuple[str, ...] = ("440070001001001", "440070001001002"), persons: int = 5) -> Path:
    """A valid block table (all persons White adults) of ``geoids``."""
    pd.DataFrame([_block_row(g, persons) for g in geoids]).to_csv(path, index=False)
    return path


# ----------------------------------------------------------------------- a measurement edited after the run
@pytest.fixture(scope="module")
def edited(demo_run, tmp_path_factory) -> tuple[Path, str]:
    """A copy of the demo run with 2000 added to one noisy answer; the edited file's path in the run."""
    run = tmp_path_factory.mktemp("edited") / "run"
    shutil.copytree(demo_run, run)
    part = sorted((run / "noisy_measurements" / "persons").glob("level=County/part-*.parquet"))[0]
    frame = pq.read_table(part).to_pandas()
    frame.loc[frame.index[0], "value"] += 2000
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), part, **MEASUREMENT_PARQUET)
    return run, str(part.relative_to(run))


@pytest.mark.parametrize("command, out", [(["reprocess"], "again"), (["uncertainty"], "unc.parquet"),
                                          (["nmf"], "nmf")])
def test_an_edited_measurement_is_refused(edited, tmp_path, command, out):
    run, part = edited
    before = snapshot(run)
    argv = [*command, run, "--out", tmp_path / out] + (["--workers", "1"] if command != ["nmf"] else [])
    outcome = topdown(*argv, cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_RUNDIR, part, "SHA-256 differs from the manifest", "nothing written")
    assert not (tmp_path / out).exists() and sorted(p.name for p in tmp_path.iterdir()) == []
    assert snapshot(run) == before


def test_the_sums_check_passes_an_untouched_run_and_names_an_added_file(demo_run, tmp_path):
    from topdown.pipeline.runtime.rundir import MEASURED

    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    RunReader(run).check_sums(MEASURED, "reprocessing")  # as the run wrote it: no error
    (run / "mdf" / "persons" / "stray.parquet").write_bytes(b"x")  # not read by reprocessing: not checked
    RunReader(run).check_sums(MEASURED, "reprocessing")
    extra = run / "noisy_measurements" / "persons" / "level=US" / "part-09999.parquet"
    extra.write_bytes(b"x")
    with pytest.raises(RunDirError, match="part-09999.parquet: not recorded in the manifest"):
        RunReader(run).check_sums(MEASURED, "reprocessing")


# -------------------------------------------------------------------------------- --out holding user files
def _user_folder(tmp: Path) -> Path:
    folder = tmp / "mine"
    (folder / "histograms").mkdir(parents=True)
    (folder / "histograms" / "important.txt").write_text("my notes\n")
    (folder / "config.json").write_text('{"mine": true}\n')
    return folder


#: Every command that writes a folder named by --out (argv after the command, then --out).
COMMANDS = {
    "run": lambda run, inp, tmp: ["run", "demo", "--input", inp, "--workers", "1"],
    "reprocess": lambda run, inp, tmp: ["reprocess", run, "--workers", "1"],
    "nmf": lambda run, inp, tmp: ["nmf", run],
    "uncertainty": lambda run, inp, tmp: ["uncertainty", run, "--workers", "1"],
    "evaluate": lambda run, inp, tmp: ["evaluate", run, "--truth", inp],
    "replicates": lambda run, inp, tmp: ["replicates", run, "--n", "2", "--workers", "1"],
    "audit": lambda run, inp, tmp: ["audit", "demo", "--input", inp, "--move", "440070001001001:440070001001002",
                                    "--runs", "1", "--workers", "1"],
    "ingest": lambda run, inp, tmp: ["ingest", "blocks", block_csv(tmp / "blocks.csv")],
    "spine": lambda run, inp, tmp: ["spine", "--baf", _folder(tmp / "baf")],
}


def _folder(path: Path) -> Path:
    path.mkdir(exist_ok=True)
    return path


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_out_holding_a_users_files_is_refused(command, demo_run, demo_input, tmp_path):
    folder = _user_folder(tmp_path)
    before, run_before = snapshot(folder), snapshot(demo_run)
    outcome = topdown(*COMMANDS[command](demo_run, demo_input, tmp_path), "--out", folder, cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_RUNDIR, str(folder), "not an earlier output of this command",
                         "nothing was touched")
    assert snapshot(folder) == before
    assert sorted(p.name for p in folder.iterdir()) == ["config.json", "histograms"]
    assert snapshot(demo_run) == run_before


def test_uncertainty_does_not_overwrite_a_users_file(demo_run, tmp_path):
    mine = tmp_path / "mine.parquet"
    pq.write_table(pa.table({"a": [1, 2]}), mine)
    before = snapshot(mine)
    outcome = topdown("uncertainty", demo_run, "--out", mine, "--workers", "1", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_RUNDIR, str(mine), "a file that is not an earlier output", "nothing was touched")
    assert snapshot(mine) == before


@pytest.mark.parametrize("command", sorted({*COMMANDS, "privacy"}))
def test_an_empty_out_is_a_usage_error(command, demo_run, demo_input, tmp_path):
    argv = {"privacy": lambda *a: ["privacy", "demo"], **COMMANDS}[command](demo_run, demo_input, tmp_path)
    cwd = tmp_path / "cwd"
    cwd.mkdir()
    outcome = topdown(*argv, "--out", "", cwd=cwd)
    assert_clean_failure(outcome, EXIT_CONFIG, "--out is empty")
    assert list(cwd.iterdir()) == []


# ------------------------------------------------------------------------------------------------- ingest
@pytest.mark.parametrize("geoid, fragments", [
    ("990070001001001", ("unknown state FIPS code '99'", "'990070001001001'")),
    ("٤٤٠٠٧٠٠٠١٠٠١٠٠١", ("malformed block GEOID", "15 digits 0-9", "'٤٤٠٠٧٠٠٠١٠٠١٠٠١'")),
    ("44007000100100１", ("malformed block GEOID", "'44007000100100１'")),  # a fullwidth digit one
])
def test_ingest_refuses_a_geoid_of_no_state_or_with_other_digits(geoid, fragments, tmp_path):
    csv = block_csv(tmp_path / "blocks.csv", ("440070001001001", geoid))
    outcome = topdown("ingest", "blocks", csv, "--out", tmp_path / "cef", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_INPUT, "blocks.csv", "column GEOID", "row 1", *fragments)
    assert not (tmp_path / "cef").exists()


def test_ingest_pl94_refuses_a_block_of_state_99(tmp_path):
    def state_99(records, row):
        records[PL_GEO][row][9] = "99" + records[PL_GEO][row][9][2:]

    argv, out = _ingest_pl94(state_99)(tmp_path, tmp_path)
    outcome = topdown(*argv, cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_INPUT, PL_GEO, "column GEOCODE", "unknown state FIPS code '99'")
    assert not out.exists()


def test_ingest_replaces_its_output_as_one_set(tmp_path, monkeypatch):
    """A failure between writing the two files (a kill, a full disk) leaves the earlier complete pair in
    place, byte for byte, and no temporary folder; a complete ingest replaces both files."""
    out = tmp_path / "cef"
    ingest_blocks(block_csv(tmp_path / "old.csv", persons=5), out)
    old = snapshot(out)
    new_csv = block_csv(tmp_path / "new.csv", persons=7)
    write = pq.write_table

    def dies_at_units(table, where, *args, **kwargs):
        if Path(where).name == "units.parquet":
            raise KeyboardInterrupt  # killed after persons.parquet was written
        return write(table, where, *args, **kwargs)

    monkeypatch.setattr(pq, "write_table", dies_at_units)
    with pytest.raises(KeyboardInterrupt):
        ingest_blocks(new_csv, out)
    assert snapshot(out) == old
    assert sorted(p.name for p in tmp_path.iterdir()) == ["cef", "new.csv", "old.csv"]
    with pytest.raises(KeyboardInterrupt):
        ingest_blocks(new_csv, tmp_path / "fresh")
    assert not (tmp_path / "fresh").exists()

    monkeypatch.setattr(pq, "write_table", write)
    ingest_blocks(new_csv, out)
    new = snapshot(out)
    assert sorted(new) == sorted(old) == [MARKER, "persons.parquet", "units.parquet"]
    assert all(new[name] != old[name] for name in ("persons.parquet", "units.parquet")) and new[MARKER] == old[MARKER]
    assert pq.read_metadata(out / "persons.parquet").num_rows == 14


def test_ingest_out_must_be_absent_empty_or_an_earlier_ingest(tmp_path):
    out = tmp_path / "cef"
    out.mkdir()
    ingest_blocks(block_csv(tmp_path / "b.csv"), out)  # empty: fine
    ingest_blocks(block_csv(tmp_path / "b.csv"), out)  # an earlier ingest: replaced
    (out / "notes.txt").write_text("mine")
    before = snapshot(out)
    with pytest.raises(RunDirError, match="not an earlier output"):
        ingest_blocks(block_csv(tmp_path / "b.csv"), out)
    assert snapshot(out) == before
    with pytest.raises(IngestError, match="unknown state"):
        ingest_blocks(block_csv(tmp_path / "b.csv", ("720010001001001", "000010001001001")), tmp_path / "x")
    assert json.dumps(sorted(p.name for p in tmp_path.iterdir())) == '["b.csv", "cef"]'


def test_which_folders_a_run_may_write_into(tmp_path):
    """Absent, empty, or a run directory by its own marker (its manifest's format, command and id); never a folder
    that only looks like a run (a manifest with a status, a staging folder), nor one another host's run holds."""
    from topdown.pipeline.runtime.outdir import check, new_marker

    def accepted(path: Path) -> bool:
        try:
            check(path, "run")
            return True
        except RunDirError:
            return False

    made = {}
    for name, entries in {"empty": {}, "manifest": {"manifest.json": '{"status": "running"}'},
                          "marked": {"manifest.json": json.dumps({**new_marker("run"), "status": "running"})},
                          "other-command": {"manifest.json": json.dumps(new_marker("evaluate"))},
                          "stopped": {".staging/chunks": None}, "locked": {".lock": "pid 1 on h"},
                          "mine": {"config.json": "{}", "histograms/important.txt": "x"},
                          "other-manifest": {"manifest.json": '{"name": "not ours"}'}}.items():
        folder = tmp_path / name
        folder.mkdir()
        for entry, text in entries.items():
            (folder / entry).parent.mkdir(parents=True, exist_ok=True)
            (folder / entry).mkdir() if text is None else (folder / entry).write_text(text)
        made[name] = accepted(folder)
    (tmp_path / "file").write_text("x")
    made["file"] = accepted(tmp_path / "file")
    made["absent"] = accepted(tmp_path / "absent")
    assert made == {"empty": True, "manifest": False, "marked": True, "other-command": False, "stopped": False,
                    "locked": False, "mine": False, "other-manifest": False, "file": False, "absent": True}
