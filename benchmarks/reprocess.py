"""Wall time, CPU and peak memory of ``topdown reprocess`` against a fresh ``topdown run`` (Rhode Island 2010
by default), from the run directory and from its noisy measurement file (``topdown nmf``).

    python benchmarks/reprocess.py --work /tmp/ri-bench [--workers 2] [--config conf/ri2010.toml]
    python benchmarks/reprocess.py --work /tmp/hi-bench --config benchmarks/synth_both.toml --input SYNTH_DIR

Ingests the bundled RI 2010 blocks if no ``--input`` is given, runs the configuration (or reuses the complete
run ``WORK/run``), then reprocesses it unchanged from the run directory and from the NMF (both must come out
byte-identical to the run) and with another rounder ordering. CPU is the user + system time of the command
and all its processes (the embedded cluster's workers included); peak RSS is the largest resident set of any
one of them (sampled every 0.2 s: ``process_cost.measure``, the one measurement of the benchmarks).
The load average is printed before and after, since wall times on a shared machine are noisy.
"""
from __future__ import annotations

import argparse
import filecmp
import os
import shutil
import subprocess
import sys
from pathlib import Path

from process_cost import measure

REPO = Path(__file__).resolve().parents[1]
ROUNDER = """[persons.estimation.rounder_passes]
Block = [["total"], ["hhgq"], ["detailed"]]
Block_Group = [["total", "hhgq", "detailed"]]
"""


def timed(cmd: list[str]) -> tuple[float, float, float]:
    """Run a command (process_cost.measure); its wall seconds, the CPU seconds of it and its descendants and the
    peak RSS (MB) of the largest of them."""
    cost = measure(cmd)
    if cost.code != 0:
        raise subprocess.CalledProcessError(cost.code, cmd)
    return cost.wall, cost.cpu, cost.largest / 2**20


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
    ap.add_argument("--input", help="an input directory to run on (default: the RI 2010 blocks, ingested)")
    args = ap.parse_args()
    work = Path(args.work)
    work.mkdir(parents=True, exist_ok=True)
    topdown = [sys.executable, "-m", "topdown.pipeline.cli"]
    inp = Path(args.input) if args.input else work / "input"
    if not args.input and not (inp / "persons.parquet").exists():
        subprocess.run([*topdown, "ingest", "blocks", args.source, "--out", str(inp)], check=True,
                       stdout=subprocess.DEVNULL)
    (work / "rounder.toml").write_text(ROUNDER)
    for name in ("same", "from-nmf", "rounder", "nmf"):
        shutil.rmtree(work / name, ignore_errors=True)
    print(f"load before: {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    w = ["--workers", str(args.workers), "--quiet"]
    rows = []
    if not (work / "run" / "manifest.json").exists():
        shutil.rmtree(work / "run", ignore_errors=True)
        rows.append(("run", *timed([*topdown, "run", args.config, "--input", str(inp), "--out", str(work / "run"), *w])))
    rows.append(("nmf", *timed([*topdown, "nmf", str(work / "run"), "--out", str(work / "nmf")])))
    rows.append(("reprocess (run dir)", *timed([*topdown, "reprocess", str(work / "run"), "--out",
                                                 str(work / "same"), *w])))
    rows.append(("reprocess (NMF)", *timed([*topdown, "reprocess", str(work / "nmf"), "--out", str(work / "from-nmf"),
                                             "--spine", str(work / "run" / "spine.parquet"), "--config", args.config,
                                             *w])))
    rows.append(("reprocess (rounder)", *timed([*topdown, "reprocess", str(work / "run"), "--out",
                                                 str(work / "rounder"), "--config", str(work / "rounder.toml"), *w])))
    print(f"load after:  {os.getloadavg()[0]:.2f} {os.getloadavg()[1]:.2f} {os.getloadavg()[2]:.2f}")
    print(f"{'command':24s} {'wall s':>8s} {'CPU s':>8s} {'peak RSS MB':>12s}")
    for name, wall, cpu, rss in rows:
        print(f"{name:24s} {wall:8.1f} {cpu:8.1f} {rss:12.0f}")
    byname = {r[0]: r for r in rows}
    a, b = byname["reprocess (run dir)"], byname["reprocess (NMF)"]
    print(f"NMF / run dir: CPU {b[2] / a[2]:.2f}x, peak RSS {b[3] / a[3]:.2f}x")
    for label, other in (("unchanged reprocessing", "same"), ("reprocessing from the NMF", "from-nmf")):
        for sub in ("histograms", "mdf"):
            print(f"{label}: {sub} byte-identical to the run: {same_tree(work / 'run' / sub, work / other / sub)}")
    verify = subprocess.run([*topdown, "verify", str(work / "rounder")], capture_output=True, text=True)
    print(f"rounder reprocessing: {verify.stdout.strip().splitlines()[-1]}")


if __name__ == "__main__":
    main()
