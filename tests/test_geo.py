"""Tests for topdown.geo: spines, bypassing, custom block groups, BAFs, off-spine distance."""
from __future__ import annotations

import itertools
import json
from pathlib import Path


import numpy as np
import pandas as pd
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topdown.geo.baf import aian_flags, mcds, place_mcd_entity, places, read_baf_dir, target_entities
from topdown.geo.blockgroups import custom_block_groups, gq_signatures
from topdown.geo.distance import off_spine_distances
from topdown.geo.report import spine_command
from topdown.geo.spine import (BLOCK, LEVELS, ROOT, STATE, Spine, aian_spine, build_spine, bypass, check_path_condition,
                               is_sorted, optimized_spine, sorted_factorize, standard_spine)
from conftest import DATA

RI_BAF = DATA / "ri_baf2020"


def geo(tract: str, block: str, county: str = "001", state: str = "44") -> str:
    """A 15-digit block GEOID."""
    return state + county + tract + block


def test_level_roles() -> None:
    """The standard levels and the roles (root, state, block) a spine reads them by."""
    assert tuple(LEVELS) == ("US", "State", "County", "Tract", "Block_Group", "Block")
    spine = standard_spine(pd.Series([geo("000100", "1000"), geo("000200", "2000", county="003")]))
    assert (spine.root, spine.block, spine.levels[spine.state_index]) == (ROOT, BLOCK, STATE) == ("US", "Block", "State")


def test_standard_prefixes() -> None:
    geoids = pd.Series([geo("000100", "2001"), geo("000100", "1000"), geo("000200", "1005", county="003")])
    spine = standard_spine(geoids)
    row = spine.table.set_index("geoid").loc["440010001002001"]
    assert row.to_dict() == {"US": "US", "State": "44", "County": "44001", "Tract": "44001000100",
                             "Block_Group": "440010001002", "Block": "440010001002001"}
    assert list(spine.nodes("Block_Group")) == ["440010001001", "440010001002", "440030002001"]
    assert spine.fanout("County").to_dict() == {"44001": 1, "44003": 1}
    assert spine.parents("Tract").to_dict() == {"44001000100": "44001", "44003000200": "44003"}
    assert spine.budget_levels("Tract", "44001000100") == ("Tract",)
    check_path_condition(spine)


@pytest.mark.parametrize("bad", ["44001000100100", "4400100010010a1", None])
def test_bad_geoid_is_named(bad) -> None:
    with pytest.raises(ValueError, match="not 15 digits"):
        standard_spine(pd.Series([geo("000100", "1000"), bad]))


def test_duplicate_geoid_rejected() -> None:
    with pytest.raises(ValueError, match="appears twice"):
        standard_spine(pd.Series([geo("000100", "1000")] * 2))


def test_nesting_violation_named() -> None:
    table = standard_spine(pd.Series([geo("000100", "1000"), geo("000200", "1000")])).table.copy()
    table["Block_Group"] = "X"
    with pytest.raises(ValueError, match="Block_Group node 'X' has 2 parents at level Tract"):
        Spine(list(LEVELS), table)


def test_aian_split_nests_every_node_in_one_branch() -> None:
    geoids = pd.Series([geo("000100", "1000"), geo("000100", "1001"), geo("000100", "1002"),
                        geo("000200", "1000"), geo("000200", "1001", county="003")])
    aian = pd.Series([True, False, False, True, False], index=geoids)
    spine = aian_spine(geoids, aian, bypass_single_children=False)
    table = spine.table.set_index("geoid")
    assert set(spine.nodes("State")) == {"044", "144"}
    assert table.loc["440010001001000", "Block_Group"] == "1440010001001"
    assert table.loc["440010001001001", "Block_Group"] == "0440010001001"
    assert spine.table["County"].nunique() == 3  # 1-44001, 0-44001, 0-44003
    for level in LEVELS[1:]:
        flags = spine.table.groupby(level)["State"].nunique()
        assert (flags == 1).all(), level
    check_path_condition(spine)


