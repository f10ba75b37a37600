"""Custom block groups of the optimized spine (DAS-2020 `source/programs/geographic_spines/optimize_spine.py`;
Abowd et al. 2022, section 7.5).

Within each tract, blocks sorted by GEOID are grouped by their "intersect entity" (the off-spine entity
codes plus the 7-character GQ signature) and each group is cut into consecutive chunks of at most
``cutoff + 1`` blocks, ``cutoff = int(sqrt(#blocks in the tract) + fanout_cutoff)``. So a custom block
group never mixes two places/MCDs, two AIAN areas, or two GQ-type combinations.
"""
from __future__ import annotations

from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from . import GeographyError, one_line

FANOUT_CUTOFF = 12  # production default (DAS-2020 `table_reader.py`)
GQ_TYPES = 7        # unit types 1..7 are the major GQ types (vocab/schema.py: the hhgq levels)


def read_units(path: Path | str) -> pd.DataFrame:
    """The columns geoid and unit_type of a units Parquet file (what :func:`gq_signatures` reads)."""
    try:
        return pd.read_parquet(path, columns=["geoid", "unit_type"])
    except pa.ArrowException as exc:
        raise GeographyError(f"{path}: not a readable units table with columns geoid and unit_type "
                             f"({one_line(exc)})") from None


def gq_types(units: pd.DataFrame) -> pd.DataFrame:
    """The distinct (geoid, t) of the GQ facilities of ``units`` (columns ``geoid`` and ``unit_type``: 0 housing
    unit, 1..7 GQ types), checked."""
    for column in ("geoid", "unit_type"):
        if column not in units.columns:
            raise GeographyError(f"units table has no column {column!r} (columns: {list(units.columns)})")
    types = pd.to_numeric(units["unit_type"])
    bad = types[(types < 0) | (types > GQ_TYPES)]
    if len(bad):
        raise GeographyError(f"units row {bad.index[0]}: unit_type {bad.iloc[0]} is not in 0..{GQ_TYPES}")
    gq = pd.DataFrame({"geoid": units["geoid"].to_numpy(), "t": types.to_numpy()})
    return gq[gq["t"] > 0].drop_duplicates()


def gq_signatures(units: pd.DataFrame, geoids: pd.Series) -> pd.Series:
    """Per block, 7 characters: "1" at position t-1 if the block has a facility of GQ type t
    (optimize_spine.py's first step).

    ``units`` has columns ``geoid`` and ``unit_type`` (0 housing unit, 1..7 GQ types). Blocks without GQ
    facilities (or without units) get "0000000". Indexed by ``geoids``.
    """
    gq = gq_types(units)
    present = pd.crosstab(gq["geoid"], gq["t"]).reindex(columns=range(1, GQ_TYPES + 1), fill_value=0) > 0
    chars = np.where(present.to_numpy(), "1", "0")
    signature = pd.Series(["".join(row) for row in chars], index=present.index, dtype=str)
    index = pd.Index(geoids, name="geoid")
    return signature.reindex(index, fill_value="0" * GQ_TYPES).rename("gq_signature")


def custom_block_groups(tract: pd.Series, geoid: pd.Series, key: pd.Series,
                        fanout_cutoff: int = FANOUT_CUTOFF) -> pd.Series:
    """Custom block group index (0-based, within the tract) for each block.

    ``tract``, ``geoid`` and ``key`` (the intersect entity) are aligned per block. Custom block groups in
    a tract are numbered in the order of their smallest block GEOID.
    """
    order = np.argsort(geoid.to_numpy(), kind="stable")
    bg = np.empty(len(geoid), dtype=np.int64)
    bg[order] = block_group_index(pd.factorize(tract.to_numpy()[order])[0], pd.factorize(key.to_numpy()[order])[0],
                                  fanout_cutoff)
    return pd.Series(bg, index=tract.index, name="custom_bg")


def block_group_index(tract: np.ndarray, key: np.ndarray, fanout_cutoff: int = FANOUT_CUTOFF) -> np.ndarray:
    """:func:`custom_block_groups` on integer codes: ``tract`` (0..m-1) and ``key`` per block, the blocks in
    increasing GEOID order; the index (int32) of each block's custom block group within its tract."""
    n = len(tract)
    if n == 0:
        return np.zeros(0, dtype=np.int32)
    at = np.arange(n)
    order = np.lexsort((at, key, tract))  # by tract, then key, then GEOID
    t, k = tract[order], key[order]
    run = np.r_[True, (t[1:] != t[:-1]) | (k[1:] != k[:-1])]  # a new (tract, key) group
    rank = at - np.maximum.accumulate(np.where(run, at, 0))
    cutoff = (np.sqrt(np.bincount(tract)[t]) + fanout_cutoff).astype(np.int64)
    chunk = rank // (cutoff + 1)
    starts = np.flatnonzero(run | np.r_[True, chunk[1:] != chunk[:-1]])  # a new chunk: a custom block group
    first, group_tract = order[starts], t[starts]  # its first block (smallest GEOID) and its tract
    by_first = np.lexsort((first, group_tract))
    new_tract = np.r_[True, group_tract[by_first][1:] != group_tract[by_first][:-1]]
    g = np.arange(len(starts))
    number = np.empty(len(starts), dtype=np.int32)
    number[by_first] = g - np.maximum.accumulate(np.where(new_tract, g, 0))
    new_group = np.zeros(n, dtype=bool)
    new_group[starts] = True
    bg = np.empty(n, dtype=np.int32)
    bg[order] = number[np.cumsum(new_group) - 1]
    return bg
