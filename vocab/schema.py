"""Histogram schemas: named dimensions and recodes (a census declaration's attributes and recodes,
docs/reference/census.md; the schemas themselves are declared in conf/census/, not here).

Cells are flattened row-major (C order) over the dimensions in schema order, so for the P.L. 94-171 persons
``cell = ((hhgq*2 + votingage)*2 + hispanic)*63 + cenrace``.
"""
from __future__ import annotations

import hashlib
from dataclasses import dataclass, field

import numpy as np


@dataclass(frozen=True, eq=False)
class Schema:
    """A histogram schema: named dimensions and named recodes (groupings of a dimension's levels).

    A recode maps a dimension's levels to groups: ``recodes[name] = (dim, groups)`` where ``groups``
    is a tuple of tuples of levels; levels not in any group are excluded from that recode.
    """

    name: str
    dims: tuple[tuple[str, int], ...]
    recodes: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = field(default_factory=dict)

    def _key(self) -> tuple:
        """What makes two schemas equal: name, dimensions and recodes (queries are cached by schema), the
        recodes as a SHA-256 digest so that comparing two copies (a task's unpickled schema against the
        cached one) costs one short comparison."""
        key = self.__dict__.get("_key_cache")
        if key is None:
            recodes = hashlib.sha256(repr(sorted(self.recodes.items())).encode()).hexdigest()
            key = (self.name, self.dims, recodes)
            object.__setattr__(self, "_key_cache", key)
        return key

    def __eq__(self, other: object) -> bool:
        return self is other or (isinstance(other, Schema) and self._key() == other._key())

    def __hash__(self) -> int:
        return hash(self._key())

    @property
    def shape(self) -> tuple[int, ...]:
        return tuple(size for _, size in self.dims)

    @property
    def ncells(self) -> int:
        return int(np.prod(self.shape))

    @property
    def dim_names(self) -> tuple[str, ...]:
        return tuple(name for name, _ in self.dims)

    def axis(self, dim: str) -> int:
        return self.dim_names.index(dim)

    def cell_index(self, *levels: np.ndarray | int) -> np.ndarray | int:
        """Flat cell index of per-dimension levels (vectorized)."""
        return np.ravel_multi_index(tuple(np.asarray(v) for v in levels), self.shape)

    def unravel(self, cells: np.ndarray) -> tuple[np.ndarray, ...]:
        """Per-dimension levels of flat cell indices."""
        return np.unravel_index(np.asarray(cells), self.shape)
