"""The top-down level loop on Dask (DESIGN.md, "A run's data flow").

For every level, whole parents are grouped into chunks by a fixed cost rule (independent of the
cluster, so output files are identical for any number of workers), the most expensive chunks are
submitted first, and the level is written completely (staging, then rename) before the next starts.
"""
from __future__ import annotations

import hashlib
import json
import logging
import pickle
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Callable

import numpy as np
import pandas as pd
import scipy.sparse as sp

from topdown.vocab.problem import GroupTotal, SparseHist

from ..configuration.config import Config
from .levels import Level, Shares, holding, node_names
from ..runtime.progress import reporter
from ..runtime.rundir import RunDir, RunDirError, changed_files, level_digests, sha256_file, write_table
from ..runtime.storage import location, read_table
from topdown.vocab.census import Product
from .sources import DRAW, MeasurementSource
from .dataplane import hist_table, run_part_chunks
from .tasks import Chunk, ChunkResult, ParentTask, batch_chunks, shared_values, windowed

if TYPE_CHECKING:  # a run's client; verify reads level digests from here without starting Dask
    from distributed import Client

log = logging.getLogger("topdown")

#: Target work per task, in (children x non-zero parent cells), and most children per task; a parent
#: above either is a task alone. Fixed numbers, so the chunks do not depend on the cluster.
CHUNK_COST = 60_000
CHUNK_CHILDREN = 256

ProgressFn = Callable[[str, str, int, int], None]


@dataclass
class LevelReport:
    level: str
    parents: int
    solved: int
    copied: int
    tasks: int
    seconds: float
    failsafe: list[dict] = field(default_factory=list)
    max_parent_seconds: float = 0.0
    #: SHA-256 of the level's files by path in the run directory, as :func:`level_digests` gives them, from the
    #: sums its tasks took of the files they wrote (None: not known; the driver reads the files)
    digests: dict[str, str] | None = None


def _group_totals(level: Level, rows: np.ndarray) -> list[GroupTotal]:
    """At the State level: each real state's parts together sum to the state's total (DESIGN.md, "State totals")."""
    if level.state_total is None:  # set at the state level only (levels.levels_from_units)
        return []
    states = level.state[rows]
    return [GroupTotal(np.flatnonzero(states == s), int(level.state_total[s])) for s in np.unique(states)]


@dataclass
class ChunkPlan:
    """A level's chunks, built one at a time when submitted (a national level's chunks would not fit the
    driver at once): ``order`` the child order (node rows), ``bounds`` each chunk's slice of it."""

    order: np.ndarray
    bounds: np.ndarray  # chunk i's children are order[bounds[i]:bounds[i + 1]]
    costs: list[int]
    build: Callable[[int], Chunk]

    def __len__(self) -> int:
        return len(self.costs)

    def rows(self, i: int) -> np.ndarray:
        """The node rows of chunk ``i``'s children."""
        return self.order[self.bounds[i]:self.bounds[i + 1]]


def make_chunks(
    product: Product, config: Config, level: Level, parent_level: Level | None, parent_hist: sp.csr_matrix | None,
    staging_dir: str | None, independent: bool = False, source: MeasurementSource = DRAW,
) -> tuple[list[Chunk], np.ndarray]:
    """Every chunk of :func:`chunk_plan`, built, and the child order they follow."""
    plan = chunk_plan(product, config, level, parent_level, parent_hist, staging_dir, independent, source)
    return [plan.build(i) for i in range(len(plan))], plan.order


