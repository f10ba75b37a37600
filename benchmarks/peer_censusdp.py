"""Side by side with the peer Yiruzz/CensusDP on HiGHS's interior-point QP (HiPO): same demo persons.

    python benchmarks/peer_censusdp.py --peer /tmp/peer --peer-python /work/venvs/peer/bin/python \
        [--repeats 3] [--work DIR]

The peer is a CensusDP checkout (its April 2026 ``main``, the snapshot GitHub serves: Pyomo models,
one process) and a Python with its requirements plus ``highspy`` and ``highspy-extras`` (HiPO) and
Pyomo >= 6.10 (whose ``highs`` interface passes a quadratic objective; the older ``appsi_highs`` refuses
one). Nothing of the peer is copied here: a small driver written to the work directory imports its
``TopDown`` class and calls its own steps, as its ``main.py`` example does.

Each repeat runs, alternating, one after the other (never two at once): the peer; ours on persons only
(``topdown run`` of a configuration that includes ``demo.toml`` with ``products = ["persons"]``); ours
as the README demo (``conf/demo.toml``, persons and units). Each is timed by ``/usr/bin/time``: wall
seconds, user + system CPU seconds of the whole process tree (children that were waited for, so the
embedded Dask cluster's worker processes count), and the peak RSS of the largest single process.
Medians over the repeats are printed, with the load average (``os.getloadavg``) before and after.

The same in both runs:
* input: the demo persons (``topdown demo-data``: the 2018 End-to-End prototype, Providence County),
  every person, as records;
* domain: hhgq 8 x votingage 2 x hispanic 2 x cenrace 63 = 2,016 cells at every node; the peer derives
  its domain from the values seen in the data (4 hhgq and 23 cenrace values here, 368 cells), so the
  driver gives it the declared 2,016-cell table before building its tree (its ``DataHandler`` attribute
  ``contingency_df``, which ``build_hierarchical_tree`` uses when set) instead of its
  ``generate_contingency_dataframe``;
* geography: US (the peer's implicit root) > State > County > Tract > Block_Group > Block by GEOID
  prefixes;
* privacy loss per level: each level's rho of ``demo.toml`` (persons); the state total is invariant;
* thread pools: ``OMP/OPENBLAS/MKL/RAYON_NUM_THREADS=1`` in both environments, and HiGHS ``threads = 1``
  for the peer.

What differs (on purpose, or because the peer cannot do it):
* processes: ours runs on an embedded Dask cluster of ``--workers 2`` worker processes (the machine's 2
  cores) plus its driver; the peer solves its parents one after another in one process;
* measurements: the peer spends each level's rho on the detailed histogram alone (discrete Gaussian,
  sigma^2 = 1 / (2 rho_level), its only query); ours on the production workload of about ten queries per
  level with their shares;
* invariants and constraints: ours keeps the production ones (state total; each block's group-quarters
  facility counts by type and the person bounds they imply; no under-18 persons in nursing facilities);
  the peer gets the state total (``SumEqualRealTotal`` at the State level) only;
* nodes: the peer's tree has only the blocks with persons (354 of the demo's 569); ours every block on
  the spine;
* estimation: ours runs the production multi-pass L2 and rounder; the peer one L2 pass (Pyomo, HiGHS with
  ``solver = "hipo"``) and one rounding problem (Pyomo; HiGHS cannot solve its quadratic objective in
  binary variables, so the driver hands HiGHS's MIP solver the same objective with y^2 written as y,
  exact for binaries);
* outputs: ours writes and verifies a run directory (both products for the demo row); the peer writes
  its microdata CSV;
* samplers: ours and the peer's both exact; the peer draws one Python call per cell.
"""
from __future__ import annotations

import argparse
import json
import math
import os
import re
import statistics
import subprocess
import sys
import tempfile
from fractions import Fraction
from itertools import product
from pathlib import Path

import pandas as pd

from topdown.geo.spine import BLOCK, LEVELS, PREFIX, STATE
from topdown.pipeline.configuration.config import load_config
from topdown.pipeline.configuration.census import PERSONS

REPO = Path(__file__).resolve().parents[1]
THREADS = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "RAYON_NUM_THREADS")}
TIME_FORMAT = "%e %U %S %M"  # wall s, user s, system s, max RSS KiB

