"""``topdown batch JOBS.toml``: many runs and reprocessings, unattended, on one Dask cluster.

A jobs file::

    [batch]
    concurrent = 1            # jobs at once (each a `topdown run` / `topdown reprocess` process)
    workers = 2               # worker processes of the batch's one embedded Dask cluster
    # scheduler = "tcp://..." # or the address of a running cluster
    summary = "jobs.summary.json"   # default: <jobs file stem>.summary.json beside it
    logs = "jobs.logs"              # one log file per job; default <stem>.logs/

    [[job]]
    name = "ri"
    kind = "run"              # or "reprocess"
    config = "conf/ri2010.toml"     # reprocess: optional file of post-processing changes
    input = "ri-input"        # run: the input directory; reprocess: the run directory to reprocess, or a
                              # noisy measurement file (`topdown nmf`; then `spine` and a full `config`)
    out = "runs/ri"
    # force = true            # run: recompute a complete output of another configuration or input
    # verify = false          # default true: `topdown verify OUT` after the job

Paths are relative to the jobs file; a job's ``input`` and ``out`` may be object-store URLs (``s3://``...,
docs/how-to/clusters.md "Object storage"), taken as they are. A job whose output is complete with the same configuration hash and
input hashes is skipped; an interrupted one is resumed (``--resume``); a reprocessing whose output is of
another configuration or source is recomputed (it costs no privacy), a run only with ``force = true``
(a new draw of noise is a new release). A reprocessing whose input is another job's output waits for it.
Each job is its own process, so a failing job does not stop the others. One batch at a time per jobs
file: a second one exits with code 4 (or waits, ``--wait SECONDS``). The summary (JSON, rewritten
atomically as jobs finish) gives per job its status, action, exit code, wall and CPU seconds and log.
The batch's exit code is 0 when every job succeeded or was skipped, else the first failed job's code.

A job's CPU seconds are its own processes' (``driver_cpu_seconds``: the ``topdown run``/``reprocess`` and
``verify`` processes) plus the cluster workers' while it ran (``workers_cpu_seconds``: each worker asked for its
process's CPU time as the job starts and ends; with ``concurrent`` above 1 this includes the jobs that ran beside
it, which the summary's ``cluster.cpu_seconds`` counts once). While jobs run, a bar counts the finished ones and
names the running ones with their time so far.
"""
from __future__ import annotations

import logging
import os
import signal
import shutil
import subprocess
import sys
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor, wait
from datetime import datetime, timezone
from pathlib import Path
from typing import Literal

from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator

from ..configuration.config import ConfigError, _format_validation_error, read_toml
from .cluster import credential_flags, tls_security
from ..runtime.outdir import MARKER_KEY, claimed, claimed_file
from ..runtime.progress import reporter
from ..configuration.limits import unsafe_name
from ..runtime.rundir import Locked, RunDir, write_json_atomic
from ..runtime.storage import StorePath, is_url, location
from .signals import Interrupted, signals_interrupt

log = logging.getLogger("topdown")

EXIT_OK, EXIT_RUNDIR, EXIT_INTERRUPTED = 0, 4, 130
#: Seconds between refreshes of the batch's bar (the running jobs' times).
TICK = 10.0
#: The CPU of a job that ran nothing (skipped or refused).
_NO_CPU = {"cpu_seconds": 0.0, "driver_cpu_seconds": 0.0, "workers_cpu_seconds": 0.0}


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class Job(_Strict):
    name: str  # its log is <logs>/<name>.log
    kind: Literal["run", "reprocess"]
    config: str | None = None
    input: str | None = None
    out: str
    spine: str | None = None  # reprocess of a noisy measurement file: its spine
    force: bool = False
    verify: bool = True

    @field_validator("name")
    @classmethod
    def _a_file_name(cls, name: str) -> str:
        if (why := unsafe_name(name, "the job name")) is not None:
            raise ValueError(why)
        return name


