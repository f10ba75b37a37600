"""What a demanding user hits through the command line (in a subprocess, tests/cli_subprocess.py): ``--quiet``
leaves nothing but warnings and errors on stderr; a command refused before it starts leaves no --out folder
it created; ``privacy --out`` replaces only an earlier certificate, atomically; ``batch`` stops on SIGTERM
like every command."""
from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from cli_subprocess import SHORT_CONNECT, Outcome, assert_clean_failure, snapshot, topdown
from topdown.pipeline.cli import EXIT_CONFIG, EXIT_INPUT, EXIT_OK, EXIT_RUNDIR, EXIT_TERMINATED
from topdown.pipeline.runtime.rundir import LOCK
from topdown.pipeline.privacy.certificate import NOT_PRIVATE_WARNING

RUN = ("--workers", "1", "--seed", "1")


def _not_warnings(outcome: Outcome) -> list[str]:
    """stderr's lines other than the test-mode warning every test-mode run prints (progress, INFO, Dask's)."""
    return [ln for ln in outcome.stderr.splitlines() if ln.strip() and NOT_PRIVATE_WARNING not in ln]


# -- 1. --quiet: warnings and errors only ------------------------------------------------------------------------
@pytest.fixture(scope="module")
def quiet_run(tmp_path_factory, demo_input) -> tuple[Path, Outcome]:
    out = tmp_path_factory.mktemp("quiet") / "run"
    return out, topdown("run", "demo", "--input", demo_input, "--out", out, "--quiet", *RUN)


def test_quiet_run_prints_nothing_but_its_warning(quiet_run):
    out, outcome = quiet_run
    assert outcome.code == EXIT_OK, str(outcome)
    assert _not_warnings(outcome) == [], str(outcome)
    assert NOT_PRIVATE_WARNING in outcome.stderr  # warnings still come through
    assert "run complete" in outcome.stdout


def test_quiet_uncertainty_prints_nothing(quiet_run, tmp_path):
    out, _ = quiet_run
    outcome = topdown("uncertainty", out, "--out", tmp_path / "u.parquet", "--workers", "1", "--quiet")
    assert outcome.code == EXIT_OK, str(outcome)
    assert outcome.stderr.strip() == "", str(outcome)


@pytest.mark.slow
def test_quiet_replicates_prints_nothing(quiet_run, tmp_path):
    out, _ = quiet_run
    outcome = topdown("replicates", out, "--n", "1", "--parallel", "1", "--out", tmp_path / "reps", "--workers", "1",
                      "--quiet")
    assert outcome.code == EXIT_OK, str(outcome)
    assert _not_warnings(outcome) == [], str(outcome)


# -- 2. refused before it starts: no --out folder left behind --------------------------------------------------
def test_input_error_leaves_no_out_folder(tmp_path, demo_input):
    bad = tmp_path / "input"
    shutil.copytree(demo_input, bad)
    persons = bad / "persons.parquet"
    persons.write_bytes(persons.read_bytes()[:3000])  # found by the workers, after the run directory was made
    out = tmp_path / "new" / "run"
    outcome = topdown("run", "demo", "--input", bad, "--out", out, "--quiet", *RUN)
    assert_clean_failure(outcome, EXIT_INPUT, "persons.parquet", "not a readable Parquet file")
    assert not (tmp_path / "new").exists()  # neither --out nor the folder above it that the run made


def test_refused_run_keeps_an_out_folder_that_was_there(tmp_path, demo_input):
    bad = tmp_path / "input"
    shutil.copytree(demo_input, bad)
    (bad / "persons.parquet").write_bytes(b"not parquet")
    out = tmp_path / "run"
    out.mkdir()
    outcome = topdown("run", "demo", "--input", bad, "--out", out, *RUN)
    assert_clean_failure(outcome, EXIT_INPUT, "persons.parquet")
    assert out.is_dir() and list(out.iterdir()) == []
    # without --quiet the INFO lines show (what the --quiet tests above find absent)
    assert any(" INFO embedded Dask cluster" in ln for ln in outcome.stderr.splitlines()), str(outcome)


@pytest.mark.slow
@pytest.mark.parametrize("command", ["run", "reprocess"])
def test_config_error_leaves_no_out_folder(tmp_path, demo_input, quiet_run, command):
    """An unreachable scheduler: exit 2 after Dask's connect timeout (shortened here), naming the wait."""
    out = tmp_path / "out"
    source = ("demo", "--input", demo_input) if command == "run" else (quiet_run[0],)
    outcome = topdown(command, *source, "--out", out, "--scheduler", "tcp://127.0.0.1:9", "--quiet",
                      env=dict(SHORT_CONNECT))
    assert_clean_failure(outcome, EXIT_CONFIG, "cannot reach the Dask scheduler", "within 3s",
                         "DASK_DISTRIBUTED__COMM__TIMEOUTS__CONNECT")
    assert not out.exists()


