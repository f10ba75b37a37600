"""The geographic spine as a table: one row per tabulation block, one column per level (DESIGN.md, the map).

The levels come from a declared :class:`~topdown.vocab.census.Hierarchy`: fixed-width prefixes of one
geocode (the U.S., :data:`US_HIERARCHY`) or one input column per level (:func:`column_spine`). Three kinds
(the Bureau's `source/programs/geographic_spines/define_spines.py` in GitHub
uscensusbureau/DAS_2020_Redistricting_Production_Code, "DAS-2020"; Abowd et al. 2022, sections 7.4-7.5):

* standard: the declared hierarchy (the U.S.: US > State > County > Tract > Block_Group > Block by GEOID
  prefixes);
* aian: every state, county, tract and block group is split into its AIAN part and its non-AIAN part, so
  that each node nests in one branch; node geocodes are prefixed by the AIAN flag ("1" or "0");
* optimized: the AIAN split plus custom block groups (``geo.blockgroups``).

The AIAN and optimized spines are U.S. features: only a hierarchy declared ``us = true`` has them.

Bypassing (DAS-2020 `optimize_spine.py`, `bypass_geounit`): a parent with exactly one child carries the
child's geolevel budget as well as its own; the child gets none (it is copied from its parent).
``budget_levels`` records these moves. The condition of Theorem 2 (paper, Appendix B) is that along every
root-to-block path each level's budget proportion is used exactly once; ``check_path_condition`` verifies it.
"""
from __future__ import annotations

import copy
import json
import warnings
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from topdown.vocab.census import Hierarchy, Level

from . import GeographyError, one_line
from .baf import aian_flags, read_baf_dir, target_entities
from .blockgroups import FANOUT_CUTOFF, block_group_index, gq_types, read_units

#: The U.S. tabulation hierarchy (DAS-2020 `define_spines.py`), the one place in Python its level names and GEOID
#: prefix widths are stated, for the U.S. features of geo (conf/census/pl94.toml declares the same; geo may not
#: import the declaration loader, so tests/test_hierarchy.py keeps the two equal).
US_HIERARCHY = Hierarchy(
    levels=(Level("US"), Level("State", width=2), Level("County", width=5), Level("Tract", width=11),
            Level("Block_Group", width=12), Level("Block", width=15)),
    geocode="geoid", pattern=r"\d{15}", root_code="US", us=True, state="State")
#: The U.S. hierarchy's level roles: the root (one node), the state level (state totals are invariant there;
#: the AIAN spine splits a state into parts at it) and the block level (one node per block), its levels and
#: the prefix widths of the levels between root and block. Values of :data:`US_HIERARCHY` only.
ROOT, STATE, BLOCK = US_HIERARCHY.root, US_HIERARCHY.state, US_HIERARCHY.leaf
LEVELS = US_HIERARCHY.names
PREFIX = {level.name: level.width for level in US_HIERARCHY.levels[1:-1]}
KINDS = ("standard", "aian", "optimized")
METADATA_KEY = b"topdown.spine"


