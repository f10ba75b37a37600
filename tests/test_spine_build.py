"""The spine built a state at a time on integer codes: the same spines, byte for byte, as the
pandas algorithms they replace (kept here as references), and the same block assignment frame."""
from __future__ import annotations

import hashlib
import io
import shutil
import warnings
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topdown.geo import GeographyError
from topdown.geo.baf import _joined, _read_one, aian_flags, read_baf_dir, target_entities
from topdown.geo.blockgroups import block_group_index, custom_block_groups, gq_signatures
from topdown.geo.spine import Spine, build_spine, bypass, check_path_condition, optimized_spine, standard_spine
from topdown.pipeline.inputs.us_synth import write_us2020

#: SHA-256 of the spines of ``write_us2020(seed=1, scale=0.001)`` (8,216 blocks, 52 states) built by the
#: earlier pandas code (commit 5636007, kept below as the reference): a run's spine hash (--resume checks it) must not move.
PINNED = {"aian": "5c289fce9544938d4e038e97e8cc3c8919fb1a77746169ce6330a927c4be6c30",
          "optimized": "582dcbb82aa48af66c24d9e4303ddcbb728bb4c973cc78a5b561f8d20a412d62"}


@pytest.fixture(scope="module")
def nation(tmp_path_factory) -> Path:
    """The national shape at scale 0.001 (every state, a block per county in the small ones)."""
    out = tmp_path_factory.mktemp("us") / "us1"
    write_us2020(out, seed=1, scale=0.001)
    return out


def _sha(spine: Spine) -> str:
    buf = io.BytesIO()
    spine.to_parquet(buf)
    return hashlib.sha256(buf.getvalue()).hexdigest()


@pytest.mark.parametrize("kind", sorted(PINNED))
def test_national_shape_spines_keep_their_bytes(nation: Path, kind: str) -> None:
    baf = read_baf_dir(nation / "baf")
    units = pq.read_table(nation / "units", columns=["geoid", "unit_type"]).to_pandas()
    spine = build_spine(kind, baf.index.to_series(), baf_dir=baf, units=units)
    assert len(spine.table) == 8216 and spine.table["State"].str[1:].nunique() == 52
    assert _sha(spine) == PINNED[kind]


def test_state_at_a_time_equals_whole_frame(nation: Path) -> None:
    """build_spine's per-state entity codes give the spine optimized_spine gives from whole-frame strings."""
    baf = read_baf_dir(nation / "baf")
    units = pq.read_table(nation / "units", columns=["geoid", "unit_type"]).to_pandas()
    geoids = baf.index.to_series()
    whole = optimized_spine(geoids, target_entities(baf), gq_signatures(units, geoids), aian_flags(baf["aiannhce"]))
    assert _sha(whole) == _sha(build_spine("optimized", geoids, baf_dir=baf, units=units))


def _reference_block_groups(tract: pd.Series, geoid: pd.Series, key: pd.Series, fanout_cutoff: int = 12) -> np.ndarray:
    """The reference: custom_block_groups written with pandas (commit 5636007)."""
    frame = pd.DataFrame({"tract": tract.to_numpy(), "geoid": geoid.to_numpy(), "key": key.to_numpy()})
    frame = frame.sort_values(["tract", "geoid"], kind="stable")
    size = frame.groupby("tract", sort=False)["geoid"].transform("size").to_numpy()
    cutoff = (np.sqrt(size) + fanout_cutoff).astype(np.int64)
    rank = frame.groupby(["tract", "key"], sort=False).cumcount().to_numpy()
    frame["chunk"] = rank // (cutoff + 1)
    first = frame.groupby(["tract", "key", "chunk"], sort=False)["geoid"].transform("min")
    frame["bg"] = first.groupby(frame["tract"]).rank(method="dense").astype(np.int64) - 1
    return frame["bg"].sort_index().to_numpy()


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 3), st.integers(0, 2)), min_size=1, max_size=300),
       st.integers(0, 3), st.randoms(use_true_random=False))
def test_block_group_index_equals_the_pandas_algorithm(rows, cutoff, rnd) -> None:
    order = list(range(len(rows)))
    rnd.shuffle(order)  # blocks in any order; the GEOIDs fix the order inside a tract
    tract = pd.Series([f"t{rows[i][0]}" for i in order])
    geoid = pd.Series([f"{rows[i][0]}{i:05d}" for i in order])
    key = pd.Series([f"k{rows[i][1]}" for i in order])
    expected = _reference_block_groups(tract, geoid, key, cutoff)
    assert custom_block_groups(tract, geoid, key, cutoff).tolist() == expected.tolist()
    by_geoid = np.argsort(geoid.to_numpy())
    codes = block_group_index(pd.factorize(tract[by_geoid])[0], pd.factorize(key[by_geoid])[0], cutoff)
    assert codes.dtype == np.int32 and codes.tolist() == expected[by_geoid].tolist()