def test_bypass_moves_budget_to_single_child_parents() -> None:
    # County 001: tract 000100 (BG 1: two blocks; BG 2: one block), tract 000200 (BG 1: two blocks).
    geoids = pd.Series([geo("000100", "1000"), geo("000100", "1001"), geo("000100", "2000"),
                        geo("000200", "1000"), geo("000200", "1001")])
    spine = standard_spine(geoids, bypass_single_children=True)
    assert spine.budget_levels("US", "US") == ("US", "State", "County")  # one state, one county
    assert spine.budget_levels("State", "44") == ()
    assert spine.budget_levels("County", "44001") == ()
    assert spine.budget_levels("Tract", "44001000200") == ("Tract", "Block_Group")
    assert spine.budget_levels("Block_Group", "440010002001") == ()
    assert spine.budget_levels("Block_Group", "440010001002") == ("Block_Group", "Block")
    assert spine.budget_levels("Block", "440010001002000") == ()
    assert spine.budget_levels("Block", "440010001001000") == ("Block",)
    assert spine.budget_levels("Tract", "44001000100") == ("Tract",)
    check_path_condition(spine)
    assert bypass(spine).moves == spine.moves  # bypassing twice changes nothing
    assert bypass(spine).moves == spine.moves  # bypassing twice changes nothing


def test_bypass_chain_collapses_to_top() -> None:
    spine = standard_spine(pd.Series([geo("000100", "1000")]), bypass_single_children=True)
    assert spine.budget_levels("US", "US") == tuple(LEVELS)
    assert all(spine.budget_levels(level, spine.table[level].iloc[0]) == () for level in LEVELS[1:])
    check_path_condition(spine)


def test_path_condition_names_offending_block() -> None:
    spine = standard_spine(pd.Series([geo("000100", "1000"), geo("000100", "1001")]))
    broken = Spine(spine.levels, spine.table, {"Tract": {"44001000100": ("Tract", "Block_Group")}})
    with pytest.raises(ValueError, match=r"Block 440010001001000.*'Block_Group': 2"):
        check_path_condition(broken)
    dropped = Spine(spine.levels, spine.table, {"Block": {"440010001001001": ()}})
    with pytest.raises(ValueError, match=r"Block 440010001001001.*'Block': 0"):
        check_path_condition(dropped)


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=60,
                unique=True))
def test_bypass_keeps_path_condition(blocks) -> None:
    geoids = pd.Series([geo(f"00010{t}", f"{g}{b:03d}") for t, g, b in blocks])
    spine = standard_spine(geoids, bypass_single_children=True)
    check_path_condition(spine)
    for level in LEVELS[:-1]:
        fanout = spine.fanout(level)
        child = LEVELS[LEVELS.index(level) + 1]
        for node in fanout[fanout == 1].index:
            only = spine.table.loc[spine.table[level] == node, child].iloc[0]
            assert spine.budget_levels(child, only) == ()
            carried = spine.budget_levels(level, node)
            assert carried == () or (carried[0] == level and child in carried)
            if carried == ():  # moved further up: the node is itself an only child
                assert spine.fanout(LEVELS[LEVELS.index(level) - 1]).loc[spine.parents(level)[node]] == 1


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 2), st.integers(0, 3), st.integers(0, 9)), min_size=1, max_size=60,
                unique=True), st.randoms(use_true_random=False))
def test_budget_codes_are_each_nodes_budget_levels(blocks, rnd) -> None:
    """Spine.budget_codes (every node's budget share at once, levels.shares): the tuple of each node is its
    budget_levels, the tuples are distinct and numbered in order of first appearance, for nodes in any order."""
    geoids = pd.Series([geo(f"00010{t}", f"{g}{b:03d}") for t, g, b in blocks])
    spine = standard_spine(geoids, bypass_single_children=True)
    for level in LEVELS:
        nodes = list(spine.table[level].drop_duplicates())
        rnd.shuffle(nodes)
        codes, keys = spine.budget_codes(level, pd.Index(nodes, dtype="str"))
        assert [keys[c] for c in codes] == [spine.budget_levels(level, g) for g in nodes]
        assert len(set(keys)) == len(keys) and list(dict.fromkeys(codes.tolist())) == list(range(len(keys)))


def test_custom_block_group_size_cap() -> None:
    geoids = pd.Series([geo("000100", f"1{i:03d}") for i in range(100)])
    bg = custom_block_groups(geoids.str[:11], geoids, pd.Series("same", index=geoids.index))
    # cutoff = int(sqrt(100) + 12) = 22, so chunks of 23 consecutive blocks: 23, 23, 23, 23, 8.
    assert bg.value_counts().sort_index().tolist() == [23, 23, 23, 23, 8]
    assert (bg.diff().fillna(0) >= 0).all()


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 1), st.sampled_from("ab"), st.sampled_from(["0000000", "0100000"])),
                min_size=1, max_size=400))