@dataclass
class Spine:
    """A spine: ``levels`` top-down, ``table`` (geoid + one geocode column per level), budget moves.

    ``moves[level][geocode]`` holds the levels whose budget proportions that node carries when it is not
    just ``(level,)``; see ``budget_levels``.
    """

    levels: list[str]
    table: pd.DataFrame
    moves: dict[str, dict[str, tuple[str, ...]]] = field(default_factory=dict)
    kind: str = "standard"
    #: The level whose totals are whole-state totals (the U.S. hierarchy's; None: a hierarchy without one).
    state: str | None = STATE

    def __post_init__(self) -> None:
        self.levels = list(self.levels)
        missing = [c for c in ["geoid", *self.levels] if c not in self.table.columns]
        if missing:
            raise GeographyError(f"spine table lacks columns {missing}")
        if _has_duplicates(self.table["geoid"]):
            raise GeographyError(f"spine table: {self.levels[-1]} "
                                 f"{self.table['geoid'][self.table['geoid'].duplicated()].iloc[0]} appears twice")
        if self.table[self.levels[0]].nunique() != 1:
            raise GeographyError(f"spine table: the root level {self.levels[0]} must hold one node")
        if _has_duplicates(self.table[self.levels[-1]]):
            raise GeographyError(f"spine table: the {self.levels[-1]} column must be unique per geoid")
        self._check_moves()
        self.check_nesting()

    def _check_moves(self) -> None:
        """The budget moves name the spine's levels only."""
        for level, codes in self.moves.items():
            if level not in self.levels:
                raise GeographyError(f"budget moves name unknown level {level!r}")
            for geocode, carried in codes.items():
                unknown = [c for c in carried if c not in self.levels]
                if unknown:
                    raise GeographyError(f"budget moves of {level} node {geocode!r} name unknown levels {unknown}")

    def check_nesting(self) -> None:
        """Every node has exactly one parent at the level above; raises naming the first offender."""
        for parent, child in zip(self.levels, self.levels[1:]):
            if _nests(self.table[parent], self.table[child]):
                continue
            parents = self.table.groupby(child, sort=False)[parent].nunique()
            bad = parents[parents > 1]
            if len(bad):
                raise GeographyError(f"{child} node {bad.index[0]!r} has {bad.iloc[0]} parents at level {parent}")

    @property
    def root(self) -> str:
        """The root level (one node)."""
        return self.levels[0]

    @property
    def block(self) -> str:
        """The block level (one node per tabulation block)."""
        return self.levels[-1]

    @property
    def state_index(self) -> int | None:
        """Position of the state level in ``levels`` (None for a spine without one)."""
        return self.levels.index(self.state) if self.state in self.levels else None

    def nodes(self, level: str) -> pd.Series:
        """The unique node geocodes at ``level``, sorted."""
        return pd.Series(np.sort(self.table[level].unique()), name=level)

    def parent_level(self, level: str) -> str | None:
        """The level above ``level`` (None for the root)."""
        i = self.levels.index(level)
        return self.levels[i - 1] if i else None

    def child_level(self, level: str) -> str | None:
        """The level below ``level`` (None for the block level)."""
        i = self.levels.index(level)
        return self.levels[i + 1] if i + 1 < len(self.levels) else None

    def parents(self, level: str) -> pd.Series:
        """Parent geocode of every node at ``level`` (indexed by the node's geocode); not for the root."""
        above = self.parent_level(level)
        if above is None:
            raise ValueError(f"{level} is the root level; it has no parents")
        pairs = self.table[[level, above]].drop_duplicates(level)
        return pd.Series(pairs[above].to_numpy(), index=pd.Index(pairs[level].to_numpy(), name=level), name=above)

    def fanout(self, level: str) -> pd.Series:
        """Number of children of every node at ``level`` (not for the block level)."""
        below = self.child_level(level)
        if below is None:
            raise ValueError(f"{level} is the block level; its nodes have no children")
        return self.table.groupby(level)[below].nunique().rename("fanout")

    def budget_levels(self, level: str, geocode: str) -> tuple[str, ...]:
        """Levels whose geolevel budget proportions node (level, geocode) carries (bypassing)."""
        return self.moves.get(level, {}).get(geocode, (level,))

    def budget_codes(self, level: str, geocodes) -> tuple[np.ndarray, list[tuple[str, ...]]]:
        """:meth:`budget_levels` of many nodes at ``level`` at once: a code per node into the distinct tuples of
        levels, numbered in order of first appearance (a national block level has millions of nodes and few
        moved ones)."""
        moved = self.moves.get(level, {})
        if not moved:
            return np.zeros(len(geocodes), dtype=np.int32), [(level,)]
        keys: dict[tuple[str, ...], int] = {(level,): 0}
        moved_codes = np.array([keys.setdefault(c, len(keys)) for c in moved.values()], dtype=np.int64)
        at = pd.Index(list(moved), dtype="str").get_indexer(pd.Index(geocodes, dtype="str"))
        raw = np.where(at >= 0, moved_codes[at], 0)
        found, first, inverse = np.unique(raw, return_index=True, return_inverse=True)
        order = np.argsort(first, kind="stable")  # the distinct codes by first appearance
        rank = np.empty(len(order), dtype=np.int32)
        rank[order] = np.arange(len(order), dtype=np.int32)
        names = list(keys)
        return rank[inverse.ravel()], [names[found[j]] for j in order]

    def to_arrow(self) -> pa.Table:
        """The table (geoid + one column per level) with kind, levels and moves in the schema metadata."""
        table = pa.Table.from_pandas(self.table[["geoid", *self.levels]], preserve_index=False)
        meta = {"kind": self.kind, "levels": self.levels,
                "moves": {lvl: {g: list(c) for g, c in codes.items()} for lvl, codes in self.moves.items()}}
        if self.state != STATE:  # a declared hierarchy's (the U.S. spine's metadata stays as it was)
            meta["state"] = self.state
        return table.replace_schema_metadata({**(table.schema.metadata or {}), METADATA_KEY: json.dumps(meta)})

    def to_parquet(self, path: Path | str) -> None:
        """Write :meth:`to_arrow` (``read_parquet`` reads it back)."""
        pq.write_table(self.to_arrow(), path)

    @classmethod
    def read_parquet(cls, path: Path | str, standard_levels: list[str] | None = None, filesystem=None) -> Spine:
        """Read a spine written by ``to_parquet``; a file without its metadata (a run's spine of an older
        version: the table only) is read as a standard spine of ``standard_levels`` when they are given.
        ``filesystem``: pyarrow's, where ``path`` is not local."""
        try:
            table = pq.read_table(path, filesystem=filesystem)
        except pa.ArrowException as exc:
            raise GeographyError(f"{path}: not a readable spine file ({one_line(exc)})") from None
        raw = (table.schema.metadata or {}).get(METADATA_KEY)
        if raw is None and standard_levels is not None:
            return cls(levels=list(standard_levels), table=table.to_pandas().astype(str), kind="standard")
        if raw is None:
            raise GeographyError(f"{path}: not a spine file (no {METADATA_KEY.decode()} metadata)")
        meta = json.loads(raw)
        moves = {lvl: {g: tuple(c) for g, c in codes.items()} for lvl, codes in meta["moves"].items()}
        return cls(levels=meta["levels"], table=table.to_pandas(), moves=moves, kind=meta["kind"],
                   state=_state(meta))


