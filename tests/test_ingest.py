"""Ingest: every published margin is reproduced exactly, allocation is deterministic and follows its rules."""
from __future__ import annotations

import gzip
import re
from itertools import combinations
from pathlib import Path


import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topdown.pipeline.inputs.demo_data import write_demo_input
from topdown.pipeline.cli import main
from topdown.pipeline.inputs.ingest import (
    TWO_RACE_WEIGHTS, IngestError, _allocate_facilities, _allocate_gq, _compact_races, ingest_blocks, ingest_pl94,
)
from topdown.pipeline.inputs.validate import validate_input
from conftest import DATA, PL94_DIR

E2E_BLOCKS = DATA / "ri2018_e2e" / "blocks.csv.gz"
RI2010 = DATA / "ri2010" / "ri_2010_block_demographics.csv.gz"


def _combo_cells() -> list[tuple[int, ...]]:
    """The 63 race combinations in P1 order, built independently of the package: by size, then
    lexicographic in the race order White, Black, AIAN, Asian, NHPI, SOR."""
    return [c for k in range(1, 7) for c in combinations(range(6), k)]


def _p1_table(detail: np.ndarray) -> np.ndarray:
    """71 P1 cells (columns) from 63 detailed counts per block (rows)."""
    sizes = np.array([len(c) for c in _combo_cells()])
    out = [detail.sum(1), detail[:, sizes == 1].sum(1), *detail[:, sizes == 1].T, detail[:, sizes > 1].sum(1)]
    for k in range(2, 7):
        out += [detail[:, sizes == k].sum(1), *detail[:, sizes == k].T]
    return np.stack(out, 1)


def _dense(persons: pd.DataFrame, geoids: pd.Index, mask: np.ndarray) -> np.ndarray:
    sub = persons[mask]
    counts = sub.groupby(["geoid", "cenrace"]).size().unstack(fill_value=0)
    return counts.reindex(index=geoids, columns=range(63), fill_value=0).to_numpy()


@pytest.fixture(scope="module")
def demo(tmp_path_factory) -> tuple[Path, pd.DataFrame, pd.DataFrame]:
    out = tmp_path_factory.mktemp("demo")
    write_demo_input(out)
    return out, pd.read_parquet(out / "persons.parquet"), pd.read_parquet(out / "units.parquet")


def test_demo_reproduces_every_published_block_margin(demo) -> None:
    _, persons, units = demo
    pub = pd.read_csv(E2E_BLOCKS, dtype={"GEOID": str}).set_index("GEOID")
    geo = pub.index
    assert set(persons["geoid"]) | set(units["geoid"]) <= set(geo)
    adult, hisp = persons["votingage"].to_numpy() == 1, persons["hispanic"].to_numpy() == 1
    every = np.ones(len(persons), bool)

    def cols(table: str, n: int) -> np.ndarray:
        return pub[[f"{table}_{i:03d}" for i in range(1, n + 1)]].to_numpy()

    p1 = _p1_table(_dense(persons, geo, every))
    np.testing.assert_array_equal(p1, cols("P1", 71))
    p3 = _p1_table(_dense(persons, geo, adult))
    np.testing.assert_array_equal(p3, cols("P3", 71))
    for mask, table, total in ((every, "P2", p1[:, 0]), (adult, "P4", p3[:, 0])):
        nh = _p1_table(_dense(persons, geo, mask & ~hisp))
        np.testing.assert_array_equal(np.column_stack([total, total - nh[:, 0], nh]), cols(table, 73))
    gq = persons.groupby(["geoid", "hhgq"]).size().unstack(fill_value=0).reindex(
        index=geo, columns=range(8), fill_value=0).to_numpy()
    p5 = np.column_stack([gq[:, 1:].sum(1), gq[:, 1:5].sum(1), gq[:, 1:5], gq[:, 5:].sum(1), gq[:, 5:]])
    np.testing.assert_array_equal(p5, cols("P5", 10))
    hu = units[units["unit_type"] == 0]
    occ = hu.groupby("geoid")["occupied"].agg(["sum", "size"]).reindex(geo, fill_value=0)
    np.testing.assert_array_equal(np.column_stack([occ["size"], occ["sum"], occ["size"] - occ["sum"]]),
                                  cols("H1", 3))
    # GQ facilities: HU100 - H1_001 per block (data README caveat 4), at least one per present type,
    # never more than persons of the type, all occupied.
    fac = units[units["unit_type"] > 0]
    assert fac["occupied"].all()
    per = fac.groupby(["geoid", "unit_type"]).size().unstack(fill_value=0).reindex(
        index=geo, columns=range(1, 8), fill_value=0).to_numpy()
    np.testing.assert_array_equal(per.sum(1), pub["HU100"].to_numpy() - pub["H1_001"].to_numpy())
    assert ((per > 0) == (gq[:, 1:] > 0)).all() and (per <= gq[:, 1:]).all()


