"""What the workers hold after a run's tabulation: bytes per spine block of each product's and level's true
histograms (``Level.parts``) and of the blocks' metadata (``Level.meta``), each worker's RSS, and its
high-water RSS (the tabulation's peak).

    python benchmarks/worker_memory.py CONFIG --input DIR [--workers N]

Reads, checks and tabulates the input as a run does (``runner.prepare``) on an embedded cluster of N workers
(default 1: one process holds everything, so its figures are the run's totals) started as a run's are
(``runner.embedded_settings``), then sizes every object the workers hold (NumPy, SciPy sparse and Arrow
buffers; pandas objects with their hash tables), each buffer once: under the first key holding it. Prints a table and one JSON line. No output is written; no true count is printed, only sizes.
"""
from __future__ import annotations

import argparse
import json
import sys
from collections import Counter
from pathlib import Path

import numpy as np
import pyarrow as pa
import scipy.sparse as sp


def nbytes(x, seen: set | None = None) -> int:
    """The bytes of ``x``'s buffers, each object counted once."""
    seen = set() if seen is None else seen
    if id(x) in seen or x is None or isinstance(x, (type, np.dtype, str, bytes, int, float, bool)):
        return 0
    seen.add(id(x))
    if isinstance(x, (pa.Array, pa.ChunkedArray)):
        return x.nbytes
    if sp.issparse(x):
        return x.data.nbytes + x.indices.nbytes + x.indptr.nbytes
    if isinstance(x, np.ndarray):
        return x.nbytes
    if hasattr(x, "memory_usage") and not isinstance(x, type):
        usage = x.memory_usage(deep=True)
        return int(usage.sum()) if hasattr(usage, "sum") else int(usage)
    if isinstance(x, (list, tuple)):
        return sum(nbytes(v, seen) for v in x)
    if isinstance(x, dict):
        return sum(nbytes(v, seen) for v in x.values())
    if hasattr(x, "__dict__"):
        return sum(nbytes(v, seen) for v in vars(x).values())
    return sys.getsizeof(x)


def held(dask_worker) -> tuple[dict, int, int]:
    """Each key's bytes on this worker, its RSS and its high-water RSS (bytes)."""
    import resource

    seen: set = set()  # a buffer shared by two keys (a later product's block metadata) counted once, first
    return ({str(k): nbytes(v, seen) for k, v in dask_worker.data.items()}, dask_worker.monitor.get_process_memory(),
            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024)


def main(argv: list[str] | None = None) -> int:
    from distributed import Client, LocalCluster

    from topdown.pipeline.execution.runner import configure_run, embedded_settings, prepare

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("config")
    ap.add_argument("--input", required=True)
    ap.add_argument("--workers", type=int, default=1)
    args = ap.parse_args(argv)
    config = configure_run(args.config, args.input)
    with embedded_settings(), LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True) as cluster, \
            Client(cluster) as c:
        prep = prepare(config, Path(args.input), c)
        blocks = len(prep.spine.table)
        per_worker = c.run(held)
        sizes = {k: v for s, _, _ in per_worker.values() for k, v in s.items()}
        rows, kinds = [], Counter()
        for product, levels in prep.levels.items():
            for level in levels:
                for kind, parts in (("parts", level.parts), ("meta", level.meta)):
                    if parts:
                        b = sum(sizes.get(str(p.future.key), 0) for p in parts)
                        rows.append({"product": product, "level": level.name, "kind": kind, "bytes": b,
                                     "bytes_per_block": round(b / blocks, 1)})
                        kinds[kind] += b
        for r in rows:
            print(f"{r['product']:10s} {r['level']:14s} {r['kind']:5s} {r['bytes'] / 1e6:10.1f} MB "
                  f"{r['bytes_per_block']:8.1f} B/block")
        total = sum(kinds.values())
        rss = [r for _, r, _ in per_worker.values()]
        hwm = [h for _, _, h in per_worker.values()]
        print(f"held {total / 1e6:.1f} MB, {total / blocks:.1f} B per spine block ({blocks:,} blocks); "
              f"worker RSS {', '.join(f'{r >> 20} MB' for r in rss)}; "
              f"high-water {', '.join(f'{h >> 20} MB' for h in hwm)}")
        print(json.dumps({"blocks": blocks, "held_bytes": total, "held_per_block": round(total / blocks, 1),
                          "worker_rss_mb": [r >> 20 for r in rss], "worker_hwm_mb": [h >> 20 for h in hwm],
                          "rows": rows}))
    return 0


if __name__ == "__main__":
    sys.exit(main())