def test_custom_block_groups_never_mix(rows) -> None:
    geoids = pd.Series([geo(f"00010{t}", f"{i:04d}") for i, (t, _, _) in enumerate(rows)])
    entities = pd.DataFrame({"place_mcd": [e for _, e, _ in rows], "aian_area": "9999"}, index=geoids)
    gq = pd.Series([s for _, _, s in rows], index=geoids)
    spine = optimized_spine(geoids, entities, gq, pd.Series(False, index=geoids))
    order = pd.Index(spine.table["geoid"])
    table = spine.table.assign(key=(entities["place_mcd"] + gq).reindex(order).to_numpy())
    assert (table.groupby("Block_Group")["key"].nunique() == 1).all()
    sizes = table.groupby("Block_Group").size()
    tract_size = table.groupby("Tract").size()
    cap = (np.sqrt(tract_size) + 12).astype(int) + 1
    parent = spine.parents("Block_Group")
    assert (sizes <= cap.reindex(parent.reindex(sizes.index)).to_numpy()).all()
    check_path_condition(spine)


def test_gq_signatures() -> None:
    units = pd.DataFrame({"geoid": ["a", "a", "a", "b", "b"], "unit_type": [0, 1, 7, 3, 3],
                          "occupied": [True] * 5})
    sig = gq_signatures(units, pd.Series(["a", "b", "c"]))
    assert sig.to_dict() == {"a": "1000001", "b": "0010000", "c": "0000000"}
    with pytest.raises(ValueError, match="unit_type 9"):
        gq_signatures(pd.DataFrame({"geoid": ["a"], "unit_type": [9]}), pd.Series(["a"]))


def toy_spine() -> Spine:
    """Tract A: BG A1 {b1,b2,b3}, BG A2 {b4,b5}; tract B: BG B1 {b6,b7}; one county."""
    geoids = pd.Series([geo("000001", "1000"), geo("000001", "1001"), geo("000001", "1002")]
                       + [geo("000001", "2000"), geo("000001", "2001"),
                          geo("000002", "1000"), geo("000002", "1001")])
    return standard_spine(geoids)


def test_off_spine_distance_toy() -> None:
    spine = toy_spine()
    b = list(spine.table["geoid"])
    entity = pd.Series({b[0]: "k", b[1]: "k", b[3]: "k", b[4]: "k", b[5]: "k", b[2]: "j", b[6]: "j"})
    distances = off_spine_distances(spine, entity)
    # k = {b1,b2,b4,b5,b6}: tract A - b3 + b6 = 3.  j = {b3, b7}: b3 + b7 = 2.
    assert distances.to_dict() == {"j": 2, "k": 3}
    whole = off_spine_distances(spine, pd.Series("w", index=b))
    assert whole.to_dict() == {"w": 1}
    tract = off_spine_distances(spine, pd.Series({g: "t" for g in b[:5]} | {b[5]: "", b[6]: ""}))
    assert tract.to_dict() == {"t": 1}


def brute_force_distance(spine: Spine, members: set[str]) -> int:
    """Minimal number of on-spine units with coefficients +1/-1 whose signed sum is the entity."""
    units = []
    for level in spine.levels:
        for _, blocks in spine.table.groupby(level)["geoid"]:
            units.append(set(blocks))
    distinct = [set(u) for u in {frozenset(u) for u in units}]
    blocks = list(spine.table["geoid"])
    matrix = np.array([[g in u for g in blocks] for u in distinct], dtype=np.int64)
    target = np.array([g in members for g in blocks], dtype=np.int64)
    best = len(blocks)
    for coefs in itertools.product((-1, 0, 1), repeat=len(distinct)):
        cost = sum(c != 0 for c in coefs)
        if cost < best and np.array_equal(np.array(coefs) @ matrix, target):
            best = cost
    return best


