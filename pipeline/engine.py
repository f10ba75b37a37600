"""The top-down level loop on Dask (DESIGN.md sections 3-4).

For every level, whole parents are grouped into chunks by a fixed cost rule (independent of the
cluster, so output files are identical for any number of workers), the most expensive chunks are
submitted first, and the level is written completely (staging, then rename) before the next starts.
"""
from __future__ import annotations

import json
import logging
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import scipy.sparse as sp
from distributed import Client, as_completed

from topdown.solvers.problem import GroupTotal

from .config import Config
from .levels import Level
from .rundir import RunDir, write_json_atomic, write_table
from .tasks import Chunk, ChunkResult, ParentTask, run_chunk

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


def _group_totals(level: Level, rows: np.ndarray) -> list[GroupTotal]:
    """At the State level: each real state's parts together sum to the state's total (facts 2.6)."""
    if level.name != "State" or "tot" not in level.units.columns:
        return []
    states = level.state[rows]
    tot = level.units["tot"].to_numpy()[rows]
    return [GroupTotal(np.flatnonzero(states == s), int(tot[states == s].sum())) for s in np.unique(states)]


def make_chunks(
    product: str, config: Config, level: Level, parent_level: Level | None, parent_hist: sp.csr_matrix | None,
    staging_dir: str | None, independent: bool = False,
) -> tuple[list[Chunk], np.ndarray]:
    """Chunks of whole parents for ``level``, and the child order (node rows) the chunks follow.
    ``staging_dir`` None: the chunks keep their noisy measurements in memory (the audit's repeated runs).

    At the root (``parent_level`` None) the level's nodes form one root problem; with ``independent``
    every node is its own root problem (the block-by-block algorithm, seed 003 Appendix A).
    """
    cfg = config.product(product)
    common = dict(product=product, level=level.name, cfg=cfg, mode=config.run.mode, seed=config.run.seed)
    n = len(level)
    if independent or parent_level is None:
        order = np.arange(n)
        bounds = np.arange(1, n) if independent else np.zeros(0, dtype=np.int64)
        nnz = np.ones(n, dtype=np.int64)  # chunk sizes must not depend on confidential counts
    else:
        order = np.lexsort((np.arange(n), level.parent))
        bounds = np.flatnonzero(np.diff(level.parent[order])) + 1
        nnz = np.diff(parent_hist.indptr)[level.parent[order][np.concatenate([[0], bounds])]]
    starts = np.concatenate([[0], bounds]).astype(np.int64)
    ends = np.concatenate([bounds, [n]]).astype(np.int64)

    def parent_task(g: int, s: int, e: int, lo: int) -> ParentTask:
        crow = order[s:e]
        children = [str(x) for x in level.nodes[crow]]
        if independent or parent_level is None:
            label, hist = (children[0] if independent else ""), None
        else:
            prow = int(level.parent[order[s]])
            label, hist = str(parent_level.nodes[prow]), np.asarray(parent_hist[prow].todense(), dtype=np.int64).ravel()
        return ParentTask(label, hist, children, slice(s - lo, e - lo), level.constraints.take(crow),
                          _group_totals(level, crow))

    chunks: list[Chunk] = []
    pending: list[int] = []
    cost = 0

    def flush() -> None:
        nonlocal pending, cost
        if not pending:
            return
        lo, hi = int(starts[pending[0]]), int(ends[pending[-1]])
        rows = order[lo:hi]
        idx = len(chunks)
        chunks.append(Chunk(index=idx, children=[str(g) for g in level.nodes[rows]], child_hist=level.hist[rows],
                            child_plb=[level.plb[r] for r in rows],
                            parents=[parent_task(g, int(starts[g]), int(ends[g]), lo) for g in pending],
                            measurements_path=None if staging_dir is None else f"{staging_dir}/part-{idx:05d}.parquet",
                            cost=cost, **common))
        pending, cost = [], 0

    for g, (s, e) in enumerate(zip(starts, ends)):
        c = int(e - s) * max(int(nnz[g]), 1)
        if pending and (cost + c > CHUNK_COST or e - starts[pending[0]] > CHUNK_CHILDREN):
            flush()
        pending.append(g)
        cost += c
    flush()
    return chunks, order


def _hist_table(nodes: pd.Index, hist: sp.csr_matrix) -> pd.DataFrame:
    coo = hist.tocoo()
    keep = coo.data != 0
    return pd.DataFrame({"geocode": np.asarray(nodes)[coo.row[keep]], "cell": coo.col[keep].astype(np.int32),
                         "count": coo.data[keep].astype(np.int64)}).sort_values(["geocode", "cell"], kind="stable")


