"""A census whose hierarchy and units are declared: spines from a declared
:class:`~topdown.vocab.census.Hierarchy` (the U.S. prefixes unchanged; a column hierarchy of codes of any
length and alphabet), its input geography read and checked (exit 3 naming file, column and code), no units
file for a census without units, the generic MDF, and verify on a declared product. Library-level tests use
hand-built Census objects; the end-to-end CLI test at the end runs a configuration that names a census file
(``[run] census = PATH``)."""
from __future__ import annotations

import dataclasses
import json
import textwrap
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import scipy.sparse as sp

from cli_subprocess import assert_clean_failure, topdown
from topdown.geo import GeographyError
from topdown.geo.spine import (LEVELS, PREFIX, US_HIERARCHY, build_spine, column_spine, spine_state, standard_spine)
from topdown.pipeline.configuration.config import ConfigError, census_hierarchy, load_config
from topdown.pipeline.execution import dataplane
from topdown.pipeline.configuration.errors import InputError
from topdown.pipeline.inputs.validate import check_records
from topdown.pipeline.outputs import verify
from topdown.pipeline.outputs.mdf import RECORD_NUMBER, generic_mdf, tabulate_generic_mdf
from topdown.pipeline.configuration.census import PERSONS, PL94, default_census
from topdown.vocab.census import (Attribute, Census, ConstraintSpec, Hierarchy, InvariantSpec, Level, Product, Records,
                                  UnitBounds, Units)
from topdown.vocab.schema import Schema

#: Region > Province > District below the root: codes of unequal lengths, letters, digits and dashes.
HIERARCHY = Hierarchy(levels=(Level("Nation"), Level("Region", column="region"), Level("Province", column="prov"),
                              Level("District", column="dist")),
                      pattern=r"[a-z]+-?\d*", root_code="XL")
#: Region code, province code, district codes.
GEOGRAPHY = {"N": {"N-a": ["ab1", "ab22", "c"], "N-bbb": ["d-4444"]}, "SUD": {"S9": ["e5", "f-66", "gg"]}}
ATTRIBUTES = (Attribute("sex", 2, "sex", labels=("male", "female")),
              Attribute("age", 3, "agegroup", values=(("0-17", 0), ("18-64", 1), ("65+", 2))),
              Attribute("kind", 4, "kind"))
SCHEMA = Schema("people", dims=tuple((a.name, a.size) for a in ATTRIBUTES),
                recodes={"old": ("age", ((2,),)), "kind3": ("kind", ((3,),))})
PEOPLE = Product(schema=SCHEMA, records=Records("persons"), attributes=ATTRIBUTES,
                 invariants={"tot": InvariantSpec("tot", "total")},
                 constraints={"total": ConstraintSpec("total", "total", "==", "total"),
                              "no_old_kind3": ConstraintSpec("no_old_kind3", "old * kind3", "==", "zero")})
CENSUS = Census("atlantis", HIERARCHY, (PEOPLE,), units=None)
LEAVES = [(r, p, d) for r, provinces in GEOGRAPHY.items() for p, districts in provinces.items() for d in districts]


def persons_frame(n: int = 400, seed: int = 3) -> pd.DataFrame:
    """Of ``n`` person records drawn over :data:`GEOGRAPHY` (one column per level and per attribute), those
    outside the structural zero ``no_old_kind3`` (the reader refuses a record in it)."""
    rng = np.random.default_rng(seed)
    where = rng.integers(0, len(LEAVES), n)
    frame = pd.DataFrame({"region": [LEAVES[i][0] for i in where], "prov": [LEAVES[i][1] for i in where],
                          "dist": [LEAVES[i][2] for i in where], "sex": rng.integers(0, 2, n).astype(np.int8),
                          "agegroup": rng.choice(["0-17", "18-64", "65+"], n), "kind": rng.integers(0, 4, n)})
    return frame[~((frame["kind"] == 3) & (frame["agegroup"] == "65+"))].reset_index(drop=True)


