"""Wall time and peak memory of every stage of one TopDown run on an embedded LocalCluster.

Stages: ingest (read and validate, on the workers), spine, <product>.tabulate, <product>.<level> (measure and
estimate one level on Dask, including writing it), <product>.mdf, and "other" (everything between:
certificate, invariants, cluster start and stop). Wall times of the named stages come from the run
manifest's "timings"; "other" is measured here.

Memory: a thread in every worker process polls its RSS, and one in the driver the driver's own, about every
0.25 s (stamped with one clock; nothing runs through the scheduler until the run ends, so the driver's CPU is
the run's own); each sample is attributed to the stage in progress. Driver stages are marked by wrapping
the runner's stage functions; levels are identified by the ``progress(product, level, done, total)``
callback of :func:`topdown.pipeline.execution.runner.run` (a sample taken before a level's first progress call is
given to that level). Peaks also use each process's high-water mark (``ru_maxrss``), so short spikes
between samples are not missed; per stage it is reported only where the high-water mark rose. The summary's
``driver_hwm_run_mb`` is the driver's high-water mark when the run returns, ``driver_hwm_mb`` at the end
(it includes this script's own reading of the task stream and samples).
CPU: the same polls read each process's CPU seconds (user + system); the CPU used between two polls goes
to the later poll's stage. The driver's leaves out the polling thread's own (a run has no such thread);
the summary's ``driver_cpu_by_thread_s`` splits the driver's process CPU by thread (``MainThread``: the
run's code; ``IO loop``: the client, the embedded scheduler and the nannies; the polling thread included).
On a shared machine worker CPU seconds, unlike wall time, do not grow with the load, so they are the
figures to project from (benchmarks/projection.py reads this output).
Tasks: Dask's task stream gives every task's compute interval. Per level: ``task_busy_s`` (the summed
compute seconds of the level's chunk tasks and of the split groups' tasks they started), ``task_span_s``
(first start to last stop) and ``span_over_busy_per_worker`` = span / (busy / workers), how well a level
keeps the workers busy (1.0: the workers never idle; 2.0 on 2 workers: one task ran alone). The polls' CPU split
at stage boundaries is approximate (a sample's CPU goes to one stage); the task stream is exact per task.

Prints one JSON object per stage, then one summary object (``"stage": "summary"``); a run stopped with
SIGTERM or Ctrl-C prints the stages so far (``"interrupted": true``; the stage in progress has no wall time).
Usage: python benchmarks/run_stages.py CONFIG --input DIR --workers N --out DIR [--cluster separate]
(``separate``: the scheduler and the workers in processes of their own, as on a cluster; the summary then adds
the scheduler's and the nannies' CPU seconds, ``scheduler_cpu_s`` and ``nannies_cpu_s``, which the embedded
cluster spends in the driver's process.)
"""
from __future__ import annotations

import argparse
import bisect
import json
import logging
import os
import re
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from array import array
from contextlib import ExitStack, contextmanager
from pathlib import Path
from typing import Callable, Iterator, NamedTuple

import pandas as pd
import psutil

MB = 1 << 20
POLL_SECONDS = 0.25


def _start_sampling(dask_worker=None) -> None:
    """In a worker process: poll its own RSS, high-water RSS and CPU seconds (its solver helpers' included) every
    ``POLL_SECONDS`` in a thread, kept as numbers (time.monotonic(), pid, rss, hwm, cpu) until :func:`_stop_sampling`."""
    from topdown.pipeline.execution.batch import tree_cpu

    numbers, stop = array("d"), threading.Event()

    def poll() -> None:
        proc = psutil.Process()
        while True:
            numbers.extend([time.monotonic(), os.getpid(), proc.memory_info().rss,
                            resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024, tree_cpu(proc)])
            if stop.wait(POLL_SECONDS):
                return

    thread = threading.Thread(target=poll, daemon=True, name="run_stages-sampler")
    thread.start()
    dask_worker.run_stages_sampler = (numbers, stop, thread)


