"""The contract between the pipeline and the solvers: one parent's children as data.

The pipeline builds a :class:`ParentProblem` per parent (children sorted by geocode) and calls
``topdown.solvers.solve_parent(problem)``, which returns a :class:`ParentSolution`.
"""
from __future__ import annotations

from dataclasses import dataclass, field, replace
from functools import cached_property
from typing import Any, Literal

import numpy as np
import scipy.sparse as sp

from .schema import Schema

Sense = Literal["==", "<=", ">="]


@dataclass(frozen=True)
class SparseHist:
    """One integer histogram as its non-zero cells: ``cells`` sorted and distinct, ``counts`` > 0."""

    cells: np.ndarray  # int64[nnz]
    counts: np.ndarray  # int64[nnz]
    ncells: int

    @classmethod
    def of(cls, hist: "SparseHist | np.ndarray | sp.spmatrix") -> "SparseHist":
        """From a dense int64[ncells] vector or a 1 x ncells sparse row (itself if already one)."""
        if isinstance(hist, SparseHist):
            return hist
        if sp.issparse(hist):
            row = sp.csr_matrix(hist)
            row.sum_duplicates()
            keep = row.data != 0
            return cls(row.indices[keep].astype(np.int64), row.data[keep].astype(np.int64), int(row.shape[1]))
        dense = np.asarray(hist).reshape(-1)
        cells = np.flatnonzero(dense)
        return cls(cells.astype(np.int64), dense[cells].astype(np.int64), dense.size)

    @classmethod
    def rows_of(cls, hist: sp.spmatrix) -> list["SparseHist"]:
        """Each row of an integer sparse matrix, from its CSR arrays."""
        csr = sp.csr_matrix(hist)
        csr.sum_duplicates()
        csr.eliminate_zeros()
        cells, counts, ip = csr.indices.astype(np.int64), csr.data.astype(np.int64), csr.indptr
        return [cls(cells[ip[i]:ip[i + 1]], counts[ip[i]:ip[i + 1]], int(csr.shape[1])) for i in range(csr.shape[0])]

    def total(self) -> int:
        return int(self.counts.sum())

    def dense(self) -> np.ndarray:
        """int64[ncells] (a schema-sized array: small schemas and tests only)."""
        out = np.zeros(self.ncells, dtype=np.int64)
        out[self.cells] = self.counts
        return out


@dataclass
class Measurement:
    """Noisy answers of one query for every child of the parent.

    ``values[c, j]`` is child c's noisy answer j; ``variance[c]`` its variance (> 0, used for
    inverse-variance weights). A child that was not measured on this query has ``variance[c] = inf``.
    ``answers`` (sorted, distinct) says which of the query's answers the columns of ``values`` are when
    only some were measured (None: all, in order).
    """

    query: str
    values: np.ndarray  # float64[n_children, n_answers or len(answers)]
    variance: np.ndarray  # float64[n_children]
    answers: np.ndarray | None = None  # int64[m]


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

    ``parent_hist`` is the parent's already-estimated integer histogram (a :class:`SparseHist`, or a dense
    int64[ncells] vector); the children must sum to it cell by cell. ``parent_hist is None`` marks the root
    problem: one "child" (the root node itself), no parent equality. ``support`` (the root only; sorted,
    distinct cells) limits the root's cells in play to those cells, every other cell being 0; it must be chosen
    from published or differentially private output only (``vocab.support``; DESIGN.md item 31). None: every
    cell is in play.
    """

    schema: Schema
    parent: str
    children: list[str]
    parent_hist: SparseHist | np.ndarray | None
    measurements: list[Measurement]
    constraints: list[Constraint] = field(default_factory=list)
    group_totals: list[GroupTotal] = field(default_factory=list)
    l2_passes: list[list[str]] = field(default_factory=list)
    rounder_passes: list[list[str]] = field(default_factory=list)
    tau_slack: float = 0.1
    #: More children than this (0: never) -> two-stage solve through groups of ``split_group`` (split.py).
    split_above: int = 0
    #: Children x non-zero parent cells above this (0: never) -> two-stage solve too (split.py).
    split_cost: int = 0
    split_group: int = 25
    support: np.ndarray | None = None

    @property
    def n_children(self) -> int:
        return len(self.children)

    def parent_sparse(self) -> SparseHist | None:
        """The parent's histogram as its non-zero cells (None at the root)."""
        return None if self.parent_hist is None else SparseHist.of(self.parent_hist)