def chunk_plan(
    product: Product, config: Config, level: Level, parent_level: Level | None, parent_hist: sp.csr_matrix | None,
    staging_dir: str | None, independent: bool = False, source: MeasurementSource = DRAW,
    parent_nnz: np.ndarray | None = None,
) -> ChunkPlan:
    """Chunks of whole parents for ``level``, and the child order (node rows) the chunks follow.
    ``staging_dir`` None: the chunks keep their noisy measurements in memory (the audit's repeated runs).

    At the root (``parent_level`` None) the level's nodes form one root problem; with ``independent``
    every node is its own root problem (the block-by-block algorithm, TDA paper Appendix A). Each chunk
    carries ``source``'s part for its children (its noisy answers are drawn, or read from a release).
    Without ``parent_hist`` (the partitioned run: the task reads its parents, dataplane.run_part_chunk),
    ``parent_nnz`` gives each parent's count of non-zero cells, and the parent tasks' histograms are None.
    """
    cfg = config.product(product.name)
    common = dict(product=product, level=level.name, cfg=cfg, mode=config.run.mode, seed=config.run.seed)
    n = len(level)
    if independent or parent_level is None:
        order = np.arange(n)
        bounds = np.arange(1, n) if independent else np.zeros(0, dtype=np.int64)
        nnz = np.ones(n, dtype=np.int64)  # chunk sizes must not depend on confidential counts
    else:
        parent = level.parent
        if (np.diff(parent) >= 0).all():  # a spine built here: the nodes are already grouped by parent
            order = np.arange(n)
        else:
            order = np.argsort(parent, kind="stable")  # by parent, then node
            parent = parent[order]
        bounds = np.flatnonzero(np.diff(parent)) + 1
        if parent_hist is not None:
            parent_nnz = np.diff(parent_hist.indptr)
        nnz = parent_nnz[parent[np.concatenate([[0], bounds])]]
    starts = np.concatenate([[0], bounds]).astype(np.int64)
    ends = np.concatenate([bounds, [n]]).astype(np.int64)

    def parent_task(s: int, e: int, lo: int, chunk_children: list[str], label: str | None) -> ParentTask:
        """The parent of nodes ``order[s:e]`` in a chunk starting at ``lo`` (its children's names
        ``chunk_children``, its parent's name ``label``: looked up once per chunk, not per parent)."""
        crow = order[s:e]
        children = chunk_children[s - lo:e - lo]
        if independent or parent_level is None:
            label, hist = (children[0] if independent else ""), None
        else:
            prow = int(level.parent[order[s]])
            hist = None if parent_hist is None else SparseHist.of(parent_hist[prow])
        cons = None if level.constraints is None else level.constraints.take(crow)  # None: the task reads them
        return ParentTask(label, hist, children, slice(s - lo, e - lo), cons, _group_totals(level, crow))

    specs: list[tuple[list[int], int]] = []  # per chunk: its parent groups and its cost
    pending: list[int] = []
    cost = 0

    ordered = bool((order == np.arange(n)).all())  # a slice of the nodes, not a take (a string per child)

    def build(idx: int) -> Chunk:
        groups, cost = specs[idx]
        lo, hi = int(starts[groups[0]]), int(ends[groups[-1]])
        rows = order[lo:hi]
        children = node_names(level.nodes, slice(lo, hi) if ordered else rows)
        labels = ([None] * len(groups) if independent or parent_level is None else
                  node_names(parent_level.nodes, level.parent[order[starts[groups]]]))
        plb = level.plb.take(rows) if isinstance(level.plb, Shares) else [level.plb[r] for r in rows]
        return Chunk(index=idx, children=children, child_hist=None if level.hist is None else level.hist[rows],
                     child_plb=plb,
                     parents=[parent_task(int(starts[g]), int(ends[g]), lo, children, label)
                              for g, label in zip(groups, labels)],
                     measurements_path=None if staging_dir is None else f"{staging_dir}/part-{idx:05d}.parquet",
                     cost=cost, source=source.for_children(children),
                     matched=None if level.matched is None else level.matched.take(rows), **common)

    for g, (s, e) in enumerate(zip(starts, ends)):
        c = int(e - s) * max(int(nnz[g]), 1)
        if pending and (cost + c > CHUNK_COST or e - starts[pending[0]] > CHUNK_CHILDREN):
            specs.append((pending, cost))
            pending, cost = [], 0
        pending.append(g)
        cost += c
    if pending:
        specs.append((pending, cost))
    bounds = np.array([0] + [int(ends[groups[-1]]) for groups, _ in specs], dtype=np.int64)
    return ChunkPlan(order, bounds, [c for _, c in specs], build)