@settings(max_examples=15, deadline=None)
@given(st.lists(st.booleans(), min_size=6, max_size=6))
def test_off_spine_distance_matches_brute_force(flags) -> None:
    geoids = pd.Series([geo("000001", "1000"), geo("000001", "1001"), geo("000001", "2000"),
                        geo("000002", "1000"), geo("000002", "1001"), geo("000002", "1002")])
    spine = standard_spine(geoids)
    members = {g for g, f in zip(geoids, flags) if f}
    if not members:
        return
    entity = pd.Series(["k" if g in members else "" for g in geoids], index=geoids)
    assert off_spine_distances(spine, entity)["k"] == brute_force_distance(spine, members)


def write_baf(directory: Path, entity: str, header: str, rows: list[str]) -> None:
    (directory / f"BlockAssign_ST44_RI_{entity}.txt").write_text("\n".join([header, *rows]) + "\n")


def test_read_baf_dir_and_entities(tmp_path: Path) -> None:
    a, b, c = geo("000100", "1000"), geo("000100", "1001"), geo("000200", "1000", county="003")
    write_baf(tmp_path, "AIANNH", "BLOCKID|AIANNHCE|COMPTYP", [f"{a}|2415|R", f"{b}||", f"{c}||"])
    write_baf(tmp_path, "INCPLACE_CDP", "BLOCKID|PLACEFP", [f"{a}|59000", f"{b}|59000", f"{c}|"])
    write_baf(tmp_path, "MCD", "BLOCKID|COUNTYFP|COUSUBFP", [f"{a}|001|05140", f"{b}|001|05140", f"{c}|003|00000"])
    write_baf(tmp_path, "VTD", "BLOCKID|COUNTYFP|DISTRICT", [f"{a}|001|440101", f"{b}|001|440101", f"{c}|003|"])
    write_baf(tmp_path, "SLDL", "BLOCKID|DISTRICT", [f"{a}|001", f"{b}|002"])
    (tmp_path / "README.txt").write_text("not a BAF")
    baf = read_baf_dir(tmp_path)
    assert list(baf.index) == [a, b, c]
    assert baf.loc[a].to_dict() == {"aiannhce": "2415", "comptyp": "R", "placefp": "59000", "countyfp": "001",
                                    "cousubfp": "05140", "sldl_district": "001", "vtd": "001440101"}
    assert baf.loc[c, "sldl_district"] == "" and baf.loc[c, "vtd"] == ""
    # RI is strong-MCD: MCD outside AIAN areas, place inside.
    assert place_mcd_entity(baf).tolist() == ["P4459000", "M4400105140", ""]
    assert place_mcd_entity(baf, state="06").tolist() == ["P4459000", "P4459000", ""]
    assert target_entities(baf)["aian_area"].tolist() == ["2415", "9999", "9999"]
    assert places(baf).tolist() == ["P4459000", "P4459000", ""]
    assert mcds(baf).tolist() == ["M4400105140", "M4400105140", ""]


def test_read_baf_dir_errors(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError, match="no block assignment files"):
        read_baf_dir(tmp_path)
    write_baf(tmp_path, "CD", "BLOCKID|DISTRICT", [f"{geo('000100', '1000')}|01", "4400100|02"])
    with pytest.raises(ValueError, match="BlockAssign_ST44_RI_CD.txt: row 3 has BLOCKID '4400100'"):
        read_baf_dir(tmp_path)
    write_baf(tmp_path, "CD", "GEOID|DISTRICT", [f"{geo('000100', '1000')}|01"])
    with pytest.raises(ValueError, match="no BLOCKID column"):
        read_baf_dir(tmp_path)


def test_aian_flags_ranges() -> None:
    codes = pd.Series(["", "0001", "4799", "4989", "5000", "7999", "8000", "8999", "9000", "9499", "9500", "9999"])
    assert aian_flags(codes).tolist() == [False, True, True, True, True, True, False, False, True, True,
                                          False, False]
    with pytest.raises(ValueError, match="4990-4999"):
        aian_flags(pd.Series(["4995"], index=["blockX"]))
    with pytest.raises(ValueError, match="not a 4-digit code"):
        aian_flags(pd.Series(["24"]))


def test_build_spine_requires_baf() -> None:
    with pytest.raises(ValueError, match="needs a block assignment file directory"):
        build_spine("optimized", pd.Series([geo("000100", "1000")]))
    with pytest.raises(ValueError, match="unknown spine kind"):
        build_spine("tract_groups", pd.Series([geo("000100", "1000")]))


