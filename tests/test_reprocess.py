"""``topdown reprocess``: estimation again from a run's published measurements, at no privacy cost.

* With the run's own configuration the histograms, the MDF and every published file are byte for byte
  those of the run, and the measurements are the run's files (linked), without reading the input.
* With another rounder ordering and L2 pass ordering it completes and ``verify`` passes.
* A change to anything measured is refused with exit code 2 naming the key; nothing is written.
* The published-measurement reader is the exact inverse of the drawn measurements.
"""
from __future__ import annotations

import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pytest

from rel_inputs import leaked_secrets
from topdown.pipeline import load_config
from topdown.pipeline.cli import EXIT_CONFIG, EXIT_INPUT, EXIT_RUNDIR, main
from topdown.pipeline.configuration.config import ConfigError
from topdown.pipeline.privacy.measure import from_table, measure
from topdown.pipeline.execution.reprocess import changed_keys, reprocess
from topdown.pipeline.runtime.rundir import sha256_file
from topdown.pipeline.configuration.census import PERSONS, PERSONS_PRODUCT
from topdown.pipeline.outputs.verify import verify_run


def _files(root: Path, sub: str) -> dict[str, bytes]:
    base = root / sub
    return {p.relative_to(base).as_posix(): p.read_bytes() for p in sorted(base.rglob("*")) if p.is_file()}


def _no_confidential_reads(monkeypatch, tmp_path) -> None:
    """Reprocessing must not tabulate or even open an input: the functions that do raise here, and the
    run's configured input ("demo-input", relative) does not exist in the working directory."""
    import topdown.pipeline.execution.runner as runner
    import topdown.pipeline.inputs.tabulate as tabulate

    def refuse(*args, **kwargs):
        raise AssertionError("reprocessing read the confidential input")

    for name in ("read_input", "tabulate_levels", "find_input", "_input_dir"):
        monkeypatch.setattr(runner, name, refuse)
    for name in ("tabulate", "block_histograms"):  # every product's tabulation
        monkeypatch.setattr(tabulate, name, refuse)
    monkeypatch.chdir(tmp_path)


