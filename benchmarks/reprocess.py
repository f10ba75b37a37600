"""Wall and CPU time of ``topdown reprocess`` against a fresh ``topdown run`` (Rhode Island 2010 by default).

    python benchmarks/reprocess.py --work /tmp/ri-bench [--workers 2] [--config conf/ri2010.toml]

Ingests the bundled RI 2010 blocks if needed, runs the configuration, then reprocesses the run unchanged
(its histograms must come out byte-identical) and with another rounder ordering. CPU is the user + system
time of the command and all its processes (the embedded cluster's workers included); the load average is
printed before and after, since wall times on a shared machine are noisy.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import resource
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
ROUNDER = """[persons.estimation.rounder_passes]
Block = [["total"], ["hhgq"], ["detailed"]]
Block_Group = [["total", "hhgq", "detailed"]]
"""


def timed(cmd: list[str]) -> tuple[float, float]:
    """Run a command; its wall seconds and the CPU seconds of it and its descendants."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t = time.perf_counter()
    subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
    wall = time.perf_counter() - t
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    return wall, (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)


def same_tree(a: Path, b: Path) -> bool:
    files = sorted(p.relative_to(a) for p in a.rglob("*") if p.is_file())
    return files == sorted(p.relative_to(b) for p in b.rglob("*") if p.is_file()) and all(
        filecmp.cmp(a / f, b / f, shallow=False) for f in files)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--work", default="/tmp/reprocess-bench")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--config", default=str(REPO / "conf" / "ri2010.toml"))
    ap.add_argument("--source", default=str(REPO / "data" / "ri2010" / "ri_2010_block_demographics.csv.gz"))
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    topdown = [sys.executable, "-m", "topdown.pipeline.cli"]
    inp = work / "input"
    if not (inp / "persons.parquet").exists():
        subprocess.run([*topdown, "ingest", "blocks", args.source, "--out", str(inp)], check=True,
                       stdout=subprocess.DEVNULL)
    (work / "rounder.toml").write_text(ROUNDER)
    for name in ("run", "same", "rounder"):
        shutil.rmtree(work / name, ignore_errors=True)
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    w = ["--workers", str(args.workers), "--quiet"]
    rows = [("run", *timed([*topdown, "run", args.config, "--input", str(inp), "--out", str(work / "run"), *w]))]
    rows.append(("reprocess (unchanged)", *timed([*topdown, "reprocess", str(work / "run"), "--out",
                                                   str(work / "same"), *w])))
    rows.append(("reprocess (rounder)", *timed([*topdown, "reprocess", str(work / "run"), "--out",
                                                 str(work / "rounder"), "--config", str(work / "rounder.toml"), *w])))
    print(f"load after:  {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(f"{'command':24s} {'wall s':>8s} {'CPU s':>8s}")
    for name, wall, cpu in rows:
        print(f"{name:24s} {wall:8.1f} {cpu:8.1f}")
    for sub in ("histograms", "mdf"):
        print(f"unchanged reprocessing: {sub} byte-identical to the run: {same_tree(work / 'run' / sub, work / 'same' / sub)}")
    verify = subprocess.run([*topdown, "verify", str(work / "rounder")], capture_output=True, text=True)
    print(f"rounder reprocessing: {verify.stdout.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
