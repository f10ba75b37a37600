"""The national shape (`topdown synth --shape us2020`): the 2020 table of state-equivalents,
scaling, partitioning by state, the block assignment files, and the CLI's refusals."""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from cli_subprocess import assert_clean_failure, topdown

from topdown.geo.baf import aian_flags, read_baf_dir
from topdown.geo.states import STATE_FIPS
from topdown.geo.us2020 import US2020
from topdown.pipeline.execution.dataplane import find_input
from topdown.pipeline.runtime.outdir import MARKER
from topdown.pipeline.inputs import us_synth
from topdown.pipeline.inputs.validate import validate_input

SCALE = 0.0005


def test_the_2020_table() -> None:
    assert len(US2020) == 52
    fips = [s.fips for s in US2020]
    assert len(set(fips)) == 52 and fips == sorted(fips)
    assert {s.usps: s.fips for s in US2020} == STATE_FIPS  # the 50 states, DC and Puerto Rico
    by = {s.usps: s for s in US2020}
    assert by["DC"].counties == 1 and by["PR"].counties == 78 and by["TX"].counties == 254
    for s in US2020:
        assert 0 < s.counties <= s.tracts <= s.block_groups <= s.blocks and s.persons > 0, s
    states = [s for s in US2020 if s.usps != "PR"]  # the published national figures, 50 states and DC
    assert sum(s.persons for s in states) == 331_449_281
    assert sum(s.counties for s in states) == 3_143
    assert sum(s.tracts for s in states) == 84_414
    assert sum(s.block_groups for s in states) == 239_780
    assert sum(s.blocks for s in states) == 8_132_968
    assert (by["RI"].blocks, by["RI"].tracts, by["RI"].block_groups) == (25_649, 250, 792)  # data/ri_baf2020


@pytest.mark.parametrize("scale", [1.0, 0.1, 0.002, 1e-5])
def test_scaling_keeps_every_state_and_county(scale: float) -> None:
    for full in US2020:
        s = us_synth.scaled_counts(full, scale)
        assert s.counties == full.counties and s.fips == full.fips
        assert s.counties <= s.tracts <= s.block_groups <= s.blocks
        assert s.block_groups <= us_synth.MAX_BG_PER_TRACT * s.tracts
        assert s.blocks <= us_synth.MAX_BLOCKS_PER_BG * s.block_groups
        assert s.persons == round(full.persons * scale)
        if full.blocks * scale >= full.counties:  # not held up by one block per county
            assert abs(s.blocks - full.blocks * scale) <= 1
        if full.tracts * scale >= full.counties:
            assert abs(s.tracts - full.tracts * scale) <= 1
    assert us_synth.scaled_counts(US2020[0], 1.0) == US2020[0]


def test_spread_keeps_bounds() -> None:
    rng = np.random.default_rng(0)
    for n, parents, cap in [(10, 10, 1), (100, 7, 20), (5000, 300, 999), (27, 3, 9)]:
        count = us_synth._spread(rng, n, parents, 1.5, cap)
        assert count.sum() == n and count.min() >= 1 and count.max() <= cap
    with pytest.raises(ValueError, match="cannot spread"):
        us_synth._spread(rng, 28, 3, 0.0, 9)


@pytest.fixture(scope="module")
def nation(tmp_path_factory):
    out = tmp_path_factory.mktemp("us2020")
    written = us_synth.write_us2020(out, seed=4, scale=SCALE)
    return out, written


def _blocks(out) -> tuple[pd.Series, pd.Series]:
    """(each block's persons, every block GEOID) of a written national input."""
    files = find_input(out)
    geoids = pd.concat([pd.read_parquet(f, columns=["geoid"])["geoid"] for f in files.units]).astype(str)
    persons = pd.concat([pd.read_parquet(f, columns=["geoid"])["geoid"] for f in files.persons]).astype(str)
    blocks = pd.Index(geoids.unique())
    return persons.value_counts().reindex(blocks, fill_value=0), pd.Series(blocks)


def test_partitioned_by_state_with_every_county_tract_and_block_group(nation) -> None:
    out, written = nation
    files = find_input(out)
    assert [f.parent.name for f in files.persons] == [f"state={s.fips}" for s in US2020]
    assert [f.parent.name for f in files.units] == [f"state={s.fips}" for s in US2020]
    for p, u in zip(files.persons[:3], files.units[:3]):
        persons, units = validate_input(p, u)
        assert persons["geoid"].str.startswith(p.parent.name[-2:]).all()
        assert units["geoid"].str.startswith(u.parent.name[-2:]).all()
    pop, geoids = _blocks(out)
    assert written["blocks"] == len(geoids) and written["persons"] == pop.sum()
    assert written["persons"] == sum(pq.ParquetFile(f).metadata.num_rows for f in files.persons)
    for full in US2020:
        s = us_synth.scaled_counts(full, SCALE)
        mine = geoids[geoids.str[:2] == s.fips]
        assert (mine.str[:5].nunique(), mine.str[:11].nunique(), mine.str[:12].nunique(), len(mine)) == \
            (s.counties, s.tracts, s.block_groups, s.blocks), s.usps
    target = sum(us_synth.scaled_counts(s, SCALE).persons for s in US2020)
    assert 0.85 < written["persons"] / target < 1.15