def _state(meta: dict) -> str | None:
    """The state level a spine's metadata names (written only when it is not the U.S. hierarchy's)."""
    return meta.get("state", STATE)


def spine_state(path: Path | str, filesystem=None) -> str | None:
    """The state level of the spine file at ``path``, from its schema's metadata only (a file of an older
    version, without metadata, is a U.S. spine)."""
    raw = (pq.read_schema(path, filesystem=filesystem).metadata or {}).get(METADATA_KEY)
    return STATE if raw is None else _state(json.loads(raw))


def check_path_condition(spine: Spine) -> None:
    """Theorem 2, condition 4: on every root-to-block path each level's budget is carried exactly once.

    Raises ValueError naming the first offending block and the levels it uses 0 or 2+ times.
    """
    column = {level: j for j, level in enumerate(spine.levels)}
    uses = np.zeros((len(spine.table), len(spine.levels)), dtype=np.int8)  # a level is used at most len(levels) times
    for j, level in enumerate(spine.levels):
        uses[:, j] += 1
        by_carried: dict[tuple[str, ...], list[str]] = {}
        for geocode, carried in spine.moves.get(level, {}).items():
            by_carried.setdefault(carried, []).append(geocode)
        for carried, geocodes in by_carried.items():
            mask = spine.table[level].isin(geocodes).to_numpy()
            uses[mask, j] -= 1
            for other in carried:
                uses[mask, column[other]] += 1
    bad = np.flatnonzero((uses != 1).any(axis=1))
    if len(bad):
        row = bad[0]
        wrong = {level: int(uses[row, j]) for j, level in enumerate(spine.levels) if uses[row, j] != 1}
        raise ValueError(f"{spine.levels[-1]} {spine.table['geoid'].iloc[row]}: the budgets of levels {wrong} "
                         f"(level: times used) break the path condition (each level exactly once)")


