"""Core-hours of a national persons run, projected from measured costs (issue 7).

National 2020 node counts (Abowd et al. 2022, the TDA paper, Table 2, production spine): 1 US, 88 state parts,
3,496 counties, 84,589 tracts, 409,548 custom block groups, 5,892,698 populated blocks. The level whose children are L
has as many parents as the level above L has nodes, with the national average children per parent.

Two sources of cost, per level:
* solver: one parent solved by ``solve_parent`` (Pyomo path), from ``benchmarks/parents.py`` output
  (JSON lines; the cases bg14, tract5, county24, state40, us88 have national-average children per
  parent); core-seconds = parents x CPU seconds per parent (``ours_cpu_s``; wall ``ours_s`` if absent).
* pipeline: a whole run measured by ``benchmarks/run_stages.py`` (its JSON-lines output): worker CPU
  seconds of a level (measurement, solves, task and write overhead) per child node, times the national
  children at that level. Used where the run has at least ``--min-children`` children at the level;
  elsewhere (a one-state run's US, State and County levels) the solver figure is used.

Usage: python benchmarks/projection.py --parents parents.jsonl [--stages run_stages.jsonl] [--product persons]
"""
from __future__ import annotations

import argparse
import json
from pathlib import Path

LEVELS = ["US", "State", "County", "Tract", "Block_Group", "Block"]
NATIONAL = {"US": 1, "State": 88, "County": 3_496, "Tract": 84_589, "Block_Group": 409_548, "Block": 5_892_698}


def read_jsonl(path: str | Path) -> list[dict]:
    """The JSON objects of a file, one a line (other lines, such as `uptime` output, skipped)."""
    out = []
    for line in Path(path).read_text().splitlines():
        line = line.strip()
        if line.startswith("{"):
            out.append(json.loads(line))
    return out


def solver_costs(rows: list[dict]) -> dict[str, dict]:
    """Per children level: seconds per parent from the parents.py case closest to the national
    average children per parent."""
    best: dict[str, dict] = {}
    for r in rows:
        child = r["level"].split("->")[-1].strip()
        if child not in NATIONAL or child == "US":
            continue
        target = NATIONAL[child] / NATIONAL[LEVELS[LEVELS.index(child) - 1]]
        if child not in best or abs(r["children"] - target) < abs(best[child]["children"] - target):
            best[child] = r
    return best


def pipeline_costs(rows: list[dict], product: str) -> tuple[dict[str, float], dict[str, int], dict]:
    """Per level: worker CPU seconds per child node of a run_stages.py run, and the run's node counts."""
    summary = next(r for r in rows if r.get("stage") == "summary")
    nodes = summary["nodes"]
    per_child = {}
    for r in rows:
        stage = r.get("stage", "")
        if stage.startswith(product + ".") and stage.split(".", 1)[1] in LEVELS:
            level = stage.split(".", 1)[1]
            per_child[level] = r["worker_cpu_s"] / max(nodes[level], 1)
    return per_child, nodes, summary


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parents", required=True, help="benchmarks/parents.py output (JSON lines)")
    ap.add_argument("--stages", help="benchmarks/run_stages.py output (JSON lines) of a persons run")
    ap.add_argument("--product", default="persons")
    ap.add_argument("--min-children", type=int, default=200)
    args = ap.parse_args()
    solver = solver_costs(read_jsonl(args.parents))
    per_child, nodes, summary = pipeline_costs(read_jsonl(args.stages), args.product) if args.stages else ({}, {}, {})
    header = (f"{'level (children)':18s} {'parents':>9s} {'children':>10s} {'ch/parent':>9s} {'case':>10s} "
              f"{'s/parent':>9s} {'solver h':>9s} {'run nodes':>9s} {'cpu s/child':>11s} {'pipeline h':>10s} {'used h':>8s}")
    print(header)
    print("-" * len(header))
    total_solver = total_used = 0.0
    for i, level in enumerate(LEVELS):
        parents = NATIONAL[LEVELS[i - 1]] if i else 1
        children = NATIONAL[level]
        case = solver.get(level)
        sec = (case.get("ours_cpu_s") or case["ours_s"]) if case else None
        solver_h = parents * sec / 3600 if case else None
        pipe_h = children * per_child[level] / 3600 if level in per_child else None
        use_pipe = pipe_h is not None and nodes.get(level, 0) >= args.min_children
        used = pipe_h if use_pipe else solver_h
        total_solver += solver_h or 0.0
        total_used += used or 0.0
        fmt = (lambda v, f: format(v, f) if v is not None else "-")
        print(f"{level:18s} {parents:9,d} {children:10,d} {children / parents:9.1f} {case['case'] if case else '-':>10s} "
              f"{fmt(sec, '9.3f'):>9s} {fmt(solver_h, '9.2f'):>9s} "
              f"{nodes.get(level, 0):9,d} {fmt(per_child.get(level), '11.4f'):>11s} {fmt(pipe_h, '10.2f'):>10s} "
              f"{fmt(used, '8.2f'):>8s}{' (run)' if use_pipe else ''}")
    print("-" * len(header))
    print(f"total core-hours: solver only {total_solver:.1f}; projection (run figures where the run has "
          f">= {args.min_children} children at the level, else solver) {total_used:.1f}; goal <= 25")
    if summary:
        print(f"run: {summary.get('config')} on {summary.get('input')}, {summary.get('workers')} workers, "
              f"load average {summary.get('loadavg')}, {summary.get('date')}")


if __name__ == "__main__":
    main()
