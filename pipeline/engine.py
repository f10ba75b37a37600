"""The top-down level loop on Dask (DESIGN.md sections 3-4).

For every level, whole parents are grouped into chunks by a fixed cost rule (independent of the
cluster, so output files are identical for any number of workers), the most expensive chunks are
submitted first, and the level is written completely (staging, then rename) before the next starts.
"""
from __future__ import annotations

import logging
import time
from dataclasses import dataclass, field
from typing import Callable

import numpy as np
import pandas as pd
import scipy.sparse as sp
from distributed import Client, as_completed

from topdown.solvers.problem import GroupTotal

from .config import Config
from .levels import Level
from .rundir import RunDir, write_table
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
    staging_dir: str,
) -> tuple[list[Chunk], np.ndarray]:
    """Chunks of whole parents for ``level``, and the child order (node rows) the chunks follow."""
    cfg = config.product(product)
    common = dict(product=product, level=level.name, cfg=cfg, mode=config.run.mode, seed=config.run.seed)
    if parent_level is None:
        rows = np.arange(len(level))
        task = ParentTask("", None, list(level.nodes), slice(0, len(level)), level.constraints.take(rows))
        return [Chunk(index=0, children=list(level.nodes), child_hist=level.hist, child_plb=list(level.plb),
                      parents=[task], measurements_path=f"{staging_dir}/part-00000.parquet", **common)], rows
    order = np.lexsort((np.arange(len(level)), level.parent))
    par_sorted = level.parent[order]
    bounds = np.flatnonzero(np.diff(par_sorted)) + 1
    starts = np.concatenate([[0], bounds])
    ends = np.concatenate([bounds, [len(order)]])
    nnz = np.diff(parent_hist.indptr)
    chunks: list[Chunk] = []
    pending: list[tuple[int, int, int]] = []
    cost = 0

    def flush() -> None:
        nonlocal pending, cost
        if not pending:
            return
        lo, hi = pending[0][1], pending[-1][2]
        rows = order[lo:hi]
        parents = []
        for prow, s, e in pending:
            crow = order[s:e]
            parents.append(ParentTask(
                parent=str(parent_level.nodes[prow]),
                parent_hist=np.asarray(parent_hist[prow].todense(), dtype=np.int64).ravel(),
                children=[str(g) for g in level.nodes[crow]], child_rows=slice(s - lo, e - lo),
                constraints=level.constraints.take(crow), group_totals=_group_totals(level, crow),
            ))
        idx = len(chunks)
        chunks.append(Chunk(index=idx, children=[str(g) for g in level.nodes[rows]], child_hist=level.hist[rows],
                            child_plb=[level.plb[r] for r in rows], parents=parents,
                            measurements_path=f"{staging_dir}/part-{idx:05d}.parquet", **common))
        pending, cost = [], 0

    for s, e in zip(starts, ends):
        prow = int(par_sorted[s])
        c = (e - s) * max(int(nnz[prow]), 1)
        if pending and (cost + c > CHUNK_COST or s - pending[0][1] + (e - s) > CHUNK_CHILDREN):
            flush()
        pending.append((prow, int(s), int(e)))
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
    parent_hist: sp.csr_matrix | None, progress: ProgressFn | None = None,
) -> tuple[sp.csr_matrix, LevelReport]:
    """Measure and estimate one level; write its measurements and histograms atomically."""
    start = time.perf_counter()
    mdir = rundir.measurements(product, level.name)
    hdir = rundir.histograms(product, level.name)
    chunks, order = make_chunks(product, config, level, parent_level, parent_hist, str(rundir.staging(mdir)))
    rundir.staging(mdir).mkdir(parents=True, exist_ok=True)
    costs = [sum(len(p.children) for p in c.parents) * max(len(c.parents), 1) for c in chunks]
    futures = {}
    for i in np.argsort(costs, kind="stable")[::-1]:
        fut = client.submit(run_chunk, chunks[i], key=f"{product}-{level.name}-{i}-{config.digest()[:8]}",
                            priority=int(costs[i]), pure=False)
        futures[fut] = int(i)
    results: dict[int, ChunkResult] = {}
    done = 0
    for fut in as_completed(list(futures)):
        res: ChunkResult = fut.result()
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
        write_table(_hist_table(pd.Index(res.children), res.hist), rundir.staging(hdir) / f"part-{i:05d}.parquet")
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


def read_level_histograms(rundir: RunDir, product: str, level: Level) -> sp.csr_matrix:
    """Estimated histograms of a level already written (for --resume)."""
    import pyarrow.parquet as pq

    table = pq.read_table(rundir.histograms(product, level.name)).to_pandas()
    rows = level.nodes.get_indexer(table["geocode"].astype(str))
    return sp.csr_matrix((table["count"].to_numpy(np.int64), (rows, table["cell"].to_numpy())),
                         shape=level.hist.shape, dtype=np.int64)