def bypass(spine: Spine) -> Spine:
    """Bypass every parent with exactly one child, bottom-up, at every level (DAS-2020 `optimize_spine.py`).

    The parent then carries its own and the child's budget levels (which may already include levels
    moved up from below) and the child carries none. Nodes are visited in the order of their first block
    (on integer codes: no hash table of geocodes per block).
    """
    moves = {level: dict(codes) for level, codes in spine.moves.items()}
    table = spine.table
    child_codes = _appearance_codes(table[spine.levels[-1]])
    for parent, child in reversed(list(zip(spine.levels, spine.levels[1:]))):
        parent_codes = _appearance_codes(table[parent])
        parent_of_child = np.zeros(int(child_codes.max()) + 1, dtype=np.int64)
        parent_of_child[child_codes] = parent_codes  # a child nests in one parent (checked)
        count = np.bincount(parent_of_child, minlength=int(parent_codes.max()) + 1)
        previous = np.maximum.accumulate(np.r_[-1, parent_codes[:-1]])
        first = np.flatnonzero(parent_codes > previous)  # each parent's first block, in code order
        rows = first[count == 1]
        parent_moves, child_moves = moves.setdefault(parent, {}), moves.setdefault(child, {})
        for node, only_child in zip(table[parent].iloc[rows].tolist(), table[child].iloc[rows].tolist()):
            parent_moves[node] = parent_moves.get(node, (parent,)) + child_moves.get(only_child, (child,))
            child_moves[only_child] = ()
        child_codes = parent_codes
    result = copy.copy(spine)  # the same (checked) table
    result.moves = {lvl: m for lvl, m in moves.items() if m}
    result._check_moves()
    check_path_condition(result)
    return result


def _appearance_codes(values: pd.Series) -> np.ndarray:
    """Each value's code, the codes numbering the distinct values in the order of their first row."""
    found = sorted_factorize(values)
    return found[0] if found is not None else pd.factorize(values)[0]


def nesting_problem(codes: pd.DataFrame, hierarchy: Hierarchy) -> tuple[str, str, str, str, str] | None:
    """The first code of ``codes`` (one column per level below the root, named by the level) under two parents,
    top-down, as (level, code, parent level, the two smallest parent codes), or None."""
    names = hierarchy.names
    for parent, child in zip(names[1:], names[2:]):
        pairs = codes[[child, parent]].drop_duplicates()
        twice = pairs[pairs[child].duplicated(keep=False)]
        if len(twice):
            code = min(twice[child])
            first, second = sorted(twice.loc[twice[child] == code, parent])[:2]
            return child, str(code), parent, str(first), str(second)
    return None


def _block_geoids(geoids: pd.Series | pd.Index | list[str], pattern: str | None = US_HIERARCHY.pattern) -> pd.Series:
    """Validated, sorted leaf geocodes (block GEOIDs): each matches ``pattern`` (None: any non-empty string),
    none twice."""
    if isinstance(geoids, (pd.Series, pd.Index)) and geoids.dtype == "str":
        values = pd.Series(geoids.array)  # Arrow strings stay so: no Python object per block
    else:
        values = pd.Series(np.asarray(geoids, dtype=object)).astype(str)
    bad = values[~values.str.fullmatch(pattern or ".+")]
    if len(bad):
        shown = "is not 15 digits" if pattern == US_HIERARCHY.pattern else \
            f"does not match the declared pattern {pattern!r}" if pattern else "is empty"
        raise ValueError(f"block GEOID {bad.iloc[0]!r} (row {bad.index[0]}) {shown}")
    ordered = values if is_sorted(values) else values.sort_values(ignore_index=True)  # an input's are sorted
    if _has_duplicates(ordered):
        raise ValueError(f"block GEOID {values[values.duplicated()].iloc[0]} appears twice")
    return ordered