def _stop_sampling(dask_worker=None) -> bytes:
    """In a worker process: stop :func:`_start_sampling`'s thread after one last poll; its numbers as bytes."""
    numbers, stop, thread = dask_worker.run_stages_sampler
    stop.set()
    thread.join()
    return numbers.tobytes()


class StageTracker:
    """The stage in progress, set by wrapped runner functions and by the progress callback."""

    def __init__(self) -> None:
        self.stage = "other"
        self.stages: list[str] = []  # each sample's stage
        self.pending: list[int] = []  # samples taken while a level had not reported yet
        self.awaiting_level = False
        self.levels: dict[str, dict] = {}
        self.lock = threading.Lock()

    def set(self, stage: str) -> None:
        with self.lock:
            self.stage = stage
            self.awaiting_level = False
            self.pending.clear()

    def await_level(self) -> None:
        """Between driver stages while Dask levels run: the next progress call names the stage."""
        with self.lock:
            self.stage, self.awaiting_level = "other", True

    def progress(self, product: str, level: str, done: int, total: int) -> None:
        now = time.perf_counter()
        name = f"{product}.{level}"
        with self.lock:
            info = self.levels.setdefault(name, {"first_chunk_s": now, "chunks": total})
            info["last_chunk_s"] = now
            if self.stage != name:
                for i in self.pending:
                    self.stages[i] = name
                self.pending.clear()
                self.stage = name
            # until its last chunk the samples are this level's; then its writes follow, and a level not
            # known until it reports (its samples wait for its first progress call)
            self.awaiting_level = done == total

    def record(self) -> None:
        """Give the sample just taken the stage in progress (called with ``lock`` held)."""
        self.stages.append(self.stage)
        if self.awaiting_level:
            self.pending.append(len(self.stages) - 1)


class Worker(NamedTuple):
    """One worker's poll: pid, RSS, high-water RSS (bytes) and CPU seconds; also read as ``w["rss"]``."""

    pid: int
    rss: int
    hwm: int
    cpu: float

    def __getitem__(self, key):
        return getattr(self, key) if isinstance(key, str) else tuple.__getitem__(self, key)


class Sampler(threading.Thread):
    """Polls the driver's memory and CPU until stopped, and has each worker poll its own (a thread in the
    worker: polling the workers from here through ``client.run`` cost the driver about 3 ms of CPU a poll,
    as much as the driver's own work on a large run). Every sample is stamped with ``time.monotonic()``
    (one clock for every process of the machine); a worker's samples go to the stage of the driver's next
    sample. The samples are kept as numbers in arrays (the driver's memory is measured) and become records
    (``samples``) after the run."""

    FIELDS = ("t", "driver_rss", "driver_hwm", "driver_cpu", "scheduler_cpu")

    def __init__(self, client, tracker: StageTracker, scheduler_pid: int | None = None) -> None:
        super().__init__(daemon=True, name="run_stages sampler")
        self.client, self.tracker = client, tracker
        self.numbers = array("d")  # per sample: FIELDS
        self.workers: list[array] = []  # per worker, after the run: (t, pid, rss, hwm, cpu) per sample
        self.stop_event = threading.Event()
        self.driver = psutil.Process()
        self.scheduler = None if scheduler_pid is None else psutil.Process(scheduler_pid)  # --cluster separate
        self.own = 0.0  # this thread's CPU seconds at its latest sample (the benchmark's, not the run's)

    @property
    def samples(self) -> list[dict]:
        """The samples as records: FIELDS, "stage" and "workers" (pid -> Worker: the worker's last poll since
        the driver's previous sample, with the largest RSS polled in between)."""
        width = len(self.FIELDS)
        times = self.numbers[0::width]
        out = [dict(zip(self.FIELDS, self.numbers[i * width:(i + 1) * width]), stage=stage, workers={})
               for i, stage in enumerate(self.tracker.stages)]
        for numbers in self.workers:
            for j in range(0, len(numbers), 5):
                t, pid, rss, hwm, cpu = numbers[j:j + 5]
                i = min(bisect.bisect_left(times, t), len(out) - 1)
                if i < 0:
                    continue
                seen = out[i]["workers"].get(int(pid))
                out[i]["workers"][int(pid)] = Worker(int(pid), max(int(rss), seen.rss if seen else 0), int(hwm), cpu)
        return out

    def sample(self) -> None:
        """One driver sample; its CPU leaves out this sampler thread's own (``self.own``: not the run's)."""
        cpu = self.driver.cpu_times()
        scheduler = 0.0 if self.scheduler is None else sum(self.scheduler.cpu_times()[:2])
        with self.tracker.lock:
            self.numbers.extend([time.monotonic(), self.driver.memory_info().rss,
                                 resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024,
                                 cpu.user + cpu.system - self.own, scheduler])
            self.tracker.record()

    def run(self) -> None:
        self.client.run(_start_sampling)
        while not self.stop_event.is_set():
            t = time.perf_counter()
            self.own = time.thread_time()
            self.sample()
            self.stop_event.wait(max(0.0, POLL_SECONDS - (time.perf_counter() - t)))

    def stop(self) -> None:
        """Stop polling; the workers' samples come back (a last driver sample follows them)."""
        self.stop_event.set()
        self.join()
        try:
            found = self.client.run(_stop_sampling)
        except Exception as exc:  # a worker lost: its samples with it
            logging.getLogger("topdown").warning("collecting the workers' samples failed: %s", exc)
            found = {}
        self.sample()
        for data in found.values():
            numbers = array("d")
            numbers.frombytes(data)
            self.workers.append(numbers)


