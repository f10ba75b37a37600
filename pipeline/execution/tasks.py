"""One Dask task: measure the children of a group of whole parents and estimate each parent's children.

A task is a pure function of its :class:`Chunk` (deterministic noise keyed by node and query,
single-threaded solvers), so results are identical whatever worker runs it.
"""
from __future__ import annotations

import time
from dataclasses import dataclass, field
from fractions import Fraction
from typing import Callable, Iterator

import numpy as np
import scipy.sparse as sp

from topdown.vocab.problem import Constraint, GroupTotal, Measurement, ParentProblem, ParentSolution, SparseHist

from ..configuration.config import ProductConfig
from ..inputs.invariants import MatchedCounts
from .memory import release_memory
from ..runtime.rundir import sha256_file
from ..runtime.storage import location
from topdown.vocab.census import Product
from .sources import DRAW, MeasurementSource
from ..privacy.measure import root_cells


class EstimationError(RuntimeError):
    """A parent could not be estimated consistently."""


@dataclass
class ParentTask:
    """One parent and its children (rows of ``child_hist`` in child order)."""

    parent: str
    parent_hist: SparseHist | np.ndarray | None  # its non-zero cells (or dense int64[ncells]); None at the root
    children: list[str]
    child_rows: slice  # rows of this parent's children in the chunk's child arrays
    constraints: list[Constraint] | None  # None until the task reads them (dataplane.run_part_chunk)
    group_totals: list[GroupTotal] = field(default_factory=list)


@dataclass
class Chunk:
    """Whole parents of one level, processed by one task."""

    index: int
    product: Product
    level: str  # the children's level
    cfg: ProductConfig
    mode: str
    seed: int | None
    children: list[str]
    child_hist: sp.csr_matrix | None  # true child histograms (confidential; never leaves the task); None: reprocessing
    child_plb: list[Fraction]
    parents: list[ParentTask]
    measurements_path: str | None  # Parquet part file for this chunk's noisy measurements (None: not written)
    cost: int = 0  # sum over its parents of children x non-zero parent cells (engine.py: packing, priority)
    source: MeasurementSource = DRAW  # where the children's noisy answers come from (sources.py)
    matched: MatchedCounts | None = None  # published counts the children's estimates equal (their rows here)


@dataclass
class ChunkResult:
    index: int
    children: list[str]
    hist: sp.csr_matrix | None  # estimated child histograms, int64 (None once written by dataplane.run_part_chunk)
    failsafe: list[dict] = field(default_factory=list)
    solved: int = 0
    copied: int = 0
    seconds: float = 0.0
    solve_seconds: list[float] = field(default_factory=list)
    measurements_sha256: str = ""  # of the Parquet file the task wrote (checked on --resume)
    nnz: np.ndarray | None = None  # non-zero cells of each child's estimate (once its histograms are written)
    hist_sha256: str = ""  # of the histogram part written on the worker


def _check(task: ParentTask, solution: ParentSolution) -> None:
    """A parent whose children the failsafe let differ from it (DESIGN.md, "The failsafe") is recorded, not summed."""
    counts = solution.counts
    if counts.dtype.kind != "i" or (counts < 0).any():
        raise EstimationError(f"parent {task.parent!r}: estimate is not a non-negative integer histogram")
    relaxed = any(step.relaxes_parent for step in solution.failsafe)
    if task.parent_hist is not None and not relaxed:
        parent = SparseHist.of(task.parent_hist)
        total = counts.sum(axis=0)
        if not (np.array_equal(solution.cells[total != 0], parent.cells)
                and np.array_equal(total[total != 0], parent.counts)):
            raise EstimationError(f"parent {task.parent!r}: children do not sum to the parent")


#: Dask priority of a split parent's second-stage groups: ahead of every chunk still queued, so the
#: parent that waits for them (the level's largest) finishes first.
GROUP_PRIORITY = 1 << 40


def map_on_cluster(backend, compiler=None) -> Callable | None:
    """Inside a Dask task: a ``map_solve`` for ``solve_parent`` that runs a split parent's second-stage
    groups as tasks of the same cluster (the waiting task secedes from its worker's thread), so a huge
    parent is spread over the workers instead of running alone. None outside a worker."""
    try:
        from distributed import get_worker

        get_worker()
    except (ImportError, ValueError):
        return None

    def map_solve(problems: list) -> list:
        from distributed import worker_client

        from topdown.solvers import solve_parent

        with worker_client() as client:
            # Scattered first: the groups' measurements travel worker to worker, not inside the task graph
            # through the scheduler (its "Sending large graph" warnings: benchmarks/RESULTS_dhc.md (g)).
            data = client.scatter(problems, hash=False)
            futures = client.map(solve_parent, data, backend=backend, compiler=compiler, pure=False,
                                 priority=GROUP_PRIORITY)
            return client.gather(futures)

    return map_solve


