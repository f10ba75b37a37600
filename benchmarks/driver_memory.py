"""The run driver's memory per block after the start-up (ingest, spine, tabulation) of a run.

Runs :func:`topdown.pipeline.execution.runner.prepare` (what a run does before its first level: the input read
and tabulated on the workers, the block assignment files and the spine in the driver) on an embedded cluster,
then prints the driver's RSS, high-water mark and Arrow allocation and the sizes of what it holds per block:
the block assignment frame (held by the run for its whole length), the spine's table, each level's block rows
and the path shares. Run from the folder that holds the input (benchmarks/national.toml names its baf):
python benchmarks/driver_memory.py benchmarks/national.toml INPUT_DIR --workers 2
"""
from __future__ import annotations

import argparse
import json
import resource
import time

import numpy as np
import psutil
import pyarrow as pa

from topdown.pipeline.configuration.config import load_config
from topdown.pipeline.execution.preflight import read_baf
from topdown.pipeline.execution.memory import release_memory
from topdown.pipeline.execution.runner import dask_client, prepare

MB = 1 << 20


def _numpy_bytes(value, seen: set[int]) -> int:
    """Bytes of the numpy arrays reachable from ``value`` through lists, tuples, dicts and objects' fields."""
    if id(value) in seen:
        return 0
    seen.add(id(value))
    if isinstance(value, np.ndarray):
        return value.nbytes if value.base is None else 0
    if isinstance(value, (list, tuple)):
        return sum(_numpy_bytes(v, seen) for v in value)
    if isinstance(value, dict):
        return sum(_numpy_bytes(v, seen) for v in value.values())
    if hasattr(value, "__dict__") and not isinstance(value, type):
        return sum(_numpy_bytes(v, seen) for v in vars(value).values())
    return 0


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("config")
    parser.add_argument("input")
    parser.add_argument("--workers", type=int, default=2)
    args = parser.parse_args()
    config = load_config(args.config)
    proc = psutil.Process()
    t = time.perf_counter()
    with dask_client(None, None, args.workers) as client:
        prep = prepare(config, args.input, client)
        release_memory()
        baf = read_baf(config)  # what run() holds beside the prepared input (read again here to size it)
        n = len(prep.spine.table)
        seen: set[int] = set()
        print(json.dumps({
            "blocks": n, "seconds": round(time.perf_counter() - t, 1),
            "driver_rss_mb": round(proc.memory_info().rss / MB),
            "driver_hwm_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
            "arrow_mb": round(pa.total_allocated_bytes() / MB),
            "per_block_bytes": {
                "baf frame": round(baf.memory_usage(deep=True).sum() / n, 1),
                "spine table": round(prep.spine.table.memory_usage(deep=True).sum() / n, 1),
                "levels (numpy)": round(_numpy_bytes(prep.levels, seen) / n, 1),
                "path shares (numpy)": round(_numpy_bytes(prep.shares, seen) / n, 1)}}), flush=True)


if __name__ == "__main__":
    main()
