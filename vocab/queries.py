"""Marginal queries on a histogram schema.

A query name is ``total``, ``detailed``, a dimension name, a recode name, or a cross of these joined by ``" * "``
(as DAS-2020 ``source/programs/schema/schema.py`` names them). Answers are ordered as the Kronecker product over
the schema's axes in schema order, whatever the order in the name. A query is held as one factor per axis (a
level -> group map), so a schema of any size costs only its axes; the answer of any cell is computed when asked
(``Query.groups_at``).
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
    """A (possibly coarsened, possibly partial) marginal query, held as per-axis factors: for each schema
    axis, ``level_maps[axis][level]`` is the level's group in the query's factor on that axis (-1: excluded)
    and ``sizes[axis]`` that factor's number of groups (1 on an axis the query does not split). An answer is
    the row-major index over the factors; no array of the schema's cell count is held unless :attr:`groups`
    is asked for."""

    name: str
    schema: Schema
    level_maps: tuple[np.ndarray, ...]
    sizes: tuple[int, ...]

    @property
    def n_answers(self) -> int:
        return int(np.prod(self.sizes, dtype=np.int64))

    @cached_property
    def key(self) -> tuple:
        """What makes two groupings identical (the same answer for every cell): the per-axis factors."""
        return tuple((lm.tobytes(), size) for lm, size in zip(self.level_maps, self.sizes))

    @property
    def is_identity(self) -> bool:
        """Whether every cell is its own answer (the grouping of ``detailed``)."""
        return all(size == n and np.array_equal(lm, np.arange(n))
                   for lm, size, n in zip(self.level_maps, self.sizes, self.schema.shape))

    @property
    def is_partition(self) -> bool:
        """True if every cell is counted by exactly one answer (sensitivity-1 marginal)."""
        return all(bool((lm >= 0).all()) for lm in self.level_maps)

    def groups_at(self, cells: np.ndarray) -> np.ndarray:
        """int64: the answer counting each of ``cells`` (flat cell indices), -1 where none does."""
        coords = self.schema.unravel(np.asarray(cells, dtype=np.int64))
        idx = [lm[c] for lm, c in zip(self.level_maps, coords)]
        excluded = np.zeros(np.shape(cells), dtype=bool)
        for i in idx:
            excluded |= i < 0
        safe = tuple(np.where(i < 0, 0, i) for i in idx)
        groups = np.ravel_multi_index(safe, self.sizes).astype(np.int64) if safe else np.zeros(0, np.int64)
        groups[excluded] = -1
        return groups

    @cached_property
    def groups(self) -> np.ndarray:
        """int64[ncells]: the answer of every cell (-1: none); a schema-sized array, for small schemas only."""
        groups = self.groups_at(np.arange(self.schema.ncells, dtype=np.int64))
        groups.flags.writeable = False
        return groups

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

    def answer_rows(self, hist: sp.csr_matrix, answers: np.ndarray | None = None) -> np.ndarray:
        """int64[rows, answers]: the answers of each row of an integer sparse histogram matrix, added up from
        its non-zero cells only; only the (sorted, distinct) ``answers`` when given, in their order."""
        hist = sp.csr_matrix(hist)
        n = hist.shape[0]
        g = self.groups_at(hist.indices)
        width = self.n_answers
        if answers is not None:
            g, width = positions(answers, g), np.size(answers)
        keep = g >= 0
        flat = np.zeros(n * width, dtype=np.int64)
        row = np.repeat(np.arange(n, dtype=np.int64), np.diff(hist.indptr))
        np.add.at(flat, row[keep] * width + g[keep], hist.data[keep].astype(np.int64))
        return flat.reshape(n, width)

    def answers_of(self, cells: np.ndarray) -> np.ndarray:
        """The answers (sorted, distinct) that count at least one of ``cells``."""
        g = self.groups_at(cells)
        return np.unique(g[g >= 0])

    def answer_sparse(self, cells: np.ndarray, counts: np.ndarray) -> np.ndarray:
        """Answers for one sparse histogram given as (cells, counts)."""
        g = self.groups_at(np.asarray(cells))
        keep = g >= 0
        return np.bincount(g[keep], weights=np.asarray(counts)[keep], minlength=self.n_answers)


def refinement(fine: Query, coarse: Query) -> tuple[np.ndarray, ...] | None:
    """Per axis, fine factor group -> coarse factor group (-1: the fine answers of that group lie in no coarse
    answer), if every cell ``coarse`` counts is counted by ``fine`` and each fine answer lies in one coarse
    answer or in none; else None. Works on the per-axis factors only (no schema-sized array); the same answer
    as comparing the two queries cell by cell. :func:`coarse_answers` applies it."""
    pairs = list(zip(fine.level_maps, coarse.level_maps, fine.sizes))
    if any(not (lc >= 0).any() for _, lc, _ in pairs):  # the coarse query counts no cell
        return tuple(np.full(nf, -1, dtype=np.int64) for _, _, nf in pairs)
    if any(((lc >= 0) & (lf < 0)).any() for lf, lc, _ in pairs):  # a counted cell the fine query leaves out
        return None
    out = []
    for lf, lc, nf in pairs:
        inside = lf >= 0
        lo = np.full(nf, np.iinfo(np.int64).max)
        hi = np.full(nf, -2, dtype=np.int64)
        np.minimum.at(lo, lf[inside], lc[inside])
        np.maximum.at(hi, lf[inside], lc[inside])
        valid = hi >= 0  # the group has a level the coarse query counts
        if (valid & (lo != hi)).any():  # ... and one it counts elsewhere or not at all
            return None
        out.append(np.where(valid, hi, -1).astype(np.int64))
    return tuple(out)


def coarse_answers(fine: Query, coarse: Query, mapping: tuple[np.ndarray, ...], answers: np.ndarray) -> np.ndarray:
    """The coarse answer each of the fine ``answers`` lies in (-1: none), by a :func:`refinement` mapping."""
    idx = np.unravel_index(np.asarray(answers, dtype=np.int64), fine.sizes)
    parts = [m[i] for m, i in zip(mapping, idx)]
    out = np.ravel_multi_index(tuple(np.maximum(p, 0) for p in parts), coarse.sizes).astype(np.int64)
    for p in parts:
        out[p < 0] = -1
    return out


def positions(sorted_ids: np.ndarray, ids: np.ndarray) -> np.ndarray:
    """int64: the position of each of ``ids`` in the sorted, distinct ``sorted_ids`` (-1: not there)."""
    ids = np.asarray(ids, dtype=np.int64)
    pos = np.searchsorted(sorted_ids, ids)
    ok = pos < np.size(sorted_ids)
    ok[ok] = np.asarray(sorted_ids)[pos[ok]] == ids[ok]
    return np.where(ok, pos, -1).astype(np.int64)


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
    if name == "total":
        return Query(name, schema, tuple(np.zeros(n, dtype=np.int64) for n in schema.shape), (1,) * len(schema.shape))
    if name == "detailed":
        return Query(name, schema, tuple(np.arange(n, dtype=np.int64) for n in schema.shape), schema.shape)
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
        lm.flags.writeable = False
        level_maps.append(lm)
    return Query(name, schema, tuple(level_maps), tuple(sizes))