def estimation_solvers(est) -> tuple[object, Callable | None, bool]:
    """The back end and compiler ``[<product>.estimation]`` asks for (``compiler = "pyomo"``: the parent's Pyomo
    model and every pass solved through Pyomo; else the direct build and ``backend``), and whether a split
    parent's groups may be solved on other workers with them (not with Gurobi's licence, held per process)."""
    if est.compiler == "pyomo":
        from topdown.solvers.model import compile_pyomo
        from topdown.solvers.pyomo_path import PyomoBackend

        return PyomoBackend(est.pyomo_solver, est.qp_solver, est.solver_options), compile_pyomo, True
    if est.backend == "gurobi":
        from topdown.solvers.gurobi import Gurobi

        return Gurobi(), None, False
    from topdown.solvers.backends import BACKENDS, REFINED_BANDS

    return (REFINED_BANDS if est.refine_banded else BACKENDS[est.backend]), None, True


def run_chunk(chunk: Chunk) -> ChunkResult:
    """Measure the chunk's children (or read their published measurements) and estimate every parent; then give
    the freed memory back (the solvers' transients: a worker's heap does not grow task after task)."""
    result = _run_chunk(chunk)
    release_memory()
    return result


def _run_chunk(chunk: Chunk) -> ChunkResult:
    from topdown.solvers import solve_parent

    backend, compiler, spreads = estimation_solvers(chunk.cfg.estimation)
    start = time.perf_counter()
    schema = chunk.product.schema
    cfg = chunk.cfg
    measured = chunk.source.by_parent(chunk)
    measurements_sha256 = (sha256_file(location(chunk.measurements_path))
                           if chunk.source.draws and chunk.measurements_path is not None else "")
    l2 = cfg.estimation.l2_passes.get(chunk.level, [])
    rounder = cfg.estimation.rounder_passes.get(chunk.level, [])
    # the chunk's estimates as (row, cell, count) pieces, one per parent, in row order
    pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []
    result = ChunkResult(chunk.index, chunk.children, None, measurements_sha256=measurements_sha256)
    for task, noisy in zip(chunk.parents, measured):
        rows = task.child_rows
        parent = None if task.parent_hist is None else SparseHist.of(task.parent_hist)
        if parent is not None and (len(task.children) == 1 or not parent.cells.size):
            if len(task.children) == 1:
                pieces.append((np.full(parent.cells.size, rows.start, dtype=np.int64), parent.cells, parent.counts))
            result.copied += 1
            continue
        constraints = list(task.constraints or [])
        support = (root_cells(schema, cfg.budget, noisy, 0)
                   if task.parent_hist is None and cfg.budget.measure == "in_play" else None)
        if chunk.matched is not None:
            constraints.append(chunk.matched.constraint(rows))
            if task.parent_hist is None:
                support = chunk.matched.in_play(schema, support, rows.start)
        problem = ParentProblem(
            schema=schema, parent=task.parent, children=task.children, parent_hist=task.parent_hist,
            measurements=[Measurement(m.query, m.values, np.where(m.variance == 0, 1.0, m.variance), m.answers)
                          for m in noisy],
            constraints=constraints, group_totals=task.group_totals,
            l2_passes=l2, rounder_passes=rounder, tau_slack=cfg.estimation.tau_slack,
            split_above=cfg.estimation.split_above, split_cost=cfg.estimation.split_cost,
            split_group=cfg.estimation.split_group, support=support,
        )
        t0 = time.perf_counter()
        spread = map_on_cluster(backend, compiler) if spreads else None
        solution = solve_parent(problem, backend, compiler, map_solve=spread)
        result.solve_seconds.append(time.perf_counter() - t0)
        _check(task, solution)
        c, j = np.nonzero(solution.counts)
        pieces.append((rows.start + c.astype(np.int64), solution.cells[j], solution.counts[c, j].astype(np.int64)))
        result.solved += 1
        if solution.failsafe:
            result.failsafe.append({"parent": task.parent, "level": chunk.level,
                                    "steps": [step.message for step in solution.failsafe],
                                    "parent_relaxed": any(step.relaxes_parent for step in solution.failsafe)})
    result.hist = _assemble(pieces, len(chunk.children), schema.ncells)
    result.seconds = time.perf_counter() - start
    return result