def estimate_level(
    client: Client, rundir: RunDir, product: str, config: Config, level: Level, parent_level: Level | None,
    parent_hist: sp.csr_matrix | None, progress: ProgressFn | None = None, independent: bool = False,
) -> tuple[sp.csr_matrix, LevelReport]:
    """Measure and estimate one level; write its measurements and histograms atomically."""
    start = time.perf_counter()
    mdir = rundir.measurements(product, level.name)
    hdir = rundir.histograms(product, level.name)
    chunks, order = make_chunks(product, config, level, parent_level, parent_hist, str(rundir.staging(mdir)),
                                independent)
    rundir.staging(mdir).mkdir(parents=True, exist_ok=True)
    records = rundir.chunk_records(product, level.name)
    results: dict[int, ChunkResult] = {}
    for chunk in chunks:  # chunks an interrupted run finished (chunking is deterministic)
        if (res := _finished_chunk(rundir, hdir, records, chunk)) is not None:
            results[chunk.index] = res
    if results:
        log.info("%s %s: %d of %d chunks finished by an earlier run, reused", product, level.name, len(results),
                 len(chunks))
        if progress:
            progress(product, level.name, len(results), len(chunks))
    futures = {}
    digest = config.digest()[:8]
    for i in np.argsort([c.cost for c in chunks], kind="stable")[::-1]:
        if int(i) in results:
            continue
        fut = client.submit(run_chunk, chunks[i], key=f"{product}-{level.name}-{i}-{digest}",
                            priority=chunks[i].cost, pure=False)
        futures[fut] = int(i)
    done = len(results)
    for fut in as_completed(list(futures)):
        res: ChunkResult = fut.result()
        _record_chunk(rundir, hdir, records, res)
        results[res.index] = res
        done += 1
        if progress:
            progress(product, level.name, done, len(chunks))
    del futures
    pos = 0
    parts = []
    for i in range(len(chunks)):
        res = results[i]
        n = len(res.children)
        rows = order[pos:pos + n]
        pos += n
        parts.append((rows, res.hist))
    hist = sp.vstack([p[1] for p in parts]).tocsr()[np.argsort(np.concatenate([p[0] for p in parts]))]
    rundir.commit(mdir)
    rundir.commit(hdir)
    report = LevelReport(
        level=level.name, parents=sum(len(c.parents) for c in chunks), solved=sum(r.solved for r in results.values()),
        copied=sum(r.copied for r in results.values()), tasks=len(chunks), seconds=time.perf_counter() - start,
        failsafe=[f for i in range(len(chunks)) for f in results[i].failsafe],
        max_parent_seconds=max((s for r in results.values() for s in r.solve_seconds), default=0.0),
    )
    return hist.astype(np.int64), report


def _record_chunk(rundir: RunDir, hdir, records, res: ChunkResult) -> None:
    """Stage a finished chunk's histograms, then its record (written last: the mark of a finished chunk)."""
    write_table(_hist_table(pd.Index(res.children), res.hist), rundir.staging(hdir) / f"part-{res.index:05d}.parquet")
    records.mkdir(parents=True, exist_ok=True)
    write_json_atomic(records / f"part-{res.index:05d}.json",
                      {"failsafe": res.failsafe, "solved": res.solved, "copied": res.copied,
                       "solve_seconds": res.solve_seconds})


def _finished_chunk(rundir: RunDir, hdir, records, chunk: Chunk) -> ChunkResult | None:
    """The result of a chunk an interrupted run finished (its record, histograms and measurements staged)."""
    record = records / f"part-{chunk.index:05d}.json"
    part = rundir.staging(hdir) / f"part-{chunk.index:05d}.parquet"
    if not (record.exists() and part.exists() and Path(chunk.measurements_path).exists()):
        return None
    meta = json.loads(record.read_text())
    table = pq.read_table(part).to_pandas()
    rows = pd.Index(chunk.children).get_indexer(table["geocode"].astype(str))
    hist = sp.csr_matrix((table["count"].to_numpy(np.int64), (rows, table["cell"].to_numpy())),
                         shape=(len(chunk.children), chunk.child_hist.shape[1]), dtype=np.int64)
    return ChunkResult(chunk.index, chunk.children, hist, meta["failsafe"], meta["solved"], meta["copied"], 0.0,
                       meta["solve_seconds"])


def write_level_histograms(rundir: RunDir, product: str, level: Level, hist: sp.csr_matrix) -> None:
    """Write an aggregated (not estimated) level's histograms atomically, in one part."""
    hdir = rundir.histograms(product, level.name)
    write_table(_hist_table(level.nodes, hist), rundir.staging(hdir) / "part-00000.parquet")
    rundir.commit(hdir)


def read_level_histograms(rundir: RunDir, product: str, level: Level) -> sp.csr_matrix:
    """Estimated histograms of a level already written (for --resume)."""
    table = pq.read_table(rundir.histograms(product, level.name)).to_pandas()
    rows = level.nodes.get_indexer(table["geocode"].astype(str))
    return sp.csr_matrix((table["count"].to_numpy(np.int64), (rows, table["cell"].to_numpy())),
                         shape=level.hist.shape, dtype=np.int64)