def is_sorted(values: pd.Series | pd.Index) -> bool:
    """Whether a column without missing values is in increasing order. A string column's neighbours are
    compared in Arrow, in place (pandas' ``is_monotonic_increasing`` over Arrow strings costs about 70 bytes
    a row while it runs)."""
    if values.dtype != "str":
        return bool(values.is_monotonic_increasing)
    arr = pa.array(values.array)
    return not arr.null_count and not pc.any(pc.less(arr[1:], arr[:-1])).as_py()


def sorted_factorize(values: pd.Series | pd.Index) -> tuple[np.ndarray, pd.Index] | None:
    """Each value's code and the unique values, of a string column sorted in increasing order, by comparing
    neighbours (a hash table over a national column costs about 200 bytes a row); None when the column is not
    sorted strings (then use ``pd.factorize``)."""
    if values.dtype != "str" or len(values) < 2 or not is_sorted(values):
        return None
    arr = pa.array(values.array)
    change = pc.not_equal(arr[1:], arr[:-1]).to_numpy(zero_copy_only=False)
    codes = np.zeros(len(arr), dtype=np.int32)  # a national level has 8 M blocks
    np.cumsum(change, out=codes[1:])
    if change.all():  # unique: the values are their own nodes
        return codes, pd.Index(values.array)
    return codes, pd.Index(values.array.take(np.r_[0, np.flatnonzero(change) + 1]))


def _has_duplicates(values: pd.Series) -> bool:
    """Whether a column holds a value twice (without a hash table when it is sorted)."""
    codes = sorted_factorize(values)
    return bool(values.duplicated().any()) if codes is None else len(codes[1]) < len(values)


def _nests(parent: pd.Series, child: pd.Series) -> bool:
    """True when no child value has two parent values (on integer codes; without a hash table when both
    columns are sorted)."""
    child_codes, parent_codes = sorted_factorize(child), sorted_factorize(parent)
    if child_codes is not None and parent_codes is not None:
        same_child = np.diff(child_codes[0]) == 0
        return not (same_child & (np.diff(parent_codes[0]) != 0)).any()
    child_codes, parent_codes = _appearance_codes(child), _appearance_codes(parent)
    first_parent = np.zeros(int(child_codes.max()) + 1 if len(child_codes) else 0, dtype=np.int64)
    first_parent[child_codes[::-1]] = parent_codes[::-1]  # the parent of each child's first row
    return bool((first_parent[child_codes] == parent_codes).all())


def _prefixed_table(geoids: pd.Series, flag: pd.Series | None, hierarchy: Hierarchy = US_HIERARCHY) -> pd.DataFrame:
    """The prefixes per level of a prefix hierarchy, each prefixed by ``flag`` when given; the leaf is the
    geocode itself, the root its ``root_code``."""
    table = {"geoid": geoids, hierarchy.root: pd.Series(hierarchy.root_code, index=geoids.index)}
    for level in hierarchy.levels[1:-1]:
        table[level.name] = geoids.str[:level.width] if flag is None else flag + geoids.str[:level.width]
    table[hierarchy.leaf] = geoids
    return pd.DataFrame(table)


def _aligned_flag(aian: pd.Series, geoids: pd.Series) -> np.ndarray:
    """The AIAN flag (bool) per block; ``aian`` is a boolean Series indexed by geoid."""
    flags = aian if aian.index.equals(pd.Index(geoids)) else aian.reindex(pd.Index(geoids))
    if flags.isna().any():
        raise ValueError(f"no AIAN flag for block {geoids[flags.isna().to_numpy()].iloc[0]}")
    return flags.astype(bool).to_numpy()


def _flag_codes(flag: np.ndarray, geoids: pd.Series) -> pd.Series:
    """The AIAN flag as the prefix of a node's geocode ("1"/"0")."""
    return pd.Series(np.where(flag, "1", "0"), index=geoids.index)


def _numbers(geoids: pd.Series) -> np.ndarray:
    """15-digit block GEOIDs (checked) as int64, in place in Arrow (no Python object per block)."""
    return pc.cast(pa.chunked_array([pa.array(geoids.array)]), pa.int64()).to_numpy()


