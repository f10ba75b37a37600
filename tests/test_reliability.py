"""Operations: resume after an interruption, one writer per run directory (with stale-lock takeover),
refusal to recompute a complete run, loss of a Dask worker, a real multi-process cluster, and output
independent of the cluster. "Identical" means every Parquet data file is byte-identical.

Fast tests use the small planted input of ``rel_inputs``; the ``slow`` ones use the demo data and
``kill -9`` a real ``topdown run`` process.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import pickle
import shutil
import signal
import socket
import subprocess
import sys
import threading
import time
from contextlib import contextmanager
from pathlib import Path
from typing import Iterator

import pandas as pd
import pytest

from conftest import end_process_groups
from rel_inputs import differing_outputs, leaked_secrets
from topdown.pipeline import load_config, run
from topdown.pipeline.cli import EXIT_OK, EXIT_RUNDIR, main
from topdown.pipeline.runtime.outdir import new_marker
from topdown.pipeline.runtime.rundir import RunDir, RunDirError

TOPDOWN = [sys.executable, "-m", "topdown.pipeline.cli"]


# ---------------------------------------------------------------------------------------- fixtures
def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


def _dead_pid() -> int:
    proc = subprocess.Popen(["true"])
    proc.wait()
    return proc.pid


# ---------------------------------------------------------------------------------------- the lock
def test_stale_lock_of_a_dead_process_is_taken_over(tmp_path, caplog):
    rd = RunDir(tmp_path)
    (tmp_path / ".lock").write_text(f"pid {_dead_pid()} on {socket.gethostname()} since 2020-04-01T00:00:00")
    with caplog.at_level(logging.WARNING, logger="topdown"), rd.lock():
        assert (tmp_path / ".lock").read_text().startswith(f"pid {os.getpid()} on ")
    assert "took over the stale lock" in caplog.text
    assert not (tmp_path / ".lock").exists()


@pytest.mark.parametrize("holder", ["live", "other_host", "unreadable"])
def test_live_or_foreign_lock_refuses(tmp_path, holder):
    text = {"live": f"pid {os.getpid()} on {socket.gethostname()} since 2020-04-01T00:00:00",
            "other_host": f"pid {_dead_pid()} on another-host.example since 2020-04-01T00:00:00",
            "unreadable": "garbage"}[holder]
    (tmp_path / ".lock").write_text(text)
    with pytest.raises(RunDirError, match="locked by another run") as err, RunDir(tmp_path).lock():
        pass
    assert text in str(err.value) and str(tmp_path / ".lock") in str(err.value)
    assert (tmp_path / ".lock").read_text() == text


def test_second_concurrent_run_is_refused_and_leaves_the_first_alone(tmp_path, planted, capsys):
    out = tmp_path / "run"
    rd = RunDir(out)
    rd.prepare()
    with rd.lock():  # the first run, in progress
        staged = out / ".staging" / "histograms" / "persons" / "level=US" / "part-00000.parquet"
        staged.parent.mkdir(parents=True)
        staged.write_bytes(b"half a level")
        code = main(["run", "demo", "--out", str(out), "--input", str(planted), "--quiet"])
        err = capsys.readouterr().err
        assert code == EXIT_RUNDIR
        assert f"locked by another run (pid {os.getpid()} on {socket.gethostname()}" in err
        assert staged.read_bytes() == b"half a level"  # the second run touched nothing
    assert not (out / "manifest.json").exists()


def test_concurrent_cli_runs_one_writer(tmp_path, planted):
    """Two real `topdown run` processes started together on one directory: exactly one runs, the other
    exits 4 naming the winner's pid and host."""
    out = tmp_path / "run"
    cmd = [*TOPDOWN, "run", "demo", "--out", str(out), "--input", str(planted), "--workers", "1", "--quiet"]
    procs = [subprocess.Popen(cmd, stderr=subprocess.PIPE, text=True) for _ in range(2)]
    errs = [p.communicate(timeout=180)[1] for p in procs]
    codes = sorted((p.returncode, i) for i, p in enumerate(procs))
    assert [c for c, _ in codes] == [EXIT_OK, EXIT_RUNDIR], errs
    winner, loser = procs[codes[0][1]], codes[1][1]
    assert f"locked by another run (pid {winner.pid} on {socket.gethostname()}" in errs[loser]
    assert _manifest(out)["status"] == "complete" and not (out / ".lock").exists()


