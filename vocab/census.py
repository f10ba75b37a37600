"""A census as data: the typed objects a census declaration (a TOML file, docs/reference/census.md) is
resolved into once, at load, and then passed along. No module looks a product or a schema up by its name.

* :class:`Census`: a name, one :class:`Hierarchy` and its :class:`Product` objects in processing order.
* :class:`Hierarchy`: ordered levels (the first is the root, one node; the last the leaf, one node per
  record geography) and how a record's geography maps to each level: fixed-width prefixes of one geocode
  column (the U.S.) or one input column per level (codes of any length and alphabet).
* :class:`Product`: a histogram :class:`~topdown.vocab.schema.Schema` (attributes and recodes), the
  :class:`Records` it counts and how a record maps to its cell, the invariants and constraints it knows
  (a documented vocabulary, :data:`CONSTRAINT_RHS` and :data:`INVARIANT_KINDS`), and its default queries.

This module holds data only; how a product is tabulated, constrained, written and verified is in the
pipeline, driven by these fields.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .schema import Schema

#: What a constraint's right-hand side is, per node (the vocabulary of ``[census.products.P.constraints]``):
#: ``zero`` a structural zero (every answer = 0); ``total`` the node's invariant total (needs the ``total``
#: invariant at that level or below); ``unit_lower`` / ``unit_upper`` the unit-based bounds of
#: :class:`UnitBounds` per answer of the bounded attribute; ``occupied`` the node's occupied housing units;
#: ``housing_units`` the node's housing-unit count; ``unit_counts`` the node's units of each type (a query with
#: one answer per unit type: a unit histogram's records by type).
RhsKind = Literal["zero", "total", "unit_lower", "unit_upper", "occupied", "housing_units", "unit_counts"]
CONSTRAINT_RHS: tuple[str, ...] = ("zero", "total", "unit_lower", "unit_upper", "occupied", "housing_units",
                                   "unit_counts")

#: What an invariant publishes (the vocabulary of ``[census.products.P.invariants]``): ``total`` the node's
#: record total; ``unit_counts`` the units of each type (housing units and GQ facilities); ``unit_total`` their
#: sum; ``housing_units`` the housing-unit count.
InvariantKind = Literal["total", "unit_counts", "unit_total", "housing_units"]
INVARIANT_KINDS: tuple[str, ...] = ("total", "unit_counts", "unit_total", "housing_units")

Sense = Literal["==", "<=", ">="]


@dataclass(frozen=True)
class Attribute:
    """One histogram dimension: ``size`` levels 0..size-1, read from input ``column``.

    ``values`` (optional) maps an input value to a level (for input codes that are not 0..size-1, or
    booleans); without it the column holds the level itself. ``labels`` names the levels (docs, MDF)."""

    name: str
    size: int
    column: str
    labels: tuple[str, ...] | None = None
    values: tuple[tuple[object, int], ...] | None = None


@dataclass(frozen=True)
class Records:
    """An input record file (``<name>.parquet`` or ``<name>/**.parquet``) a product counts, and the records
    of it that it counts: ``where`` keeps records whose column equals one of the listed values."""

    name: str
    where: tuple[tuple[str, tuple[object, ...]], ...] = ()


@dataclass(frozen=True)
class UnitBounds:
    """Unit-based bounds on the answers of ``attribute`` (its levels are the unit types of the units records'
    ``type_column``): persons of type k >= units of type k x ``min_per_unit[k]`` and <= units x ``cap[k]``,
    tightened where the node's total is invariant (docs/reference/census.md)."""

    attribute: str
    min_per_unit: tuple[int, ...]
    cap: tuple[int, ...]


@dataclass(frozen=True)
class ConstraintSpec:
    """A named constraint a configuration may declare at a level: ``query(node) <sense> rhs(node)``."""

    name: str
    query: str
    sense: Sense
    rhs: RhsKind


@dataclass(frozen=True)
class InvariantSpec:
    """A named invariant a configuration may declare at a level."""

    name: str
    kind: InvariantKind


@dataclass(frozen=True)
class EvaluationRoles:
    """Which of a product's queries ``topdown evaluate`` uses for its studies beyond the errors of each query
    (the ``[census.products.P.evaluation]`` table). A study whose role is not declared is left out, and the
    report says so in one line.

    ``diversity_query``: the groups whose shares give each geounit's Blau diversity index (TOTAL error by
    diversity quintile); ``share_query``: the groups whose largest share the off-spine entities compare
    (with ``--entities``); ``sample_queries``: the queries also computed for simple random samples of the
    product's records (accuracy and empirical privacy loss baselines); ``tradeoff_query``: one of them, the
    query of the accuracy / privacy trade-off figure; ``homogeneity``: whether TOTAL's bias is studied against
    the homogeneity index (truly zero cells of the detailed histogram)."""

    diversity_query: str | None = None
    share_query: str | None = None
    sample_queries: tuple[str, ...] = ()
    tradeoff_query: str | None = None
    homogeneity: bool = False


@dataclass(frozen=True)
class Product:
    """One product of a census: everything the pipeline does differently for it, as data."""

    schema: Schema
    records: Records
    attributes: tuple[Attribute, ...]  # in schema dimension order
    invariants: dict[str, InvariantSpec] = field(default_factory=dict)
    constraints: dict[str, ConstraintSpec] = field(default_factory=dict)
    unit_bounds: UnitBounds | None = None
    evaluation_queries: tuple[str, ...] = ("total", "detailed")
    uncertainty_queries: tuple[str, ...] = ("total",)
    evaluation: EvaluationRoles = EvaluationRoles()
    #: The MDF layout: "generic" (geocode per level and one column per attribute) or one of the named layouts
    #: the declaration loader knows (``MDF_LAYOUTS``).
    mdf: str = "generic"

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def total_invariant(self) -> bool:
        """Whether the record total is an invariant this product knows (state totals, the ``tot`` rows)."""
        return any(s.kind == "total" for s in self.invariants.values())

    @property
    def feasibility_queries(self) -> tuple[str, ...]:
        """Per-node answers the feasibility checks and the total invariant need."""
        return tuple(sorted({"total"} | {c.query for c in self.constraints.values()}))


@dataclass(frozen=True)
class Level:
    """One level of a hierarchy: ``width`` characters of the geocode column (prefix hierarchies) or the
    input ``column`` holding its codes (column hierarchies); the root has neither (its one node is named
    ``root_code``)."""

    name: str
    width: int | None = None
    column: str | None = None


@dataclass(frozen=True)
class Hierarchy:
    """Ordered levels, top-down. ``geocode`` names the records' geocode column of a prefix hierarchy (None
    for a column hierarchy); ``pattern`` is a regular expression every leaf geocode must match.
    ``us`` switches on the U.S. features: the AIAN and optimized spines, block assignment files, the State
    level's role (whole-state totals)."""

    levels: tuple[Level, ...]
    geocode: str | None = None
    pattern: str | None = None
    root_code: str = "US"
    us: bool = False
    state: str | None = None  # the level whose totals are whole-state totals on the AIAN spine (U.S. only)

    @property
    def names(self) -> tuple[str, ...]:
        return tuple(level.name for level in self.levels)

    @property
    def root(self) -> str:
        return self.levels[0].name

    @property
    def leaf(self) -> str:
        return self.levels[-1].name

    @property
    def by_prefix(self) -> bool:
        return self.geocode is not None


@dataclass(frozen=True)
class UnitDetail:
    """A detailed code column of the unit records that implies each record's unit type and occupancy:
    ``types[k]`` lists the codes of unit type k, ``vacant`` the codes of vacant housing units (all of type 0).
    The input is checked against it, and replicates rebuild unit records from the MDFs of products that
    count them by it."""

    column: str
    types: tuple[tuple[int, ...], ...]
    vacant: tuple[int, ...] = ()

    def type_of(self, codes) -> np.ndarray:
        """Each code's unit type (-1 for a code no type lists)."""
        codes = np.asarray(codes, dtype=np.int64)
        table = np.full(max(max(t) for t in self.types if t) + 1, -1, np.int64)
        for k, listed in enumerate(self.types):
            table[list(listed)] = k
        inside = (codes >= 0) & (codes < table.size)
        return np.where(inside, table[np.clip(codes, 0, table.size - 1)], -1)


@dataclass(frozen=True)
class Units:
    """The census's unit records (``<name>.parquet``), the source of unit-based invariants and constraints:
    ``type_column`` holds the unit type 0..types-1 (0 housing unit, then group-quarters types in the order of
    the bounded attribute's levels), ``occupied_column`` whether a housing unit is occupied; ``detail`` (or
    None) a code column that implies both."""

    name: str = "units"
    type_column: str = "unit_type"
    types: int = 8
    occupied_column: str = "occupied"
    detail: UnitDetail | None = None


@dataclass(frozen=True)
class Census:
    """A declared census: its hierarchy, its unit records (None: a census without them; then no invariant or
    constraint may depend on units) and its products, in the order runs process them."""

    name: str
    hierarchy: Hierarchy
    products: tuple[Product, ...]
    units: Units | None = None
    source: str = "<memory>"

    def product(self, name: str) -> Product:
        """The product called ``name`` (for the declaration loader and the command line only)."""
        for p in self.products:
            if p.name == name:
                return p
        raise KeyError(f"census {self.name!r} has no product {name!r} (products: "
                       f"{', '.join(p.name for p in self.products)})")


#: The generic MDF layout (one code column per level below the root, the record's number, one column per attribute).
GENERIC_MDF = "generic"

#: The largest histogram a product may declare (cells): 2^31, so that a cell index fits the files' int32. A
#: parent's problem holds its cells in play only; a histogram far above 10^6 cells needs
#: ``[<product>.budget] measure = "in_play"`` and ``root_support`` (DESIGN.md items 30 and 31) to run.
MAX_CELLS = 2**31
#: The most unit types a census may declare (``[census.units] types``): the invariants' unit columns u0..u7.
MAX_UNIT_TYPES = 8