def _state_rows(numbers: np.ndarray) -> list[tuple[int, int]]:
    """The row range of each state of sorted block GEOID numbers (a state's blocks are consecutive)."""
    state = numbers // 10 ** (15 - PREFIX[STATE])
    cuts = [0, *(np.flatnonzero(state[1:] != state[:-1]) + 1).tolist(), len(numbers)]
    return list(zip(cuts[:-1], cuts[1:]))


def _key_codes(columns: list, n: int) -> np.ndarray:
    """One code per row for the tuple of its values in ``columns`` (equal tuples, equal codes)."""
    codes = np.zeros(n, dtype=np.int64)
    for column in columns:
        values, distinct = pd.factorize(column)
        codes = pd.factorize(codes * len(distinct) + values)[0]
    return codes


def standard_spine(geoids: pd.Series | pd.DataFrame, bypass_single_children: bool = False,
                   hierarchy: Hierarchy = US_HIERARCHY) -> Spine:
    """The tabulation spine of ``hierarchy`` (the U.S.: by GEOID prefixes, DAS-2020 `define_spines.py`); optionally bypassed.
    A prefix hierarchy takes the leaf geocodes, a column hierarchy the frame of :func:`column_spine`."""
    if hierarchy.by_prefix:
        table = _prefixed_table(_block_geoids(geoids, hierarchy.pattern), None, hierarchy)
        spine = Spine(list(hierarchy.names), table, kind="standard", state=hierarchy.state)
    else:
        spine = column_spine(geoids, hierarchy)
    return bypass(spine) if bypass_single_children else spine


def column_spine(codes: pd.DataFrame, hierarchy: Hierarchy) -> Spine:
    """The spine of a column hierarchy from ``codes``: one row per leaf (duplicates allowed) and one column per
    level below the root, named by the level, holding its codes (strings of any length and alphabet; the
    leaf level's codes are the blocks' geocodes). Raises :class:`GeographyError` naming the level and the
    code of a missing or empty code, a leaf code off the declared pattern, or a code under two parents."""
    names = list(hierarchy.names)
    missing = [n for n in names[1:] if n not in codes.columns]
    if missing:
        raise GeographyError(f"no codes of level {missing[0]!r} (have {list(codes.columns)})")
    table = codes[names[1:]].drop_duplicates(ignore_index=True)
    for name in names[1:]:
        values = table[name]
        empty = values.isna() | (values.astype(str).str.len() == 0)
        if empty.any():
            raise GeographyError(f"level {name!r}: an empty code (a leaf's {name} code is missing)")
        table[name] = values.astype("str")
    leaf = table[hierarchy.leaf]
    if hierarchy.pattern:
        bad = leaf[~leaf.str.fullmatch(hierarchy.pattern)]
        if len(bad):
            raise GeographyError(f"level {hierarchy.leaf!r}: code {bad.iloc[0]!r} does not match the declared "
                                 f"pattern {hierarchy.pattern!r}")
    problem = nesting_problem(table, hierarchy)
    if problem is not None:
        child, code, parent, first, second = problem
        raise GeographyError(f"level {child!r}: code {code!r} has two parents at level {parent!r}: "
                             f"{first!r} and {second!r} (each code must nest in one parent)")
    table = table.sort_values(hierarchy.leaf, ignore_index=True)
    table.insert(0, hierarchy.root, hierarchy.root_code)
    table.insert(0, "geoid", table[hierarchy.leaf])
    return Spine(names, table, kind="standard", state=hierarchy.state)


def aian_spine(geoids: pd.Series, aian: pd.Series, bypass_single_children: bool = True) -> Spine:
    """The AIAN spine (DAS-2020 `define_spines.py`, `aian_spine`; Abowd et al. 2022, section 7.4): each
    node's geocode is [AIAN flag] + its prefix."""
    geoids = _block_geoids(geoids)
    spine = Spine(list(LEVELS), _prefixed_table(geoids, _flag_codes(_aligned_flag(aian, geoids), geoids)), kind="aian")
    return bypass(spine) if bypass_single_children else spine