@dataclass
class LevelOutput:
    """Where an estimated level's histograms are: its committed directory of parts, and per node row the
    part (chunk index) holding it and its count of non-zero cells. The histograms stay in the files."""

    directory: Path
    part_of: np.ndarray
    nnz: np.ndarray

    def files(self, rows: np.ndarray) -> list[str]:
        """The part files holding node ``rows``."""
        return [f"{self.directory}/part-{i:05d}.parquet" for i in np.unique(self.part_of[rows])]


def estimate_level(
    client: Client, rundir: RunDir, product: Product, config: Config, level: Level, parent_level: Level | None,
    parent: LevelOutput | None, progress: ProgressFn | None = None, independent: bool = False,
    source: MeasurementSource = DRAW,
) -> tuple[LevelOutput, LevelReport]:
    """Measure (or read the published measurements of) and estimate one level; its measurements (when drawn)
    and histograms are written by the tasks and committed atomically. The true histograms of the children
    come from ``level.parts`` (on the workers), the parents' estimates from ``parent``'s files."""
    start = time.perf_counter()
    name = product.name
    mdir = rundir.measurements(name, level.name)
    hdir = rundir.histograms(name, level.name)
    plan = chunk_plan(product, config, level, parent_level, None, str(rundir.staging(mdir)), independent, source,
                      parent_nnz=None if parent is None else parent.nnz)
    if source.draws:
        rundir.staging(mdir).mkdir(parents=True, exist_ok=True)
    rundir.staging(hdir).mkdir(parents=True, exist_ok=True)
    records = rundir.chunk_records(name, level.name)
    tally = _Tally(len(level))  # the driver keeps no chunk result, only the level's arrays and sums
    finished = set()
    for i in _recorded(records, len(plan)):  # chunks an interrupted run finished (chunking is deterministic)
        if (res := _finished_chunk(rundir, hdir, records, plan.build(i))) is not None:
            tally.add(res, plan.rows(i))
            finished.add(i)
    if finished:
        log.info("%s %s: %d of %d chunks finished by an earlier run, reused", name, level.name, len(finished),
                 len(plan))
        if progress:
            progress(name, level.name, len(finished), len(plan))
    kept = [f"part-{i:05d}.parquet" for i in finished]
    for folder in (mdir, hdir) if source.draws else (hdir,):
        rundir.clear_place(folder, keep=kept)
    if len(finished) < len(plan):  # the level's bar from its start; a cancelled job stops here
        reporter().tasks(name, level.name, len(finished), len(plan))
    # Keys unique to the configuration and the run directory: jobs of a batch may share one cluster.
    digest = config.digest()[:8] + "-" + hashlib.sha256(str(rundir.root.resolve()).encode()).hexdigest()[:8]
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    batches = batch_chunks(plan.costs, [i for i in range(len(plan)) if i not in finished], workers)
    batch_costs = [sum(plan.costs[i] for i in b) for b in batches]

    staged = str(rundir.staging(hdir))

    def chunk_args(i: int) -> tuple:
        """What chunk ``i``'s run needs besides the chunk (dataplane.run_part_chunk)."""
        rows = plan.rows(i)
        parts = None if level.parts is None else holding(level.parts, rows)
        parent_files = None if parent is None else parent.files(level.parent[rows])
        meta = None if level.meta is None else holding(level.meta, rows)
        return rows, parts, parent_files, f"{staged}/part-{i:05d}.parquet", meta

    def submit(b: int):
        batch = batches[b]
        # A batch's chunks pickled here, together: their product and configuration once a task, and the driver's
        # scheduler keeps bytes, a third of the objects they unpickle to (benchmarks/RESULTS.md, "Driver memory,
        # third round", measures it).
        chunks = pickle.dumps([plan.build(i) for i in batch], protocol=5)
        args = [chunk_args(i) for i in batch]
        shards, where = shared_values([a[1] for a in args] + [a[4] for a in args])  # each shard named once
        plain = [(rows, where[j], files, path, where[len(args) + j]) for j, (rows, _, files, path, _) in enumerate(args)]
        return client.submit(run_part_chunks, chunks, pickle.dumps(plain, protocol=5), shards, str(records),
                             key=f"{name}-{level.name}-{batch[0]}-{digest}", priority=batch_costs[b], pure=False)

    done = len(finished)
    costliest = [int(b) for b in np.argsort(batch_costs, kind="stable")[::-1]]
    for fut in windowed(client, submit, costliest):  # a bounded number of tasks in the driver and the scheduler
        results: list[ChunkResult] = fut.result()  # the task wrote each chunk's part and record
        for res in results:
            tally.add(res, plan.rows(res.index))
        done += len(results)
        if progress:
            progress(name, level.name, done, len(plan))
    if source.draws:
        rundir.commit(mdir)
    rundir.commit(hdir)
    report = LevelReport(
        level=level.name, parents=tally.solved + tally.copied, solved=tally.solved, copied=tally.copied,
        tasks=len(plan), seconds=time.perf_counter() - start,
        failsafe=[f for i in sorted(tally.failsafe) for f in tally.failsafe[i]],
        max_parent_seconds=tally.max_parent_seconds,
        # from the tasks' sums only where they wrote every file of the level (a reprocessing writes its measurements
        # before the tasks run: the driver reads the level's files back)
        digests=tally.digests(rundir.root, mdir, hdir) if source.draws and len(tally.sha256) == len(plan) else None,
    )
    return LevelOutput(hdir, tally.part_of, tally.nnz), report


