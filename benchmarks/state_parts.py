"""The AIAN state parts' totals (DESIGN.md item 13): the Bureau's State hhgq bounds against this project's.

The Bureau bounds persons by hhgq type at the State level with each *part's* total T: a part without GQ
facilities gets lb_0 = ub_0 = T, so the published total of that part is its true total, and the other
part's is the state total minus it. This project bounds a part without its total (pipeline/inputs/invariants.py);
the whole state's total binds the parts as a group. For each rule and seed, one test-mode run (persons,
2021 production budget, ``aian`` spine) of the input of tests/test_spines_e2e.py (synthetic persons on
real RI 2020 blocks, AIAN area 2415 in its own part) prints one JSON line: rule, seed, and per part its GQ
facility count and published total minus true total. A last line sums up per rule and part: runs, mean
absolute error, and how many runs published the exact true total.
Usage: python benchmarks/state_parts.py [--seeds 1,2,3,4,5] [--workers 2] [--out /tmp/state_parts]
"""
from __future__ import annotations

import argparse
import json
import sys
import tempfile
from pathlib import Path

import numpy as np
import pandas as pd

REPO = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(REPO / "tests"))

from test_spines_e2e import BAF_DIR, write_input  # noqa: E402

import topdown.pipeline.execution.levels as levels  # noqa: E402
from topdown.pipeline import load_config, run  # noqa: E402

OURS = levels._invariant_totals


def bureau_totals(hist, state):
    """The Bureau's rule: every State node's total (parts included) enters its hhgq bounds."""
    return OURS(hist, None)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seeds", default="1,2,3,4,5")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", default=None)
    args = ap.parse_args()
    from distributed import Client, LocalCluster

    out = Path(args.out or tempfile.mkdtemp(prefix="state_parts-"))
    inp = out / "input"
    if not (inp / "persons.parquet").exists():
        write_input(inp)
    persons = pd.read_parquet(inp / "persons.parquet", columns=["geoid"])
    units = pd.read_parquet(inp / "units.parquet")
    summary: dict[tuple[str, str], list[int]] = {}
    with LocalCluster(n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        for rule, totals in (("whole_state", OURS), ("bureau", bureau_totals)):
            levels._invariant_totals = totals  # the constraints are built in this process (levels.build_levels)
            for seed in (int(s) for s in args.seeds.split(",")):
                config = load_config("pl94_production_2021").with_overrides(
                    name=f"parts-{rule}-{seed}", products=["persons"], spine="aian", baf=str(BAF_DIR),
                    input=str(inp), mode="test", seed=seed)
                run_dir = run(config, out / f"{rule}-{seed}", input_dir=inp, client=client, force=True)
                spine = pd.read_parquet(run_dir / "spine.parquet").astype(str).set_index("geoid")["State"]
                truth = persons["geoid"].map(spine).value_counts()
                gq = units.loc[units["unit_type"] > 0, "geoid"].map(spine).value_counts()
                hist = pd.read_parquet(run_dir / "histograms" / "persons" / "level=State")
                published = hist.assign(geocode=hist["geocode"].astype(str)).groupby("geocode")["count"].sum()
                row = {"rule": rule, "seed": seed, "parts": {}}
                for part in sorted(truth.index):
                    err = int(published.get(part, 0) - truth[part])
                    row["parts"][part] = {"gq_facilities": int(gq.get(part, 0)), "error": err}
                    summary.setdefault((rule, part), []).append(err)
                print(json.dumps(row), flush=True)
    levels._invariant_totals = OURS
    print(json.dumps({f"{rule} {part}": {"runs": len(e), "mean_abs_error": float(np.mean(np.abs(e))),
                                         "exact_true_total": int(sum(x == 0 for x in e))}
                      for (rule, part), e in summary.items()}))


if __name__ == "__main__":
    main()
