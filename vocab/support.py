"""The root's cells in play, from published answers of coarse queries (DESIGN.md item 31, "The root").

The root has no parent estimate to say which cells can be non-zero, and its confidential histogram's non-zero
cells are not public. A support computed here is a function of answers the caller passes, which must be
published or differentially private output (e.g. the root's noisy marginals): then anything chosen from it is
post-processing. A cell is kept when, for every given query that counts it, its answer is among that query's
allowed answers. The cells are found axis by axis, never as an array of the declared cell count.
"""
from __future__ import annotations

import numpy as np

from .queries import Query


class SupportError(ValueError):
    """The support (or a partial one, axis by axis) would exceed the limit of cells asked for."""


def answers_above(values: np.ndarray, threshold: float) -> np.ndarray:
    """int64: the answers (sorted) of one node's published answers ``values`` that are above ``threshold``."""
    return np.flatnonzero(np.asarray(values, float) > threshold).astype(np.int64)


def _active(query: Query) -> list[int]:
    """The axes whose level decides the query's answer or whether it counts a cell."""
    return [a for a, (lm, size) in enumerate(zip(query.level_maps, query.sizes)) if size > 1 or (lm < 0).any()]


def support(queries: list[tuple[Query, np.ndarray]], limit: int) -> np.ndarray:
    """int64 (sorted, distinct): the cells c such that, for every ``(query, allowed)``, the query does not
    count c or counts it in one of ``allowed`` (sorted answer ids). All queries must be on one schema.

    Raises :class:`SupportError` when more than ``limit`` candidate cells would be held at any axis.
    """
    if not queries:
        raise ValueError("a support needs at least one query")
    schema = queries[0][0].schema
    last: dict[int, list[tuple[Query, np.ndarray, list[int]]]] = {}
    for q, allowed in queries:
        axes = _active(q)
        if not axes:  # total-like: counts every cell in answer 0
            if not np.isin(0, allowed):
                return np.zeros(0, dtype=np.int64)
            continue
        last.setdefault(axes[-1], []).append((q, np.asarray(allowed, dtype=np.int64), axes))
    coords = np.zeros((1, 0), dtype=np.int64)  # candidates over the axes done so far, row-major order
    for axis, size in enumerate(schema.shape):
        m = coords.shape[0]
        if m * size > limit:
            raise SupportError(f"the support would hold {m * size:,} candidate cells at dimension "
                               f"{schema.dim_names[axis]!r}, above the limit of {limit:,}")
        coords = np.column_stack([np.repeat(coords, size, axis=0),
                                  np.tile(np.arange(size, dtype=np.int64), m)])
        for q, allowed, axes in last.get(axis, ()):
            idx = [q.level_maps[a][coords[:, a]] for a in axes]
            counted = np.ones(coords.shape[0], dtype=bool)
            for i in idx:
                counted &= i >= 0
            sizes = [q.sizes[a] for a in axes]
            group = np.ravel_multi_index(tuple(np.where(i < 0, 0, i) for i in idx), sizes)
            coords = coords[~counted | np.isin(group, allowed)]
    if not coords.shape[0]:
        return np.zeros(0, dtype=np.int64)
    return np.ravel_multi_index(tuple(coords.T), schema.shape).astype(np.int64)