@contextmanager
def wrapped(module, name: str, stage: Callable[..., str], tracker: StageTracker) -> Iterator[None]:
    """Replace ``module.name`` for the duration by a function that marks its stage while it runs."""
    original = getattr(module, name)

    def marked(*args, **kwargs):
        tracker.set(stage(*args, **kwargs))
        try:
            return original(*args, **kwargs)
        finally:
            tracker.await_level()

    setattr(module, name, marked)
    try:
        yield
    finally:
        setattr(module, name, original)


def _interrupt(signum, frame) -> None:
    raise KeyboardInterrupt


def _rows(path: Path) -> int:
    import pyarrow.parquet as pq

    return pq.ParquetFile(path).metadata.num_rows


def stage_rows(samples: list[dict], timings: dict, tracker: StageTracker, total_wall: float) -> list[dict]:
    """Per stage: wall seconds, peak RSS of each worker process and of the driver (MB)."""
    order = list(dict.fromkeys([k for k in timings if k != "total"] + [s["stage"] for s in samples]))
    rows = []
    prev_hwm: dict[int, int] = {}
    prev_driver_hwm = 0
    by_stage: dict[str, list[dict]] = {}
    for s in samples:
        by_stage.setdefault(s["stage"], []).append(s)
    # high-water rises are attributed to the stage of the sample that saw them
    rises: dict[str, dict] = {}
    for s in samples:
        r = rises.setdefault(s["stage"], {"workers": {}, "driver": 0})
        for w in s["workers"].values():
            if w["hwm"] > prev_hwm.get(w["pid"], 0):
                r["workers"][w["pid"]] = max(r["workers"].get(w["pid"], 0), w["hwm"])
                prev_hwm[w["pid"]] = w["hwm"]
        if s["driver_hwm"] > prev_driver_hwm:
            r["driver"] = s["driver_hwm"]
            prev_driver_hwm = s["driver_hwm"]
    # CPU seconds (user + system) used between a sample and the one before go to the later sample's stage
    cpu: dict[str, float] = {}
    driver_cpu: dict[str, float] = {}
    scheduler_cpu: dict[str, float] = {}
    last: dict[int, float] = {}
    last_driver = samples[0]["driver_cpu"] if samples else 0.0
    last_scheduler = samples[0]["scheduler_cpu"] if samples else 0.0
    for s in samples:
        for w in s["workers"].values():
            cpu[s["stage"]] = cpu.get(s["stage"], 0.0) + w["cpu"] - last.get(w["pid"], w["cpu"])
            last[w["pid"]] = w["cpu"]
        driver_cpu[s["stage"]] = driver_cpu.get(s["stage"], 0.0) + s["driver_cpu"] - last_driver
        last_driver = s["driver_cpu"]
        scheduler_cpu[s["stage"]] = scheduler_cpu.get(s["stage"], 0.0) + s["scheduler_cpu"] - last_scheduler
        last_scheduler = s["scheduler_cpu"]
    accounted = sum(v for k, v in timings.items() if k != "total")
    for stage in order:
        ss = by_stage.get(stage, [])
        peak: dict[int, int] = {}
        for s in ss:
            for w in s["workers"].values():
                peak[w["pid"]] = max(peak.get(w["pid"], 0), w["rss"])
        row = {"stage": stage,
               "wall_s": round(timings[stage], 2) if stage in timings else (
                   round(total_wall - accounted, 2) if stage == "other" else None),
               "samples": len(ss),
               "worker_cpu_s": round(cpu.get(stage, 0.0), 2), "driver_cpu_s": round(driver_cpu.get(stage, 0.0), 2),
               # --cluster separate: the scheduler's process (embedded: 0, its CPU is the driver's)
               "scheduler_cpu_s": round(scheduler_cpu.get(stage, 0.0), 2),
               "worker_rss_peak_mb": [round(v / MB) for _, v in sorted(peak.items())],
               "driver_rss_peak_mb": round(max((s["driver_rss"] for s in ss), default=0) / MB)}
        r = rises.get(stage)
        if r and r["workers"]:
            row["worker_hwm_rise_to_mb"] = {str(pid): round(v / MB) for pid, v in sorted(r["workers"].items())}
        if r and r["driver"]:
            row["driver_hwm_rise_to_mb"] = round(r["driver"] / MB)
        info = tracker.levels.get(stage)
        if info:
            row["chunks"] = info["chunks"]
            row["first_to_last_chunk_s"] = round(info["last_chunk_s"] - info["first_chunk_s"], 2)
        rows.append(row)
    return rows