# -- 3. privacy --out: only an earlier certificate is replaced, atomically ----------------------------------------
def test_privacy_out_refuses_a_file_that_is_not_a_certificate(tmp_path):
    mine = tmp_path / "notes.json"
    mine.write_text('{"mine": 1}\n')
    outcome = topdown("privacy", "demo", "--out", mine)
    assert_clean_failure(outcome, EXIT_RUNDIR, str(mine), "not an earlier output of this command")
    assert outcome.stdout == ""  # refused before the certificate is printed
    assert mine.read_text() == '{"mine": 1}\n' and [p.name for p in tmp_path.iterdir()] == ["notes.json"]
    folder = tmp_path / "folder"
    folder.mkdir()
    assert_clean_failure(topdown("privacy", "demo", "--out", folder), EXIT_RUNDIR, str(folder), "a folder")
    assert list(folder.iterdir()) == []


def test_privacy_out_replaces_an_earlier_certificate_but_not_a_runs(tmp_path, quiet_run):
    out = tmp_path / "new" / "cert.json"  # a missing folder is made, as for the other commands' --out
    assert topdown("privacy", "demo", "--out", out).code == EXIT_OK
    tmp_path = out.parent
    first = json.loads(out.read_text())
    assert first["run"] == "demo"
    done = topdown("privacy", "pl94_production_2021", "--out", out)  # a new certificate over the earlier one
    assert done.code == EXIT_OK, str(done)
    assert json.loads(out.read_text())["mode"] == "production" and [p.name for p in tmp_path.iterdir()] == ["cert.json"]
    # A run directory's certificate is part of that run (its manifest records its SHA-256): never replaced.
    run_cert = quiet_run[0] / "certificate.json"
    before = run_cert.read_bytes()
    outcome = topdown("privacy", "pl94_production_2021", "--out", run_cert)
    assert_clean_failure(outcome, EXIT_RUNDIR, str(run_cert), "run directory")
    assert run_cert.read_bytes() == before


# -- 4. batch stops on SIGTERM through the commands' one mechanism (execution/signals.py) ---------------------------
def test_sigterm_stops_a_batch_and_its_job_cleanly(tmp_path, demo_input):
    """A batch system's kill of the batch process alone: the running job gets SIGINT and releases its run
    directory, the summary says interrupted, and the batch exits 143 like any command stopped by SIGTERM."""
    (tmp_path / "jobs.toml").write_text(f'[batch]\nworkers = 1\n\n[[job]]\nname = "demo"\nkind = "run"\n'
                                        f'config = "demo"\ninput = "{demo_input}"\nout = "out/demo"\n')
    lock = tmp_path / "out" / "demo" / LOCK
    proc = subprocess.Popen([sys.executable, "-m", "topdown.pipeline.cli", "batch", str(tmp_path / "jobs.toml")],
                            stdin=subprocess.DEVNULL, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    try:
        deadline = time.monotonic() + 240
        while not lock.exists() and proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.05)
        assert lock.exists(), "the job never started its run"
        os.kill(proc.pid, signal.SIGTERM)
        stdout, stderr = proc.communicate(timeout=120)
    finally:
        from conftest import end_process_groups
        end_process_groups([proc])
    outcome = Outcome(("batch",), proc.returncode, stdout, stderr)
    assert outcome.code == EXIT_TERMINATED, str(outcome)
    assert outcome.tracebacks() == [] and "Exception ignored" not in stderr, str(outcome)
    summary = json.loads((tmp_path / "jobs.summary.json").read_text())
    assert summary["status"] == "interrupted" and summary["exit_code"] == EXIT_TERMINATED, summary
    assert summary["jobs"][0]["status"] == "failed" and summary["jobs"][0]["exit_code"] == 130, summary
    assert not lock.exists()  # the job released its run directory: it resumes
    assert not (tmp_path / "jobs.logs" / LOCK).exists()  # and the batch the lock of its logs


def test_signals_interrupt_off_the_main_thread_changes_nothing():
    """batch.Batch.run may run in a thread (a notebook's): there Python allows no signal handler."""
    import threading

    from topdown.pipeline.execution.signals import signals_interrupt

    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), sys.unraisablehook)
    seen = []

    def body():
        with signals_interrupt():
            seen.append((signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), sys.unraisablehook))

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == [before]


def _ignored(status: str) -> set[int]:
    """The signals a process ignores, from the SigIgn mask of its /proc/PID/status."""
    mask = int(next(line.split()[1] for line in status.splitlines() if line.startswith("SigIgn:")), 16)
    return {n for n in range(1, 65) if mask >> (n - 1) & 1}


@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads /proc")
def test_embedded_workers_ignore_the_stop_signals_and_the_driver_gets_them_back():
    """A signal to the whole group must stop the driver alone: a worker dying first makes the scheduler log
    its loss before the command's one line. The driver's own handlers are restored once the cluster is up (what
    they were: a shell's background job starts with SIGINT ignored)."""
    from topdown.pipeline.execution.runner import dask_client

    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
    with dask_client(workers=1) as client:
        during = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT))
        statuses = client.run(lambda: Path("/proc/self/status").read_text())
    assert during == before
    assert statuses and all({signal.SIGTERM, signal.SIGINT} <= _ignored(s) for s in statuses.values()), statuses