# -------------------------------------------------------------------------- complete runs, --force
def test_complete_run_is_refused_without_force(tmp_path, planted, capsys):
    out = tmp_path / "run"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({**new_marker("run"), "status": "complete",
                                                   "config_hash": "ab" * 32}))
    for flags in ([], ["--resume"]):
        assert main(["run", "demo", "--out", str(out), "--input", str(planted), "--quiet", *flags]) == EXIT_RUNDIR
        err = capsys.readouterr().err
        assert "already holds a complete run" in err and "use --force" in err
    assert not (out / ".lock").exists()


def test_force_recomputes_a_complete_run(tmp_path, planted, planted_run, dask_client):
    out = tmp_path / "run"
    shutil.copytree(planted_run, out)
    seen: list[tuple[str, str]] = []
    run(load_config("demo"), out, input_dir=planted, client=dask_client, force=True,
        progress=lambda p, lv, done, total: seen.append((p, lv)))
    assert {lv for _, lv in seen} == set(_manifest(out)["levels"])
    assert differing_outputs(planted_run, out) == []


def test_resume_refuses_another_configuration(tmp_path, planted, dask_client):
    out = tmp_path / "run"
    out.mkdir()
    (out / "manifest.json").write_text(json.dumps({**new_marker("run"), "status": "running", "config_hash": "0" * 64}))
    with pytest.raises(RunDirError, match="different configuration"):
        run(load_config("demo"), out, input_dir=planted, client=dask_client, resume=True)
    # A run started before a default changed (the QP back end) is told which key differs and how it was set.
    config = load_config("demo")
    before = config.with_overrides(input=str(planted), build_demo_input=False).model_dump(mode="json")
    before["persons"]["estimation"]["backend"] = "clarabel-highs"
    (out / "config.json").write_text(json.dumps(before))
    with pytest.raises(RunDirError, match=r"differs in persons\.estimation\.backend \(run: 'clarabel-highs'\)\)$"):
        run(config, out, input_dir=planted, client=dask_client, resume=True)


# ----------------------------------------------------------------------------------------- resume
class _Interrupted(Exception):
    pass


def test_resume_after_an_interruption_in_a_level(tmp_path, planted, planted_run, dask_client):
    """Interrupted while the persons Block level runs (half of it staged): --resume recomputes only
    what was not committed, and the output is identical to the uninterrupted run."""
    out = tmp_path / "run"

    def interrupt(product: str, level: str, done: int, total: int) -> None:
        if (product, level) == ("persons", "Block"):
            raise _Interrupted

    with pytest.raises(_Interrupted):
        run(load_config("demo"), out, input_dir=planted, client=dask_client, progress=interrupt)
    manifest = _manifest(out)
    assert manifest["status"] == "running"
    done_before = list(manifest["completed"]["persons"])
    assert done_before == ["US", "State", "County", "Tract", "Block_Group"]
    assert not (out / "histograms" / "persons" / "level=Block").exists()
    assert not (out / ".lock").exists()

    seen: list[tuple[str, str]] = []
    run(load_config("demo"), out, input_dir=planted, client=dask_client, resume=True,
        progress=lambda p, lv, d, t: seen.append((p, lv)))
    recomputed = {lv for p, lv in seen if p == "persons"}
    assert recomputed == {"Block"}
    assert {lv for p, lv in seen if p == "units"} == set(manifest["levels"])
    assert _manifest(out)["status"] == "complete"
    assert not (out / ".staging").exists()
    assert differing_outputs(planted_run, out) == []


def _interrupted_in_persons_block(config, out: Path, planted: Path, client) -> None:
    def interrupt(product: str, level: str, done: int, total: int) -> None:
        if (product, level) == ("persons", "Block"):
            raise _Interrupted

    with pytest.raises(_Interrupted):
        run(config, out, input_dir=planted, client=client, progress=interrupt)


def _tamper(part: Path, column: str) -> None:
    """Rewrite a staged Parquet file as a valid file with one value changed (what reuse would not notice)."""
    frame = pd.read_parquet(part)
    frame.loc[0, column] += 1
    frame.to_parquet(part, index=False)