def codes_frame() -> pd.DataFrame:
    return pd.DataFrame(LEAVES, columns=["Region", "Province", "District"])


# ------------------------------------------------------------------------------------------------- spines

def test_the_us_constants_are_the_us_hierarchys_values():
    assert LEVELS == ("US", "State", "County", "Tract", "Block_Group", "Block") == US_HIERARCHY.names
    assert PREFIX == {"State": 2, "County": 5, "Tract": 11, "Block_Group": 12}
    assert US_HIERARCHY.by_prefix and US_HIERARCHY.us and US_HIERARCHY.state == "State"
    config = load_config("demo")
    assert census_hierarchy(config) == US_HIERARCHY and config.census == default_census()


def test_the_pl94_declaration_states_the_us_hierarchy():
    """conf/census/pl94.toml and US_HIERARCHY state the same levels and widths (geo may not import the loader,
    so the U.S. widths are stated in both places and kept equal here)."""
    assert default_census().hierarchy == US_HIERARCHY


def test_pl94_is_read_as_declared_its_units_product_from_the_unit_records(demo_input, dask_client):
    """P.L. 94-171 is read as every census is: each product's records by ``check_records``, the housing-units
    product (``records = units``) from the unit records, its cells the occupied and vacant housing units."""
    from topdown.pipeline.inputs.tabulate import block_units
    from topdown.pipeline.inputs.validate import check_units

    pl94 = default_census()
    files = dataplane.find_input(demo_input)
    inp = dataplane.read_input(dask_client, files)
    assert set(inp.parts) == {p.name for p in pl94.products}
    parts = dask_client.gather(inp.parts["units"][0])
    counted = pd.concat([pd.DataFrame(p.hist.toarray(), index=p.geoids, columns=["occupied", "vacant"])
                         for p in parts]).groupby(level=0).sum()
    expected = block_units(check_units(files.units[0])[1]).set_index("geoid")[["occupied", "vacant"]]
    expected = expected[expected.sum(axis=1) > 0]
    assert counted.sum().sum() > 0 and (counted.to_numpy() == expected.loc[counted.index].to_numpy()).all()
    assert set(counted.index) == set(expected.index)


def test_a_prefix_hierarchy_of_other_widths():
    h = Hierarchy(levels=(Level("All"), Level("Zone", width=1), Level("Cell", width=3)), geocode="code",
                  pattern=r"[A-Z]\d\d", root_code="ALL")
    spine = standard_spine(pd.Series(["B10", "A02", "A01"]), hierarchy=h)
    assert spine.levels == ["All", "Zone", "Cell"] and spine.state is None and spine.state_index is None
    assert spine.table.to_dict("list") == {"geoid": ["A01", "A02", "B10"], "All": ["ALL"] * 3,
                                           "Zone": ["A", "A", "B"], "Cell": ["A01", "A02", "B10"]}
    with pytest.raises(ValueError, match="'a01' .*declared pattern"):
        standard_spine(pd.Series(["a01"]), hierarchy=h)


def test_a_column_spine_keeps_the_declared_codes(tmp_path):
    spine = build_spine("standard", codes_frame(), hierarchy=HIERARCHY)
    assert spine.levels == ["Nation", "Region", "Province", "District"]
    assert list(spine.table["geoid"]) == sorted(d for _, _, d in LEAVES) == list(spine.table["District"])
    assert set(spine.table["Nation"]) == {"XL"}
    assert spine.parents("Province").to_dict() == {"N-a": "N", "N-bbb": "N", "S9": "SUD"}
    assert spine.fanout("Region").to_dict() == {"N": 2, "SUD": 1}
    spine.to_parquet(tmp_path / "spine.parquet")
    assert spine_state(tmp_path / "spine.parquet") is None  # not the U.S. one: written in the metadata
    back = type(spine).read_parquet(tmp_path / "spine.parquet")
    assert back.levels == spine.levels and back.state is None and back.table.equals(spine.table)


