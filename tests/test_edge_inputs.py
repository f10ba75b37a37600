"""Edge inputs that are legal and must run: a block table with the 2020 GEOID column name and extra columns,
housing-unit columns that replace the derived units, blocks and whole counties with housing units but no
persons (they stay on the spine, as in production), and a state with no persons at all."""
from __future__ import annotations

from pathlib import Path

import pandas as pd
import pytest

from topdown.pipeline import load_config, run
from topdown.pipeline.inputs.ingest import BLOCK_GROUPS, ingest_blocks
from topdown.pipeline.outputs.verify import verify_run


def _table(rows: list[tuple[str, int, int, int]]) -> pd.DataFrame:
    """A block table from (GEOID, White adults, hu_occupied, hu_vacant) rows."""
    frame = pd.DataFrame(rows, columns=["GEOID", "pop", "hu_occupied", "hu_vacant"])
    frame["vap"] = frame["pop"]
    for g in BLOCK_GROUPS:
        frame[f"pop_{g}"] = frame["pop"] if g == "white" else 0
        frame[f"vap_{g}"] = frame["pop"] if g == "white" else 0
    return frame


#: County 007 has persons; county 009 has housing units and no persons; one block of 007 is vacant.
MIXED = [("440070001001001", 40, 12, 1), ("440070001001002", 25, 9, 0), ("440070001001003", 0, 0, 4),
         ("440070002001001", 31, 10, 2), ("440090001001001", 0, 0, 6), ("440090001001002", 0, 0, 3)]


def _ingest(tmp: Path, frame: pd.DataFrame, name: str) -> Path:
    frame.to_csv(tmp / f"{name}.csv", index=False)
    ingest_blocks(tmp / f"{name}.csv", tmp / name)
    return tmp / name


def test_geoid20_and_extra_columns_read_as_geoid(tmp_path: Path) -> None:
    table = _table(MIXED).drop(columns=["hu_occupied", "hu_vacant"])
    plain = _ingest(tmp_path, table, "plain")
    renamed = table.rename(columns={"GEOID": "GEOID20"}).assign(state="44", county=lambda f: f["GEOID20"].str[2:5])
    named = _ingest(tmp_path, renamed[["state", "county", *renamed.columns[:-2]]], "named")
    for name in ("persons.parquet", "units.parquet"):
        assert (plain / name).read_bytes() == (named / name).read_bytes()


def test_housing_unit_columns_replace_the_derived_units(tmp_path: Path) -> None:
    units = pd.read_parquet(_ingest(tmp_path, _table(MIXED), "split") / "units.parquet")
    got = units.groupby(["geoid", "occupied"]).size()
    want = {(g, flag): n for g, _, o, v in MIXED for flag, n in ((True, o), (False, v)) if n}
    assert got.to_dict() == want and (units["unit_type"] == 0).all()

    hu = _table(MIXED).assign(hu=lambda f: f["hu_occupied"] + f["hu_vacant"]).drop(columns=["hu_occupied", "hu_vacant"])
    units = pd.read_parquet(_ingest(tmp_path, hu, "total") / "units.parquet")
    per_block = units.groupby("geoid").agg(occupied=("occupied", "sum"), units=("occupied", "size"))
    for geoid, persons, occ, vac in MIXED:  # hu alone: occupied = min(hu, ceil(persons / 2.5)), the rest vacant
        assert per_block.loc[geoid, "units"] == occ + vac
        assert per_block.loc[geoid, "occupied"] == min(occ + vac, -(-2 * persons // 5))


@pytest.mark.parametrize("case", ["mixed", "no_persons"])
def test_blocks_and_counties_without_persons_run_and_verify(case: str, tmp_path: Path, dask_client) -> None:
    rows = MIXED if case == "mixed" else [(g, 0, 0, max(o + v, 1)) for g, _, o, v in MIXED]
    inp = _ingest(tmp_path, _table(rows), "input")
    config = load_config("demo").with_overrides(name=f"edge-{case}", mode="test", seed=7)
    out = run(config, tmp_path / "run", input_dir=inp, client=dask_client)
    report = verify_run(out)
    assert report.ok, report.failures
    spine = pd.read_parquet(out / "spine.parquet")
    assert set(spine["geoid"]) == {g for g, *_ in rows}  # vacant blocks and the empty county stay on the spine
    persons = pd.read_parquet(out / "mdf" / "persons")
    units = pd.read_parquet(out / "mdf" / "units")
    assert len(units[units["RTYPE"] == "2"]) == sum(o + v for _, _, o, v in rows)  # housing units are invariant
    if case == "no_persons":
        assert len(persons) == 0 and list(persons.columns)[:3] == ["SCHEMA_TYPE_CODE", "SCHEMA_BUILD_ID", "TABBLKST"]
    else:
        assert len(persons) == sum(n for _, n, _, _ in rows)  # the state total is invariant; county 009 may get persons