def test_demo_rules_and_contract(demo) -> None:
    out, persons, _ = demo
    nursing = persons[persons["hhgq"] == 3]
    assert len(nursing) > 0 and (nursing["votingage"] == 1).all()
    validate_input(out / "persons.parquet", out / "units.parquet")
    keys = ["geoid", "hhgq", "votingage", "hispanic", "cenrace"]
    assert persons[keys].equals(persons[keys].sort_values(keys, kind="stable").reset_index(drop=True))


def test_demo_is_deterministic(demo, tmp_path) -> None:
    out, _, _ = demo
    write_demo_input(tmp_path)
    for name in ("persons.parquet", "units.parquet"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()


def test_ingest_pl94_directory_matches_bundled_demo(demo, tmp_path) -> None:
    out, _, _ = demo
    summary = ingest_pl94(PL94_DIR, tmp_path)
    assert summary.blocks_read == 569 and summary.gq_facilities == 17 and not summary.notes
    for name in ("persons.parquet", "units.parquet"):
        assert (tmp_path / name).read_bytes() == (out / name).read_bytes()


def _copy_pl(tmp_path: Path) -> Path:
    src = tmp_path / "pl"
    src.mkdir()
    for f in PL94_DIR.glob("*.pl.gz"):
        (src / f.name[:-3]).write_bytes(gzip.decompress(f.read_bytes()))
    return src


def _edit_field(path: Path, line: int, field: int, value: str) -> None:
    lines = path.read_text().splitlines()
    parts = lines[line].split("|")
    parts[field] = value
    lines[line] = "|".join(parts)
    path.write_text("\n".join(lines) + "\n")


def test_pl94_inconsistent_p5_names_file_column_row(tmp_path) -> None:
    src = _copy_pl(tmp_path)
    seg3 = src / "ri000032018_2020Style.pl"
    lines = seg3.read_text().splitlines()
    row = next(i for i, ln in enumerate(lines) if i > 50 and ln.split("|")[5] == "0")
    _edit_field(seg3, row, 5 + 9, "1")  # P0050010 without its subtotals
    with pytest.raises(IngestError, match=rf"ri000032018_2020Style\.pl: column P005000\d, row {row}:"):
        ingest_pl94(src, tmp_path / "out")


def test_pl94_inconsistent_p3_names_file_column_row(tmp_path) -> None:
    src = _copy_pl(tmp_path)
    seg2 = src / "ri000022018_2020Style.pl"
    geo = pd.read_csv(src / "rigeo2018_2020Style.pl", sep="|", header=None, dtype=str, keep_default_na=False)
    row = int(np.flatnonzero((geo[2] == "750") & (geo[9] == "440070001011018"))[0])
    _edit_field(seg2, row, 5, "0")  # P0030001 no longer the sum of its cells
    with pytest.raises(IngestError, match=rf"ri000022018_2020Style\.pl: column P0030001, row {row}: block 440070001011018"):
        ingest_pl94(src, tmp_path / "out")


def test_nursing_needs_adults() -> None:
    cells = np.zeros(252, np.int64)
    cells[5] = 4  # under 18
    cells[126 + 5] = 2  # 18+
    gq = np.array([0, 0, 3, 0, 0, 0, 0])
    with pytest.raises(IngestError, match="too few persons aged 18\\+"):
        list(_allocate_gq(cells, gq, "f.pl", 7, "440070001011018"))


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 30), min_size=252, max_size=252), st.lists(st.integers(0, 12), min_size=7, max_size=7))
def test_gq_allocation_preserves_cells(cells_list: list[int], gq_list: list[int]) -> None:
    cells, gq = np.array(cells_list, np.int64), np.array(gq_list, np.int64)
    gq[2] = min(gq[2], cells[126:].sum())
    gq = np.minimum(gq, cells.sum() // 7)
    before = cells.copy()
    taken = dict(_allocate_gq(cells, gq, "f", 0, "g"))
    total = sum(taken.values(), np.zeros(252, np.int64))
    np.testing.assert_array_equal(total + cells, before)
    assert (cells >= 0).all()
    for k, t in taken.items():
        assert t.sum() == gq[k - 1] and (t >= 0).all()
    if 3 in taken:
        assert taken[3][:126].sum() == 0


@settings(max_examples=200, deadline=None)
@given(st.lists(st.integers(0, 40), min_size=7, max_size=7), st.integers(0, 300))
def test_facility_allocation_rules(gq_list: list[int], extra: int) -> None:
    gq = np.array(gq_list, np.int64)
    present = int((gq > 0).sum())
    if present == 0:
        return
    facilities = present + extra % (gq.sum() - present + 1)
    fac = _allocate_facilities(gq, facilities, "f", 0, "g")
    assert fac.sum() == facilities
    assert ((fac > 0) == (gq > 0)).all() and (fac <= gq).all()


@pytest.mark.parametrize("races", ["spread", "compact"])
def test_blocks_csv_reproduces_every_group_margin(tmp_path, races) -> None:
    summary = ingest_blocks(RI2010, tmp_path, races=races)
    pub = pd.read_csv(RI2010, dtype={"GEOID": str}).set_index("GEOID")
    assert summary.blocks_read == len(pub) == 25_181
    persons = pd.read_parquet(tmp_path / "persons.parquet")
    units = pd.read_parquet(tmp_path / "units.parquet")
    assert (persons["hhgq"] == 0).all()
    names = np.array(["white", "black", "aian", "asian", "nhpi", "other"] + ["two"] * 57)
    group = np.where(persons["hispanic"].to_numpy() == 1, "hisp", names[persons["cenrace"].to_numpy()])
    two = persons[group == "two"]["cenrace"]
    assert two.between(6, 20).all()  # two or more races -> two-race combinations
    table = pd.crosstab([persons["geoid"], persons["votingage"]], group).unstack(fill_value=0)
    for g in ("hisp", "white", "black", "aian", "asian", "nhpi", "other", "two"):
        got = table.get(g, pd.DataFrame()).reindex(index=pub.index, columns=[0, 1], fill_value=0).to_numpy()
        np.testing.assert_array_equal(got[:, 1], pub[f"vap_{g}"].to_numpy(), err_msg=g)
        np.testing.assert_array_equal(got.sum(1), pub[f"pop_{g}"].to_numpy(), err_msg=g)
    hu = units.groupby("geoid")["occupied"].agg(["sum", "size"]).reindex(pub.index, fill_value=0)
    pop = pub["pop"].to_numpy()
    np.testing.assert_array_equal(hu["sum"].to_numpy(), -(-2 * pop // 5))  # ceil(pop / 2.5)
    vacancy = 1 - hu["sum"].sum() / hu["size"].sum()
    assert 0.09 < vacancy < 0.11
    combos = persons[np.isin(group, ["two", "hisp"])].assign(group=group[np.isin(group, ["two", "hisp"])])
    per_block = combos.groupby(["geoid", "group"])["cenrace"].nunique()
    if races == "compact":  # one race combination per block and collapsed group
        assert per_block.max() == 1
    else:  # spread: a block's group over several combinations
        assert per_block[per_block.index.get_level_values("group") == "two"].max() > 3
    text = "\n".join(summary.lines())
    assert "25,181 blocks" in text and "kept 17,644 blocks; dropped 7,537 with neither persons nor housing" in text
    assert f"--races {races}" in text and "housing units: the table has none" in text


def test_compact_races_follow_the_weights_over_blocks() -> None:
    counts = np.zeros((300, 2), np.int64)
    counts[::3, 1] = 5  # 100 blocks with the group, 200 without
    races = _compact_races(counts, TWO_RACE_WEIGHTS)
    assert races.shape == (600,) and (races[0::2] == races[1::2]).all()  # both age groups of a block
    got = pd.Series(races[0::2][::3]).value_counts().to_dict()
    assert got == TWO_RACE_WEIGHTS  # any 100 consecutive blocks with the group follow the weights exactly


def test_ingest_races_is_for_block_tables_only(tmp_path, capsys) -> None:
    assert main(["ingest", "pl94", str(tmp_path), "--out", str(tmp_path / "o"), "--races", "compact"]) == 2
    assert "--races is for `ingest blocks`" in capsys.readouterr().err
    assert not (tmp_path / "o").exists()


def _small_csv(path: Path) -> Path:
    frame = pd.DataFrame({"GEOID": ["440010301001000", "440010301001001"], "pop": [10, 7], "vap": [6, 5]})
    for g in ("white", "black", "hisp", "aian", "asian", "nhpi", "other", "two"):
        frame[f"pop_{g}"], frame[f"vap_{g}"] = 0, 0
    frame[["pop_white", "vap_white"]] = [[6, 4], [3, 3]]
    frame[["pop_hisp", "vap_hisp"]] = [[2, 1], [2, 1]]
    frame[["pop_two", "vap_two"]] = [[2, 1], [2, 1]]
    frame.to_csv(path, index=False)
    return path


def test_blocks_csv_small_roundtrip_and_determinism(tmp_path) -> None:
    csv = _small_csv(tmp_path / "b.csv")
    ingest_blocks(csv, tmp_path / "a")
    ingest_blocks(csv, tmp_path / "b")
    for name in ("persons.parquet", "units.parquet"):
        assert (tmp_path / "a" / name).read_bytes() == (tmp_path / "b" / name).read_bytes()
    validate_input(tmp_path / "a" / "persons.parquet", tmp_path / "a" / "units.parquet")


@pytest.mark.parametrize("col,row,value,pattern", [
    ("GEOID", 1, "44001030100100", "column GEOID, row 1: malformed"),
    ("vap_two", 0, 3, "column vap, row 0:"),
    ("pop_black", 1, -1, "column pop_black, row 1: not a non-negative integer"),
])
def test_blocks_csv_errors_name_file_column_row(tmp_path, col: str, row: int, value: object, pattern: str) -> None:
    csv = _small_csv(tmp_path / "bad.csv")
    frame = pd.read_csv(csv, dtype={"GEOID": str})
    frame.loc[row, col] = value
    frame.to_csv(csv, index=False)
    with pytest.raises(IngestError, match=rf"bad\.csv: {pattern}"):
        ingest_blocks(csv, tmp_path / "out")


def test_pl94_missing_files(tmp_path) -> None:
    with gzip.open(tmp_path / "rigeo2018.pl.gz", "wt") as fh:
        fh.write("")
    with pytest.raises(IngestError, match=r"missing P\.L\. 94-171 file\(s\) \['seg1', 'seg2', 'seg3'\]"):
        ingest_pl94(tmp_path, tmp_path / "out")


def test_tabulation_of_demo(demo) -> None:
    from topdown.pipeline.configuration.census import PERSONS, PL94
    from topdown.pipeline.inputs.tabulate import block_histograms, block_units, tabulate

    _, persons, units = demo
    pub = pd.read_csv(E2E_BLOCKS, dtype={"GEOID": str}).set_index("GEOID")
    hist = block_histograms(persons, PERSONS)
    assert list(hist.columns) == ["geocode", "cell", "count"] and hist["count"].dtype == np.int64
    assert hist[["geocode", "cell"]].equals(hist[["geocode", "cell"]].sort_values(["geocode", "cell"]).reset_index(drop=True))
    assert (hist["count"] > 0).all()
    tot = hist.groupby("geocode")["count"].sum().reindex(pub.index, fill_value=0)
    np.testing.assert_array_equal(tot.to_numpy(), pub["P1_001"].to_numpy())
    hhgq = hist["cell"] // 252
    gq = hist[hhgq > 0].groupby("geocode")["count"].sum().reindex(pub.index, fill_value=0)
    np.testing.assert_array_equal(gq.to_numpy(), pub["P5_001"].to_numpy())
    uh = tabulate(PL94.product("units"), {"units": units}).pivot(index="geocode", columns="cell", values="count")
    uh = uh.reindex(index=pub.index, columns=[0, 1]).fillna(0).astype(int)
    np.testing.assert_array_equal(uh.to_numpy(), pub[["H1_002", "H1_003"]].to_numpy())
    bu = block_units(units).set_index("geoid").reindex(pub.index, fill_value=0)
    np.testing.assert_array_equal(bu[[f"u{k}" for k in range(8)]].sum(axis=1).to_numpy(), pub["HU100"].to_numpy())
    np.testing.assert_array_equal(bu[["u0", "occupied", "vacant"]].to_numpy(), pub[["H1_001", "H1_002", "H1_003"]].to_numpy())


def test_the_words_summary_shows_no_count_beyond_its_totals(tmp_path) -> None:
    """What ingest prints may come from confidential tables: only the block counts and the file's totals (state
    totals, invariants of a release), and the constants of its rules, appear as numbers."""
    summary = ingest_blocks(RI2010, tmp_path / "out")
    allowed = {summary.blocks_read, summary.blocks_written, summary.blocks_read - summary.blocks_written,
               summary.persons, summary.housing_units, summary.gq_facilities, 1, 2, 5, 9}
    text = "\n".join(summary.lines()).replace(str(RI2010), "")
    numbers = {int(n.replace(",", "")) for n in re.findall(r"\d[\d,]*", text)}
    assert numbers <= allowed, numbers - allowed
