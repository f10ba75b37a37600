"""CPU and peak memory per process of one ``topdown`` command.

    python benchmarks/process_cost.py -- replicates RUN --n 5 --out DIR --workers 2

Runs ``python -m topdown.pipeline.cli ARGS`` and samples its process tree every 0.2 s (psutil): the peak
resident memory of the client (the command's own process, which holds the embedded scheduler) and of the
largest other process (a Dask worker or nanny); CPU is the user + system time of the command and all its
processes (``getrusage`` of the children), the client's own share from its last sample. The load average is
printed before and after: on a shared machine wall times are noisy, CPU seconds less so.
"""
from __future__ import annotations

import os
import resource
import subprocess
import sys
import time
from dataclasses import dataclass

import psutil


@dataclass
class Cost:
    """What one command cost: its exit code, wall and CPU seconds (all its processes; ``client_cpu``: its own
    process), and the peak resident bytes of each of its processes by pid (``root``: the command's own)."""

    code: int
    wall: float
    cpu: float
    client_cpu: float
    root: int
    peak: dict[int, int]

    @property
    def others(self) -> list[int]:
        """The peaks of the processes other than the command's own (Dask workers and nannies)."""
        return [v for k, v in self.peak.items() if k != self.root]

    @property
    def largest(self) -> int:
        """The peak resident bytes of the largest process."""
        return max(self.peak.values(), default=0)


def measure(cmd: list[str]) -> Cost:
    """Run ``cmd`` (its stdout discarded), sampling its process tree every 0.2 s: its :class:`Cost`. CPU is the
    ``getrusage`` of the waited-for children, so measure one command at a time in a process."""
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen(cmd, stdout=subprocess.DEVNULL)
    root = psutil.Process(proc.pid)
    peak: dict[int, int] = {}
    client_cpu = 0.0
    while proc.poll() is None:
        try:
            procs = [root, *root.children(recursive=True)]
        except psutil.NoSuchProcess:
            break
        for p in procs:
            try:
                peak[p.pid] = max(peak.get(p.pid, 0), p.memory_info().rss)
                if p.pid == root.pid:
                    t = p.cpu_times()
                    client_cpu = t.user + t.system
            except psutil.NoSuchProcess:
                pass
        time.sleep(0.2)
    proc.wait()
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
    return Cost(proc.returncode, wall, cpu, client_cpu, root.pid, peak)


def main(argv: list[str]) -> None:
    if argv[:1] == ["--"]:
        argv = argv[1:]
    print(f"load before: {' '.join(f'{x:.2f}' for x in os.getloadavg())}", flush=True)
    cost = measure([sys.executable, "-m", "topdown.pipeline.cli", *argv])
    others = cost.others
    print(f"load after:  {' '.join(f'{x:.2f}' for x in os.getloadavg())}")
    print(f"exit {cost.code}; wall {cost.wall:.1f} s; CPU {cost.cpu:.1f} s (client {cost.client_cpu:.1f} s, workers and "
          f"nannies {cost.cpu - cost.client_cpu:.1f} s); peak RSS client {cost.peak.get(cost.root, 0) / 2**20:.0f} MiB, "
          f"largest other process {max(others, default=0) / 2**20:.0f} MiB ({len(others)} processes)")


if __name__ == "__main__":
    main(sys.argv[1:])