class _Tally:
    """What the driver keeps of a level's chunk results: each node's part file and non-zero cells, and the
    report's sums (a national level has tens of thousands of chunks)."""

    def __init__(self, nodes: int) -> None:
        self.part_of = np.zeros(nodes, dtype=np.int32)
        self.nnz = np.zeros(nodes, dtype=np.int32)
        self.solved = self.copied = 0
        self.max_parent_seconds = 0.0
        self.failsafe: dict[int, list[dict]] = {}
        self.sha256: dict[int, tuple[str, str]] = {}  # per chunk: its histogram and measurement parts'

    def digests(self, root: Path, mdir: Path, hdir: Path) -> dict[str, str]:
        """The level's files' SHA-256 by path below ``root``, ordered as :func:`level_digests` orders them
        (the tasks wrote both: measurements in ``mdir``, histograms in ``hdir``)."""
        out = {}
        for folder, which in ((mdir, 1), (hdir, 0)):
            files = {str((folder / f"part-{i:05d}.parquet").relative_to(root)): sums[which]
                     for i, sums in self.sha256.items()}
            out.update((k, files[k]) for k in sorted(files, key=Path))
        return out

    def add(self, res: ChunkResult, rows: np.ndarray) -> None:
        """Take chunk ``res``, whose children are the level's nodes ``rows``."""
        self.part_of[rows] = res.index
        self.nnz[rows] = res.nnz
        self.solved += res.solved
        self.copied += res.copied
        self.max_parent_seconds = max([self.max_parent_seconds, *res.solve_seconds])
        self.sha256[res.index] = (res.hist_sha256, res.measurements_sha256)
        if res.failsafe:
            self.failsafe[res.index] = res.failsafe


def _recorded(records: Path, chunks: int) -> list[int]:
    """The chunks of a level with a record in ``records`` (an interrupted run's finished chunks), by index."""
    if not records.is_dir():
        return []
    found = (f.name[5:-5] for f in records.iterdir() if f.name.startswith("part-") and f.name.endswith(".json"))
    return sorted(i for i in {int(x) for x in found if x.isdigit()} if i < chunks)


def _unverified(record: Path, files: dict[str, Path]) -> tuple[dict | None, str | None]:
    """A chunk record and, when its staged files are not exactly what it recorded, the reason."""
    try:
        meta = json.loads(record.read_text())
    except (OSError, ValueError):
        meta = None
    recorded = meta.get("sha256") if isinstance(meta, dict) else None
    if not isinstance(recorded, dict):
        return None, f"{record}: unreadable or without SHA-256 sums"
    for name, path in files.items():
        if not path.exists():
            return meta, f"{path}: missing"
        if sha256_file(path) != recorded.get(name):
            return meta, f"{path}: SHA-256 differs from the one recorded in {record.name}"
    return meta, None


