"""Single-pass against multi-pass estimation, same data, seed and budget.

multi: the production orderings (uscensusbureau/DAS_2020_Redistricting_Production_Code
`source/programs/strategies/strategies.py`, `Strategy1b_ST_CTY_TR_BG_isoTot_Ordering_dsepJune3`):
at State..Block_Group the L2 estimation and the rounder
  isolate the total in pass 0, then fit everything else with bands (eq. 7.6) around pass 0's answers.
single: every level's L2 passes and rounder passes concatenated into one pass each (the rounder's
  queries stay laminar: total, hhgq, hhgq * hispanic, ..., detailed).

For every input directory and variant: persons only, production preset, standard spine. Prints the mean
absolute error of TOTAL per level against the truth (input block histograms rolled up by the run's
spine.parquet; every node of the level counts, empty ones too) and the share of solved parents that
needed the failsafe (manifest ``failsafe`` over ``parents_solved``). MAE over many nodes is a public
summary; no single true count is printed.

Usage: python benchmarks/passes.py INPUT_DIR [INPUT_DIR ...] --out RUNS_DIR [--seed 2021] [--workers 2]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

import pandas as pd

from topdown.pipeline import load_config, run
from topdown.pipeline.configuration.config import Config, config_from_dict

PRESET = "pl94_production_2021"


def variant(kind: str, seed: int, input_dir: Path) -> Config:
    """The production preset (persons, standard spine) as is ("multi") or with one pass per level ("single")."""
    config = load_config(PRESET).with_overrides(name=f"passes-{kind}", products=["persons"], spine="standard",
                                                seed=seed, mode="test", input=str(input_dir))
    if kind == "multi":
        return config
    data = config.model_dump(mode="json")
    est = data["persons"]["estimation"]
    for table in ("l2_passes", "rounder_passes"):
        est[table] = {level: [[q for p in passes for q in p]] for level, passes in est[table].items()}
    return config_from_dict(data, source=f"{config.source} (single pass)")


def total_mae(run_dir: Path, input_dir: Path) -> dict[str, float]:
    """Mean absolute error of the persons total at every level of the run."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    spine = pd.read_parquet(run_dir / "spine.parquet").astype(str)
    persons = pd.read_parquet(input_dir / "persons.parquet", columns=["geoid"])
    per_block = persons.groupby("geoid").size()
    out = {}
    for level in manifest["levels"]:
        true = per_block.reindex(spine["geoid"], fill_value=0).groupby(spine[level].to_numpy()).sum()
        est = pd.read_parquet(run_dir / "histograms" / "persons" / f"level={level}", columns=["geocode", "count"])
        est = est.assign(geocode=est["geocode"].astype(str)).groupby("geocode")["count"].sum()
        est = est.reindex(true.index, fill_value=0)
        out[level] = float((est - true).abs().mean())
    return out


def failsafe_share(run_dir: Path) -> tuple[int, int]:
    """(parents that needed the failsafe, parents solved) over all levels."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    solved = sum(v["solved"] for v in manifest["parents_solved"]["persons"].values())
    return sum(1 for f in manifest["failsafe"] if f["product"] == "persons"), solved


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("inputs", nargs="+", type=Path, help="input directories (persons.parquet, units.parquet)")
    ap.add_argument("--out", type=Path, required=True, help="directory for the run directories")
    ap.add_argument("--seed", type=int, default=2021)
    ap.add_argument("--workers", type=int, default=None)
    args = ap.parse_args()
    rows = []
    for input_dir in args.inputs:
        for kind in ("multi", "single"):
            out = args.out / f"{input_dir.name}-{kind}"
            if not (out / "manifest.json").exists() or json.loads((out / "manifest.json").read_text()).get("status") != "complete":
                run(variant(kind, args.seed, input_dir), out, input_dir=input_dir, workers=args.workers, force=True)
            mae = total_mae(out, input_dir)
            fs, solved = failsafe_share(out)
            rows.append({"input": input_dir.name, "variant": kind, **{f"MAE {k}": round(v, 3) for k, v in mae.items()},
                         "failsafe": f"{fs}/{solved} ({fs / max(solved, 1):.1%})"})
    print(markdown(rows))


def markdown(rows: list[dict]) -> str:
    """A Markdown table of dicts with the same keys."""
    cols = list(rows[0])
    lines = ["| " + " | ".join(cols) + " |", "|" + "---|" * len(cols)]
    lines += ["| " + " | ".join(str(r[c]) for c in cols) + " |" for r in rows]
    return "\n".join(lines)


if __name__ == "__main__":
    main()