def test_a_code_under_two_parents_is_named_with_both():
    codes = pd.concat([codes_frame(), pd.DataFrame([["SUD", "N-a", "zz"]], columns=["Region", "Province", "District"])])
    with pytest.raises(GeographyError, match=r"level 'Province': code 'N-a' has two parents at level 'Region': "
                                             r"'N' and 'SUD'"):
        column_spine(codes, HIERARCHY)
    twice = pd.concat([codes_frame(), pd.DataFrame([["N", "N-bbb", "c"]], columns=["Region", "Province", "District"])])
    with pytest.raises(GeographyError, match=r"level 'District': code 'c' has two parents .* 'N-a' and 'N-bbb'"):
        column_spine(twice, HIERARCHY)


@pytest.mark.parametrize("change, message", [
    ({"District": ""}, "level 'District': an empty code"),
    ({"District": "ABC"}, "code 'ABC' does not match the declared pattern"),
])
def test_bad_column_codes(change, message):
    codes = codes_frame()
    for column, value in change.items():
        codes.loc[0, column] = value
    with pytest.raises(GeographyError, match=message):
        column_spine(codes, HIERARCHY)


def test_us_spines_need_the_us_hierarchy():
    with pytest.raises(ValueError, match="'aian' is a U.S. spine"):
        build_spine("aian", codes_frame(), hierarchy=HIERARCHY)


def test_a_us_spine_on_another_census_is_a_config_error(tmp_path):
    """A configuration running a non-U.S. census on the AIAN or optimized spine is refused at load (exit 2)."""
    path = _e2e_config(tmp_path, tmp_path / "input")
    config = load_config(path)
    assert census_hierarchy(config).names == HIERARCHY.names and config.census.hierarchy == HIERARCHY
    path.write_text(path.read_text().replace('mode = "test"', 'mode = "test"\nspine = "optimized"'))
    with pytest.raises(ConfigError, match=r"run.spine = 'optimized' is a U.S. spine .*us = false"):
        load_config(path)
    failed = topdown("run", path, "--out", tmp_path / "out", "--workers", "1", timeout=120)
    assert_clean_failure(failed, 2, "run.toml", "run.spine = 'optimized'")
    assert not (tmp_path / "out").exists()


# ----------------------------------------------------------------------------------------- input records

def test_check_records_reads_levels_and_attributes(tmp_path):
    frame = persons_frame()
    frame["ignored"] = 1
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), tmp_path / "persons.parquet")
    leaf, cells, geography = check_records(tmp_path / "persons.parquet", PEOPLE, HIERARCHY)
    assert list(leaf) == list(frame["dist"])
    ages = frame["agegroup"].map({"0-17": 0, "18-64": 1, "65+": 2})
    assert (cells == SCHEMA.cell_index(frame["sex"], ages, frame["kind"])).all()
    assert sorted(map(tuple, geography[["Region", "Province", "District"]].to_numpy())) == sorted(LEAVES)
    kept = Product(schema=SCHEMA, records=Records("persons", where=(("sex", (1,)),)), attributes=ATTRIBUTES)
    leaf1, cells1, _ = check_records(tmp_path / "persons.parquet", kept, HIERARCHY)
    assert len(leaf1) == int((frame["sex"] == 1).sum()) and (SCHEMA.unravel(cells1)[0] == 1).all()


def _write(path: Path, frame: pd.DataFrame) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    pq.write_table(pa.Table.from_pandas(frame, preserve_index=False), path)
    return path


