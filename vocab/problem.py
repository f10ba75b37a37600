"""The contract between the pipeline and the solvers: one parent's children as data.

The pipeline builds a :class:`ParentProblem` per parent (children sorted by geocode) and calls
``topdown.solvers.solve_parent(problem)``, which returns a :class:`ParentSolution`.
"""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Literal

import numpy as np

from .schema import Schema

Sense = Literal["==", "<=", ">="]


@dataclass
class Measurement:
    """Noisy answers of one query for every child of the parent.

    ``values[c, j]`` is child c's noisy answer j; ``variance[c]`` its variance (> 0, used for
    inverse-variance weights). A child that was not measured on this query has ``variance[c] = inf``.
    """

    query: str
    values: np.ndarray  # float64[n_children, n_answers]
    variance: np.ndarray  # float64[n_children]


@dataclass
class Constraint:
    """``query(child c) <sense> rhs[c]`` answer by answer, for every child c.

    Entries of ``rhs`` that are NaN mean "no constraint on this answer for this child".
    """

    name: str
    query: str
    sense: Sense
    rhs: np.ndarray  # float64[n_children, n_answers]


@dataclass
class GroupTotal:
    """The total over several children together is fixed (the AIAN/non-AIAN state-total invariant)."""

    children: np.ndarray  # int64 indices into the children list
    total: int


@dataclass
class ParentProblem:
    """All children of one parent, to be estimated jointly.

    ``parent_hist`` is the parent's already-estimated integer histogram; the children must sum to it
    cell by cell. ``parent_hist is None`` marks the root problem: one "child" (the root node itself),
    no parent equality.
    """

    schema: Schema
    parent: str
    children: list[str]
    parent_hist: np.ndarray | None  # int64[ncells]
    measurements: list[Measurement]
    constraints: list[Constraint] = field(default_factory=list)
    group_totals: list[GroupTotal] = field(default_factory=list)
    l2_passes: list[list[str]] = field(default_factory=list)
    rounder_passes: list[list[str]] = field(default_factory=list)
    tau_slack: float = 0.1
    #: More children than this (0: never) -> two-stage solve through groups of ``split_group`` (split.py).
    split_above: int = 0
    split_group: int = 25

    @property
    def n_children(self) -> int:
        return len(self.children)


@dataclass
class ParentSolution:
    """Integer, non-negative child histograms that sum to the parent and meet every constraint."""

    hist: np.ndarray  # int64[n_children, ncells]
    failsafe: list[str] = field(default_factory=list)  # relaxation steps that were needed, in order
    stats: dict = field(default_factory=dict)  # timings, tau values, solver statuses