def test_unchanged_configuration_reproduces_the_run_byte_for_byte(demo_run, dask_client, tmp_path, monkeypatch):
    _no_confidential_reads(monkeypatch, tmp_path)
    out = reprocess(demo_run, tmp_path / "again", client=dask_client)
    for sub in ("histograms", "mdf", "noisy_measurements", "invariants"):
        assert _files(out, sub) == _files(demo_run, sub), sub
        assert _files(out, sub)
    assert (out / "spine.parquet").read_bytes() == (demo_run / "spine.parquet").read_bytes()
    part = next((out / "noisy_measurements" / "persons" / "level=Block").glob("*.parquet"))
    assert part.stat().st_nlink >= 2  # hard-linked, not rewritten (same file system)
    cert = json.loads((out / "certificate.json").read_text())
    source = json.loads((demo_run / "manifest.json").read_text())
    assert cert["reprocessing_of"] == {"run": str(demo_run.resolve()), "config_sha256": source["config_hash"],
                                       "changed_keys": []}
    assert cert["added_privacy_loss"]["rho"] == "0" and cert["added_privacy_loss"]["epsilon"] == "0"
    assert cert["persons"]["rho"] == json.loads((demo_run / "certificate.json").read_text())["persons"]["rho"]
    manifest = json.loads((out / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["reprocessing_of"]["run"] == str(demo_run.resolve())
    assert set(manifest["input_sha256"]) == {"config.json", "spine.parquet", "invariants", "noisy_measurements"}
    assert verify_run(out).ok
    assert leaked_secrets((out / "manifest.json").read_text() + (out / "certificate.json").read_text()) == []


CHANGES = """
[persons.estimation]
tau_slack = 0.2
[persons.estimation.l2_passes]
Tract = [["cenrace", "hispanic", "votingage", "hhinstlevels", "hhgq", "hispanic * cenrace", "votingage * cenrace",
          "votingage * hispanic", "votingage * hispanic * cenrace", "detailed", "total"]]
[persons.estimation.rounder_passes]
Block = [["total"], ["hhgq"], ["detailed"]]
Block_Group = [["total", "hhgq", "detailed"]]
"""


def test_changed_rounder_and_pass_ordering_complete_and_verify(demo_run, dask_client, tmp_path):
    changes = tmp_path / "changes.toml"
    changes.write_text(CHANGES)
    out = reprocess(demo_run, tmp_path / "new-rounder", changes, client=dask_client)
    report = verify_run(out)
    assert report.ok, report.failures
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["reprocessing_of"]["changed_keys"] == [
        "persons.estimation.l2_passes.Tract", "persons.estimation.rounder_passes.Block",
        "persons.estimation.rounder_passes.Block_Group", "persons.estimation.tau_slack"]
    assert cert["config_sha256"] != cert["reprocessing_of"]["config_sha256"]
    assert _files(out, "noisy_measurements") == _files(demo_run, "noisy_measurements")
    # The top of the tree is unchanged (the same measurements and passes), the blocks are re-rounded.
    assert _files(out, "histograms/persons/level=County") == _files(demo_run, "histograms/persons/level=County")
    block = pd.read_parquet(out / "histograms" / "persons" / "level=Block")
    before = pd.read_parquet(demo_run / "histograms" / "persons" / "level=Block")
    assert block["count"].sum() == before["count"].sum()  # the state total is invariant


@pytest.mark.parametrize("toml, key", [
    ('[persons.budget]\nrho = "1"\n', "persons.budget.rho"),
    ('[run]\nseed = 7\n', "run.seed"),
    ('[run]\nspine = "aian"\n', "run.spine"),
    ('[units.budget.queries.Block]\noccupancy = "1/2"\n', "units.budget.queries.Block.occupancy"),
    # dropping the total invariant is refused before the comparison: the total constraint needs it
    ('[persons.invariants]\nState = []\n', "needs the total invariant"),
])
def test_changes_to_what_was_measured_are_refused(demo_run, tmp_path, capsys, toml, key):
    changes = tmp_path / "changes.toml"
    changes.write_text(toml)
    out = tmp_path / "refused"
    assert main(["reprocess", str(demo_run), "--out", str(out), "--config", str(changes)]) == EXIT_CONFIG
    err = capsys.readouterr().err
    said = key if " " in key else f"{key} changes what was measured"
    assert said in err and str(changes) in err
    assert not out.exists()


def test_changed_keys_allows_post_processing_only():
    demo = load_config("demo")
    data = demo.model_dump(mode="json")
    data["persons"]["estimation"]["split_above"] = 7
    data["persons"]["constraints"]["Block"] = ["hhgq_total_lb"]
    data["run"]["name"] = "renamed"
    from topdown.pipeline.configuration.config import config_from_dict

    assert changed_keys(demo, config_from_dict(data), "x") == [
        "persons.constraints.Block", "persons.estimation.split_above", "run.name"]
    data["run"]["mode"] = "production"
    data["run"]["seed"] = None
    with pytest.raises(ConfigError, match="run.mode changes what was measured"):
        changed_keys(demo, config_from_dict(data), "x")


def test_an_incomplete_or_missing_run_is_refused(tmp_path, capsys):
    assert main(["reprocess", str(tmp_path / "nothing"), "--out", str(tmp_path / "new")]) == EXIT_RUNDIR
    assert "not a complete run directory" in capsys.readouterr().err


def test_published_table_reads_back_to_the_drawn_measurements():
    """from_table inverts measure's table exactly, unmeasured nodes (zero share) included."""
    import scipy.sparse as sp
    from fractions import Fraction

    cfg = load_config("demo").product("persons")
    rng = np.random.default_rng(3)
    hist = sp.csr_matrix(rng.integers(0, 3, size=(4, PERSONS.ncells)) * (rng.random((4, PERSONS.ncells)) < 0.01))
    nodes = ["a1", "a2", "a3", "a4"]
    plb = [Fraction(1, 3), Fraction(0), Fraction(1, 3), Fraction(1, 3)]
    drawn, table = measure(PERSONS_PRODUCT, cfg.budget, "Block", nodes, plb, hist, "test", 5)
    table = table.to_pandas()
    shuffled = table.sample(frac=1, random_state=1)  # row order in the files does not matter
    back = from_table(PERSONS, list(cfg.budget.queries["Block"]), nodes, shuffled)
    assert [m.query for m in back] == [m.query for m in drawn]
    for a, b in zip(drawn, back):
        np.testing.assert_array_equal(a.values, b.values)
        np.testing.assert_array_equal(a.variance, b.variance)
    assert np.isinf(back[0].variance[1])
    with pytest.raises(ValueError, match="lacks some of its"):
        from_table(PERSONS, ["detailed"], nodes, table[~((table["query"] == "detailed") & (table["answer"] == 3))])


def test_a_bad_spine_or_measurement_file_is_an_input_error(demo_run, tmp_path, capsys):
    """Reprocessing a noisy measurement file: a --spine that is not a Parquet file or holds other blocks, and an
    unreadable nmf.json, exit 3 with one line naming the file (no traceback). A run's spine of an older version (the
    table only, no metadata) is still read, as a standard spine."""
    import pyarrow.parquet as pq

    from topdown.geo.spine import Spine
    from topdown.pipeline.execution.nmf import write_nmf

    nmf = write_nmf(demo_run, tmp_path / "nmf")
    table_only = tmp_path / "table-only.parquet"
    pq.write_table(pq.read_table(demo_run / "spine.parquet").replace_schema_metadata(None), table_only)
    levels = Spine.read_parquet(demo_run / "spine.parquet").levels
    old = Spine.read_parquet(table_only, standard_levels=levels)
    assert old.kind == "standard" and old.levels == levels and len(old.table) == len(pd.read_parquet(table_only))
    junk, fewer = tmp_path / "junk.parquet", tmp_path / "fewer.parquet"
    junk.write_bytes(b"not a Parquet file")
    pq.write_table(pq.read_table(table_only).slice(1), fewer)

    def reprocess_with(spine: Path) -> str:
        capsys.readouterr()
        code = main(["reprocess", str(nmf), "--out", str(tmp_path / "x"), "--config", "demo", "--spine", str(spine)])
        err = capsys.readouterr().err
        assert code == EXIT_INPUT and "Traceback" not in err and len(err.strip().splitlines()) == 1, err
        assert not (tmp_path / "x").exists()
        return err

    assert "junk.parquet: not a readable spine file (ArrowInvalid" in reprocess_with(junk)
    assert "fewer.parquet: the " in reprocess_with(fewer) and "nodes differ from those of the measurement file" in \
        reprocess_with(fewer)
    (nmf / "nmf.json").write_text("{not json")
    assert "nmf.json: not a readable noisy measurement file" in reprocess_with(table_only)


@pytest.mark.parametrize("toml, key", [
    ('include = "demo.toml"\n[persons.budget]\nrho = "1"\n', "persons.budget.rho"),
    ('include = "demo.toml"\n[units.budget.queries.Block]\noccupancy = "1/2"\nvacant = "1/2"\n',
     "units.budget.queries.Block"),
    ('include = "demo.toml"\n[run]\nspine = "aian"\nbaf = "x"\n', "run.spine"),
])
def test_a_measurement_file_refuses_a_configuration_of_other_measurements(demo_run, tmp_path, capsys, toml, key):
    from topdown.pipeline.execution.nmf import write_nmf

    nmf = write_nmf(demo_run, tmp_path / "nmf")
    conf = tmp_path / "conf.toml"
    conf.write_text(toml)
    argv = ["reprocess", str(nmf), "--out", str(tmp_path / "x"), "--config", str(conf),
            "--spine", str(demo_run / "spine.parquet")]
    assert main(argv) == EXIT_CONFIG
    assert key in capsys.readouterr().err
    assert main(argv[:-2]) == EXIT_CONFIG  # no spine
    assert "needs --spine" in capsys.readouterr().err


def test_a_run_missing_a_nodes_invariants_is_an_input_error(demo_run, tmp_path, capsys):
    """Reprocessing a run whose invariants file lacks a node of its spine exits 3 naming the level and node
    (not an internal error), and writes nothing."""
    import pyarrow.parquet as pq

    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    table = run / "invariants" / "persons.parquet"
    frame = pq.read_table(table).to_pandas()
    tract = frame.loc[frame["level"] == "Tract", "geocode"].iloc[0]
    pq.write_table(pa.Table.from_pandas(frame[frame["geocode"] != tract], preserve_index=False), table)
    manifest = json.loads((run / "manifest.json").read_text())  # as if the run had written it so
    manifest["output_sha256"]["invariants/persons.parquet"] = sha256_file(table)
    (run / "manifest.json").write_text(json.dumps(manifest))
    capsys.readouterr()
    code = main(["reprocess", str(run), "--out", str(tmp_path / "x")])
    err = capsys.readouterr().err
    assert code == EXIT_INPUT and "Traceback" not in err, err
    assert f"no invariants for Tract node {tract!r}" in err
    assert not (tmp_path / "x").exists()