def task_levels(stream: list[dict], workers: int) -> dict[str, dict]:
    """Per ``product.level``: its tasks (keys ``product-level-i-digest``, and ``solve_parent`` tasks of split
    groups, given to the level whose chunks were running when they started), summed compute seconds, span."""
    spans: dict[str, list[float]] = {}
    busy: dict[str, list[float]] = {}
    groups = []
    for d in stream:
        key = d["key"] if isinstance(d["key"], str) else str(d["key"])
        for ss in d["startstops"]:
            if ss["action"] != "compute":
                continue
            parts = key.split("-")
            if parts[0] in ("persons", "units") and len(parts) >= 4:
                name = f"{parts[0]}.{parts[1]}"
                busy.setdefault(name, []).append(ss["stop"] - ss["start"])
                span = spans.setdefault(name, [ss["start"], ss["stop"]])
                span[0], span[1] = min(span[0], ss["start"]), max(span[1], ss["stop"])
            elif parts[0] == "solve_parent":
                groups.append((ss["start"], ss["stop"]))
    for start, stop in groups:
        name = next((n for n, (a, b) in spans.items() if a <= start <= b), None)
        if name is not None:
            busy[name].append(stop - start)
    out = {}
    for name, (a, b) in spans.items():
        total = sum(busy[name])
        out[name] = {"tasks": len(busy[name]), "task_busy_s": round(total, 2), "task_span_s": round(b - a, 2),
                     "span_over_busy_per_worker": round((b - a) / (total / workers), 2) if total else None}
    return out


def _process_cpu(pid: int) -> float:
    """CPU seconds (user + system) of process ``pid`` so far."""
    cpu = psutil.Process(pid).cpu_times()
    return cpu.user + cpu.system


