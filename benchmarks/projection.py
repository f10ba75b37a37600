"""Core-hours of a national persons run, projected from measured costs.

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

Wall time on a cluster: ``--wall run_stages.jsonl --machines 1,4,10 --cores 16`` projects a
national run of every product of that run (persons and units) from its measured stages. Every stage's worker
and driver CPU seconds are scaled to national size by its nodes (a level: the level's nodes; ingest,
tabulate, MDF and the rest: the spine's blocks; national counts: geo/us2020.py's standard spine, 5,892,698
populated blocks). A stage's wall on N cores is at least each of: its worker CPU over N, its longest
parent (serial: the run's largest parent solve at the level, a California-sized state holding the nation's
largest County and Tract parents; ``--serial STAGE=SECONDS`` for a parent measured alone, such as the US ->
State parent of 52 states, about 58 CPU s), its driver CPU (one process) and, from a run with ``--cluster
separate``, its scheduler's CPU (another process); the projection is the largest, summed over the stages, and
the same plus the driver CPU (no overlap) as an upper figure.
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


def national_nodes() -> dict[str, int]:
    """National node counts of the standard spine (geo/us2020.py), populated blocks from the TDA paper."""
    from topdown.geo.us2020 import US2020

    return {"US": 1, "State": len(US2020), "County": sum(s.counties for s in US2020),
            "Tract": sum(s.tracts for s in US2020), "Block_Group": sum(s.block_groups for s in US2020),
            "Block": NATIONAL["Block"]}


def wall_projection(rows: list[dict], machines: list[int], cores: int, serial: dict[str, float]) -> list[str]:
    """The lines of the national wall-time projection of a run_stages.py run (see the module docstring)."""
    summary = next(r for r in rows if r.get("stage") == "summary")
    run_nodes, nation = summary["nodes"], national_nodes()
    largest = {f"{p}.{lv}": v.get("max_parent_seconds", 0.0)
               for p, levels in (summary.get("parents_solved") or {}).items() for lv, v in levels.items()}
    largest.update(serial)
    stages = []
    for r in rows:
        if r.get("stage") in (None, "summary") or r.get("wall_s") is None and not r.get("worker_cpu_s"):
            continue
        level = r["stage"].split(".", 1)[-1]
        scale = nation[level] / max(run_nodes[level], 1) if level in LEVELS else nation["Block"] / run_nodes["Block"]
        stages.append((r["stage"], r["worker_cpu_s"] * scale, r["driver_cpu_s"] * scale,
                       largest.get(r["stage"], 0.0), r.get("scheduler_cpu_s", 0.0) * scale))
    work = sum(s[1] for s in stages)
    driver = sum(s[2] for s in stages)
    scheduler = sum(s[4] for s in stages)
    out = [f"national projection from {summary.get('config')} on {summary.get('input')} "
           f"({run_nodes['Block']:,} spine blocks -> {nation['Block']:,}), {summary.get('date')}, "
           f"load {summary.get('loadavg')}",
           f"worker CPU {work / 3600:.2f} core-hours, driver CPU {driver / 60:.1f} min "
           f"({100 * driver / max(work, 1e-9):.2f} % of the workers'), scheduler CPU {scheduler / 60:.1f} min "
           f"({100 * scheduler / max(work, 1e-9):.2f} %; 0 where it ran in the driver's process)"]
    out.append(f"{'stage':22s} {'worker CPU s':>13s} {'driver CPU s':>12s} {'sched CPU s':>11s} {'serial s':>9s} "
               + " ".join(f"{f'{m}x{cores} wall s':>14s}" for m in machines))
    totals = {m: [0.0, 0.0] for m in machines}
    for name, w, d, ser, sch in stages:
        walls = []
        for m in machines:
            wall = max(w / (m * cores), ser, d, sch)
            totals[m][0] += wall
            totals[m][1] += max(w / (m * cores), ser, sch) + d
            walls.append(f"{wall:14.0f}")
        out.append(f"{name:22s} {w:13,.0f} {d:12,.0f} {sch:11,.0f} {ser:9.1f} " + " ".join(walls))
    out.append("total wall (stages overlapping the driver; without overlap): " + "; ".join(
        f"{m} machine{'s' if m > 1 else ''} of {cores} cores {lo / 60:.1f} min ({hi / 60:.1f})"
        for m, (lo, hi) in totals.items()))
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--parents", help="benchmarks/parents.py output (JSON lines)")
    ap.add_argument("--wall", help="run_stages.py output of a run (all its products): project the national wall")
    ap.add_argument("--machines", default="1,4,10", help="cluster sizes for --wall (machines, comma-separated)")
    ap.add_argument("--cores", type=int, default=16, help="cores (workers) per machine for --wall")
    ap.add_argument("--serial", action="append", default=[], metavar="STAGE=SECONDS",
                    help="for --wall: the longest parent of a stage measured alone (persons.State=58)")
    ap.add_argument("--stages", help="benchmarks/run_stages.py output (JSON lines) of a persons run")
    ap.add_argument("--product", default="persons")
    ap.add_argument("--min-children", type=int, default=200)
    args = ap.parse_args()
    if args.wall:
        serial = {k: float(v) for k, v in (x.split("=", 1) for x in args.serial)}
        print("\n".join(wall_projection(read_jsonl(args.wall), [int(m) for m in args.machines.split(",")],
                                         args.cores, serial)))
        return
    if not args.parents:
        ap.error("--parents is required without --wall")
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