#: The driver run with the peer's Python (argv: peer dir, records CSV, params JSON, output CSV).
PEER_DRIVER = r'''
import json, sys
from itertools import product
peer, records, params_path, out = sys.argv[1:5]
sys.path.insert(0, peer)
import pandas as pd
import pyomo.environ as pyo
from topdown import TopDown
from constraints.contextual_constraints import SumEqualRealTotal
from constraints.logical_expressions.atomic import TrueExpression

params = json.load(open(params_path))


class HiPODispatch:
    """HiGHS for the peer's two models: its L2 QP with HiPO; its binary rounding problem, whose objective
    sum (r_i - y_i)^2 is rewritten sum r_i^2 + (1 - 2 r_i) y_i (y^2 = y for binaries), with HiGHS's MIP."""

    def __init__(self, **kwargs):
        self.highs = pyo.SolverFactory("highs")

    def solve(self, instance, tee=False, options=None):
        opts = {"threads": 1, **(options or {})}
        if hasattr(instance, "y") and hasattr(instance, "r"):
            instance.obj.deactivate()
            r = {i: pyo.value(instance.r[i]) for i in instance.I}
            instance.linear_obj = pyo.Objective(
                expr=sum(v * v for v in r.values()) + pyo.quicksum((1 - 2 * r[i]) * instance.y[i] for i in instance.I))
            opts.pop("solver", None)
        return self.highs.solve(instance, tee=tee, options=opts)


pyo.SolverFactory.register("hipo_dispatch", doc="HiGHS: HiPO for QPs, MIP for the rounding")(HiPODispatch)
levels = params["levels"]
td = TopDown(data_path=records, hierarchy=levels[1:], queries=params["dims"], out_path=out,
             optimizer="hipo_dispatch", solver_options={"solver": "hipo"})
td.set_privacy_parameters(params["sigma2"])  # exact fractions as text; its sampler reads Fraction(sigma2)
td.set_mechanism("discrete_gaussian")
td.set_constraint_to_level(levels.index(params["state"]), SumEqualRealTotal(expression=TrueExpression()))
# TopDown.run() with initialize()'s data-derived domain replaced by the declared one.
dh = td.data_handler
dh.read_data(levels[1:] + params["dims"], sep=";")
domain = pd.DataFrame(list(product(*[range(n) for n in params["sizes"]])), columns=params["dims"])
dh.contingency_df = domain.astype({c: dh.dataframe[c].dtype for c in params["dims"]})
td.tree = dh.build_hierarchical_tree(td.constraints)
td.measurement_phase()
td.estimation_phase()
td.construct_microdata()
td.check_correctness()
'''


def peer_records(persons: pd.DataFrame) -> pd.DataFrame:
    """The demo persons as the peer's records: one geocode column per level below the root, then the dims."""
    geo = {level: persons["geoid"].str[:width] for level, width in PREFIX.items()}
    geo[BLOCK] = persons["geoid"]
    return pd.DataFrame({**geo, **{d: persons[d] for d in PERSONS.dim_names}})


def peer_sigma2(config: Path) -> list[Fraction]:
    """Per level (root first) the variance 1 / (2 rho_level) of detailed-only measurements at ours' level rho."""
    budget = load_config(config).product("persons").budget
    return [1 / (2 * budget.rho * budget.levels[level]) for level in LEVELS]


def timed(cmd: list[str], env: dict[str, str], log: Path) -> dict[str, float]:
    """Wall s, CPU s (user + system, whole waited-for tree) and peak RSS (MiB) of one command."""
    stats = log.with_suffix(".time")
    with log.open("w") as fh:
        proc = subprocess.run(["/usr/bin/time", "-f", TIME_FORMAT, "-o", str(stats), *cmd],
                              stdout=fh, stderr=subprocess.STDOUT, env=env)
    if proc.returncode != 0:
        sys.exit(f"{cmd[0]} failed (exit {proc.returncode}); see {log}")
    wall, user, system, rss = stats.read_text().split()[-4:]
    return {"wall_s": float(wall), "cpu_s": float(user) + float(system), "rss_mib": int(rss) / 1024}


def peer_phases(log: Path) -> dict[str, float]:
    """The peer's own wall seconds of its measurement (noise) and estimation phases, from its log."""
    found = re.findall(r"(Measurement|Estimation) phase completed in ([0-9.]+) seconds", log.read_text())
    return {f"{phase.lower()}_s": float(sec) for phase, sec in found}


