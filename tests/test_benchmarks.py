"""The benchmark scripts still run and print what RESULTS.md reads (smoke tests on tiny cases)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

BENCH = Path(__file__).resolve().parents[1] / "benchmarks"


def _json_lines(*args: str) -> list[dict]:
    out = subprocess.run([sys.executable, str(BENCH / args[0]), *args[1:]], check=True, capture_output=True,
                         text=True, timeout=300).stdout
    return [json.loads(line) for line in out.splitlines() if line.startswith("{")]


def test_parents_prints_ours_and_floor_per_case():
    (row,) = _json_lines("parents.py", "--cases", "tract5", "--repeats", "1")
    assert row["level"] == "Tract -> Block_Group" and row["children"] == 5
    assert row["ours_s"] > 0 and row["floor_s"] > 0 and row["failsafe_level"] == "exact" and row["split"] is None


def test_split_accuracy_compares_joint_and_two_stage():
    rows = _json_lines("split_accuracy.py", "8", "4000", "0", "--modes", "joint,3,default")
    assert [r["mode"] for r in rows] == ["joint", "3", "default"]
    assert [r["split"] for r in rows] == [None, {"groups": 3, "group_size": 3}, None]  # 8 x 2016 < 100,000
    for r in rows:
        assert r["failsafe_level"] == "exact" and 0 <= r["total"] < 10 and r["detailed"] >= 0


def test_split_spread_solves_one_parent_in_a_task_of_the_cluster():
    (row,) = _json_lines("split_spread.py", "--case", "tract5", "--split-cost", "1", "--workers", "2")
    assert row["split"] == {"groups": 3, "group_size": 2} and row["worker_cpu_s"] > 0
    assert len(row["worker_peak_rss_mb"]) == len(row["worker_cpu_each_s"]) == 2 and row["cpu_ratio"] > 0


def test_accuracy_seeds_compares_means_within_two_standard_errors(tmp_path):
    def rows(offset: float, digest: str) -> str:
        return "\n".join(json.dumps({"seed": s, "errors": {"Block": {"total": 1.0 + offset + 0.1 * s,
                                                                        "detailed": 0.01 * s}},
                                     "verify_ok": True, "failsafe": 0, "parents_solved": 10,
                                     "histograms_sha256": digest}) for s in range(1, 6))
    (tmp_path / "a.jsonl").write_text(rows(0.0, "x"))
    (tmp_path / "b.jsonl").write_text(rows(0.0, "x"))
    (tmp_path / "c.jsonl").write_text(rows(1.0, "y"))
    out = subprocess.run([sys.executable, str(BENCH / "accuracy_seeds.py"), "compare", str(tmp_path / "a.jsonl"),
                          str(tmp_path / "b.jsonl")], check=True, capture_output=True, text=True).stdout
    assert "| Block | total | 1.3000 +- 0.0707 | 1.3000 +- 0.0707 | +0.0000 | yes |" in out
    assert "byte-identical estimates in 5 of 5 seeds" in out
    out = subprocess.run([sys.executable, str(BENCH / "accuracy_seeds.py"), "compare", str(tmp_path / "a.jsonl"),
                          str(tmp_path / "c.jsonl")], check=True, capture_output=True, text=True).stdout
    assert "| +1.0000 | NO |" in out and "in 0 of 5 seeds" in out


@pytest.mark.slow
def test_profile_steps_captures_and_times_every_step(tmp_path, demo_input):
    cfg = tmp_path / "bench_demo.toml"
    cfg.write_text(f'include = "demo.toml"\n[run]\ninput = "{demo_input}"\n')
    _json_lines("profile_steps.py", "capture", str(cfg), "--out", str(tmp_path / "p"), "--every", "1")
    bg, county, task = _json_lines("profile_steps.py", "profile", str(tmp_path / "p"), "--repeats", "1")
    assert bg["parent_level"] == "Block_Group -> Block" and county["parent_level"] == "County -> Tract"
    for row in (bg, county):
        steps = row["cpu_s"]
        assert {"layout", "compile", "L2 pass 0", "rounder pass 0", "checks", "total"} <= steps.keys()
        assert abs(sum(v for k, v in steps.items() if k != "total") - steps["total"]) < 1e-3
    assert task["solved"] >= 1 and task["steps"]["noise draws"] > 0
    (blocks,) = _json_lines("profile_steps.py", "blocks", str(tmp_path / "p"))
    assert blocks["chunks"] >= 1 and blocks["blocks"] > 0 and blocks["cpu_s"] > 0
    # The same chunks interleaved under two trees (here this tree twice): same digests as ``blocks``.
    first, second, verdict = _json_lines("profile_steps.py", "ab", str(tmp_path / "p"), "--tree", "", "--tree", "")
    assert verdict == {"identical_outputs": True}
    assert first["median_chunk_cpu_ratio_to_first"] == 1.0 and second["median_chunk_cpu_ratio_to_first"] > 0
    for row in (first, second):
        assert {k: row[k] for k in ("chunks", "blocks", "estimates_sha256", "measurements_sha256")} == \
            {k: blocks[k] for k in ("chunks", "blocks", "estimates_sha256", "measurements_sha256")}
    # The same chunks at two values of split_cost (0: no cost rule; 1: every parent of two or more blocks split),
    # scored against their true histograms: a coarser query's error is at most a finer one's (|sum d| <= sum |d|).
    rows = _json_lines("profile_steps.py", "splits", str(tmp_path / "p"), "--costs", "0,1", "--query", "total",
                       "--query", "hhgq")
    assert [r["split_cost"] for r in rows] == [0, 1]
    for row in rows:
        assert row["blocks"] == blocks["blocks"] and row["cpu_s"] > 0
        assert row["abs_error total"] == pytest.approx(row["mae_total"] * row["blocks"], abs=5e-4 * row["blocks"])
        detailed = row["l1_detailed_per_block"] * row["blocks"]  # rounded to 2 decimals a block
        assert row["abs_error total"] <= row["abs_error hhgq"] <= detailed + 0.005 * row["blocks"]


def test_peer_censusdp_converts_demo_persons_and_spends_each_level_rho(demo_input):
    import importlib.util
    from fractions import Fraction

    import pandas as pd

    spec = importlib.util.spec_from_file_location("peer_censusdp", BENCH / "peer_censusdp.py")
    peer = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(peer)
    persons = pd.read_parquet(Path(demo_input) / "persons.parquet")
    records = peer.peer_records(persons)
    assert list(records.columns) == ["State", "County", "Tract", "Block_Group", "Block",
                                     "hhgq", "votingage", "hispanic", "cenrace"]
    assert len(records) == len(persons) and (records["Block"] == persons["geoid"]).all()
    assert (records["Block_Group"] == persons["geoid"].str[:12]).all() and records["State"].nunique() == 1
    sigma2 = peer.peer_sigma2(BENCH.parent / "conf" / "demo.toml")
    assert len(sigma2) == 6 and sum(1 / (2 * s) for s in sigma2) == Fraction(293764, 114921)


def test_reprocess_times_a_command_with_process_costs_measurement():
    """benchmarks/reprocess.py's ``timed`` is process_cost.measure (one measurement): wall, CPU and the peak
    resident memory of the largest process, here a child that holds 150 MiB; a failing command raises."""
    sys.path.insert(0, str(BENCH))
    try:
        import reprocess
    finally:
        sys.path.remove(str(BENCH))
    hold = "import time; x = bytearray(150 * 2**20); x[::4096] = b'1' * len(x[::4096]); time.sleep(1.5)"
    wall, cpu, rss_mb = reprocess.timed([sys.executable, "-c", hold])
    assert wall >= 1.5 and cpu > 0 and 150 <= rss_mb < 400
    with pytest.raises(subprocess.CalledProcessError):
        reprocess.timed([sys.executable, "-c", "raise SystemExit(3)"])
