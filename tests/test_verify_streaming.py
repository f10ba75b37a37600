"""``topdown verify`` one group at a time: on a run of three states it finds what reading
every level whole finds (one group), never reads a level below the root into memory whole, and groups a
state's nodes together."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from topdown.pipeline.runtime.rundir import RunReader
from topdown.pipeline.inputs.us_synth import write_partitioned
from topdown.pipeline.outputs import verify


@pytest.fixture(scope="module")
def three_states(tmp_path_factory, dask_client) -> Path:
    """The demo configuration (persons and units, standard spine) on 600 synthetic blocks in three states."""
    from topdown.pipeline import load_config, run

    base = tmp_path_factory.mktemp("three-states")
    write_partitioned(base / "input", 600, seed=5, persons=20_000, states=3)
    out = base / "run"
    run(load_config("demo").with_overrides(build_demo_input=False), out, input_dir=base / "input", client=dask_client)
    return out


def _report(run_dir: Path, monkeypatch, by_state: bool) -> verify.VerifyReport:
    """verify_run by state (groups of one block: a state each), or in one group (the default for a small run)."""
    with monkeypatch.context() as m:
        if by_state:
            m.setattr(verify, "GROUP_BLOCKS", 1)
        return verify.verify_run(run_dir)


def test_groups_are_states(three_states, monkeypatch) -> None:
    reader = RunReader(three_states)
    assert verify._Groups(reader.spine_path, reader.manifest().levels, us=True).count == 1  # 600 blocks: one group
    monkeypatch.setattr(verify, "GROUP_BLOCKS", 1)
    groups = verify._Groups(reader.spine_path, reader.manifest().levels, us=True)
    assert groups.count == 3
    spine = reader.spine_table()
    for g in range(3):
        assert groups.spine_frame(g)["geoid"].str[:2].nunique() == 1
    assert sorted(len(groups.spine_frame(g)) for g in range(3)) == sorted(spine["geoid"].str[:2].value_counts())
    block = groups.route("Block", pa.array(spine["Block"]))
    assert (pd.Series(block).groupby(spine["geoid"].str[:2].to_numpy()).nunique() == 1).all()


def test_a_clean_run_passes_the_same_checks_as_one_group(three_states, monkeypatch) -> None:
    streamed, whole = _report(three_states, monkeypatch, True), _report(three_states, monkeypatch, False)
    assert streamed.ok and whole.ok, (streamed.failures, whole.failures)
    assert streamed.checks == whole.checks > 100


def test_a_tampered_run_fails_the_same_checks_as_one_group(three_states, tmp_path, monkeypatch) -> None:
    copy = tmp_path / "tampered"
    shutil.copytree(three_states, copy)
    parts = sorted((copy / "histograms" / "persons" / "level=Block").glob("*.parquet"))
    frame = pd.read_parquet(parts[-1])  # the last state's blocks
    frame.loc[len(frame) // 2, "count"] += 2
    frame.to_parquet(parts[-1], index=False)
    mdf = sorted((copy / "mdf" / "units").rglob("*.parquet"))[0]
    pq.write_table(pq.read_table(mdf).slice(1), mdf)  # the first county loses a unit record
    streamed, whole = _report(copy, monkeypatch, True), _report(copy, monkeypatch, False)
    assert streamed.checks == whole.checks
    assert sorted(streamed.failures) == sorted(whole.failures)
    text = "\n".join(streamed.failures)
    assert "persons Block: children do not sum to their Block_Group parent (first: parent" in text
    assert "persons MDF does not tabulate back to the block histograms" in text
    assert "units MDF housing-unit rows differ from the block histograms" in text


def test_no_level_below_the_root_is_read_whole(three_states, monkeypatch) -> None:
    read: list[Path] = []
    table = RunReader.table

    def recording(self, path, columns=None):
        read.append(Path(path))
        return table(self, path, columns)

    monkeypatch.setattr(RunReader, "table", recording)
    monkeypatch.setattr(verify, "GROUP_BLOCKS", 1)
    monkeypatch.setattr(RunReader, "spine_table", lambda self: pytest.fail("verify read the whole spine as a frame"))
    assert verify.verify_run(three_states).ok
    assert read and all(p.name == "level=US" for p in read), read


def test_groups_are_sized_by_records_too(three_states, monkeypatch) -> None:
    """A run of few leaves holding many records each (the 1940 census: 152 k enumeration districts of about 870
    persons) is split by its published counts, not only by its leaves; both limits bound a group."""
    reader = RunReader(three_states)
    levels = reader.manifest().levels
    records = verify._records(reader, reader.products(), levels[1])
    assert records and all(n > 0 for n in records.values())
    assert verify._Groups(reader.spine_path, levels, True, records).count == 1  # 20,000 persons: one group
    monkeypatch.setattr(verify, "GROUP_RECORDS", 1)
    groups = verify._Groups(reader.spine_path, levels, True, records)
    assert groups.count == 3
    spine = reader.spine_table()
    assert all(groups.spine_frame(g)["geoid"].str[:2].nunique() == 1 for g in range(3))
    assert _report(three_states, monkeypatch, False).checks == verify.verify_run(three_states).checks


@pytest.mark.parametrize("blocks,records,limits,expected", [
    ([5, 5, 5, 5], [0, 0, 0, 0], (10, 100), [0, 0, 1, 1]),      # blocks alone
    ([1, 1, 1, 1], [60, 60, 60, 60], (10, 100), [0, 0, 1, 1]),  # records alone: a group starts below 100
    ([1, 1, 1, 1], [30, 30, 30, 30], (10, 100), [0, 0, 0, 0]),  # below both (120 records: a quarter past)
    ([1], [10**9], (10, 100), [0]),                              # one key larger than both: its own group
])
def test_group_keys(monkeypatch, blocks, records, limits, expected) -> None:
    monkeypatch.setattr(verify, "GROUP_BLOCKS", limits[0])
    monkeypatch.setattr(verify, "GROUP_RECORDS", limits[1])
    assert verify._group_keys(np.array(blocks), np.array(records, float)).tolist() == expected


def test_the_mdf_is_checked_a_batch_at_a_time(three_states, tmp_path, monkeypatch) -> None:
    """A group's MDF is tabulated a batch of rows at a time (a national group's MDF, tens of millions of records,
    does not fit one frame): batches of 97 rows find what one batch finds, on a clean and a tampered run."""
    copy = tmp_path / "tampered"
    shutil.copytree(three_states, copy)
    mdf = sorted((copy / "mdf" / "persons").rglob("*.parquet"))[-1]
    table = pq.read_table(mdf)
    race = table.column("CENRACE").to_pylist()
    race[len(race) // 2] = "02" if race[len(race) // 2] != "02" else "01"  # one person's race changed
    pq.write_table(table.set_column(table.schema.get_field_index("CENRACE"), "CENRACE",
                                    pa.array(race, table.schema.field("CENRACE").type)), mdf)
    batches = []
    read = verify._Spill.batches

    def counting(self, g):
        for frame in read(self, g):
            batches.append(len(frame))
            yield frame

    for run_dir, ok in ((three_states, True), (copy, False)):
        whole = verify.verify_run(run_dir)
        with monkeypatch.context() as m:
            m.setattr(verify, "ROUTE_BATCH", 97)
            m.setattr(verify._Spill, "batches", counting)
            small = verify.verify_run(run_dir)
        assert small.checks == whole.checks and small.ok == whole.ok == ok
        assert sorted(small.failures) == sorted(whole.failures)
    assert max(batches) == 97 and len(batches) > 100
    assert "persons MDF does not tabulate back to the block histograms" in "\n".join(whole.failures)
