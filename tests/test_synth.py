"""Synthetic input: passes validation, is deterministic in the seed, and has a census-like shape."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from topdown.pipeline.inputs.us_synth import write_synthetic
from topdown.pipeline.inputs.tabulate import block_units
from topdown.pipeline.inputs.validate import validate_input

BLOCKS = 6000


@pytest.fixture(scope="module")
def synth(tmp_path_factory) -> tuple[pd.DataFrame, pd.DataFrame]:
    out = tmp_path_factory.mktemp("synth")
    write_synthetic(out, BLOCKS, seed=11)
    return validate_input(out / "persons.parquet", out / "units.parquet")


def test_deterministic_in_seed(tmp_path) -> None:
    for name, seed in (("a", 5), ("b", 5), ("c", 6)):
        write_synthetic(tmp_path / name, 800, seed=seed)
    for f in ("persons.parquet", "units.parquet"):
        assert (tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes()
        assert (tmp_path / "a" / f).read_bytes() != (tmp_path / "c" / f).read_bytes()


def test_state_code_and_small_sizes(tmp_path) -> None:
    write_synthetic(tmp_path, 7, seed=0, state="06")
    persons, units = validate_input(tmp_path / "persons.parquet", tmp_path / "units.parquet")
    assert persons["geoid"].str.startswith("06").all() and units["geoid"].str.startswith("06").all()
    with pytest.raises(ValueError, match="2-digit state"):
        write_synthetic(tmp_path, 7, seed=0, state="6")


def test_person_shape(synth) -> None:
    persons, units = synth
    per_block = len(persons) / BLOCKS
    assert 30 < per_block < 55
    populated = persons["geoid"].nunique()
    assert 0.6 < populated / BLOCKS < 0.8  # many empty blocks
    sizes = persons.groupby("geoid").size()
    assert sizes.quantile(0.99) > 4 * sizes.median()  # long tail
    assert 0.72 < persons["votingage"].mean() < 0.82
    assert 0.12 < persons["hispanic"].mean() < 0.26
    assert (persons["cenrace"] < 6).mean() > 0.9  # most persons single-race
    nh = persons[persons["hispanic"] == 0]
    assert nh["cenrace"].value_counts().idxmax() == 0  # White the largest not-Hispanic group
    tract_hisp = persons.groupby(persons["geoid"].str[:11])["hispanic"].mean()
    assert tract_hisp.std() > 0.05  # tracts differ in their mix


def test_units_and_group_quarters(synth) -> None:
    persons, units = synth
    bu = block_units(units)
    assert bu["occupied"].sum() > 0 and 0.03 < bu["vacant"].sum() / bu["u0"].sum() < 0.2
    household = persons[persons["hhgq"] == 0].groupby("geoid").size()
    occ = bu.set_index("geoid")["occupied"].reindex(household.index)
    assert (occ >= 1).all() and (occ <= household).all()
    gq_types = set(units.loc[units["unit_type"] > 0, "unit_type"])
    assert {1, 3, 5, 6, 7} <= gq_types
    assert (persons.loc[persons["hhgq"] == 3, "votingage"] == 1).all()
    assert 0 < (persons["hhgq"] > 0).mean() < 0.1


def test_geography_nesting(synth) -> None:
    persons, units = synth
    geo = pd.Series(sorted(set(units["geoid"]) | set(persons["geoid"])))
    assert geo.str.fullmatch(r"\d{15}").all()
    county, tract = geo.str[:5], geo.str[:11]
    block_group = geo.str[:12]
    assert county.nunique() >= 2
    per_tract_bg = block_group.groupby(tract).nunique()
    assert per_tract_bg.between(1, 4).all()
    assert (block_group.str[-1] != "0").all()
    assert 20 < geo.groupby(tract).size().mean() < 150
    # blocks per county (the non-empty ones) within the 1,000-4,000 design range, scaled by the populated share
    per_county = geo.groupby(county).size()
    assert per_county.iloc[:-1].between(500, 4000).all()
    assert np.all(np.diff(geo.str[5:11].astype(int).groupby(county).first().to_numpy()) == 0)


def test_partitioned_national_shape(tmp_path, monkeypatch) -> None:
    """`topdown synth --states`: hive partitions by state, one row group per batch, deterministic in the seed,
    about the requested persons, every partition a valid input."""
    from topdown.pipeline.inputs import us_synth
    from topdown.pipeline.execution.dataplane import find_input

    monkeypatch.setattr(us_synth, "BATCH_BLOCKS", 700)
    counts = us_synth.write_partitioned(tmp_path / "a", 4000, seed=3, persons=300_000, states=3)
    assert us_synth.write_partitioned(tmp_path / "b", 4000, seed=3, persons=300_000, states=3) == counts
    files = find_input(tmp_path / "a")
    assert [f.parent.name for f in files.persons] == ["state=01", "state=02", "state=04"]
    assert [f.parent.name for f in files.units] == ["state=01", "state=02", "state=04"]
    for p, u in zip(files.persons, files.units):
        assert p.read_bytes() == (tmp_path / "b" / p.relative_to(tmp_path / "a")).read_bytes()
        persons, units = validate_input(p, u)
        state = p.parent.name[-2:]
        assert persons["geoid"].str.startswith(state).all() and units["geoid"].str.startswith(state).all()
        assert persons["geoid"].is_monotonic_increasing
    assert max(pq.ParquetFile(f).metadata.num_row_groups for f in files.persons) > 1  # streamed, a batch at a time
    assert counts[0] == sum(pq.ParquetFile(f).metadata.num_rows for f in files.persons)
    assert 0.85 < counts[0] / 300_000 < 1.15
    blocks = sum(pd.read_parquet(f, columns=["geoid"])["geoid"].nunique() for f in files.units)
    assert blocks > 0.6 * 4000