def optimized_spine(geoids: pd.Series, entities: pd.DataFrame, gq_signature: pd.Series | None,
                    aian: pd.Series, fanout_cutoff: int = FANOUT_CUTOFF,
                    bypass_single_children: bool = True) -> Spine:
    """The optimized spine (DAS-2020 `optimize_spine.py`; Abowd et al. 2022, section 7.5): AIAN split,
    custom block groups, bypassing.

    ``entities`` (indexed by geoid) holds one column per targeted off-spine entity code (production:
    place/MCD and DAS AIAN area); ``gq_signature`` (indexed by geoid) the 7-character GQ signature, or
    None to ignore group quarters. Tracts stay tabulation tracts within each AIAN part (production has
    no tract-group level). The custom block group geocode is the tract's geocode plus a zero-padded
    index, the width being the digits of the largest fan-out.
    """
    geoids = _block_geoids(geoids)
    index = pd.Index(geoids)
    aligned = entities.reindex(index)
    if aligned.isna().any(axis=None):
        raise ValueError(f"no off-spine entity codes for block {geoids[aligned.isna().any(axis=1).to_numpy()].iloc[0]}")
    columns = [aligned[column].astype(str) for column in aligned.columns]
    if gq_signature is not None:
        signature = gq_signature.reindex(index)
        if signature.isna().any():
            raise ValueError(f"no GQ signature for block {geoids[signature.isna().to_numpy()].iloc[0]}")
        columns.append(signature.astype(str))
    return _optimized(geoids, _aligned_flag(aian, geoids), _key_codes(columns, len(geoids)), fanout_cutoff,
                      bypass_single_children)


def _optimized(geoids: pd.Series, flag: np.ndarray, key: np.ndarray, fanout_cutoff: int,
               bypass_single_children: bool) -> Spine:
    """The optimized spine of the sorted, checked ``geoids`` from each block's AIAN flag and intersect entity
    code ``key`` (codes compared within a state only): custom block groups a state at a time, on integer
    codes."""
    numbers = _numbers(geoids)
    bg = np.zeros(len(numbers), dtype=np.int32)
    for start, stop in _state_rows(numbers):
        tract = numbers[start:stop] // 10 ** (15 - PREFIX["Tract"]) * 2 + flag[start:stop]  # AIAN part of a tract
        bg[start:stop] = block_group_index(np.unique(tract, return_inverse=True)[1], key[start:stop], fanout_cutoff)
    del numbers
    table = _prefixed_table(geoids, _flag_codes(flag, geoids))
    width = len(str(int(bg.max()) + 1))
    number = pc.utf8_lpad(pc.cast(pa.array(bg + 1), pa.string()), width=width, padding="0").to_pandas()
    table["Block_Group"] = table["Tract"] + number.set_axis(table.index)
    spine = Spine(list(LEVELS), table, kind="optimized")
    return bypass(spine) if bypass_single_children else spine


def _baf_for(geoids: pd.Series, baf_dir: Path | str | pd.DataFrame | None, kind: str) -> pd.DataFrame:
    """BAF rows for ``geoids``; blocks missing from the BAF are "not in any area" (with a warning)."""
    if baf_dir is None:
        raise GeographyError(f"spine kind {kind!r} needs a block assignment file directory (--baf DIR)")
    baf = baf_dir if isinstance(baf_dir, pd.DataFrame) else read_baf_dir(baf_dir)
    source = "the given BAF table" if isinstance(baf_dir, pd.DataFrame) else str(baf_dir)
    if "aiannhce" not in baf.columns:
        raise GeographyError(f"{source}: no AIANNH block assignment file; spine kind {kind!r} needs it")
    index = pd.Index(_block_geoids(geoids), name="geoid")
    if baf.index.equals(index):  # the input's blocks are the BAF's: no copy
        return baf.rename_axis("geoid")
    missing = int((~index.isin(baf.index)).sum())
    if missing:
        warnings.warn(f"{missing} of {len(index)} blocks are not in the BAFs of {source}; "
                      f"they are treated as in no AIAN area, place or MCD", stacklevel=3)
    return baf.reindex(index, fill_value="")