@pytest.mark.parametrize("scale", [SCALE, 4 * SCALE])
def test_a_quarter_of_the_blocks_hold_no_persons_only_units(tmp_path, nation, scale) -> None:
    out = nation[0] if scale == SCALE else tmp_path
    if scale != SCALE:
        us_synth.write_us2020(out, seed=4, scale=scale)
    pop, geoids = _blocks(out)
    assert 0.21 < (pop == 0).mean() < 0.29  # every block is in the units files, a quarter without persons


def test_block_assignment_files(nation) -> None:
    out, written = nation
    baf = read_baf_dir(out / "baf")
    assert len(baf) == written["blocks"] and {"aiannhce", "placefp", "cousubfp"} <= set(baf.columns)
    aian = aian_flags(baf["aiannhce"])
    in_aian = set(baf.index[aian].str[:2])
    assert in_aian == {s.fips for s in US2020} - {"11", "72"}  # every state but DC and Puerto Rico has an AIAN area
    assert (baf["countyfp"] == baf.index.str[2:5]).all()
    assert 0.4 < (baf["placefp"] != "").mean() < 0.8


def test_deterministic_and_streamed(tmp_path, monkeypatch) -> None:
    monkeypatch.setattr(us_synth, "BATCH_BLOCKS", 100)
    a = us_synth.write_us2020(tmp_path / "a", seed=9, scale=0.0003)
    assert us_synth.write_us2020(tmp_path / "b", seed=9, scale=0.0003) == a
    files = sorted(p.relative_to(tmp_path / "a") for p in (tmp_path / "a").rglob("*") if p.is_file() and p.name != MARKER)
    assert files and all((tmp_path / "a" / f).read_bytes() == (tmp_path / "b" / f).read_bytes() for f in files)
    ca = tmp_path / "a" / "persons" / "state=06" / "part-00000.parquet"
    assert pq.ParquetFile(ca).metadata.num_row_groups > 1  # a batch of whole tracts at a time
    assert [p.name for p in (tmp_path / "a").rglob(".*")] == [MARKER]  # the output's marker, no temporary file left


@pytest.mark.parametrize("argv, fragments", [
    (["--shape", "us2020", "--scale", "0"], ["--scale", "(0, 1]"]),
    (["--shape", "us2020", "--scale", "2"], ["--scale", "(0, 1]"]),
    (["--shape", "us2020", "--blocks", "10"], ["--shape us2020", "--scale"]),
    (["--blocks", "10", "--scale", "0.5"], ["--scale", "--shape us2020"]),
])
def test_cli_refusals(tmp_path, argv, fragments) -> None:
    outcome = topdown("synth", *argv, tmp_path / "out")
    assert_clean_failure(outcome, 2, *fragments)
    assert not (tmp_path / "out" / "persons").exists()


def test_cli_unknown_shape_is_a_usage_error(tmp_path) -> None:
    outcome = topdown("synth", "--shape", "us1990", tmp_path / "out")
    assert outcome.code == 2 and "invalid choice: 'us1990'" in outcome.stderr and not outcome.tracebacks()


def test_cli_writes_the_shape(tmp_path) -> None:
    outcome = topdown("synth", "--shape", "us2020", "--scale", "0.0002", "--seed", "2", tmp_path / "out")
    assert outcome.code == 0, str(outcome)
    assert "52 states" in outcome.stdout and (tmp_path / "out" / "baf").is_dir()
    assert len(list((tmp_path / "out" / "persons").glob("state=*"))) == 52


@pytest.mark.slow
def test_the_production_preset_runs_the_national_shape_and_verifies(tmp_path, dask_client) -> None:
    """benchmarks/national.toml (the production preset, optimized AIAN spine) end to end on the national shape:
    52 states (their AIAN parts) under the one US node, DC with one county, Puerto Rico; verify passes."""
    from conftest import REPO

    from topdown.pipeline import load_config, run
    from topdown.pipeline.outputs.verify import verify_run

    us_synth.write_us2020(tmp_path / "input", seed=1, scale=0.0002)
    config = load_config(REPO / "benchmarks" / "national.toml").with_overrides(baf=str(tmp_path / "input" / "baf"))
    out = run(config, tmp_path / "run", input_dir=tmp_path / "input", client=dask_client)
    spine = pd.read_parquet(out / "spine.parquet")
    assert spine["State"].nunique() == 102 and spine["County"].nunique() == 3221
    assert spine["geoid"].str[:2].nunique() == 52
    report = verify_run(out)
    assert report.ok, report.failures
