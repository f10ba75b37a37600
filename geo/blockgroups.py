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


def gq_signatures(units: pd.DataFrame, geoids: pd.Series) -> pd.Series:
    """Per block, 7 characters: "1" at position t-1 if the block has a facility of GQ type t
    (optimize_spine.py's first step).

    ``units`` has columns ``geoid`` and ``unit_type`` (0 housing unit, 1..7 GQ types). Blocks without GQ
    facilities (or without units) get "0000000". Indexed by ``geoids``.
    """
    for column in ("geoid", "unit_type"):
        if column not in units.columns:
            raise GeographyError(f"units table has no column {column!r} (columns: {list(units.columns)})")
    types = pd.to_numeric(units["unit_type"])
    bad = types[(types < 0) | (types > GQ_TYPES)]
    if len(bad):
        raise GeographyError(f"units row {bad.index[0]}: unit_type {bad.iloc[0]} is not in 0..{GQ_TYPES}")
    gq = pd.DataFrame({"geoid": units["geoid"].to_numpy(), "t": types.to_numpy()})
    gq = gq[gq["t"] > 0].drop_duplicates()
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
    frame = pd.DataFrame({"tract": tract.to_numpy(), "geoid": geoid.to_numpy(), "key": key.to_numpy()})
    frame = frame.sort_values(["tract", "geoid"], kind="stable")
    size = frame.groupby("tract", sort=False)["geoid"].transform("size").to_numpy()
    cutoff = (np.sqrt(size) + fanout_cutoff).astype(np.int64)
    rank = frame.groupby(["tract", "key"], sort=False).cumcount().to_numpy()
    frame["chunk"] = rank // (cutoff + 1)
    first = frame.groupby(["tract", "key", "chunk"], sort=False)["geoid"].transform("min")
    frame["bg"] = first.groupby(frame["tract"]).rank(method="dense").astype(np.int64) - 1
    return pd.Series(frame["bg"].sort_index().to_numpy(), index=tract.index, name="custom_bg")