def _assemble(pieces: list[tuple[np.ndarray, np.ndarray, np.ndarray]], n_rows: int, ncells: int) -> sp.csr_matrix:
    """int64[n_rows, ncells] CSR of (row, cell, count) pieces (rows in order, cells sorted within a row, no
    zero counts): the matrix ``sp.csr_matrix`` makes of the dense estimates, without the dense array."""
    row = np.concatenate([p[0] for p in pieces]) if pieces else np.zeros(0, dtype=np.int64)
    cell = np.concatenate([p[1] for p in pieces]) if pieces else np.zeros(0, dtype=np.int64)
    count = np.concatenate([p[2] for p in pieces]) if pieces else np.zeros(0, dtype=np.int64)
    if (np.diff(row) < 0).any():
        order = np.lexsort((cell, row))
        row, cell, count = row[order], cell[order], count[order]
    index_dtype = np.int32 if max(n_rows, ncells, count.size) < 2 ** 31 else np.int64
    indptr = np.concatenate(([0], np.cumsum(np.bincount(row, minlength=n_rows)))).astype(index_dtype)
    return sp.csr_matrix((count, cell.astype(index_dtype), indptr), shape=(n_rows, ncells))


#: Tasks submitted ahead per worker by :func:`windowed` (the driver and the scheduler hold the arguments
#: of a bounded number of tasks, whatever the size of a level or of the MDF).
WINDOW_PER_WORKER = 4


def windowed(client, submit: Callable[[int], object], order: list[int]) -> Iterator:
    """The futures of ``submit(i)`` for every ``i`` of ``order``, as they finish, with at most
    :data:`WINDOW_PER_WORKER` per worker submitted and not yet finished (submitted in ``order``)."""
    from distributed import as_completed

    window = WINDOW_PER_WORKER * max(1, len(client.scheduler_info().get("workers", {})))
    todo = list(order)
    queue = as_completed([submit(i) for i in todo[:window]])
    todo = todo[window:]
    for fut in queue:
        if todo:
            queue.add(submit(todo.pop(0)))
        yield fut


#: Dask tasks per worker a level's chunks (or the MDF's counties) are batched into (:func:`batch_chunks`), and most
#: chunks per task.
TASKS_PER_WORKER = 16
BATCH_CHUNKS = 32


def batch_chunks(costs: list[int], todo: list[int], workers: int) -> list[list[int]]:
    """The chunks ``todo`` (indices into ``costs``, ascending) in batches run by one Dask task each: runs of
    consecutive chunks (neighbouring geography: the batch reads few shards) of summed cost up to the level's
    cost over ``TASKS_PER_WORKER`` tasks per worker and at most ``BATCH_CHUNKS`` chunks; a chunk above that cost
    alone. Each chunk still writes its own part and record, so outputs and --resume do not depend on the
    batches; the driver and the scheduler handle a task per batch instead of one per chunk.
    The MDF batches its counties the same way, by their blocks."""
    target = sum(costs[i] for i in todo) / (TASKS_PER_WORKER * max(1, workers))
    batches: list[list[int]] = []
    cost = 0
    for i in todo:
        if batches and len(batches[-1]) < BATCH_CHUNKS and cost + costs[i] <= target and batches[-1][-1] == i - 1:
            batches[-1].append(i)
            cost += costs[i]
        else:
            batches.append([i])
            cost = costs[i]
    return batches


def shared_values(groups: list[list | None]) -> tuple[list, list[list[int] | None]]:
    """Each distinct object of ``groups`` (lists of Dask futures or other objects; None: no list) once, in order of
    first appearance, and each group as positions into them. A task then names each future once, in one flat
    list, and carries the rest pickled: the scheduler's cost grows with every future named in a task's nested
    arguments (a batch's chunks name the same few shards again and again)."""
    values: list = []
    seen: dict = {}
    out: list[list[int] | None] = []
    for group in groups:
        if group is None:
            out.append(None)
            continue
        positions = []
        for value in group:
            key = getattr(value, "key", None) or id(value)  # a future's key; another object itself
            if key not in seen:
                seen[key] = len(values)
                values.append(value)
            positions.append(seen[key])
        out.append(positions)
    return values, out


def taken(values: list, positions: list[int] | None) -> list | None:
    """The objects at ``positions`` of ``values`` (:func:`shared_values`, on the worker: futures resolved)."""
    return None if positions is None else [values[i] for i in positions]

