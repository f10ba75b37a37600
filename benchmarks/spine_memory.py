"""Peak memory of building the optimized spine as a run's driver does, step by step.

Reads the block assignment files (``read_baf_dir``), the blocks of the input (person and unit files, their
``geoid`` column) and the GQ presence of the unit files (``(geoid, unit_type)``), then ``build_spine``, and
what the driver derives from the spine for every product (``levels._geography``: each level's nodes and
each block's node row; the path shares of the certificate), keeping all of it as a run's driver does. A
thread samples this process's RSS every 10 ms; each step's peak and the RSS after it are printed (MB), with
Arrow's allocation, then what is held per block. ``--tracemalloc`` lists the largest Python allocations
held after the build. Usage (benchmarks/RESULTS_national.md, "Memory at national size"):
python benchmarks/spine_memory.py INPUT_DIR [--config benchmarks/national.toml] [--tracemalloc]
"""
from __future__ import annotations

import argparse
import gc
import json
import threading
import time
import tracemalloc
from pathlib import Path

import pandas as pd
import psutil
import pyarrow as pa
import pyarrow.parquet as pq

from topdown.geo.baf import read_baf_dir
from topdown.geo.spine import build_spine
from topdown.pipeline.configuration.config import load_config
from topdown.pipeline.execution.levels import _geography
from topdown.pipeline.execution.runner import path_shares
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
    parser.add_argument("--config", default=str(Path(__file__).with_name("national.toml")))
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

    def gq():  # gq_presence: the workers' part in a run, one file at a time
        found = []
        for f in sorted((inp / "units").rglob("*.parquet")):
            frame = pq.read_table(f, columns=["geoid", "unit_type"]).to_pandas()
            found.append(frame[frame["unit_type"] > 0].drop_duplicates())
        return pd.concat(found, ignore_index=True).sort_values(["geoid", "unit_type"], ignore_index=True)

    units = step("gq presence", gq)
    if args.tracemalloc:
        tracemalloc.start()
    spine = step("build_spine optimized", lambda: build_spine("optimized", geoids, baf_dir=baf, units=units))
    n = len(spine.table)
    config = load_config(args.config)
    geography = step("levels._geography", lambda: _geography(spine))
    shares = step("path shares", lambda: path_shares(spine, config))
    baf = units = geoids = None  # the run drops them after the spine
    gc.collect()
    release_memory()
    held = spine.table.memory_usage(deep=True)
    geo_bytes = sum(g.inverse.nbytes + (0 if g.first_block is None else g.first_block.nbytes) for g in geography[1]) + \
        sum(p.nbytes for p in geography[2] if p is not None)
    share_bytes = sum(codes.nbytes for s in shares.values() for codes, _ in s.shares)
    print(json.dumps({"blocks": n, "rss_after_mb": round(sampler.proc.memory_info().rss / MB),
                      "arrow_after_mb": round(pa.total_allocated_bytes() / MB),
                      "table_bytes_per_block": round(held.sum() / n, 1),
                      "columns_bytes_per_block": {k: round(v / n, 1) for k, v in held.items()},
                      "geography_numpy_bytes_per_block": round(geo_bytes / n, 1),
                      "path_shares_numpy_bytes_per_block": round(share_bytes / n, 1),
                      "moves_nodes": sum(len(m) for m in spine.moves.values()),
                      "peak_mb": max(s["peak_mb"] for s in steps)}), flush=True)
    if args.tracemalloc:
        snap = tracemalloc.take_snapshot()
        for stat in snap.statistics("lineno")[:8]:
            print("tracemalloc", stat, flush=True)


if __name__ == "__main__":
    main()
