"""Histogram schemas: the person histogram (hhgq x votingage x hispanic x cenrace) and the unit histogram.

Cells are flattened row-major (C order) over the dimensions in schema order, so for persons
``cell = ((hhgq*2 + votingage)*2 + hispanic)*63 + cenrace`` (facts file section 1.1).
"""
from __future__ import annotations

from dataclasses import dataclass, field
from itertools import product

import numpy as np

RACES = ("white", "black", "aian", "asian", "nhpi", "sor")


def _cenrace_combinations() -> tuple[tuple[int, ...], ...]:
    """The 63 race combinations in Census order: 6-bit membership strings, '1' before '0'
    (White most significant), empty string dropped, stable-sorted by number of races."""
    strings = ["".join(bits) for bits in product("10", repeat=6)]
    strings = [s for s in strings if "1" in s]
    strings.sort(key=lambda s: s.count("1"))
    return tuple(tuple(int(b) for b in s) for s in strings)


#: CENRACE_COMBOS[i] is the 6-tuple of membership bits (White, Black, AIAN, Asian, NHPI, SOR) of index i.
CENRACE_COMBOS: tuple[tuple[int, ...], ...] = _cenrace_combinations()
_COMBO_INDEX = {combo: i for i, combo in enumerate(CENRACE_COMBOS)}


def cenrace_index(bits: tuple[int, ...]) -> int:
    """Index 0..62 of a race-membership 6-tuple."""
    return _COMBO_INDEX[tuple(int(b) for b in bits)]


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
        """What makes two schemas equal: name, dimensions and recodes (queries are cached by schema)."""
        key = self.__dict__.get("_key_cache")
        if key is None:
            key = (self.name, self.dims, tuple(sorted(self.recodes.items())))
            object.__setattr__(self, "_key_cache", key)
        return key

    def __eq__(self, other: object) -> bool:
        return isinstance(other, Schema) and self._key() == other._key()

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


def _race_alone_or_combo(r: int) -> tuple[int, ...]:
    return tuple(i for i, c in enumerate(CENRACE_COMBOS) if c[r] == 1)


def _num_races(k: int) -> tuple[int, ...]:
    return tuple(i for i, c in enumerate(CENRACE_COMBOS) if sum(c) == k)


PERSON_RECODES: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {
    "hhinstlevels": ("hhgq", ((0,), (1, 2, 3, 4), (5, 6, 7))),
    "gqlevels": ("hhgq", tuple((k,) for k in range(1, 8))),
    "householdTotal": ("hhgq", ((0,),)),
    "gqTotal": ("hhgq", ((1, 2, 3, 4, 5, 6, 7),)),
    "gqNursingTotal": ("hhgq", ((3,),)),
    "nonvoting": ("votingage", ((0,),)),
    "voting": ("votingage", ((1,),)),
    "majorRaces": ("cenrace", tuple((k,) for k in range(6)) + (tuple(range(6, 63)),)),
    "cenrace_7lev_two_comb": (
        "cenrace",
        ((0,), (1, 6), (2, 7), (3, 8), (4, 9), (5, 10), tuple(range(11, 63))),
    ),
    "numraces": ("cenrace", tuple(_num_races(k) for k in range(1, 7))),
    **{f"{race}Combo": ("cenrace", (_race_alone_or_combo(r),)) for r, race in enumerate(RACES)},
}

#: The P.L. 94-171 person histogram: 8 x 2 x 2 x 63 = 2016 cells.
PERSONS = Schema(
    name="persons",
    dims=(("hhgq", 8), ("votingage", 2), ("hispanic", 2), ("cenrace", 63)),
    recodes=PERSON_RECODES,
)

#: The H1 housing-unit histogram: occupancy, 0 = occupied, 1 = vacant.
UNITS = Schema(name="units", dims=(("occupancy", 2),), recodes={"occupied": ("occupancy", ((0,),)), "vacant": ("occupancy", ((1,),))})

SCHEMAS = {"persons": PERSONS, "units": UNITS}

#: Number of unit types: 0 housing unit, 1..7 the major group-quarters types (same order as hhgq).
N_UNIT_TYPES = 8
HHGQ_LABELS = (
    "Household",
    "Correctional facilities for adults",
    "Juvenile facilities",
    "Nursing facilities/skilled-nursing facilities",
    "Other institutional facilities",
    "College/university student housing",
    "Military quarters",
    "Other noninstitutional facilities",
)
