"""Off-spine entity distance (OSED; DAS-2020 `source/programs/geographic_spines/optimize_spine.py`; Abowd et al. 2022,
section 7.5).

The OSED of an entity k is the minimal number of on-spine geounits added or subtracted to form k. It is
computed bottom-up: for a unit u, ``c_k(u)`` is the cost of forming u's part of k and ``c_notk(u)`` the
cost of forming the rest of u. A block in k has (1, 0), a block outside k (0, 1). At a unit with
children sums ``S_k`` and ``S_notk``: ``c_k = min(S_k, S_notk + 1)`` (either build k's part, or take u and
subtract the rest) and ``c_notk = min(S_k + 1, S_notk)``. The distance is ``c_k`` at the root. (At a
block group this reduces to the Bureau's ``min(a, b+1)`` and ``min(a+1, b)``.)
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from .spine import Spine


def off_spine_distances(spine: Spine, block_entity: pd.Series) -> pd.Series:
    """OSED of every entity in ``block_entity`` (indexed by block geoid; "" or NA = in no entity).

    Returns a Series indexed by entity code (name "entity"), values the distance (int).
    """
    entity = block_entity.reindex(pd.Index(spine.table["geoid"])).fillna("").astype(str).to_numpy()
    inside = entity != ""
    block_level = spine.levels[-1]
    # (node, entity) pairs of the current level that contain blocks of the entity, with (c_k, c_notk).
    pairs = pd.DataFrame({"node": spine.table[block_level].to_numpy()[inside], "entity": entity[inside],
                          "c_k": 1, "c_notk": 0})
    for parent, child in reversed(list(zip(spine.levels, spine.levels[1:]))):
        links = spine.table[[child, parent]].drop_duplicates(child)
        parent_of = pd.Series(links[parent].to_numpy(), index=links[child].to_numpy())
        fanout = links.groupby(parent).size()
        pairs["node"] = parent_of.reindex(pairs["node"].to_numpy()).to_numpy()
        sums = pairs.groupby(["node", "entity"], sort=False).agg(s_k=("c_k", "sum"), s_notk=("c_notk", "sum"),
                                                                 n=("c_k", "size")).reset_index()
        # Children of the parent without blocks of the entity each cost (0, 1).
        s_notk = sums["s_notk"].to_numpy() + fanout.reindex(sums["node"].to_numpy()).to_numpy() - sums["n"].to_numpy()
        s_k = sums["s_k"].to_numpy()
        pairs = pd.DataFrame({"node": sums["node"], "entity": sums["entity"],
                              "c_k": np.minimum(s_k, s_notk + 1), "c_notk": np.minimum(s_k + 1, s_notk)})
    return pd.Series(pairs["c_k"].to_numpy(), index=pd.Index(pairs["entity"].to_numpy(), name="entity"),
                     name="distance").sort_index()