class BatchSection(_Strict):
    concurrent: int = Field(default=1, ge=1)
    workers: int | None = Field(default=None, ge=1)
    scheduler: str | None = None
    tls_ca_file: str | None = None  # credentials of a tls:// scheduler (paths relative to the jobs file)
    tls_cert: str | None = None
    tls_key: str | None = None
    summary: str | None = None
    logs: str | None = None


class JobsFile(_Strict):
    batch: BatchSection = BatchSection()
    job: list[Job] = Field(min_length=1)


def load_jobs(path: Path) -> JobsFile:
    """Read and validate a jobs file (paths made relative to it); errors name the file and key."""
    if not path.exists():
        raise ConfigError(f"{path}: no such jobs file")
    try:
        jobs = JobsFile.model_validate(read_toml(path))
    except ValidationError as exc:
        raise ConfigError(_format_validation_error(path, exc, JobsFile)) from None
    names = [j.name for j in jobs.job]
    for j in jobs.job:  # a URL where a job's command takes a local path, or one whose extra is missing: refused
        for key in ("config", "spine"):
            if is_url(getattr(j, key)):
                raise ConfigError(f"{path}: job {j.name!r}: {key} {getattr(j, key)}: a local path (storage URLs are "
                                  "taken by input and out)")
        for value in (j.input, j.out):
            if is_url(value):
                location(value)
    outs = [str(where(path.parent, j.out)) for j in jobs.job]
    for values, what in ((names, "name"), (outs, "out")):
        dup = next((v for v in values if values.count(v) > 1), None)
        if dup is not None:
            raise ConfigError(f"{path}: two jobs have the same {what} {dup!r}")
    for j in jobs.job:
        if j.kind == "run" and j.config is None:
            raise ConfigError(f"{path}: job {j.name!r}: a run needs 'config'")
        if j.kind == "reprocess" and j.input is None:
            raise ConfigError(f"{path}: job {j.name!r}: a reprocessing needs 'input' (the run directory)")
    return jobs


def _path(base: Path, value: str | None) -> str | None:
    """A path of the jobs file, relative to its folder (a storage URL as it is)."""
    return None if value is None else value if is_url(value) else str(base / value)


def where(base: Path, value: str) -> Path | StorePath:
    """A job's input or output: a storage URL's object, or a path relative to the jobs file's folder, resolved."""
    return location(value) if is_url(value) else (base / value).resolve()


def _config(base: Path, value: str | None) -> str | None:
    """A configuration path relative to the jobs file or, when there is no such file, as given (a preset name)."""
    if value is None:
        return None
    return str(base / value) if (base / value).is_file() else value


def expected(job: Job, base: Path) -> tuple[str, dict[str, str]]:
    """The configuration hash and input hashes the job's output will record."""
    if job.kind == "run":
        from .runner import _input_dir, block_by_block_config, configure_run, input_hashes

        config = configure_run(_config(base, job.config), _path(base, job.input))
        if config.run.algorithm == "block_by_block":
            config = block_by_block_config(config)
        return config.digest(), input_hashes(config, _input_dir(config, None))
    from .reprocess import identity

    return identity(_path(base, job.input), _config(base, job.config), _path(base, job.spine))


def plan(job: Job, base: Path) -> tuple[str, list[str]]:
    """What to do with a job's output: ("skip" | "run" | "resume" | "force" | "refuse", extra CLI flags)."""
    manifest = RunDir(where(base, job.out)).read_manifest()
    if not manifest:
        return "run", []
    try:
        digest, hashes = expected(job, base)
    except Exception:  # noqa: BLE001  the job's own process reports the error with its exit code
        return "run", []
    same = manifest.get("config_hash") == digest and manifest.get("input_sha256") == hashes
    if manifest.get("status") == "complete":
        if same:
            return "skip", []
        if job.kind == "reprocess" or job.force:
            return "force", ["--force"]
        return "refuse", []
    if manifest.get("config_hash") == digest:
        return "resume", ["--resume"]
    return "run", []  # the job's process reports a directory it cannot use