#: What a failsafe step did (solvers/failsafe.py): dropped the tau bands of earlier L2 passes (step 1),
#: dropped a constant-infeasible inequality or relaxed a constraint's rhs (step 3), relaxed the parent
#: equality (steps 2-3), or a whole failsafe level failed.
FailsafeAction = Literal["drop_tau", "drop_infeasible", "relax_constraint", "relax_parent", "level_failed"]


@dataclass(frozen=True)
class FailsafeStep:
    """One thing the failsafe did for a parent; ``message`` is the sentence the manifest records."""

    step: int  # 1, 2 or 3 (DAS-2020 ``sequential_optimizers.py``; failsafe.py); 0 for a failed level
    action: FailsafeAction
    message: str

    @property
    def relaxes_parent(self) -> bool:
        """The children need not sum to the parent (recorded, and not checked by verify)."""
        return self.action == "relax_parent"

    def within(self, part: str) -> "FailsafeStep":
        """The same step, its message prefixed by the part of a two-stage solve it happened in."""
        return replace(self, message=f"{part}: {self.message}")

    def __str__(self) -> str:
        return self.message


@dataclass
class SolveStats:
    """Sizes, timings and statuses of one parent's solve (per-pass details in ``l2`` and ``rounder``)."""

    level: str = "exact"  # the failsafe level that succeeded
    shortcut: str = ""  # "zero parent", "single child", "no free cells": solved without a model
    build_s: float = 0.0
    n_x: int = 0
    n_cols: int = 0
    n_rows: int = 0
    nnz: int = 0
    l2: list[dict[str, Any]] = field(default_factory=list)
    tau: list[float] = field(default_factory=list)
    rounder: list[dict[str, Any]] = field(default_factory=list)
    rounder_milp: int = 0
    parent_l1_change: int | None = None
    total_s: float = 0.0
    split: dict[str, int] | None = None  # two-stage solves: number and size of the groups
    largest_n_cols: int = 0


@dataclass
class ParentSolution:
    """Integer, non-negative child histograms that sum to the parent and meet every constraint, held over
    the parent's cells in play: child c's count of cell ``cells[j]`` is ``counts[c, j]`` (0 elsewhere)."""

    cells: np.ndarray  # int64[n], sorted
    counts: np.ndarray  # int64[n_children, n]
    ncells: int
    failsafe: list[FailsafeStep] = field(default_factory=list)  # relaxation steps that were needed, in order
    stats: SolveStats = field(default_factory=SolveStats)

    @classmethod
    def zeros(cls, k: int, ncells: int, **kwargs) -> "ParentSolution":
        return cls(np.zeros(0, dtype=np.int64), np.zeros((k, 0), dtype=np.int64), ncells, **kwargs)

    def csr(self) -> sp.csr_matrix:
        """int64[n_children, ncells] as CSR without explicit zeros, indices sorted."""
        c, j = np.nonzero(self.counts)
        return sp.csr_matrix((self.counts[c, j].astype(np.int64), (c, self.cells[j])),
                             shape=(self.counts.shape[0], self.ncells), dtype=np.int64)

    def row(self, c: int) -> SparseHist:
        """Child c's histogram."""
        keep = self.counts[c] != 0
        return SparseHist(self.cells[keep], self.counts[c][keep].astype(np.int64), self.ncells)

    @cached_property
    def hist(self) -> np.ndarray:
        """int64[n_children, ncells], dense (a schema-sized array per child: small schemas and tests only)."""
        out = np.zeros((self.counts.shape[0], self.ncells), dtype=np.int64)
        out[:, self.cells] = self.counts
        return out