@pytest.fixture(scope="module")
def ri() -> dict:
    baf = read_baf_dir(RI_BAF)
    geoids = baf.index.to_series()
    return {"baf": baf, "standard": build_spine("standard", geoids),
            "optimized": build_spine("optimized", geoids, RI_BAF)}


def test_ri_spines_nest_and_keep_tabulation_geoids(ri) -> None:
    std, opt = ri["standard"], ri["optimized"]
    assert len(opt.table) == 25_649 and opt.table["geoid"].is_unique
    assert (opt.table["Block"] == opt.table["geoid"]).all()
    assert std.table["Block_Group"].nunique() == 792
    assert opt.table["State"].nunique() == 2  # the Narragansett Reservation (AIANNHCE 2415) splits RI
    assert opt.table["Block_Group"].nunique() > std.table["Block_Group"].nunique()
    for level in LEVELS[1:]:
        assert (opt.table.groupby(level)[LEVELS[LEVELS.index(level) - 1]].nunique() == 1).all()
    check_path_condition(opt)
    entity = target_entities(ri["baf"]).reindex(opt.table["geoid"])
    key = entity["place_mcd"] + entity["aian_area"]
    assert (pd.Series(key.to_numpy()).groupby(opt.table["Block_Group"].to_numpy()).nunique() == 1).all()


def test_ri_block_missing_from_baf_warns(ri) -> None:
    geoids = pd.concat([ri["baf"].index.to_series().iloc[:50], pd.Series(["449999999999999"])])
    with pytest.warns(UserWarning, match="1 of 51 blocks are not in the BAFs"):
        spine = build_spine("aian", geoids, ri["baf"])
    assert spine.table.set_index("geoid").loc["449999999999999", "State"] == "044"


def test_ri_off_spine_distance_reduced(ri) -> None:
    for block_entity in (places(ri["baf"]), mcds(ri["baf"])):
        std = off_spine_distances(ri["standard"], block_entity)
        opt = off_spine_distances(ri["optimized"], block_entity)
        assert len(std) == len(opt) == block_entity[block_entity != ""].nunique()
        assert opt.mean() < std.mean() and opt.median() < std.median()


def test_spine_command_writes_report(tmp_path: Path) -> None:
    units = pd.DataFrame({"geoid": ["440010301001000", "440010301001001", "440010301001002"],
                          "unit_type": [0, 3, 5], "occupied": [True, True, True]})
    units.to_parquet(tmp_path / "units.parquet")
    report = spine_command(RI_BAF, tmp_path / "units.parquet", tmp_path / "out")
    assert json.loads((tmp_path / "out" / "report.json").read_text()) == report
    assert "off-spine distance" in (tmp_path / "out" / "report.txt").read_text()
    spine = Spine.read_parquet(tmp_path / "out" / "spine.parquet")
    assert spine.kind == "optimized" and list(spine.table.columns) == ["geoid", *LEVELS]
    check_path_condition(spine)
    bg = spine.table.set_index("geoid")["Block_Group"]
    assert len({bg["440010301001000"], bg["440010301001001"], bg["440010301001002"]}) == 3  # GQ types isolated
    assert report["block_groups"]["custom"] == spine.table["Block_Group"].nunique()
    for entity in ("place", "mcd"):
        d = report["off_spine_distance"][entity]
        assert d["optimized"]["mean"] < d["standard"]["mean"]


@settings(max_examples=60, deadline=None)
@given(st.lists(st.text(alphabet="0123", min_size=1, max_size=3), min_size=2, max_size=40))
def test_sorted_factorize_equals_pandas_on_sorted_columns_and_declines_unsorted_ones(values):
    """Neighbour comparison gives pd.factorize(sort=True)'s codes and uniques on a sorted column and
    declines (None) an unsorted one, where callers fall back to hashing."""
    column = pd.Series(sorted(values), dtype="str")
    codes, uniques = sorted_factorize(column)
    expected_codes, expected_uniques = pd.factorize(column, sort=True)
    assert codes.tolist() == expected_codes.tolist()
    assert list(uniques) == list(expected_uniques)
    shuffled = pd.Series(values, dtype="str")
    assert (sorted_factorize(shuffled) is None) == (values != sorted(values))
    assert is_sorted(column) and is_sorted(shuffled) == (values == sorted(values))