@contextmanager
def separate_cluster(workers: int) -> Iterator[tuple]:
    """A client of a scheduler and ``workers`` workers started as on a cluster (``--cluster separate``): the
    scheduler in its own process (``dask scheduler``), the workers and their nannies in another (``dask worker
    --nworkers``), both under the embedded cluster's settings (:func:`runner.embedded_settings`, passed on in
    ``DASK_INTERNAL_INHERIT_CONFIG``); the driver holds the client alone. Plain TCP on 127.0.0.1, no TLS: for
    measuring on a machine of one's own. Yields the client and the two processes' pids."""
    import dask
    from distributed import Client

    with tempfile.TemporaryDirectory() as tmp:
        env = {**os.environ, "DASK_INTERNAL_INHERIT_CONFIG": dask.config.serialize(dask.config.global_config)}
        sfile = f"{tmp}/scheduler.json"
        quiet = dict(env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        scheduler = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_scheduler", "--scheduler-file", sfile,
                                      "--host", "127.0.0.1", "--port", "0", "--no-dashboard"], **quiet)
        nannies = subprocess.Popen([sys.executable, "-m", "distributed.cli.dask_worker", "--scheduler-file", sfile,
                                    "--nworkers", str(workers), "--nthreads", "1", "--host", "127.0.0.1",
                                    "--no-dashboard"], **quiet)
        try:
            deadline = time.monotonic() + 60
            while not Path(sfile).exists() and time.monotonic() < deadline:
                time.sleep(0.1)
            with Client(scheduler_file=sfile, timeout="60s") as client:
                client.wait_for_workers(workers, timeout=120)
                yield client, scheduler.pid, nannies.pid
        finally:
            for proc in (nannies, scheduler):
                proc.terminate()
                try:
                    proc.wait(30)
                except subprocess.TimeoutExpired:
                    proc.kill()