def test_resume_recomputes_a_staged_chunk_that_fails_its_sha256_in_test_mode(tmp_path, planted, planted_run,
                                                                            dask_client, caplog):
    out = tmp_path / "run"
    _interrupted_in_persons_block(load_config("demo"), out, planted, dask_client)
    record = json.loads((out / ".staging/chunks/persons/level=Block/part-00000.json").read_text())
    part = out / ".staging/histograms/persons/level=Block/part-00000.parquet"
    assert record["sha256"]["histograms"] == hashlib.sha256(part.read_bytes()).hexdigest()
    _tamper(part, "count")
    with caplog.at_level(logging.WARNING, logger="topdown"):
        run(load_config("demo"), out, input_dir=planted, client=dask_client, resume=True)
    assert "SHA-256 differs" in caplog.text and "recomputing chunk 0 of persons Block" in caplog.text
    assert leaked_secrets(caplog.text) == []
    assert differing_outputs(planted_run, out) == []


def test_resume_stops_on_a_staged_chunk_that_fails_its_sha256_in_production(tmp_path, planted, dask_client):
    out = tmp_path / "run"
    config = load_config("demo").with_overrides(mode="production", seed=None)
    _interrupted_in_persons_block(config, out, planted, dask_client)
    part = out / ".staging/noisy_measurements/persons/level=Block/part-00000.parquet"
    _tamper(part, "value")
    tampered = part.read_bytes()
    with pytest.raises(RunDirError, match=r"part-00000.parquet: SHA-256 differs .*production mode neither reuses it") as err:
        run(config, out, input_dir=planted, client=dask_client, resume=True)
    assert leaked_secrets(str(err.value)) == []
    assert part.read_bytes() == tampered and _manifest(out)["status"] == "running"
    assert not (out / "noisy_measurements" / "persons" / "level=Block").exists()


def test_a_batch_of_chunks_writes_each_chunks_part_and_record_and_resume_reuses_them(
        tmp_path, demo_input, demo_run, dask_client, caplog, monkeypatch):
    """The persons Block level's two chunks run in one Dask task (one batch); each chunk's part
    and record are written by the task, an interruption after it keeps both for --resume, and the output is
    the unbatched reference run's, byte for byte."""
    from topdown.pipeline.execution import tasks

    monkeypatch.setattr(tasks, "TASKS_PER_WORKER", 0.001)  # a target cost above the level's: one batch
    submitted = []
    real_submit = dask_client.submit
    monkeypatch.setattr(dask_client, "submit", lambda fn, *a, **k: (submitted.append((fn.__name__, a)),
                                                                   real_submit(fn, *a, **k))[1])
    out = tmp_path / "run"
    _interrupted_in_persons_block(load_config("demo"), out, demo_input, dask_client)
    batches = [pickle.loads(a[1]) for name, a in submitted if name == "run_part_chunks"]
    assert [c[3][-30:] for c in batches[-1]] == ["level=Block/part-00000.parquet", "level=Block/part-00001.parquet"]
    records = sorted((out / ".staging/chunks/persons/level=Block").glob("part-*.json"))
    assert [r.name for r in records] == ["part-00000.json", "part-00001.json"]
    with caplog.at_level(logging.INFO, logger="topdown"):
        run(load_config("demo"), out, input_dir=demo_input, client=dask_client, resume=True)
    assert "persons Block: 2 of 2 chunks finished by an earlier run, reused" in caplog.text
    assert differing_outputs(demo_run, out) == []


def test_resume_checks_the_committed_levels_it_reads_back(tmp_path, planted, planted_run, dask_client, caplog):
    """A committed level changed after the interruption: test mode recomputes it (same output as the
    reference run), production stops."""
    for mode in ("test", "production"):
        out = tmp_path / mode
        config = load_config("demo") if mode == "test" else load_config("demo").with_overrides(mode=mode, seed=None)
        _interrupted_in_persons_block(config, out, planted, dask_client)
        assert set(_manifest(out)["sha256"]["persons"]) == {"US", "State", "County", "Tract", "Block_Group"}
        part = next((out / "histograms" / "persons" / "level=Tract").glob("*.parquet"))
        _tamper(part, "count")
        if mode == "production":
            with pytest.raises(RunDirError, match="SHA-256 differs from the manifest: persons Tract changed"):
                run(config, out, input_dir=planted, client=dask_client, resume=True)
            continue
        with caplog.at_level(logging.WARNING, logger="topdown"):
            run(config, out, input_dir=planted, client=dask_client, resume=True)
        assert "recomputing persons Tract" in caplog.text
        assert differing_outputs(planted_run, out) == []


