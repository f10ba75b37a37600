"""The product registry: each product (persons, units) is one :class:`Product`, registered once in :data:`PRODUCTS`.

A product bundles what the pipeline does differently per product: its histogram schema, the invariants and
constraints it knows and how its constraint right-hand sides are computed per level, how its block
histograms are tabulated from the input, its MDF writer, its verify checks, the rows of its invariants in
the noisy measurement file, and its default evaluation and uncertainty queries. No other module compares a
product name; it looks the product up here. DESIGN.md sketches what a DHC persons product would add.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp

from topdown.vocab.schema import Schema

from topdown.pipeline.configuration.census import PERSONS, UNITS

from .execution.invariants import (PERSON_CONSTRAINTS, PERSON_INVARIANTS, UNIT_COLUMNS, UNIT_CONSTRAINTS, UNIT_INVARIANTS,
                         ConstraintDef, LevelConstraints, person_constraints, unit_constraints)
from .outputs.mdf import person_mdf, unit_mdf
from .inputs.tabulate import block_histograms, units_histograms
from .inputs.validate import PERSON_RECORDS, UNIT_RECORDS
from .outputs.verify import verify_persons, verify_units

#: ``(cfg, levels, level, nodes, child_rhs, child_parent) -> LevelConstraints`` (see invariants.person_constraints).
LevelConstraintsFn = Callable[..., LevelConstraints]


@dataclass(frozen=True)
class Product:
    """One product of a run: everything the pipeline does differently for it."""

    schema: Schema
    invariants: tuple[str, ...]  # invariant names a configuration may declare
    constraints: dict[str, ConstraintDef]  # constraint names a configuration may declare, with query and sense
    level_constraints: LevelConstraintsFn  # right-hand sides of one level from its node frame
    #: The person total ``tot`` is an invariant of this product (US, whole states): state-total group
    #: constraints, ``tot`` and whole-state rows in the invariants file, their verify checks.
    total_invariant: bool
    tabulate: Callable[[pd.DataFrame, pd.DataFrame], pd.DataFrame]  # (persons, units) records -> block histograms
    records: str  # the input records it counts (validate.PERSON_RECORDS or UNIT_RECORDS): how workers tabulate it
    mdf: Callable[[np.ndarray, sp.csr_matrix, pd.DataFrame], pa.Table]  # (geoids, block hist, block units)
    verify: Callable[..., None]  # (reader, level histograms, invariants, spine, report, totals_invariant)
    nmf_invariants: tuple[tuple[str, tuple[str, ...], str], ...]  # (name, invariants columns, query) in the NMF
    evaluation_queries: tuple[str, ...]  # accuracy metrics (evaluate.py; facts 8)
    uncertainty_queries: tuple[str, ...]  # default queries of `topdown uncertainty`

    @property
    def name(self) -> str:
        return self.schema.name

    @property
    def feasibility_queries(self) -> tuple[str, ...]:
        """Per-node answers the feasibility checks (invariants.check_feasible) and the total invariant need."""
        return tuple(sorted({"total"} | {d.query for d in self.constraints.values()}))


def _unit_level_constraints(cfg, levels, level, nodes, child_rhs, child_parent) -> LevelConstraints:
    """The units product's constraints do not depend on the level: the housing-unit count is invariant."""
    return unit_constraints(nodes)


def _unit_mdf(geoids: np.ndarray, hist: sp.csr_matrix, units: pd.DataFrame) -> pa.Table:
    return unit_mdf(geoids, hist, units[UNIT_COLUMNS[1:]].to_numpy().sum(axis=1))


PERSONS_PRODUCT = Product(
    schema=PERSONS,
    invariants=PERSON_INVARIANTS,
    constraints=PERSON_CONSTRAINTS,
    level_constraints=person_constraints,
    total_invariant=True,
    tabulate=lambda persons, units: block_histograms(persons),
    records=PERSON_RECORDS,
    mdf=lambda geoids, hist, units: person_mdf(geoids, hist),
    verify=verify_persons,
    nmf_invariants=(("gqhh_vect", tuple(UNIT_COLUMNS), ""), ("tot", ("tot",), "total")),
    # Tables 9-10 of the paper plus hhgq and the 14-cell race/ethnicity query of facts 8.
    evaluation_queries=("total", "votingage", "hispanic", "hhgq", "cenrace", "hispanic * cenrace",
                        "majorRaces * hispanic", "detailed"),
    uncertainty_queries=("total", "votingage", "hispanic", "cenrace", "hhgq", "votingage * hispanic * cenrace"),
)

UNITS_PRODUCT = Product(
    schema=UNITS,
    invariants=UNIT_INVARIANTS,
    constraints=UNIT_CONSTRAINTS,
    level_constraints=_unit_level_constraints,
    total_invariant=False,
    tabulate=lambda persons, units: units_histograms(units),
    records=UNIT_RECORDS,
    mdf=_unit_mdf,
    verify=verify_units,
    nmf_invariants=(("hu_tot", ("u0",), "total"),),
    evaluation_queries=("total", "occupancy"),
    uncertainty_queries=("total", "occupancy"),
)

#: Every product, by name, in the order runs process and certificates list them.
PRODUCTS: dict[str, Product] = {p.name: p for p in (PERSONS_PRODUCT, UNITS_PRODUCT)}
