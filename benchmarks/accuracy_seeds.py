"""Accuracy over several seeds: mean absolute error of TOTAL and of the detailed query at
every level, the failsafe share and ``topdown verify``, for one code tree; then a comparison of two trees.

``run CONFIG --input DIR --out RUNS --seeds 1,2,3,4,5 [--workers 1]``: runs CONFIG (persons only, test
mode, the given seeds, the config's budgets) into RUNS/seed-S (reused when complete), verifies each run and
prints one JSON line per seed: per level the MAE of TOTAL (over every node of the level) and of the
detailed query (over every node and cell), the failsafe count, the parents solved, verify's verdict and a
SHA-256 over the run's estimated histograms (equal digests: byte-identical estimates).
Run it once with the untouched tree on the Python path and once with the changed one.

``compare BASE.jsonl NEW.jsonl``: a Markdown table, per level and query, of the mean over seeds +- its
standard error for both, and whether the new mean lies within two standard errors of the base mean
(SE of the difference of the two means, seeds independent within each tree).

MAEs over whole levels are public summaries; no single true count is printed.
"""
from __future__ import annotations

import argparse
import hashlib
import json
import math
import statistics
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.sparse as sp

from topdown.pipeline import load_config, run
from topdown.pipeline.configuration.census import PERSONS
from topdown.pipeline.inputs.tabulate import block_histograms
from topdown.pipeline.outputs.verify import verify_run


def _matrix(frame: pd.DataFrame, index: pd.Index) -> sp.csr_matrix:
    rows = index.get_indexer(frame["geocode"].astype(str))
    keep = rows >= 0
    return sp.csr_matrix((frame["count"].to_numpy(np.int64)[keep], (rows[keep], frame["cell"].to_numpy()[keep])),
                         shape=(len(index), PERSONS.ncells))


def level_errors(run_dir: Path, input_dir: Path) -> dict[str, dict[str, float]]:
    """Per level: MAE of TOTAL (per node) and of the detailed query (per node and cell)."""
    manifest = json.loads((run_dir / "manifest.json").read_text())
    spine = pd.read_parquet(run_dir / "spine.parquet").astype(str)
    blocks = pd.Index(spine["geoid"])
    truth_blocks = _matrix(block_histograms(pd.read_parquet(input_dir / "persons.parquet"), PERSONS), blocks)
    out = {}
    for level in manifest["levels"]:
        codes, nodes = pd.factorize(spine[level].to_numpy(), sort=True)
        roll = sp.csr_matrix((np.ones(len(codes)), (codes, np.arange(len(codes)))), shape=(len(nodes), len(codes)))
        true = (roll @ truth_blocks).toarray()
        est = _matrix(pd.read_parquet(run_dir / "histograms" / "persons" / f"level={level}",
                                      columns=["geocode", "cell", "count"]), pd.Index(nodes)).toarray()
        out[level] = {"total": float(np.abs(est.sum(axis=1) - true.sum(axis=1)).mean()),
                      "detailed": float(np.abs(est - true).mean())}
    return out


def histogram_digest(run_dir: Path) -> str:
    h = hashlib.sha256()
    for f in sorted((run_dir / "histograms").rglob("*.parquet")):
        h.update(f.relative_to(run_dir).as_posix().encode())
        h.update(f.read_bytes())
    return h.hexdigest()


def run_seeds(config_path: str, input_dir: Path, out: Path, seeds: list[int], workers: int) -> None:
    for seed in seeds:
        rd = out / f"seed-{seed}"
        done = (rd / "manifest.json").exists() and json.loads((rd / "manifest.json").read_text()).get("status") == "complete"
        if not done:
            config = load_config(config_path).with_overrides(products=["persons"], seed=seed, mode="test",
                                                             input=str(input_dir))
            run(config, rd, input_dir=input_dir, workers=workers, force=True)
        manifest = json.loads((rd / "manifest.json").read_text())
        report = verify_run(rd)
        solved = sum(v["solved"] for v in manifest["parents_solved"]["persons"].values())
        print(json.dumps({"seed": seed, "errors": level_errors(rd, input_dir), "verify_ok": report.ok,
                          "verify_checks": report.checks, "failsafe": len(manifest["failsafe"]),
                          "parents_solved": solved, "histograms_sha256": histogram_digest(rd)}), flush=True)


def _mean_se(values: list[float]) -> tuple[float, float]:
    return statistics.fmean(values), (statistics.stdev(values) / math.sqrt(len(values)) if len(values) > 1 else 0.0)


def compare(base_path: Path, new_path: Path) -> str:
    base = [json.loads(line) for line in base_path.read_text().splitlines() if line.strip()]
    new = [json.loads(line) for line in new_path.read_text().splitlines() if line.strip()]
    lines = ["| level | query | base mean +- SE | new mean +- SE | difference | within 2 SE |", "|---|---|---|---|---|---|"]
    for level in base[0]["errors"]:
        for query in ("total", "detailed"):
            bm, bs = _mean_se([r["errors"][level][query] for r in base])
            nm, ns = _mean_se([r["errors"][level][query] for r in new])
            se = math.hypot(bs, ns)
            lines.append(f"| {level} | {query} | {bm:.4f} +- {bs:.4f} | {nm:.4f} +- {ns:.4f} | {nm - bm:+.4f} | "
                         f"{'yes' if abs(nm - bm) <= 2 * se else 'NO'} |")
    fs = lambda rows: f"{sum(r['failsafe'] for r in rows)}/{sum(r['parents_solved'] for r in rows)}"  # noqa: E731
    same = sum(b["histograms_sha256"] == n["histograms_sha256"] for b, n in zip(base, new))
    lines += ["", f"seeds: {[r['seed'] for r in base]}; failsafe parents base {fs(base)}, new {fs(new)}; "
              f"verify OK base {sum(r['verify_ok'] for r in base)}/{len(base)}, new {sum(r['verify_ok'] for r in new)}/"
              f"{len(new)}; byte-identical estimates in {same} of {len(base)} seeds"]
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    r = sub.add_parser("run")
    r.add_argument("config")
    r.add_argument("--input", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--seeds", default="1,2,3,4,5")
    r.add_argument("--workers", type=int, default=1)
    c = sub.add_parser("compare")
    c.add_argument("base", type=Path)
    c.add_argument("new", type=Path)
    args = ap.parse_args()
    if args.cmd == "run":
        run_seeds(args.config, args.input, args.out, [int(s) for s in args.seeds.split(",")], args.workers)
    else:
        print(compare(args.base, args.new))


if __name__ == "__main__":
    main()
