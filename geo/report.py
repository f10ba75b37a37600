"""`topdown spine`: build the standard and optimized spines from BAFs and report their shape.

The report compares, for places and MCDs, the off-spine distance (``geo.distance``) on the standard
tabulation spine and on the optimized spine (paper section 7.5: custom block groups and bypassing bring
the targeted entities closer to the spine).
"""
from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np
import pandas as pd

from .baf import mcds, places, read_baf_dir
from .blockgroups import read_units
from .distance import off_spine_distances
from .spine import Spine, build_spine, check_path_condition


def _distribution(values: pd.Series) -> dict[str, float]:
    """min, median, p90, max (and mean) of a numeric series (linear-interpolated quantiles)."""
    array = values.to_numpy(dtype=float)
    if array.size == 0:
        return {"count": 0}
    return {"count": int(array.size), "min": float(array.min()), "median": float(np.median(array)),
            "p90": float(np.quantile(array, 0.9)), "mean": float(array.mean()), "max": float(array.max())}


def spine_summary(spine: Spine) -> dict:
    """Nodes per level, fan-out distribution per parent level, and nodes whose budget moved (bypassing)."""
    return {
        "kind": spine.kind,
        "nodes": {level: int(spine.table[level].nunique()) for level in spine.levels},
        "fanout": {level: _distribution(spine.fanout(level)) for level in spine.levels[:-1]},
        "bypassed_nodes": {level: sum(1 for carried in spine.moves.get(level, {}).values() if not carried)
                           for level in spine.levels},
    }


def distance_comparison(spines: dict[str, Spine], block_entity: pd.Series) -> dict:
    """Off-spine distance distribution (median, p90, mean, ...) of the entities on each spine."""
    result: dict = {"entities": int(block_entity[block_entity != ""].nunique())}
    for name, spine in spines.items():
        result[name] = _distribution(off_spine_distances(spine, block_entity))
    return result


def format_report(report: dict) -> str:
    """The report as plain text."""
    lines = [f"Spine report for {report['blocks']} blocks (BAF {report['baf_dir']}, units {report['units']})", ""]
    for name, summary in report["spines"].items():
        lines.append(f"{name} spine (built in {report['seconds'][name]:.2f} s)")
        for level, count in summary["nodes"].items():
            fan = summary["fanout"].get(level)
            fan_text = "" if fan is None else (f"  fan-out min {fan['min']:.0f} median {fan['median']:.1f} "
                                               f"p90 {fan['p90']:.1f} max {fan['max']:.0f}")
            lines.append(f"  {level:<12} {count:>7} nodes, {summary['bypassed_nodes'][level]:>5} bypassed{fan_text}")
        lines.append("")
    bgs = report["block_groups"]
    lines.append(f"block groups: {bgs['tabulation']} tabulation, {bgs['custom']} custom (optimized spine)")
    lines.append("")
    lines.append("off-spine distance       entities   median      p90     mean      max")
    for entity, comparison in report["off_spine_distance"].items():
        for name in report["spines"]:
            d = comparison[name]
            if d["count"]:
                lines.append(f"  {entity:<6} {name:<10} {comparison['entities']:>10} {d['median']:>8.1f} "
                             f"{d['p90']:>8.1f} {d['mean']:>8.2f} {d['max']:>8.0f}")
    return "\n".join(lines) + "\n"


def spine_command(baf_dir: Path, units_path: Path | None, out: Path) -> dict:
    """Build the standard and optimized spines for all BAF blocks; write spine.parquet and the report.

    Writes ``out/spine.parquet`` (the optimized spine: geoid + one column per level, budget moves in the
    file metadata), ``out/report.json`` and ``out/report.txt``; returns the report dictionary.
    """
    baf_dir, out = Path(baf_dir), Path(out)
    baf = read_baf_dir(baf_dir)
    geoids = baf.index.to_series()
    units = None if units_path is None else read_units(units_path)
    spines: dict[str, Spine] = {}
    seconds: dict[str, float] = {}
    for kind in ("standard", "optimized"):
        start = time.perf_counter()
        spines[kind] = build_spine(kind, geoids, baf, units)
        seconds[kind] = time.perf_counter() - start
        check_path_condition(spines[kind])
    report = {
        "baf_dir": str(baf_dir),
        "units": None if units_path is None else str(units_path),
        "blocks": len(geoids),
        "seconds": seconds,
        "spines": {name: spine_summary(spine) for name, spine in spines.items()},
        "block_groups": {"tabulation": int(geoids.str[:12].nunique()),
                         "custom": int(spines["optimized"].table["Block_Group"].nunique())},
        "off_spine_distance": {"place": distance_comparison(spines, places(baf)),
                               "mcd": distance_comparison(spines, mcds(baf))},
    }
    out.mkdir(parents=True, exist_ok=True)
    spines["optimized"].to_parquet(out / "spine.parquet")
    (out / "report.json").write_text(json.dumps(report, indent=2) + "\n")
    (out / "report.txt").write_text(format_report(report))
    return report
