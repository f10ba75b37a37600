"""Empirical privacy loss of the persons product at the production setting and at scaled budgets.

For each setting (the preset's rho, and rho scaled so that the persons epsilon at the preset's delta is 1, 4
and 10), one seeded run of the persons product and the residual EPL (metrics.empirical_privacy_loss) of
TOTAL and the detailed query per level; then, optionally, the direct audit (pipeline/evaluation/audit.py) at the
production setting for one moved person. Prints Markdown tables, the commands' timings (wall and CPU) and the
load. Everything runs in test mode with explicit seeds.

    python benchmarks/epl_study.py demo --input /tmp/i19/demo-input --out /tmp/i19/epl-demo --audit-runs 200
    python benchmarks/epl_study.py conf/ri2010.toml --input /tmp/i19/ri --out /tmp/i19/epl-ri --audit-runs 100
"""
from __future__ import annotations

import argparse
import math
import os
import resource
import time
from pathlib import Path

import pandas as pd

from topdown.pipeline.evaluation import audit as A
from topdown.pipeline.privacy.budget import rho_for_epsilon, zcdp_to_epsilon
from topdown.pipeline.configuration.config import config_from_dict, load_config
from topdown.pipeline.evaluation.eval_report import _fmt_epl
from topdown.pipeline.evaluation.evaluate import EvalOptions, default_out, evaluate
from topdown.pipeline.execution.runner import dask_client, run

QUERIES = ("total", "detailed")


def markdown(frame: pd.DataFrame, index: bool = True) -> str:
    """A Markdown table (floats to 3 decimals, missing as blank)."""
    frame = frame.reset_index() if index else frame
    cell = lambda v: "" if v is None or (isinstance(v, float) and math.isnan(v)) else (  # noqa: E731
        f"{v:.3f}" if isinstance(v, float) else str(v))
    lines = ["| " + " | ".join(map(str, frame.columns)) + " |", "|" + "---|" * len(frame.columns)]
    lines += ["| " + " | ".join(cell(v) for v in row) + " |" for row in frame.itertuples(index=False)]
    return "\n".join(lines)


def settings(config) -> dict[str, object]:
    base = config.with_overrides(products=["persons"], mode="test", seed=2021)
    budget = base.persons.budget
    out = {f"production (eps {zcdp_to_epsilon(budget.rho, budget.delta):.2f})": base}
    for eps in (1, 4, 10):
        data = base.model_dump(mode="json")
        data["persons"]["budget"]["rho"] = str(rho_for_epsilon(eps, budget.delta))
        out[f"eps {eps}"] = config_from_dict(data, source=f"{config.source} (rho scaled to epsilon {eps})")
    return out


def cpu() -> float:
    r = resource.getrusage(resource.RUSAGE_CHILDREN)
    s = resource.getrusage(resource.RUSAGE_SELF)
    return r.ru_utime + r.ru_stime + s.ru_utime + s.ru_stime


def choose_move(input_dir: Path, spine: pd.DataFrame) -> tuple[str, str]:
    """FROM: the block with most household persons; TO: the first block of another tract with an occupied
    housing unit (so D' satisfies every invariant)."""
    persons = pd.read_parquet(input_dir / "persons.parquet", columns=["geoid", "hhgq"])
    units = pd.read_parquet(input_dir / "units.parquet")
    src = persons.loc[persons["hhgq"] == 0, "geoid"].value_counts().index[0]
    housed = set(units.loc[units["occupied"] & (units["unit_type"] == 0), "geoid"])
    tract = spine.set_index("geoid")["Tract"]
    return src, next(g for g in spine["geoid"] if g in housed and tract[g] != tract[src])


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("config")
    ap.add_argument("--input", required=True)
    ap.add_argument("--out", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--audit-runs", type=int, default=0)
    args = ap.parse_args()
    out, inp = Path(args.out), Path(args.input)
    print(f"load at start: {os.getloadavg()}")
    rows = []
    with dask_client(None, None, args.workers) as client:
        runs = {}
        for name, config in settings(load_config(args.config)).items():
            t, c = time.perf_counter(), cpu()
            rdir = out / name.split(" (")[0].replace(" ", "_")
            if not (rdir / "manifest.json").exists():
                run(config, rdir, input_dir=inp, client=client, force=True)
            runs[name] = rdir
            ev = evaluate([rdir], inp, out=default_out(rdir), client=client,
                          options=EvalOptions(queries={"persons": QUERIES}, sampling_rates=(), sampling_queries=(),
                                              figures=False))
            epl = pd.read_parquet(ev / "epl.parquet")
            for _, r in epl[epl["query"].isin(QUERIES)].iterrows():
                rows.append({"setting": name, "level": r["level"], "query": r["query"], "epl": _fmt_epl(r),
                             "eps_query": r["epsilon_query"]})
            print(f"{name}: run + evaluate {time.perf_counter() - t:.1f} s wall, {cpu() - c:.1f} s CPU (driver + "
                  f"waited-for children; workers not counted), load {os.getloadavg()[0]:.1f}", flush=True)
        table = pd.DataFrame(rows)
        for query in QUERIES:
            q = table[table["query"] == query]
            print(f"\n### Residual EPL [95% bootstrap interval], {query}\n")
            print(markdown(q.pivot_table(index="level", columns="setting", values="epl", aggfunc="first", sort=False)))
            print("\ntheoretical epsilon of the query's measurement at each level:\n")
            print(markdown(q.pivot_table(index="level", columns="setting", values="eps_query", aggfunc="first",
                                         sort=False)))
        if args.audit_runs:
            prod = next(iter(runs))
            config = settings(load_config(args.config))[prod]
            move = choose_move(inp, pd.read_parquet(runs[prod] / "spine.parquet"))
            t = time.perf_counter()
            res = A.audit(config, inp, move, args.audit_runs, client, queries=QUERIES, seed=7)
            wall = time.perf_counter() - t
            eps = A.theoretical_epsilons(config, config.census.product("persons"))
            res.table["epsilon_query"] = [eps.get((lv, q)) for lv, q in zip(res.table["level"], res.table["query"])]
            A.write_audit(out / "audit-CONFIDENTIAL", res, {"move": f"{move[0]}:{move[1]}", "alpha": A.AUDIT_ALPHA,
                                                            "config": config.source, "seed": 7})
            print(f"\n### Direct audit at {prod}: {args.audit_runs} runs on D and on D', one person moved between "
                  f"tracts; {wall:.1f} s wall, load {os.getloadavg()[0]:.1f}\n")
            cols = ["level", "query", "path", "changed", "epl_lower", "epl_point", "event", "epsilon_query"]
            print(markdown(res.table[cols], index=False))
    print(f"\nload at end: {os.getloadavg()}")


if __name__ == "__main__":
    main()