def distrust(problem: str, mode: str, what: str, remedy: str) -> None:
    """What --resume does with output that fails its SHA-256 check: in test mode it is recomputed (the same
    noise again; a warning), in production the run stops (recomputing would draw its noise again)."""
    if mode == "production":
        raise RunDirError(f"{problem}: {what} changed since the interrupted run; production mode neither reuses it "
                          f"nor draws its noise again silently. {remedy}")
    log.warning("%s; recomputing %s", problem, what)


def _finished_chunk(rundir: RunDir, hdir, records, chunk: Chunk) -> ChunkResult | None:
    """The result of a chunk an interrupted run finished, once its staged files match the SHA-256 sums of
    its record. A mismatch (a file changed or lost since) is never reused: in test mode the chunk is
    recomputed (same noise), in production the run stops (recomputing would draw its noise again)."""
    record = records / f"part-{chunk.index:05d}.json"
    part = rundir.staging(hdir) / f"part-{chunk.index:05d}.parquet"
    if not record.exists():
        return None
    files = {"histograms": part}
    if chunk.source.draws:  # a reprocessing reads published measurements: nothing of its own to check
        files["measurements"] = location(chunk.measurements_path)
    meta, problem = _unverified(record, files)
    if problem is not None:
        distrust(problem, chunk.mode, f"chunk {chunk.index} of {chunk.product.name} {chunk.level}",
                 f"Delete {record} to recompute that chunk (a new draw of unreleased noise), then --resume")
        return None
    return ChunkResult(chunk.index, chunk.children, None, meta["failsafe"], meta["solved"], meta["copied"], 0.0,
                       meta["solve_seconds"], meta["sha256"]["measurements"], _part_nnz(part, chunk.children),
                       meta["sha256"]["histograms"])


def _part_nnz(path: Path, nodes: list[str]) -> np.ndarray:
    """Non-zero cells of each node of a histogram part (one row per non-zero cell; only the geocodes are read)."""
    geocodes = read_table(path, columns=["geocode"]).column("geocode").to_pandas().astype(str)
    return np.bincount(pd.Index(nodes).get_indexer(geocodes), minlength=len(nodes)).astype(np.int32)


def write_level_histograms(rundir: RunDir, product: Product, level: Level, hist: sp.csr_matrix) -> None:
    """Write an aggregated (not estimated) level's histograms atomically, in one part."""
    hdir = rundir.histograms(product.name, level.name)
    rundir.clear_place(hdir)
    write_table(hist_table(level.nodes, hist), rundir.staging(hdir) / "part-00000.parquet")
    rundir.commit(hdir)


def changed_level(rundir: RunDir, product: Product, level: str, recorded: dict[str, str] | None) -> str | None:
    """Why a committed level cannot be read back as recorded in the manifest (None: every file matches)."""
    if not recorded:
        return f"{rundir.histograms(product.name, level)}: no SHA-256 sums in the manifest"
    problems = changed_files(recorded, level_digests(rundir, product.name, level))
    path = next(iter(problems), None)  # the first, in path order
    return None if path is None else f"{rundir.root / path}: {problems[path]}"


def read_level_histograms(rundir: RunDir, product: Product, level: Level) -> sp.csr_matrix:
    """Estimated histograms of a level already written, in the driver (the block-by-block roll-up)."""
    table = read_table(rundir.histograms(product.name, level.name)).to_pandas()
    rows = level.nodes.get_indexer(table["geocode"].astype(str))
    return sp.csr_matrix((table["count"].to_numpy(np.int64), (rows, table["cell"].to_numpy())),
                         shape=(len(level), product.schema.ncells), dtype=np.int64)


def read_level_output(rundir: RunDir, product: Product, level: Level) -> LevelOutput:
    """Where a level already written (--resume) holds each node, from its parts' geocodes."""
    hdir = rundir.histograms(product.name, level.name)
    part_of = np.zeros(len(level), dtype=np.int32)
    nnz = np.zeros(len(level), dtype=np.int32)
    for f in sorted(hdir.glob("part-*.parquet")):
        geocodes = read_table(f, columns=["geocode"]).column("geocode").to_pandas().astype(str)
        rows, counts = np.unique(level.nodes.get_indexer(geocodes), return_counts=True)
        part_of[rows] = int(f.stem.split("-")[1])
        nnz[rows] = counts
    return LevelOutput(hdir, part_of, nnz)