BAD_RECORDS = {
    "missing level column": (lambda f: f.drop(columns="prov"), "column 'prov': required column missing"),
    "null code": (lambda f: f.assign(dist=f["dist"].where(f.index != 5, None)), "column 'dist'"),
    "empty code": (lambda f: f.assign(prov=f["prov"].where(f.index != 5, "")), "column 'prov': empty Province code"),
    "leaf off pattern": (lambda f: f.assign(dist=f["dist"].where(f.index != 5, "X_1")), "column 'dist'"),
    "not nesting": (lambda f: f.assign(prov=f["prov"].where(f["dist"] != "e5", "N-a")),
                    "column 'prov': Province code 'N-a' lies in two Region codes, 'N' and 'SUD'"),
    "undeclared value": (lambda f: f.assign(agegroup=f["agegroup"].where(f.index != 5, "old")),
                         "column 'agegroup'"),
    "code out of range": (lambda f: f.assign(kind=f["kind"].where(f.index != 5, 4)), "column 'kind'"),
    "structural zero": (lambda f: f.assign(kind=f["kind"].where(f.index != 5, 3), agegroup=f["agegroup"].where(
        f.index != 5, "65+")), "a record of persons in structural zero no_old_kind3: age '65+', kind 3 (value 3)"),
}


@pytest.mark.parametrize("case", sorted(BAD_RECORDS))
def test_bad_records_name_file_and_column(tmp_path, case):
    change, fragment = BAD_RECORDS[case]
    path = _write(tmp_path / "persons.parquet", change(persons_frame()))
    with pytest.raises(InputError) as err:
        check_records(path, PEOPLE, HIERARCHY)
    assert str(err.value).startswith(f"{path}: ") and fragment in str(err.value) and "\n" not in str(err.value)


def test_read_input_without_units_builds_the_column_spine(tmp_path, dask_client):
    frame = persons_frame()
    _write(tmp_path / "in" / "persons" / "a.parquet", frame.iloc[:200])
    _write(tmp_path / "in" / "persons" / "b.parquet", frame.iloc[200:])
    files = dataplane.find_input(tmp_path / "in", CENSUS)  # no units file: the census declares none
    assert files.units == () and len(files.persons) == 2
    inp = dataplane.read_input(dask_client, files, CENSUS)
    spine = build_spine("standard", dataplane.input_geography(inp, HIERARCHY), hierarchy=HIERARCHY)
    assert list(spine.table["geoid"]) == sorted(set(frame["dist"]))
    parts = dask_client.gather(inp.parts["people"][0])
    total = sum(int(p.hist.sum()) for p in parts)
    assert total == len(frame)
    assert list(dataplane.block_geoids(inp)) == sorted(set(frame["dist"]))
    # across files: b.parquet puts district 'e5' under province 'N-a', a.parquet under 'S9' (the file named)
    bad = frame.iloc[200:].assign(region="N", prov=lambda f: f["prov"].where(f["dist"] != "e5", "N-a"))
    bad = bad[bad["dist"].isin(["e5", "ab1"])]
    _write(tmp_path / "in" / "persons" / "b.parquet", bad)
    inp = dataplane.read_input(dask_client, dataplane.find_input(tmp_path / "in", CENSUS), CENSUS)
    with pytest.raises(InputError, match=r"persons/a\.parquet: column 'dist': District code 'e5' lies in two Province "
                                         r"codes, 'N-a' and 'S9'"):
        dataplane.input_geography(inp, HIERARCHY)