def load() -> str:
    return " ".join(f"{x:.2f}" for x in os.getloadavg())


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--peer", required=True, type=Path, help="a CensusDP checkout")
    ap.add_argument("--peer-python", required=True, help="a Python with the peer's requirements and highspy-extras")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--workers", type=int, default=2, help="our embedded cluster's worker processes")
    ap.add_argument("--work", type=Path, default=None, help="scratch directory (default: a new temporary one)")
    args = ap.parse_args()
    work = args.work or Path(tempfile.mkdtemp(prefix="peer-censusdp-"))
    work.mkdir(parents=True, exist_ok=True)
    env = {**os.environ, **THREADS}
    topdown = str(Path(sys.executable).with_name("topdown"))

    demo_input = work / "demo-input"
    if not (demo_input / "persons.parquet").exists():
        subprocess.run([topdown, "demo-data", str(demo_input)], check=True, stdout=subprocess.DEVNULL)
    persons = pd.read_parquet(demo_input / "persons.parquet")
    peer_records(persons).to_csv(work / "records.csv", sep=";", index=False)
    params = {"levels": list(LEVELS), "state": STATE, "dims": list(PERSONS.dim_names), "sizes": list(PERSONS.shape),
              "sigma2": [str(s) for s in peer_sigma2(REPO / "conf" / "demo.toml")]}
    (work / "params.json").write_text(json.dumps(params))
    (work / "driver.py").write_text(PEER_DRIVER)
    (work / "persons.toml").write_text('include = "demo.toml"\n\n[run]\nproducts = ["persons"]\n')

    runs = {
        "peer (CensusDP, HiPO)": lambda i: [args.peer_python, str(work / "driver.py"), str(args.peer.resolve()),
                                            str(work / "records.csv"), str(work / "params.json"),
                                            str(work / f"peer-out-{i}.csv")],
        "ours, persons": lambda i: [topdown, "run", str(work / "persons.toml"), "--input", str(demo_input),
                                    "--out", str(work / f"ours-persons-{i}"), "--workers", str(args.workers)],
        "ours, demo (persons + units)": lambda i: [topdown, "run", str(REPO / "conf" / "demo.toml"), "--input",
                                                   str(demo_input), "--out", str(work / f"ours-demo-{i}"),
                                                   "--workers", str(args.workers)],
    }
    print(f"persons {len(persons)}, blocks with persons {persons['geoid'].nunique()}, cells {math.prod(PERSONS.shape)}; "
          f"work {work}")
    print(f"load before: {load()}", flush=True)
    results: dict[str, list[dict[str, float]]] = {name: [] for name in runs}
    for i in range(args.repeats):
        for k, (name, cmd) in enumerate(runs.items()):
            log = work / f"run{k}-{i}.log"
            r = timed(cmd(i), env, log)
            phases = peer_phases(log) if k == 0 else {}
            results[name].append(r | phases)
            print(f"  {name} #{i + 1}: {r['wall_s']:.1f} s wall, {r['cpu_s']:.1f} CPU s, "
                  f"{r['rss_mib']:.0f} MiB peak{''.join(f', {p} {v:.1f}' for p, v in phases.items())}, "
                  f"load {load()}", flush=True)
    print(f"load after: {load()}")
    med = {name: {k: statistics.median(r[k] for r in rs) for k in rs[0]} for name, rs in results.items()}
    peer = med["peer (CensusDP, HiPO)"]
    print(f"\nmedians of {args.repeats}:")
    print("| run | wall s | CPU s (user+sys, all processes) | peak RSS MiB | peer/ours wall | peer/ours CPU |")
    print("|---|---|---|---|---|---|")
    for name, m in med.items():
        print(f"| {name} | {m['wall_s']:.1f} | {m['cpu_s']:.1f} | {m['rss_mib']:.0f} | "
              f"{peer['wall_s'] / m['wall_s']:.1f}x | {peer['cpu_s'] / m['cpu_s']:.1f}x |")
    print(f"peer's own phase wall s (medians): measurement {peer.get('measurement_s', float('nan')):.1f}, "
          f"estimation {peer.get('estimation_s', float('nan')):.1f}")


if __name__ == "__main__":
    main()