def command(job: Job, base: Path, scheduler: str | None, workers: int | None, flags: list[str]) -> list[str]:
    """The ``topdown`` command line of a job."""
    cli = [sys.executable, "-m", "topdown.pipeline.cli"]
    out = _path(base, job.out)
    if job.kind == "run":
        cmd = [*cli, "run", _config(base, job.config), "--out", out]
        if job.input:
            cmd += ["--input", _path(base, job.input)]
    else:
        cmd = [*cli, "reprocess", _path(base, job.input), "--out", out]
        if job.config:
            cmd += ["--config", _config(base, job.config)]
        if job.spine:
            cmd += ["--spine", _path(base, job.spine)]
    cmd += ["--scheduler", scheduler] if scheduler else (["--workers", str(workers)] if workers else [])
    return [*cmd, "--quiet", *flags]


def _run_process(cmd: list[str], logfile: Path, procs: set, lock: threading.Lock) -> tuple[int, float]:
    """Run one process with its output appended to ``logfile``: (exit code, its CPU seconds)."""
    with open(logfile, "a") as fh:
        fh.write(f"$ {' '.join(cmd)}\n")
        fh.flush()
        proc = subprocess.Popen(cmd, stdout=fh, stderr=subprocess.STDOUT)
        with lock:
            procs.add(proc)
        try:
            _, status, usage = os.wait4(proc.pid, 0)
            proc.returncode = os.waitstatus_to_exitcode(status)
        finally:
            with lock:
                procs.discard(proc)
    code = proc.returncode
    return (EXIT_INTERRUPTED if code < 0 else code), usage.ru_utime + usage.ru_stime


def _last_error(logfile: Path) -> str | None:
    lines = [ln for ln in logfile.read_text(errors="replace").splitlines() if ln.startswith(("topdown:", "verify:"))]
    return lines[-1] if lines else None


