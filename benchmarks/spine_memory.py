"""Peak memory of building the optimized spine as a run's driver does (issue 30 item 2), step by step.

Reads the block assignment files (``read_baf_dir``), the blocks of the input (person and unit files, their
``geoid`` column) and the GQ presence of the unit files (``(geoid, unit_type)``), then ``build_spine``, and
what the driver derives from the spine (``levels._geography``, the path shares). A thread samples this
process's RSS every 10 ms; each step's peak and the RSS after it are printed (MB), then the driver's
holding per block after the build. Usage: python benchmarks/spine_memory.py INPUT_DIR [--tracemalloc]
"""
from __future__ import annotations

import argparse
import gc
import json
import threading
import time
import tracemalloc
from pathlib import Path

import numpy as np
import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.dataset as ds
import pyarrow.parquet as pq

from topdown.geo.baf import read_baf_dir
from topdown.geo.spine import build_spine
from topdown.pipeline.execution.memory import release_memory

MB = 1 << 20


class Sampler(threading.Thread):
    """The process's RSS every 10 ms; ``peak`` since the last ``reset``."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.proc, self.peak, self.stop = psutil.Process(), 0, False

    def run(self) -> None:
        while not self.stop:
            self.peak = max(self.peak, self.proc.memory_info().rss)
            time.sleep(0.01)

    def reset(self) -> int:
        self.peak = self.proc.memory_info().rss
        return self.peak


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("input")
    parser.add_argument("--tracemalloc", action="store_true")
    args = parser.parse_args()
    inp = Path(args.input)
    sampler = Sampler()
    sampler.start()
    steps = []

    def step(name, fn):
        gc.collect()
        release_memory()
        before = sampler.reset()
        t = time.perf_counter()
        value = fn()
        seconds = time.perf_counter() - t
        gc.collect()
        release_memory()
        steps.append({"step": name, "seconds": round(seconds, 1), "before_mb": round(before / MB),
                      "peak_mb": round(sampler.peak / MB), "after_mb": round(sampler.proc.memory_info().rss / MB),
                      "arrow_mb": round(pa.total_allocated_bytes() / MB)})
        print(json.dumps(steps[-1]), flush=True)
        return value

    baf = step("read_baf_dir", lambda: read_baf_dir(inp / "baf"))

    def blocks():  # the workers' part in a run: one file at a time
        found = [pq.read_table(f, columns=["geoid"])["geoid"].unique() for kind in ("persons", "units")
                 for f in sorted((inp / kind).rglob("*.parquet"))]
        return pd.Series(pd.Index(pa.chunked_array(found).unique().to_pandas().astype("str")).sort_values(),
                         name="geoid").reset_index(drop=True)

    geoids = step("input blocks", blocks)

    def gq():
        units = ds.dataset(inp / "units", partitioning="hive").to_table(columns=["geoid", "unit_type"]).to_pandas()
        units = units[units["unit_type"] > 0].drop_duplicates()
        return units.sort_values(["geoid", "unit_type"], ignore_index=True)

    units = step("gq presence", gq)
    if args.tracemalloc:
        tracemalloc.start()
    spine = step("build_spine optimized", lambda: build_spine("optimized", geoids, baf_dir=baf, units=units))
    if args.tracemalloc:
        snap = tracemalloc.take_snapshot()
        tracemalloc.stop()
        for stat in snap.statistics("lineno")[:10]:
            print("tracemalloc", stat, flush=True)
    n = len(spine.table)
    del baf, units, geoids
    gc.collect()
    held = spine.table.memory_usage(deep=True)
    moves = sum(len(m) for m in spine.moves.values())
    print(json.dumps({"blocks": n, "rss_after_mb": round(sampler.proc.memory_info().rss / MB),
                      "table_bytes_per_block": round(held.sum() / n, 1),
                      "columns_bytes_per_block": {k: round(v / n, 1) for k, v in held.items()},
                      "moves_nodes": moves, "peak_build_mb": max(s["peak_mb"] for s in steps)}), flush=True)


if __name__ == "__main__":
    main()