@pytest.mark.slow
def test_kill_9_mid_level_then_resume(tmp_path, demo_input, demo_run):
    """`kill -9` of a `topdown run` (and its worker processes) while the persons Block level runs; the
    stale lock is taken over, completed levels are read back, and the output equals the reference."""
    out = tmp_path / "run"
    base = [*TOPDOWN, "run", "demo", "--out", str(out), "--input", str(demo_input), "--workers", "2", "--quiet"]
    proc = subprocess.Popen(base, start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        manifest = _wait_for(out, lambda m: m.get("status") == "running"
                             and "Block_Group" in m["completed"].get("persons", []), proc)
        os.killpg(proc.pid, signal.SIGKILL)
    finally:
        if proc.poll() is None:
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait()
    manifest = _manifest(out)
    assert manifest["status"] == "running" and "Block" not in manifest["completed"]["persons"], manifest["completed"]
    assert (out / ".lock").read_text().startswith(f"pid {proc.pid} ")  # left behind by the killed run
    done = list(manifest["completed"]["persons"])

    loud = [a for a in base if a != "--quiet"]  # --quiet keeps only warnings; the levels read back are INFO lines
    resumed = subprocess.run([*loud, "--resume"], capture_output=True, text=True, timeout=300)
    assert resumed.returncode == EXIT_OK, resumed.stderr
    assert "took over the stale lock" in resumed.stderr
    for level in done:
        assert f"persons {level}: complete in an earlier run, read back" in resumed.stderr
    assert "persons Block: 28 parents" in resumed.stderr
    assert _manifest(out)["status"] == "complete"
    assert differing_outputs(demo_run, out) == []

    again = subprocess.run(base, capture_output=True, text=True, timeout=120)
    assert again.returncode == EXIT_RUNDIR and "already holds a complete run" in again.stderr


def _wait_for(out: Path, ready, proc: subprocess.Popen, timeout: float = 180) -> dict:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        assert proc.poll() is None, f"the run ended (exit {proc.returncode}) before the kill point"
        try:
            manifest = _manifest(out)
        except (FileNotFoundError, json.JSONDecodeError):
            manifest = {}
        if manifest and ready(manifest):
            return manifest
        time.sleep(0.02)
    raise AssertionError("the kill point was not reached in time")


# ----------------------------------------------------------------------------------- worker loss
@contextmanager
def _worker_killer(client, key_prefix: str) -> Iterator[dict]:
    """Kill (SIGKILL) the first worker seen processing a task whose key starts with ``key_prefix``."""
    pids = client.run(os.getpid)
    state: dict = {"killed": None}
    stop = threading.Event()

    def watch() -> None:
        while not stop.is_set() and state["killed"] is None:
            for addr, keys in client.processing().items():
                if any(str(k).startswith(key_prefix) for k in keys) and addr in pids:
                    os.kill(pids[addr], signal.SIGKILL)
                    state["killed"] = (addr, pids[addr])
                    return
            time.sleep(0.01)

    thread = threading.Thread(target=watch, daemon=True)
    thread.start()
    try:
        yield state
    finally:
        stop.set()
        thread.join(timeout=5)


def _lost_worker_run(input_dir: Path, out: Path, key_prefix: str) -> tuple:
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        client.run(lambda: None)  # workers up
        with _worker_killer(client, key_prefix) as state:
            run(load_config("demo"), out, input_dir=input_dir, client=client)
        return state["killed"]


def test_worker_killed_mid_level_does_not_fail_the_run(tmp_path, planted, planted_run):
    killed = _lost_worker_run(planted, tmp_path / "run", "persons-")
    assert killed is not None, "no persons task was seen running"
    assert _manifest(tmp_path / "run")["status"] == "complete"
    assert differing_outputs(planted_run, tmp_path / "run") == []


@pytest.mark.slow
def test_worker_killed_in_the_block_level_of_the_demo(tmp_path, demo_input, demo_run):
    killed = _lost_worker_run(demo_input, tmp_path / "run", "persons-Block-")
    assert killed is not None, "no persons Block task was seen running"
    assert differing_outputs(demo_run, tmp_path / "run") == []


# --------------------------------------------------------------------------------- real clusters
def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@pytest.fixture(scope="module")
def real_cluster(tmp_path_factory) -> Iterator[str]:
    """`dask scheduler` and two `dask worker` processes on localhost (lifetime bounded, always ended), shared by
    the module's tests that run on it (none of them stops a worker)."""
    tmp_path = tmp_path_factory.mktemp("real-cluster")
    port = _free_port()
    addr = f"tcp://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
    log = open(tmp_path / "cluster.log", "w")
    dask = [sys.executable, "-m", "dask"]  # this interpreter: the `dask` on PATH may import another checkout
    procs = [subprocess.Popen(["timeout", "600", *dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--no-dashboard"], stdout=log, stderr=log, env=env, start_new_session=True)]
    for i in range(2):
        procs.append(subprocess.Popen(["timeout", "600", *dask, "worker", addr, "--nthreads", "1", "--nworkers", "1",
                                       "--no-dashboard", "--local-directory", str(tmp_path / f"w{i}")],
                                      stdout=log, stderr=log, env=env, start_new_session=True))
    try:
        from distributed import Client

        with Client(addr, timeout=60) as client:
            client.wait_for_workers(2, timeout=60)
        yield addr
    finally:
        end_process_groups(procs)
        log.close()


def _cli_demo_run(out: Path, input_dir: Path, *extra: str, timeout: int = 300) -> None:
    """`topdown run demo` in a subprocess; it must succeed."""
    done = subprocess.run([*TOPDOWN, "run", "demo", "--out", str(out), "--input", str(input_dir), *extra, "--quiet"],
                          capture_output=True, text=True, timeout=timeout)
    assert done.returncode == EXIT_OK, done.stderr


def test_real_cluster_cli_and_python_give_identical_output(tmp_path, planted, planted_run, real_cluster):
    from distributed import Client

    cli_out = tmp_path / "cli"
    _cli_demo_run(cli_out, planted, "--scheduler", real_cluster, timeout=180)
    assert differing_outputs(planted_run, cli_out) == []

    py_out = tmp_path / "python"
    with Client(real_cluster) as client:
        assert len(client.scheduler_info()["workers"]) == 2
        run(load_config("demo"), py_out, input_dir=planted, client=client)
    assert differing_outputs(planted_run, py_out) == []


@pytest.mark.slow
def test_real_cluster_on_the_demo(tmp_path, demo_input, demo_run, real_cluster):
    out = tmp_path / "cli"
    _cli_demo_run(out, demo_input, "--scheduler", real_cluster)
    assert differing_outputs(demo_run, out) == []


@pytest.mark.slow
def test_one_or_two_embedded_workers_give_identical_output(tmp_path, demo_input, demo_run):
    for n in (1, 2):
        out = tmp_path / f"w{n}"
        _cli_demo_run(out, demo_input, "--workers", str(n))
        assert differing_outputs(demo_run, out) == [], n


def _malloc_trim_threshold() -> str | None:
    return os.environ.get("MALLOC_TRIM_THRESHOLD_")


def test_embedded_workers_keep_glibc_malloc_defaults(monkeypatch):
    """Dask's nanny would start the workers with MALLOC_TRIM_THRESHOLD_=65536 (and a Dask cluster started
    earlier in this process leaves it in the environment): the embedded cluster's workers start without it
    (runner.GLIBC_ENV), and this process's environment is as it was afterwards."""
    from topdown.pipeline.execution.runner import dask_client

    monkeypatch.setenv("MALLOC_TRIM_THRESHOLD_", "65536")
    with dask_client(workers=1) as client:
        assert list(client.run(_malloc_trim_threshold).values()) == [None]
    assert os.environ["MALLOC_TRIM_THRESHOLD_"] == "65536"


def _arrow_pool() -> str:
    import pyarrow as pa

    return pa.default_memory_pool().backend_name


def test_embedded_workers_allocate_arrow_buffers_with_glibc(monkeypatch):
    """The embedded cluster's workers use Arrow's system pool (runner.WORKER_ENV), and this process's
    environment is as it was afterwards."""
    from topdown.pipeline.execution.runner import dask_client

    monkeypatch.delenv("ARROW_DEFAULT_MEMORY_POOL", raising=False)
    with dask_client(workers=1) as client:
        assert list(client.run(_arrow_pool).values()) == ["system"]
    assert "ARROW_DEFAULT_MEMORY_POOL" not in os.environ