def _gq_bits(units: pd.DataFrame, numbers: np.ndarray) -> tuple[np.ndarray, int]:
    """Per block (``numbers``: sorted GEOID numbers), bit t-1 set where it has a GQ facility of type t, and
    the number of distinct blocks of ``units`` that are not among ``numbers``."""
    gq = gq_types(units)
    bits = np.zeros(len(numbers), dtype=np.uint8)
    row, found = _block_rows(gq["geoid"], numbers)
    types = gq["t"].to_numpy().astype(np.int64)[found]
    np.bitwise_or.at(bits, row[found], (1 << (types - 1)).astype(np.uint8))
    return bits, int((~_block_rows(pd.Series(pd.unique(units["geoid"])), numbers)[1]).sum())


def _block_rows(geoids: pd.Series, numbers: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The row of each GEOID among the sorted GEOID ``numbers``, and whether it is there (one that is not 15
    digits is not)."""
    geoid = geoids.astype(str)
    digits = geoid.str.fullmatch(r"\d{15}").to_numpy()
    wanted = np.full(len(geoid), -1, dtype=np.int64)
    wanted[digits] = geoid[digits].astype("int64").to_numpy()
    if not len(numbers):
        return np.zeros(len(wanted), dtype=np.int64), np.zeros(len(wanted), dtype=bool)
    row = np.minimum(np.searchsorted(numbers, wanted), len(numbers) - 1)
    return row, digits & (numbers[row] == wanted)


def build_spine(kind: str, geoids: pd.Series | pd.DataFrame, baf_dir: Path | str | pd.DataFrame | None = None,
                units: pd.DataFrame | Path | str | None = None, hierarchy: Hierarchy = US_HIERARCHY) -> Spine:
    """Build a spine of ``kind`` ("standard", "aian", "optimized") of ``hierarchy`` for the blocks ``geoids``
    (a column hierarchy's: the frame of :func:`column_spine`).

    aian and optimized are U.S. spines (a hierarchy with ``us``); they need ``baf_dir`` (a BAF directory, or a
    frame from ``read_baf_dir``); optimized takes the GQ signature from ``units`` (a units table or the path
    of a units parquet with columns geoid, unit_type, occupied) when given. The optimized spine's entities
    are computed a state at a time; the driver keeps per block a flag and an entity code.
    """
    if kind not in KINDS:
        raise ValueError(f"unknown spine kind {kind!r}; expected one of {KINDS}")
    if kind == "standard":
        return standard_spine(geoids, hierarchy=hierarchy)
    if not hierarchy.us:
        raise ValueError(f"spine kind {kind!r} is a U.S. spine; this census's hierarchy is not the U.S. one")
    baf = _baf_for(geoids, baf_dir, kind)
    if kind == "aian":
        return aian_spine(baf.index.to_series(), aian_flags(baf["aiannhce"]))
    if isinstance(units, (str, Path)):
        units = read_units(units)
    blocks = _block_geoids(baf.index.to_series())
    numbers = _numbers(blocks)
    bits = None
    if units is not None:
        bits, outside = _gq_bits(units, numbers)
        if outside:
            warnings.warn(f"{outside} blocks of the units table are not among the spine's blocks; "
                          f"their GQ facilities are ignored", stacklevel=2)
    flag = np.zeros(len(blocks), dtype=bool)
    key = np.zeros(len(blocks), dtype=np.int64)
    for start, stop in _state_rows(numbers):
        part = baf.iloc[start:stop]
        flag[start:stop] = aian_flags(part["aiannhce"]).to_numpy()
        entities = target_entities(part)
        columns = [entities[column] for column in entities.columns] + ([] if bits is None else [bits[start:stop]])
        key[start:stop] = _key_codes(columns, stop - start)
        del part, entities, columns
    del numbers, bits
    return _optimized(blocks, flag, key, FANOUT_CUTOFF, True)
