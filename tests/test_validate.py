"""validate_input: one test per kind of bad input; messages name file, column, block and value, never a person
count nor a record's position (a row number in a GEOID-sorted file is a cumulative count of persons)."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from topdown.pipeline.configuration.census import load_census
from topdown.pipeline.configuration.errors import InputError
from topdown.pipeline.inputs.validate import check_units, validate_input

A, B, C = "440070001011000", "440070001011001", "440070002002005"


def _persons() -> pd.DataFrame:
    """A: 41 in households; B: 29 in households + 27 in college housing; C: 23 nursing (18+) + 31 households."""
    rows = [(A, 0, 1, 0, 0)] * 41 + [(B, 0, 1, 1, 5)] * 29 + [(B, 5, 1, 0, 3)] * 27 \
        + [(C, 3, 1, 0, 1)] * 23 + [(C, 0, 0, 0, 6)] * 31
    return pd.DataFrame(rows, columns=["geoid", "hhgq", "votingage", "hispanic", "cenrace"]).astype(
        {"hhgq": "int8", "votingage": "int8", "hispanic": "int8", "cenrace": "int8"})


def _units() -> pd.DataFrame:
    rows = [(A, 0, True)] * 17 + [(A, 0, False)] * 2 + [(B, 0, True)] * 11 + [(B, 5, True)] * 2 \
        + [(C, 0, True)] * 12 + [(C, 3, True)]
    return pd.DataFrame(rows, columns=["geoid", "unit_type", "occupied"]).astype({"unit_type": "int8"})


def _person_counts(persons: pd.DataFrame) -> set[int]:
    """Every tally of persons an error message could leak: total, per block, per block and type, per type."""
    counts = {len(persons)}
    counts |= set(persons.groupby("geoid").size())
    counts |= set(persons.groupby(["geoid", "hhgq"]).size())
    counts |= set(persons.groupby("hhgq").size())
    counts |= set(persons.groupby(["geoid", "votingage"]).size())
    return {int(c) for c in counts if c > 0}


def _write(tmp_path: Path, persons: pd.DataFrame, units: pd.DataFrame) -> tuple[Path, Path]:
    p, u = tmp_path / "persons.parquet", tmp_path / "units.parquet"
    persons.to_parquet(p, index=False)
    units.to_parquet(u, index=False)
    return p, u


def _expect(tmp_path: Path, persons: pd.DataFrame, units: pd.DataFrame, file: str, column: str,
            block: str | None, value: str | None = None) -> str:
    p, u = _write(tmp_path, persons, units)
    with pytest.raises(InputError) as err:
        validate_input(p, u)
    msg = str(err.value)
    assert isinstance(err.value, ValueError)
    assert str(tmp_path / file) in msg
    assert f"column '{column}'" in msg
    assert not re.search(r"\brow\b", msg), msg
    if block is not None:
        assert f"block {block}" in msg
    if value is not None:
        assert f"value {value}" in msg
    # no tally of persons anywhere outside the path and the GEOIDs
    scrubbed = msg.replace(str(tmp_path / file), "").replace(A, "").replace(B, "").replace(C, "")
    numbers = {int(x) for x in re.findall(r"\d+", scrubbed)}
    assert not numbers & _person_counts(_persons()), msg
    return msg


def test_valid_input_returns_compact_frames(tmp_path) -> None:
    p, u = _write(tmp_path, _persons(), _units())
    persons, units = validate_input(p, u)
    assert len(persons) == len(_persons()) and len(units) == len(_units())
    assert pd.api.types.is_string_dtype(persons["geoid"]) and pd.api.types.is_string_dtype(units["geoid"])
    assert all(persons[c].dtype == np.int8 for c in ("hhgq", "votingage", "hispanic", "cenrace"))
    assert units["unit_type"].dtype == np.int8 and units["occupied"].dtype == bool
    assert persons["geoid"].iloc[-1] == C


def test_missing_column(tmp_path) -> None:
    _expect(tmp_path, _persons().drop(columns="cenrace"), _units(), "persons.parquet", "cenrace", None)


def test_wrong_type_codes(tmp_path) -> None:
    persons = _persons().astype({"hhgq": "float64"})
    _expect(tmp_path, persons, _units(), "persons.parquet", "hhgq", None, "0.0")


def test_wrong_type_geoid(tmp_path) -> None:
    units = _units().assign(geoid=lambda f: f["geoid"].astype("int64"))
    _expect(tmp_path, _persons(), units, "units.parquet", "geoid", None, "440070001011000")


def test_wrong_type_occupied(tmp_path) -> None:
    units = _units().assign(occupied=lambda f: f["occupied"].map({True: "yes", False: "no"}))
    _expect(tmp_path, _persons(), units, "units.parquet", "occupied", None, "'yes'")


def test_null(tmp_path) -> None:
    persons = _persons().astype({"hispanic": "Int8"})
    persons.loc[7, "hispanic"] = pd.NA
    _expect(tmp_path, persons, _units(), "persons.parquet", "hispanic", A)


def test_null_geoid(tmp_path) -> None:
    units = _units()
    units.loc[3, "geoid"] = None
    _expect(tmp_path, _persons(), units, "units.parquet", "geoid", None)


def test_out_of_range_code(tmp_path) -> None:
    persons = _persons()
    persons.loc[11, "cenrace"] = 63
    _expect(tmp_path, persons, _units(), "persons.parquet", "cenrace", A, "63")


def test_out_of_range_unit_type(tmp_path) -> None:
    units = _units()
    units.loc[4, "unit_type"] = -1
    _expect(tmp_path, _persons(), units, "units.parquet", "unit_type", A, "-1")


@pytest.mark.parametrize("bad", ["44007000101100", "4400700010110001", "44007000101100x", " 44007000101100"])
def test_malformed_geoid(tmp_path, bad: str) -> None:
    units = _units()
    units.loc[3, "geoid"] = bad
    _expect(tmp_path, _persons(), units, "units.parquet", "geoid", None, repr(bad))


def test_truncated_parquet(tmp_path) -> None:
    p, u = _write(tmp_path, _persons(), _units())
    data = p.read_bytes()
    p.write_bytes(data[: len(data) // 2])
    with pytest.raises(InputError, match=re.escape(str(p)) + ".*not a readable Parquet file"):
        validate_input(p, u)


def test_missing_file(tmp_path) -> None:
    _, u = _write(tmp_path, _persons(), _units())
    with pytest.raises(InputError, match="nope.parquet.*not a readable Parquet file"):
        validate_input(tmp_path / "nope.parquet", u)


def test_household_person_without_housing_unit(tmp_path) -> None:
    units = _units()
    units = units[~((units["geoid"] == C) & (units["unit_type"] == 0))]
    msg = _expect(tmp_path, _persons(), units, "persons.parquet", "hhgq", C, "0")
    assert C in msg and "housing unit" in msg


def test_gq_person_without_facility_of_type(tmp_path) -> None:
    persons = _persons()
    persons.loc[50, "hhgq"] = 7  # a household person of B moved to other noninstitutional GQ
    msg = _expect(tmp_path, persons, _units(), "persons.parquet", "hhgq", B, "7")
    assert B in msg and "type 7" in msg


def test_gq_facility_unoccupied(tmp_path) -> None:
    units = _units()
    units.loc[30, "occupied"] = False  # the first college facility of B
    msg = _expect(tmp_path, _persons(), units, "units.parquet", "occupied", B, "False")
    assert B in msg


def test_nursing_person_under_18(tmp_path) -> None:
    persons = _persons()
    persons.loc[100, "votingage"] = 0  # a nursing resident of C
    msg = _expect(tmp_path, persons, _units(), "persons.parquet", "votingage", C, "0")
    assert C in msg and "nurse_nva_0" in msg


def test_gq_facility_without_resident(tmp_path) -> None:
    units = pd.concat([_units(), pd.DataFrame({"geoid": [A], "unit_type": [4], "occupied": [True]})],
                      ignore_index=True).astype({"unit_type": "int8"})
    msg = _expect(tmp_path, _persons(), units, "units.parquet", "unit_type", A, "4")
    assert A in msg


def test_gq_facilities_outnumber_residents(tmp_path) -> None:
    persons = _persons().drop(index=range(71, 97)).reset_index(drop=True)  # B keeps one college resident
    msg = _expect(tmp_path, persons, _units(), "units.parquet", "unit_type", B, "5")
    assert B in msg


#: A declared census of its own words: ``rel`` is unit-bounded (units of types 0..2), two structural zeros on
#: rel x age (checked together) and one on sex alone.
OWN = {"name": "own", "hierarchy": {"geocode": "cell", "pattern": r"\d{4}", "root_code": "ALL",
                                    "levels": [{"name": "Nation"}, {"name": "Zone", "width": 2}, {"name": "Cell", "width": 4}]},
       "units": {"name": "homes", "type_column": "kind", "types": 3, "occupied_column": "lived_in"},
       "products": {"people": {
           "records": "people",
           "attributes": [{"name": "rel", "size": 3, "column": "relation"},
                          {"name": "age", "size": 4, "labels": ["child", "young", "adult", "old"]},
                          {"name": "sex", "size": 2, "values": [["F", 0], ["M", 1]]}],
           "constraints": {"rel_low": {"query": "rel", "sense": ">=", "rhs": "unit_lower"},
                           "rel_high": {"query": "rel", "sense": "<=", "rhs": "unit_upper"},
                           "no_child_rel1": {"zero_where": {"rel": [1], "age": [0]}},
                           "no_old_rel2": {"zero_where": {"rel": [2], "age": [3]}}},
           "unit_bounds": {"attribute": "rel", "min_per_unit": [0, 2, 1], "cap": [5, 9, 9]}}}}


def _own_people(tmp_path: Path, rows: list[tuple]) -> Path:
    path = tmp_path / "people.parquet"
    pd.DataFrame(rows, columns=["cell", "relation", "age", "sex"]).to_parquet(path, index=False)
    return path


def test_a_declared_census_gets_the_structural_zero_check_in_its_words(tmp_path) -> None:
    """The declared reader refuses a record in any of the census's structural zeros (exit 3), naming the zero,
    its last attribute's column, the block, the value and the levels with their labels; zeros restricting the
    same attributes are checked at once, and the one holding the record is named."""
    from topdown.pipeline.configuration.census import census_from_dict
    from topdown.pipeline.inputs.validate import check_records, zero_checks

    census = census_from_dict(OWN)
    people = census.product("people")
    groups = zero_checks(people)
    assert [(axes, [name for name, _ in zeros]) for axes, _, zeros in groups] == [((0, 1), ["no_child_rel1",
                                                                                            "no_old_rel2"])]
    ok = [("1001", 0, 0, "F"), ("1001", 1, 1, "M"), ("1002", 2, 0, "F")]
    leaf, cells, _ = check_records(_own_people(tmp_path, ok), people, census.hierarchy)
    assert list(leaf) == ["1001", "1001", "1002"] and len(cells) == 3
    path = _own_people(tmp_path, ok + [("1003", 2, 3, "M"), ("1004", 1, 0, "F")])
    with pytest.raises(InputError) as err:
        check_records(path, people, census.hierarchy)
    assert isinstance(err.value, ValueError)  # exit 3
    assert str(err.value) == (f"{path}: column 'age', block 1003: a record of people in structural zero no_old_rel2: "
                              "rel 2, age 3 (old) (value 3)")


def test_unit_bounds_are_checked_in_a_declared_census_words() -> None:
    """block_problem reads the declared bounds (cap and min_per_unit) and names the census's constraints; the
    error names the bounded attribute's column or the units' type column."""
    from topdown.pipeline.configuration.census import census_from_dict
    from topdown.pipeline.inputs.validate import block_problem, raise_block_problem

    census = census_from_dict(OWN)
    people = census.product("people")
    blocks = np.array(["1001", "1002"])
    fine = np.array([[5, 2, 1], [0, 0, 0]]), np.array([[1, 1, 1], [0, 0, 0]])
    assert block_problem(blocks, *fine, people) is None
    homeless = block_problem(blocks, np.array([[1, 0, 0], [0, 0, 1]]), np.array([[1, 0, 0], [0, 0, 0]]), people)
    assert homeless == ("persons", "1002", 2, "the block has no GQ facility of type 2 for this person")
    crowded = block_problem(blocks, np.array([[6, 0, 0], [0, 0, 0]]), np.array([[1, 0, 0], [0, 0, 0]]), people)
    assert crowded[:3] == ("persons", "1001", 0) and "5 each: rel_high" in crowded[3]
    short = block_problem(blocks, np.array([[0, 3, 0], [0, 0, 0]]), np.array([[0, 2, 0], [0, 0, 0]]), people)
    assert short == ("units", "1001", 1, "the block has more GQ facilities of this type than residents of that "
                                         "type (each facility needs 2 residents: rel_low)")
    with pytest.raises(InputError, match=r"^p.parquet: column 'relation', block 1002: .* \(value 2\)$"):
        raise_block_problem(homeless, "p.parquet", "u.parquet", people, census.units)
    with pytest.raises(InputError, match=r"^u.parquet: column 'kind', block 1001: .*rel_low\) \(value 1\)$"):
        raise_block_problem(short, "p.parquet", "u.parquet", people, census.units)


@pytest.mark.parametrize("edit, fragments", [
    ({"unit_type": [0, 0, 2]}, ("column 'unit_type', block 440010001001001", "not the unit type its tenvacgq implies",
                               "(tenvacgq 12)", "(value 2)")),
    ({"occupied": [True, True, True]}, ("column 'occupied', block 440010001001000",
                                        "not the occupancy its tenvacgq implies", "(tenvacgq 4)", "(value True)")),
    ({"tenvacgq": [0, 4, 35]}, ("column 'tenvacgq', block 440010001001001", "a code [census.units.detail] does not "
                                "list", "(value 35)")),
])
def test_unit_records_must_match_the_type_and_occupancy_their_detail_code_implies(tmp_path, edit, fragments) -> None:
    """dhc2020's [census.units.detail]: tenvacgq 0-3 occupied, 4-10 vacant housing units, 11-34 the facilities'
    types; a record whose unit_type or occupied says otherwise, or whose code is not listed, is refused."""
    census = load_census("dhc2020")
    good = {"geoid": ["440010001001001", "440010001001000", "440010001001001"], "unit_type": [0, 0, 1],
            "occupied": [True, False, True], "tenvacgq": [0, 4, 12]}
    path = tmp_path / "units.parquet"
    pd.DataFrame(good).astype({"unit_type": "int8", "tenvacgq": "int8"}).to_parquet(path)
    _, units = check_units(path, hierarchy=census.hierarchy, declared=census.units)
    assert units["unit_type"].tolist() == [0, 0, 1]
    pd.DataFrame({**good, **edit}).astype({"unit_type": "int8", "tenvacgq": "int8"}).to_parquet(path)
    with pytest.raises(InputError) as err:
        check_units(path, hierarchy=census.hierarchy, declared=census.units)
    assert all(f in str(err.value) for f in fragments), str(err.value)