def _reference_moves(spine: Spine) -> dict:
    """The reference: bypass written with a pandas groupby (commit 5636007)."""
    moves: dict = {}
    for parent, child in reversed(list(zip(spine.levels, spine.levels[1:]))):
        grouped = spine.table.groupby(parent, sort=False)[child]
        only = grouped.first()[grouped.nunique() == 1]
        parent_moves, child_moves = moves.setdefault(parent, {}), moves.setdefault(child, {})
        for node, only_child in only.items():
            parent_moves[node] = parent_moves.get(node, (parent,)) + child_moves.get(only_child, (child,))
            child_moves[only_child] = ()
    return {lvl: m for lvl, m in moves.items() if m}


@settings(max_examples=40, deadline=None)
@given(st.dictionaries(st.tuples(st.integers(1, 3), st.integers(1, 3), st.integers(1, 2), st.integers(0, 2)),
                       st.booleans(), min_size=1, max_size=60))
def test_bypass_equals_the_groupby_algorithm(rows) -> None:
    """Same moves, in the same order (the order is the spine file's metadata, so its bytes)."""
    blocks = sorted((f"4400{c}00000{t}{g}{b:03d}", flag) for (c, t, g, b), flag in rows.items())
    table = standard_spine(pd.Series([g for g, _ in blocks])).table
    flag = np.array([f for _, f in blocks])
    for level in ("State", "County", "Tract", "Block_Group"):  # an AIAN-like split: not sorted by geocode
        table[level] = np.where(flag, "1", "0") + table[level]
    spine = Spine(list(table.columns[1:]), table)
    result = bypass(spine)
    assert list(result.moves.items()) == list(_reference_moves(spine).items())
    assert all(list(result.moves[k]) == list(v) for k, v in _reference_moves(spine).items())
    check_path_condition(result)


def test_unsorted_child_under_two_parents_is_refused() -> None:
    """The nesting check on codes (a column the AIAN flag leaves unsorted) still names the node."""
    table = standard_spine(pd.Series(["440010001001000", "440010001001001", "440010001002000"])).table
    table["County"] = ["144001", "044001", "144001"]  # Tract 44001000100 under two counties
    table["State"] = ["144", "044", "144"]
    with pytest.raises(GeographyError, match="Tract node '44001000100' has 2 parents at level County"):
        Spine(list(table.columns[1:]), table)


def _whole_join(directory: Path) -> pd.DataFrame:
    """The reference: read_baf_dir's frame joined over every file at once (commit 5636007), before the vtd column."""
    per_entity: dict = {}
    for path in sorted(directory.iterdir()):
        entity = path.name.split("_", 3)[3].split(".")[0]
        per_entity.setdefault(entity, []).append(_read_one(path, entity))
    return _joined(directory, per_entity)


def test_baf_joined_by_state_equals_the_whole_join(nation: Path, tmp_path: Path) -> None:
    """States with different sets of files (no MCD file in one, no AIANNH file in another)."""
    for path in (nation / "baf").iterdir():
        if not (path.name.startswith("BlockAssign_ST02") and "MCD" in path.name
                or path.name.startswith("BlockAssign_ST01") and "AIANNH" in path.name):
            shutil.copy(path, tmp_path / path.name)
    frame = read_baf_dir(tmp_path)
    whole = _whole_join(tmp_path)
    pd.testing.assert_frame_equal(frame, whole.rename_axis("geoid"))
    assert list(frame.columns) == ["placefp", "countyfp", "cousubfp", "aiannhce", "comptyp"]
    assert (frame.loc[frame.index.str[:2] == "02", "cousubfp"] == "").all()


def test_baf_block_in_two_states_files(tmp_path: Path) -> None:
    """A block listed under two states' file names: joined as one row (two entities) or refused (one entity)."""
    header = "BLOCKID|COUNTYFP|COUSUBFP\n"
    (tmp_path / "BlockAssign_ST44_RI_AIANNH.txt").write_text("BLOCKID|AIANNHCE|COMPTYP\n440010001001000|0001|R\n"
                                                            "450010001001000||\n")
    (tmp_path / "BlockAssign_ST45_SC_MCD.txt").write_text(header + "440010001001000|001|00100\n")
    frame = read_baf_dir(tmp_path)
    assert frame.to_dict("index") == {
        "440010001001000": {"aiannhce": "0001", "comptyp": "R", "countyfp": "001", "cousubfp": "00100"},
        "450010001001000": {"aiannhce": "", "comptyp": "", "countyfp": "", "cousubfp": ""}}
    (tmp_path / "BlockAssign_ST44_RI_MCD.txt").write_text(header + "440010001001000|001|00200\n")
    with pytest.raises(GeographyError, match="block 440010001001000 appears twice in the MCD files"):
        read_baf_dir(tmp_path)


def test_units_outside_the_spine_are_counted(nation: Path) -> None:
    """The warning counts the distinct blocks of the units table that the spine lacks (also a malformed one)."""
    baf = read_baf_dir(nation / "baf")
    blocks = baf.index[:50]
    units = pd.DataFrame({"geoid": [blocks[0], blocks[0], "990010001001000", "990010001001000", "x"],
                          "unit_type": [2, 0, 3, 0, 0]})
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        spine = build_spine("optimized", pd.Series(blocks), baf_dir=baf.loc[blocks], units=units)
    assert [str(w.message).split(" blocks")[0] for w in caught] == ["2"]
    assert len(spine.table) == 50