class Batch:
    """One batch over a jobs file (see the module docstring)."""

    def __init__(self, path: Path, summary: Path | None = None):
        self.path = Path(path).resolve()
        self.base = self.path.parent
        self.jobs = load_jobs(self.path)
        cfg = self.jobs.batch
        self.summary_path = summary or self.base / (cfg.summary or f"{self.path.stem}.summary.json")
        self.logs = self.base / (cfg.logs or f"{self.path.stem}.logs")
        self.records = [{"name": j.name, "kind": j.kind, "out": _path(self.base, j.out), "status": "pending"}
                        for j in self.jobs.job]
        self.done = {j.name: threading.Event() for j in self.jobs.job}
        self.procs: set = set()
        self.tls_flags: list[str] = []  # the --tls-* flags that let a job join the batch's cluster
        self.lock = threading.Lock()
        self.summary: dict = {}
        self.running: dict[str, float] = {}  # the running jobs' names and start times (perf_counter)
        self.marker: dict[str, str] = {}  # of the summary (outdir.claimed_file)

    def _write(self) -> None:
        with self.lock:
            write_json_atomic(self.summary_path, self.summary)

    def _dependencies(self, i: int) -> list[int]:
        """Earlier jobs whose output is job ``i``'s input (a later one would be read as it was: jobs start in order)."""
        job = self.jobs.job[i]
        if job.input is None:
            return []
        target = where(self.base, job.input)
        return [d for d, j in enumerate(self.jobs.job[:i]) if where(self.base, j.out) == target]

    def _job(self, i: int, client, scheduler: str | None, workers: int | None) -> None:
        job, rec = self.jobs.job[i], self.records[i]
        try:
            for d in self._dependencies(i):
                self.done[self.jobs.job[d].name].wait()
                if self.records[d].get("exit_code") != 0:
                    rec.update(status="failed", exit_code=EXIT_RUNDIR, action="none",
                               message=f"its input is the output of job {self.jobs.job[d].name!r}, which failed")
                    return
            action, flags = plan(job, self.base)
            rec.update(action=action, started=_now())
            if action == "skip":
                rec.update(status="skipped", exit_code=EXIT_OK, wall_seconds=0.0, **_NO_CPU,
                           message="output complete with the same configuration and input hashes")
                return
            if action == "refuse":
                rec.update(status="failed", exit_code=EXIT_RUNDIR, wall_seconds=0.0, **_NO_CPU,
                           message=f"{rec['out']} holds a complete run of another configuration or input; a new run "
                                   "draws new noise (a new release): set force = true in the job to recompute it")
                return
            rec["status"] = "running"
            self._write()
            logfile = self.logs / f"{job.name}.log"
            rec["log"] = str(logfile)
            log.info("batch: job %s started (%s)", job.name, action)
            t, workers0 = time.perf_counter(), _workers_cpu(client)
            self.running[job.name] = t
            code, cpu = _run_process(command(job, self.base, scheduler, workers, flags + self.tls_flags), logfile,
                                     self.procs, self.lock)
            if code == 0 and job.verify:
                code, vcpu = _run_process([sys.executable, "-m", "topdown.pipeline.cli", "verify", rec["out"]],
                                          logfile, self.procs, self.lock)
                cpu += vcpu
            worker_cpu = _cpu_since(client, workers0)
            rec.update(status="complete" if code == 0 else "failed", exit_code=code,
                       wall_seconds=round(time.perf_counter() - t, 3), cpu_seconds=round(cpu + (worker_cpu or 0), 3),
                       driver_cpu_seconds=round(cpu, 3),
                       workers_cpu_seconds=None if worker_cpu is None else round(worker_cpu, 3))
            log.info("batch: job %s %s in %.0fs (exit code %d)", job.name, rec["status"], rec["wall_seconds"], code)
            if code != 0:
                rec["message"] = _last_error(logfile)
        except Exception as exc:  # noqa: BLE001  a bug here must not stop the other jobs
            rec.update(status="failed", exit_code=6, message=f"batch: {type(exc).__name__}: {exc}")
        finally:
            rec["finished"] = _now()
            self.running.pop(job.name, None)
            self.done[job.name].set()
            self._write()

    def run(self, wait: float = 0.0) -> int:
        """Run every job; returns the batch's exit code. SIGTERM (a scheduler's kill) stops it like Ctrl-C."""
        with signals_interrupt():
            return self._run_guarded(wait)

    def _run_guarded(self, wait: float) -> int:
        """Run holding the batch's logs folder and summary (``outdir``): one batch over these jobs at a time;
        another waits ``wait`` seconds for them, then exits 4."""
        deadline = time.monotonic() + wait
        while True:
            try:
                with claimed(self.logs, "batch"), claimed_file(self.summary_path, "batch") as marker:
                    self.marker = marker
                    return self._run_locked()
            except Locked as exc:
                if time.monotonic() >= deadline:
                    raise Locked(f"{self.path}: another batch over these jobs is running ({exc.holder}). If none "
                                 f"is, delete {exc.path}.", exc.path, exc.holder) from None
                time.sleep(min(5.0, max(0.1, deadline - time.monotonic())))

    def _run_locked(self) -> int:
        from .runner import dask_client

        cfg = self.jobs.batch
        start = time.perf_counter()
        self.summary = {MARKER_KEY: self.marker, "jobs_file": str(self.path), "started": _now(), "status": "running",
                        "concurrent": cfg.concurrent, "jobs": self.records}
        self._write()
        security = tls_security(*(str(self.base / v) if v else None for v in (cfg.tls_ca_file, cfg.tls_cert, cfg.tls_key)))
        credentials = Path(tempfile.mkdtemp(prefix="topdown-batch-"))
        try:
            with dask_client(None, cfg.scheduler, cfg.workers, security) as client:
                self.tls_flags = credential_flags(client.security, credentials)  # the jobs join this cluster
                stopped = self._run_jobs(client, cfg)
        finally:
            shutil.rmtree(credentials, ignore_errors=True)
        failed = [r for r in self.records if r.get("exit_code") not in (0, None)]
        code = stopped or (failed[0]["exit_code"] if failed else EXIT_OK)
        self.summary.update(status="interrupted" if stopped else ("failed" if failed else "ok"),
                            finished=_now(), wall_seconds=round(time.perf_counter() - start, 3), exit_code=code,
                            counts={s: sum(r["status"] == s for r in self.records)
                                    for s in ("complete", "skipped", "failed", "pending")})
        self._write()
        return code


    def _run_jobs(self, client, cfg: "BatchSection") -> int | None:
        """Every job on the cluster of ``client``, ``cfg.concurrent`` at a time; when a signal stopped the batch,
        its exit code (130 SIGINT, 143 SIGTERM), else None."""
        address = client.scheduler.address
        cpu0 = _workers_cpu(client)
        self.summary["cluster"] = {"scheduler": address, "workers": len(cpu0)}
        pool = ThreadPoolExecutor(max_workers=cfg.concurrent)
        futures = [pool.submit(self._job, i, client, address, None) for i in range(len(self.records))]
        stopped = None
        progress = reporter()
        bar = progress.bar("batch", len(futures), "jobs")
        try:
            pending = set(futures)
            while pending:
                finished, pending = wait(pending, timeout=TICK)
                bar.update(len(finished))
                now = time.perf_counter()
                bar.set_postfix_str(", ".join(f"{name} {_clock(now - t)}" for name, t in list(self.running.items())))
            for f in futures:
                f.result()
        except KeyboardInterrupt as exc:  # Interrupted (signals_interrupt), or a KeyboardInterrupt raised elsewhere
            stopped = exc.exit_code if isinstance(exc, Interrupted) else EXIT_INTERRUPTED
            for f in futures:
                f.cancel()
            with self.lock:
                for proc in list(self.procs):
                    proc.send_signal(signal.SIGINT)  # the job stops cleanly and releases its run directory
            for event in self.done.values():
                event.set()
        pool.shutdown(wait=True)
        progress.close(bar)
        cpu = _cpu_since(client, cpu0)
        self.summary["cluster"]["cpu_seconds"] = None if cpu is None else round(cpu, 3)
        return stopped


