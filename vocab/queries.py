"""Marginal queries on a histogram schema.

A query name is ``total``, ``detailed``, a dimension name, a recode name, or a cross of these joined by ``" * "``
(as DAS-2020 ``source/programs/schema/schema.py`` names them). Answers are ordered as the Kronecker product over
the schema's axes in schema order, whatever the order in the name. Every query is represented by ``groups``: for
each histogram cell, the index of the answer that counts it, or -1 if no answer does.
"""
from __future__ import annotations

from dataclasses import dataclass
from functools import cached_property, lru_cache

import numpy as np
import scipy.sparse as sp

from .schema import Schema

CROSS = " * "


class QueryError(ValueError):
    """An unknown or malformed query name; for an unknown term, the ``term`` and the ``known`` ones."""

    def __init__(self, message: str, term: str | None = None, known: tuple[str, ...] = ()) -> None:
        super().__init__(message)
        self.term, self.known = term, known


@dataclass(frozen=True, eq=False)
class Query:
    """A (possibly coarsened, possibly partial) marginal query."""

    name: str
    schema: Schema
    groups: np.ndarray  # int64[ncells], answer index per cell or -1
    n_answers: int

    @property
    def is_partition(self) -> bool:
        """True if every cell is counted by exactly one answer (sensitivity-1 marginal)."""
        return bool((self.groups >= 0).all())

    def matrix(self) -> sp.csr_matrix:
        """The 0/1 query matrix, n_answers x ncells."""
        cols = np.flatnonzero(self.groups >= 0)
        data = np.ones(cols.size)
        return sp.csr_matrix((data, (self.groups[cols], cols)), shape=(self.n_answers, self.schema.ncells))

    @cached_property
    def _summing(self) -> sp.csr_matrix:
        """The query matrix with int64 entries (integer histograms keep an integer dtype)."""
        return self.matrix().astype(np.int64)

    def answer(self, hist: np.ndarray) -> np.ndarray:
        """Answers for a dense histogram ``hist[..., ncells]`` (any leading shape). Each answer adds its
        cells in cell order, so float answers are the same sums, bit for bit, as a loop over cells."""
        hist = np.asarray(hist)
        dtype = np.result_type(hist.dtype, np.int64)
        lead = hist.shape[:-1]
        flat = hist.reshape(-1, hist.shape[-1]).astype(dtype, copy=False)
        out = np.asarray(self._summing @ flat.T, dtype=dtype).T
        return np.ascontiguousarray(out).reshape(*lead, self.n_answers)

    def answer_rows(self, hist: sp.csr_matrix) -> np.ndarray:
        """int64[rows, answers]: the answers of each row of an integer sparse histogram matrix, added up from
        its non-zero cells only."""
        hist = sp.csr_matrix(hist)
        n = hist.shape[0]
        g = self.groups[hist.indices]
        keep = g >= 0
        flat = np.zeros(n * self.n_answers, dtype=np.int64)
        row = np.repeat(np.arange(n, dtype=np.int64), np.diff(hist.indptr))
        np.add.at(flat, row[keep] * self.n_answers + g[keep], hist.data[keep].astype(np.int64))
        return flat.reshape(n, self.n_answers)

    def answer_sparse(self, cells: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Answers for one sparse histogram given as (cells, counts)."""
        g = self.groups[np.asarray(cells)]
        keep = g >= 0
        return np.bincount(g[keep], weights=np.asarray(counts)[keep], minlength=self.n_answers)


def _axis_factor(schema: Schema, term: str) -> tuple[int, list[tuple[int, ...]]]:
    """The axis a name term acts on and its groups of levels."""
    if term in schema.dim_names:
        axis = schema.axis(term)
        return axis, [(k,) for k in range(schema.dims[axis][1])]
    if term in schema.recodes:
        dim, groups = schema.recodes[term]
        return schema.axis(dim), [tuple(g) for g in groups]
    known = sorted(set(schema.dim_names) | set(schema.recodes) | {"total", "detailed"})
    raise QueryError(f"unknown query term {term!r} for schema {schema.name!r}; known terms: {', '.join(known)}",
                     term, tuple(known))


def canonical_name(name: str) -> str:
    """Normalise spacing around the cross operator."""
    return CROSS.join(part.strip() for part in name.split("*"))


@lru_cache(maxsize=None)
def build_query(schema: Schema, name: str) -> Query:
    """Parse a query name into a :class:`Query` on ``schema``."""
    name = canonical_name(name)
    ncells = schema.ncells
    if name == "total":
        return Query(name, schema, np.zeros(ncells, dtype=np.int64), 1)
    if name == "detailed":
        return Query(name, schema, np.arange(ncells, dtype=np.int64), ncells)
    terms = name.split(CROSS)
    per_axis: dict[int, list[tuple[int, ...]]] = {}
    for term in terms:
        if term in ("total", "detailed"):
            raise QueryError(f"query {name!r}: {term!r} cannot be crossed")
        axis, groups = _axis_factor(schema, term)
        if axis in per_axis:
            raise QueryError(f"query {name!r}: two terms act on dimension {schema.dim_names[axis]!r}")
        per_axis[axis] = groups
    # For each axis: level -> group index within the axis factor (-1 if excluded), and factor size.
    level_maps, sizes = [], []
    for axis, (_, size) in enumerate(schema.dims):
        lm = np.full(size, -1, dtype=np.int64)
        if axis in per_axis:
            for gi, levels in enumerate(per_axis[axis]):
                lm[list(levels)] = gi
            sizes.append(len(per_axis[axis]))
        else:
            lm[:] = 0
            sizes.append(1)
        level_maps.append(lm)
    coords = schema.unravel(np.arange(ncells))
    idx = [lm[c] for lm, c in zip(level_maps, coords)]
    excluded = np.zeros(ncells, dtype=bool)
    for i in idx:
        excluded |= i < 0
    safe = [np.where(i < 0, 0, i) for i in idx]
    groups = np.ravel_multi_index(tuple(safe), tuple(sizes)).astype(np.int64)
    groups[excluded] = -1
    return Query(name, schema, groups, int(np.prod(sizes)))