def test_a_census_with_units_reads_them_with_its_geography(tmp_path, dask_client):
    """Unit records carry the level columns too; a product counting them (with ``where``) reads the units file."""
    rng = np.random.default_rng(5)
    units = persons_frame(120, seed=8)[["region", "prov", "dist"]]  # fewer than 120: records in zeros dropped
    units = units.assign(unit_type=rng.integers(0, 3, len(units)),
                         occupied=lambda f: (f["unit_type"] > 0) | (rng.random(len(units)) < 0.7))
    dwellings = Product(schema=Schema("dwellings", dims=(("occupied", 2),)),
                        records=Records("units", where=(("unit_type", (0,)),)),
                        attributes=(Attribute("occupied", 2, "occupied", values=((False, 0), (True, 1))),))
    census = Census("atlantis", HIERARCHY, (PEOPLE, dwellings), units=Units())
    _write(tmp_path / "persons.parquet", persons_frame())
    _write(tmp_path / "units.parquet", units)
    files = dataplane.find_input(tmp_path, census)
    assert [f.name for f in (*files.persons, *files.units)] == ["persons.parquet", "units.parquet"]
    inp = dataplane.read_input(dask_client, files, census)
    counted = dask_client.gather(inp.parts["dwellings"][0])
    assert sum(int(p.hist.sum()) for p in counted) == int((units["unit_type"] == 0).sum())
    assert sum(int(p.hist[:, 1].sum()) for p in counted) == int(((units["unit_type"] == 0) & units["occupied"]).sum())
    frames = dask_client.gather(inp.units)
    assert sum(int(f[["u0", "u1", "u2"]].to_numpy().sum()) for f in frames) == len(units)
    spine = build_spine("standard", dataplane.input_geography(inp, HIERARCHY), hierarchy=HIERARCHY)
    assert set(spine.table["geoid"]) == set(persons_frame()["dist"]) | set(units["dist"])
    # evaluate's truth counts the product of unit records as the run does, leaf by leaf
    from topdown.pipeline.evaluation.evaluate import load_truth

    truth = load_truth(tmp_path, census).blocks["dwellings"]
    housing = units[units["unit_type"] == 0]
    expected = housing.groupby(["dist", "occupied"]).size()
    assert truth.set_index(["geocode", "cell"])["count"].to_dict() == {
        (dist, int(occupied)): n for (dist, occupied), n in expected.items()}


def test_evaluate_reads_a_declared_truth(tmp_path):
    from topdown.pipeline.evaluation.evaluate import load_truth

    frame = persons_frame()
    _write(tmp_path / "persons.parquet", frame)
    truth = load_truth(tmp_path, CENSUS)
    blocks = truth.blocks["people"]
    assert list(truth.blocks) == ["people"] and int(blocks["count"].sum()) == len(frame)
    assert blocks.groupby("geocode")["count"].sum().to_dict() == frame["dist"].value_counts().to_dict()


def test_a_census_needs_its_record_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="needs persons.parquet, or directories persons/"):
        dataplane.find_input(tmp_path, CENSUS)


