"""The cost benchmark benchmarks/uncertainty_cost.py's rows and ratios, and the chunk task
that gives its freed memory back."""
from __future__ import annotations

import sys

import pytest

from conftest import REPO
from topdown.pipeline.execution import tasks

sys.path.insert(0, str(REPO / "benchmarks"))
try:
    import uncertainty_cost
    from process_cost import Cost
finally:
    sys.path.remove(str(REPO / "benchmarks"))

MIB = 2 ** 20


def _cost(cpu: float, client_cpu: float, client: int, workers: list[int]) -> Cost:
    return Cost(0, 10.0, cpu, client_cpu, 1, {1: client * MIB, **{2 + i: w * MIB for i, w in enumerate(workers)}})


def test_rows_and_ratios_of_alternating_commands():
    """Two pairs (reprocess, uncertainty): each pair's ratios and the ratio of the means, of CPU, the client's
    peak and the largest worker's peak."""
    pairs = [(_cost(60, 5, 240, [400, 380]), _cost(72, 10, 300, [480, 200])),
             (_cost(40, 5, 250, [420]), _cost(60, 10, 290, [400]))]
    row = uncertainty_cost.row(1, "uncertainty", pairs[0][1], (2.0, 3.5))
    assert row == "| 1 | `uncertainty` | 2.0 -> 3.5 | 10 s | 72.0 s | 10.0 s | 62.0 s | 300 MiB | 480 MiB |"
    lines = uncertainty_cost.ratios(pairs)
    assert lines[0] == "pair 1: CPU 1.20x, client peak 1.25x, largest worker peak 1.20x"
    assert lines[1] == "pair 2: CPU 1.50x, client peak 1.16x, largest worker peak 0.95x"
    assert lines[2] == "means: CPU 1.32x, client peak 1.20x, largest worker peak 1.07x"


def test_a_chunk_task_gives_its_freed_memory_back(monkeypatch):
    """run_chunk returns the chunk's result and then releases the freed memory (once per task)."""
    calls = []
    monkeypatch.setattr(tasks, "_run_chunk", lambda chunk: calls.append(("run", chunk)) or "result")
    monkeypatch.setattr(tasks, "release_memory", lambda: calls.append(("release",)))
    assert tasks.run_chunk("chunk") == "result"
    assert calls == [("run", "chunk"), ("release",)]
    with pytest.raises(ZeroDivisionError):  # a failing chunk raises as before
        monkeypatch.setattr(tasks, "_run_chunk", lambda chunk: 1 / 0)
        tasks.run_chunk("chunk")