def driver_threads_cpu() -> dict[str, float]:
    """This process's CPU seconds since it started, by thread: ``MainThread`` (the run's own code), ``IO loop``
    (the event loop of the client, the embedded scheduler and the workers' nannies), Dask's offload threads,
    this script's sampler; ``ended threads`` those no longer running (by difference)."""
    proc = psutil.Process()
    names = {t.native_id: t.name for t in threading.enumerate()}
    out: dict[str, float] = {}
    for t in proc.threads():
        name = re.sub(r"[-_ ]?\d+$", "", names.get(t.id, "other"))
        out[name] = out.get(name, 0.0) + t.user_time + t.system_time
    out["ended threads"] = max(0.0, sum(proc.cpu_times()[:2]) - sum(out.values()))
    return {k: round(v, 2) for k, v in sorted(out.items(), key=lambda kv: -kv[1])}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("config")
    ap.add_argument("--input", required=True)
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", required=True, help="run directory (replaced, unless --resume)")
    ap.add_argument("--keep", action="store_true", help="keep the run directory afterwards")
    ap.add_argument("--resume", action="store_true",
                    help="continue an interrupted run in --out (the figures are this sitting's; add the sittings' up)")
    ap.add_argument("--cluster", choices=("embedded", "separate"), default="embedded",
                    help="embedded: the runner's LocalCluster (scheduler and nannies in the driver's process); "
                         "separate: scheduler and workers in processes of their own, as on a cluster (no TLS)")
    args = ap.parse_args()

    from distributed import Client, LocalCluster, get_task_stream

    import dask

    from topdown.pipeline.execution import runner
    from topdown.pipeline.execution.cluster import NO_DASHBOARD
    from topdown.pipeline.configuration.config import load_config
    from topdown.pipeline.execution.dataplane import find_input

    if not args.resume:
        shutil.rmtree(args.out, ignore_errors=True)
    os.environ.update(runner.SINGLE_THREAD_ENV)
    tracker = StageTracker()
    interrupted = False
    t0 = time.perf_counter()
    # Started as the runner's own embedded cluster is (short scheduler logs, glibc's malloc defaults, no dashboard).
    with runner.embedded_settings(), dask.config.set(NO_DASHBOARD), ExitStack() as stack:
        if args.cluster == "separate":
            client, *others = stack.enter_context(separate_cluster(args.workers))
        else:
            cluster = stack.enter_context(LocalCluster(
                n_workers=args.workers, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                host="127.0.0.1", silence_logs=logging.ERROR))
            client, others = stack.enter_context(Client(cluster)), []
        others_cpu = [_process_cpu(pid) for pid in others]
        cluster_s = time.perf_counter() - t0
        driver_start = psutil.Process().memory_info().rss
        sampler = Sampler(client, tracker, others[0] if others else None)
        sampler.start()
        with get_task_stream(client) as stream:
            try:
                with wrapped(runner, "read_input", lambda *a, **k: "ingest", tracker), \
                     wrapped(runner, "build_spine", lambda *a, **k: "spine", tracker), \
                     wrapped(runner, "tabulate_levels", lambda client, config, product, *a, **k: f"{product.name}.tabulate",
                             tracker), \
                     wrapped(runner, "write_mdf", lambda client, rundir, product, *a, **k: f"{product.name}.mdf", tracker):
                    t1 = time.perf_counter()
                    signal.signal(signal.SIGTERM, _interrupt)
                    try:
                        out = runner.run(args.config, args.out, input_dir=args.input, client=client,
                                         force=not args.resume, resume=args.resume, progress=tracker.progress)
                    except KeyboardInterrupt:  # SIGTERM or Ctrl-C: report the stages so far
                        out, interrupted = Path(args.out), True
                    run_wall = time.perf_counter() - t1
                    threads = driver_threads_cpu()
                    others_cpu = [_process_cpu(pid) - cpu for pid, cpu in zip(others, others_cpu)]
                    run_hwm = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss  # before this script's own summing up
            finally:
                sampler.stop()
    samples = sampler.samples
    manifest = json.loads((Path(out) / "manifest.json").read_text())
    timings = dict(manifest["timings"])
    rows = stage_rows(samples, timings, tracker, run_wall)
    per_level = task_levels(stream.data, args.workers)
    for row in rows:
        row.update(per_level.get(row["stage"], {}))
    spine = pd.read_parquet(Path(out) / "spine.parquet")
    nodes = {level: int(spine[level].nunique()) for level in manifest["levels"]}
    for row in rows:
        print(json.dumps(row), flush=True)
    worker_peak = max((w["hwm"] for s in samples for w in s["workers"].values()), default=0)
    worker_rss = max((w["rss"] for s in samples for w in s["workers"].values()), default=0)
    print(json.dumps({
        "stage": "summary", "config": args.config, "input": args.input, "workers": args.workers,
        "interrupted": interrupted,
        "total_wall_s": round(run_wall, 2), "cluster_start_s": round(cluster_s, 2),
        "worker_cpu_s": round(sum(r["worker_cpu_s"] for r in rows), 1),
        "driver_cpu_s": round(sum(r["driver_cpu_s"] for r in rows), 1),
        "driver_over_worker_cpu": round(sum(r["driver_cpu_s"] for r in rows) / max(sum(r["worker_cpu_s"] for r in rows), 1e-9), 4),
        "driver_cpu_by_thread_s": threads,
        "cluster": args.cluster,
        # --cluster separate: the scheduler's and the nannies' processes over the run (embedded: in the driver's)
        **({"scheduler_cpu_s": round(others_cpu[0], 1), "nannies_cpu_s": round(others_cpu[1], 1)} if others else {}),
        "max_worker_rss_mb": round(worker_rss / MB), "max_worker_hwm_mb": round(worker_peak / MB),
        "driver_rss_peak_mb": round(max((s["driver_rss"] for s in samples), default=0) / MB),
        "driver_hwm_mb": round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024),
        "driver_hwm_run_mb": round(run_hwm / 1024),
        "driver_rss_at_start_mb": round(driver_start / MB),
        "worker_hwm_mb": sorted({w["pid"]: round(w["hwm"] / MB) for s in samples
                                 for w in s["workers"].values()}.values()),
        "persons": sum(_rows(f) for f in find_input(args.input, load_config(args.config).census).persons),
        "nodes": nodes, "parents_solved": manifest.get("parents_solved"), "failsafe": len(manifest.get("failsafe", [])),
        "loadavg": [round(x, 2) for x in os.getloadavg()],
        "date": time.strftime("%Y-%m-%d %H:%M:%S %Z"),
    }), flush=True)
    if not (args.keep or args.resume or interrupted):
        shutil.rmtree(args.out, ignore_errors=True)


if __name__ == "__main__":
    main()
