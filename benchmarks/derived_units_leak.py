"""The leak scan of derived housing units, on a whole state.

``python benchmarks/derived_units_leak.py CSV WORK [--config conf/ri2010.toml] [--workers 2]`` ingests a block
table without housing-unit columns (ingest derives occupied = ceil(persons / 2.5)), then runs CONFIG in production
mode twice: as configured (production refuses the derived units: exit 3, nothing written) and with
``weaken_privacy = ["derived_housing_units"]``. From the waived run's published block housing-unit invariants
alone it infers every block's household population (tests/test_adversarial_privacy.household_bounds: the
running totals give each block's occupied units exactly, and ceil(p / 2.5) = o leaves 2 or 3 values of p) and
prints how many blocks are bounded within 3 values and how many bounds hold the true value. Counts of blocks
only: no true count is printed.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
from test_adversarial_privacy import household_bounds  # noqa: E402  (the scan the tests assert)


def topdown(*argv: str | Path) -> int:
    return subprocess.run([sys.executable, "-m", "topdown.pipeline.cli", *map(str, argv)]).returncode


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("csv")
    ap.add_argument("work", type=Path)
    ap.add_argument("--config", default="conf/ri2010.toml")
    ap.add_argument("--workers", default="2")
    args = ap.parse_args()
    work = args.work
    work.mkdir(parents=True, exist_ok=True)
    inp = work / "input"
    if not (inp / "units.parquet").exists():
        assert topdown("ingest", "blocks", args.csv, "--out", inp, "--quiet") == 0
    production = f'include = "{Path(args.config).resolve()}"\n[run]\nmode = "production"\n'
    (work / "production.toml").write_text(production)
    (work / "waived.toml").write_text(production + 'weaken_privacy = ["derived_housing_units"]\n')
    refused = topdown("run", work / "production.toml", "--input", inp, "--out", work / "refused", "--quiet",
                      "--workers", args.workers)
    written = sorted(p.name for p in (work / "refused").rglob("*") if p.is_file()) if (work / "refused").exists() else []
    print(f"production as configured: exit {refused}; files written: {len(written)}")
    assert topdown("run", work / "waived.toml", "--input", inp, "--out", work / "waived", "--quiet", "--workers",
                   args.workers, "--force") == 0
    invariants = pd.read_parquet(work / "waived" / "invariants" / "units.parquet")
    bounds = household_bounds(invariants[invariants["level"] == "Block"].set_index("geocode")["u0"])
    truth = pd.read_parquet(inp / "persons.parquet", columns=["geoid"]).groupby("geoid").size()
    pop = truth.reindex(bounds.index, fill_value=0)
    within3 = int((bounds["high"] - bounds["low"] + 1 <= 3).sum())
    right = int(((bounds["low"] <= pop) & (pop <= bounds["high"])).sum())
    populated = int((pop > 0).sum())
    print(f"production with the waiver: {within3} of {len(bounds)} published blocks ({populated} with persons) have "
          f"their household population bounded within 3 values by the invariants alone; the bound holds the true "
          f"value for {right} of them")


if __name__ == "__main__":
    main()