def _now() -> str:
    return datetime.now(timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def _clock(seconds: float) -> str:
    """``12m04s``."""
    return f"{int(seconds) // 60}m{int(seconds) % 60:02d}s"


def _process_cpu() -> float:
    """This process's CPU seconds, user and system, with its children's (its solver helpers: run on each
    worker)."""
    import psutil

    return tree_cpu(psutil.Process())


def _workers_cpu(client) -> dict[str, float]:
    """The CPU seconds each worker process of ``client``'s cluster has used, by worker address ({} when the
    workers cannot be asked)."""
    try:
        return client.run(_process_cpu)
    except Exception:  # noqa: BLE001  a cluster closing or unreachable: its CPU is not measured
        return {}


def _cpu_since(client, before: dict[str, float]) -> float | None:
    """The workers' CPU seconds since ``before`` (:func:`_workers_cpu`); a worker started since counts whole, the
    CPU of one that has gone is lost; None when the workers cannot be asked."""
    now = _workers_cpu(client)
    return sum(cpu - before.get(address, 0.0) for address, cpu in now.items()) if now else None


def tree_cpu(proc) -> float:
    """CPU seconds (user + system) of a ``psutil.Process`` and of its children, running or ended and waited for
    (a worker's solver helpers: solvers/isolated.py)."""
    import psutil

    t = proc.cpu_times()
    total = t.user + t.system + t.children_user + t.children_system
    for child in proc.children(recursive=True):
        try:
            c = child.cpu_times()
            total += c.user + c.system
        except (psutil.Error, OSError):  # ended meanwhile
            pass
    return total


def render(summary: dict) -> str:
    """A short text table of a batch summary."""
    lines = [f"batch {summary.get('status')}: exit code {summary.get('exit_code')}, "
             f"{summary.get('wall_seconds', 0):.1f}s, cluster CPU {summary.get('cluster', {}).get('cpu_seconds') or 0:.1f}s"]
    for r in summary["jobs"]:
        lines.append(f"  {r['name']:20s} {r['kind']:9s} {r.get('action', '-'):7s} {r['status']:9s} "
                     f"exit {r.get('exit_code', '-')!s:4s} {r.get('wall_seconds', 0):8.1f}s"
                     + (f"  {r['message']}" if r.get("status") == "failed" and r.get("message") else ""))
    return "\n".join(lines)