def test_unit_checks_follow_the_declared_bounds():
    assert dataplane.unit_bounded(PL94.product("persons")) == "hhgq"
    assert dataplane.unit_bounded(PL94.product("units")) is None
    assert dataplane.unit_bounded(PEOPLE) is None
    bounded = Product(schema=SCHEMA, records=Records("persons"), attributes=ATTRIBUTES,
                      unit_bounds=UnitBounds("kind", (0, 1, 1, 1), (99, 99, 99, 99)))
    assert dataplane.unit_bounded(bounded) == "kind"
    by_type = dataplane.unit_type_matrix(SCHEMA, "kind")
    assert by_type.shape == (SCHEMA.ncells, 4)
    assert (np.asarray(by_type.argmax(axis=1)).ravel() == SCHEMA.unravel(np.arange(SCHEMA.ncells))[2]).all()
    pl94 = dataplane.unit_type_matrix(PERSONS, "hhgq")  # the cells of hhgq k: the k-th 1/8 of the cell index
    assert (np.asarray(pl94.argmax(axis=1)).ravel() == np.arange(PERSONS.ncells) // (PERSONS.ncells // 8)).all()


def test_block_geocodes_of_any_common_width_are_searched_as_numbers():
    spine = pd.Index(["000101", "000102", "120000", "999999"], dtype="str")
    numbers = dataplane._spine_numbers(spine)
    assert isinstance(numbers, np.ndarray) and dataplane._code_width(spine) == 6
    assert dataplane._geoid_strings(numbers, 6).equals(spine)
    assert dataplane._spine_rows(numbers, spine[[3, 0]], 6).tolist() == [3, 0]
    with pytest.raises(ValueError, match="not the input's blocks"):
        dataplane._spine_rows(numbers, pd.Index(["0000101"], dtype="str"), 6)  # 7 digits: not 101
    letters = pd.Index(["ab1", "ab22"], dtype="str")
    assert dataplane._spine_numbers(letters) is letters  # not numbers: searched as strings


# ------------------------------------------------------------------------------------------------- MDF

def _leaf_hist(frame: pd.DataFrame, spine) -> sp.csr_matrix:
    ages = frame["agegroup"].map({"0-17": 0, "18-64": 1, "65+": 2})
    rows = pd.Index(spine.table["geoid"]).get_indexer(frame["dist"])
    cells = SCHEMA.cell_index(frame["sex"], ages, frame["kind"])
    m = sp.csr_matrix((np.ones(len(frame), np.int64), (rows, cells)), shape=(len(spine.table), SCHEMA.ncells))
    m.sum_duplicates()
    return m


def test_generic_mdf_tabulates_back_to_the_leaf_histograms():
    spine = column_spine(codes_frame(), HIERARCHY)
    hist = _leaf_hist(persons_frame(), spine)
    codes = spine.table[spine.levels[1:]]
    mdf = generic_mdf(PEOPLE, codes, hist)
    assert mdf.column_names == ["Region", "Province", "District", RECORD_NUMBER, "sex", "age", "kind"]
    assert mdf.num_rows == hist.sum()
    frame = mdf.to_pandas()
    assert set(frame["sex"].astype(str)) == {"male", "female"} and frame["age"].dtype.kind == "i"
    assert (frame.groupby("District")[RECORD_NUMBER].max() + 1).to_dict() == \
        dict(zip(spine.table["geoid"], np.asarray(hist.sum(axis=1)).ravel()))
    assert set(map(tuple, frame[["Region", "Province", "District"]].drop_duplicates().to_numpy())) <= set(LEAVES)
    tab = tabulate_generic_mdf(frame, PEOPLE, HIERARCHY)
    coo = hist.tocoo()
    want = pd.DataFrame({"geocode": spine.table["geoid"].to_numpy()[coo.row], "cell": coo.col, "count": coo.data})
    assert tab.sort_values(["geocode", "cell"], ignore_index=True).equals(
        want.sort_values(["geocode", "cell"], ignore_index=True).astype(tab.dtypes.to_dict()))


def test_mdf_tasks(monkeypatch):
    us = pd.Index(["440010001001000", "440010001001001", "440030002001000"], dtype="str")
    groups, path = dataplane.mdf_groups(us, US_HIERARCHY)
    assert groups.names == ["44001", "44003"] and path("44001") == "county=44001/part-00000.parquet"
    monkeypatch.setattr(dataplane, "MDF_LEAVES", 3)
    leaves = pd.Index(sorted(d for _, _, d in LEAVES), dtype="str")
    groups, path = dataplane.mdf_groups(leaves, HIERARCHY)
    assert groups.names == ["00000", "00001", "00002"] and path("00001") == "part-00001.parquet"
    assert [list(groups.rows(i)) for i in range(3)] == [[0, 1, 2], [3, 4, 5], [6]]


# ---------------------------------------------------------------------------------------------- verify

class _Reader:
    """What verify_declared reads of a run directory, over hand-made files."""

    def __init__(self, root: Path, constraints: dict[str, list[str]]):
        self.root, self.spine_path, self._constraints = root, root / "spine.parquet", constraints

    def config(self):
        cfg = type("Cfg", (), {"constraints": self._constraints})()
        return type("Config", (), {"product": lambda _, name: cfg})()

    def mdf(self, product: str) -> Path:
        return self.root / "mdf" / product

    def table(self, path: Path) -> pd.DataFrame:
        return pq.read_table(path).to_pandas()


def _declared_run(tmp_path: Path):
    spine = column_spine(codes_frame(), HIERARCHY)
    spine.to_parquet(tmp_path / "spine.parquet")
    frame = persons_frame()
    hist = _leaf_hist(frame, spine)
    (tmp_path / "mdf" / "people").mkdir(parents=True)
    pq.write_table(generic_mdf(PEOPLE, spine.table[spine.levels[1:]], hist), tmp_path / "mdf" / "people" / "part-00000.parquet")
    hists, inv = {}, []
    for level in spine.levels:
        nodes, inverse = np.unique(spine.table[level], return_inverse=True)
        agg = sp.csr_matrix((np.ones(len(inverse)), (inverse, np.arange(len(inverse)))), shape=(len(nodes), len(inverse)))
        coo = (agg @ hist).tocoo()
        hists[level] = pd.DataFrame({"geocode": nodes[coo.row], "cell": coo.col, "count": coo.data.astype(np.int64)})
        inv.append(pd.DataFrame({"level": level, "geocode": nodes,
                                 "tot": np.asarray((agg @ hist).sum(axis=1)).ravel() if level == "Nation" else np.nan}))
    return spine, hists, pd.concat(inv, ignore_index=True)


def test_verify_declared(tmp_path):
    zero = PEOPLE
    spine, hists, inv = _declared_run(tmp_path)
    reader = _Reader(tmp_path, {"District": ["no_old_kind3"]})
    rep = verify.VerifyReport()
    verify.verify_declared(reader, hists, inv, spine.table, rep, True, zero, HIERARCHY)
    assert rep.ok and rep.checks == 2 + 4, rep.failures  # the total, the MDF, the zero at every level
    # a changed total, a broken structural zero and an MDF that no longer matches are each found
    bad_inv = inv.assign(tot=inv["tot"].where(inv["level"] != "Nation", inv["tot"] + 1))
    broken = dict(hists, District=pd.concat([hists["District"], pd.DataFrame(
        {"geocode": ["c"], "cell": [SCHEMA.cell_index(0, 2, 3)], "count": [1]})], ignore_index=True))
    rep = verify.VerifyReport()
    verify.verify_declared(reader, broken, bad_inv, spine.table, rep, True, zero, HIERARCHY)
    assert any("Nation: total differs from its invariant" in f for f in rep.failures)
    assert any("District: structural zero no_old_kind3 broken" in f for f in rep.failures)
    assert any("people MDF does not tabulate back" in f for f in rep.failures)


# ------------------------------------------------------------------------------------- end to end (CLI)

DECLARATION = """
[census]
name = "atlantis"

[census.hierarchy]
pattern = "[a-z]+-?\\\\d*"
root_code = "XL"
us = false
levels = [{ name = "Nation" }, { name = "Region", column = "region" }, { name = "Province", column = "prov" },
          { name = "District", column = "dist" }]

[census.products.people]
records = "persons"
mdf = "generic"
evaluation_queries = ["total", "sex", "age", "detailed"]
uncertainty_queries = ["total", "sex"]

[[census.products.people.attributes]]
name = "sex"
size = 2
column = "sex"
labels = ["male", "female"]

[[census.products.people.attributes]]
name = "age"
size = 3
column = "agegroup"
values = [["0-17", 0], ["18-64", 1], ["65+", 2]]

[[census.products.people.attributes]]
name = "kind"
size = 4
column = "kind"

[census.products.people.invariants]
tot = "total"

[census.products.people.constraints]
total = { query = "total", sense = "==", rhs = "total" }
"""

RUN = """
[run]
name = "atlantis"
census = "{census}"
products = ["people"]
mode = "test"
seed = 11
input = "{input}"

[people.budget]
mechanism = "discrete_gaussian"
rho = "1"

[people.budget.levels]
Nation = "1/4"
Region = "1/4"
Province = "1/4"
District = "1/4"
{queries}
[people.invariants]
Nation = ["tot"]

[people.constraints]
Nation = ["total"]
"""


def _e2e_config(tmp_path: Path, input_dir: Path) -> Path:
    (tmp_path / "atlantis.toml").write_text(DECLARATION)
    queries = "".join(f'[people.budget.queries.{lv}]\n"detailed" = "1/2"\n"sex * age" = "1/2"\n'
                      for lv in HIERARCHY.names)
    queries += "[people.estimation.l2_passes]\n" + "".join(f'{lv} = [["detailed", "sex * age"]]\n' for lv in HIERARCHY.names)
    queries += "[people.estimation.rounder_passes]\n" + "".join(f'{lv} = [["detailed"]]\n' for lv in HIERARCHY.names)
    path = tmp_path / "run.toml"
    path.write_text(textwrap.dedent(RUN).format(census=tmp_path / "atlantis.toml", input=input_dir, queries=queries))
    return path


def test_run_and_verify_a_declared_column_census(tmp_path):
    """``topdown run`` on a 4-level column hierarchy, persons only, no units file; verify OK; histograms
    sum to their parents; the leaf codes are the declared ones; bad geography exits 3 with one line."""
    frame = persons_frame(600)
    _write(tmp_path / "input" / "persons.parquet", frame)
    config = _e2e_config(tmp_path, tmp_path / "input")
    out = tmp_path / "run"
    done = topdown("run", config, "--out", out, "--workers", "1", timeout=600)
    assert done.code == 0, done
    checked = topdown("verify", out, timeout=300)
    assert checked.code == 0, checked
    spine = pq.read_table(out / "spine.parquet").to_pandas()
    assert sorted(spine["District"]) == sorted(set(frame["dist"]))
    hists = {lv: pq.read_table(out / "histograms" / "people" / f"level={lv}").to_pandas() for lv in HIERARCHY.names}
    for parent, child in zip(HIERARCHY.names, HIERARCHY.names[1:]):
        up = spine.drop_duplicates(child).set_index(child)[parent]
        summed = hists[child].assign(geocode=lambda h: h["geocode"].astype(str).map(up)).groupby(
            ["geocode", "cell"])["count"].sum()
        summed = summed[summed != 0].sort_index()
        mine = hists[parent].assign(geocode=lambda h: h["geocode"].astype(str)).set_index(["geocode", "cell"])["count"]
        assert summed.equals(mine[mine != 0].sort_index()), (parent, child)
    assert int(hists["Nation"]["count"].sum()) == len(frame)  # the declared total invariant
    mdf = pq.read_table(out / "mdf" / "people").to_pandas()
    assert set(mdf["District"].astype(str)) <= set(frame["dist"]) and len(mdf) == len(frame)
    assert json.loads((out / "config.json").read_text())["run"]["products"] == ["people"]

    bad = frame.assign(prov=frame["prov"].where(frame["dist"] != "e5", "N-a"))
    _write(tmp_path / "bad" / "persons.parquet", bad)
    failed = topdown("run", _e2e_config(tmp_path, tmp_path / "bad"), "--out", tmp_path / "badrun", "--workers", "1",
                     timeout=300)
    assert_clean_failure(failed, 3, "persons.parquet", "column 'prov'", "'N-a'")
    assert not (tmp_path / "badrun").exists() or not any((tmp_path / "badrun").iterdir())
    missing = frame.drop(columns="region")
    _write(tmp_path / "missing" / "persons.parquet", missing)
    failed = topdown("run", _e2e_config(tmp_path, tmp_path / "missing"), "--out", tmp_path / "missingrun",
                     "--workers", "1", timeout=300)
    assert_clean_failure(failed, 3, "persons.parquet", "column 'region'")
