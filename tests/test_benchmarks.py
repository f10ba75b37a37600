"""The benchmark scripts still run and print what RESULTS.md reads (smoke tests on tiny cases)."""
from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

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
    rows = _json_lines("split_accuracy.py", "8", "4000", "0", "--modes", "joint,3")
    assert [r["mode"] for r in rows] == ["joint", "3"]
    for r in rows:
        assert r["failsafe_level"] == "exact" and 0 <= r["total"] < 10 and r["detailed"] >= 0
