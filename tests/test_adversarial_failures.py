"""Clean failure everywhere, through the command line in a subprocess (cli_subprocess.py):
every documented error is one line and its exit code, with no traceback, the embedded cluster's workers
included; a refused write (full disk, file size limit, read-only place) is an error of the run directory or
--out (exit 4) that leaves nothing half-written and no lock; SIGTERM and SIGINT stop a run with one line,
release its lock, and ``--resume`` then finishes it byte for byte as an uninterrupted run; ``--workers`` is
bounded; a lock of a dead process is taken over.

We run as root here, where a read-only mode bit stops nothing: refused writes are provoked with
``RLIMIT_FSIZE`` (every write past the limit fails with EFBIG, in the workers too), and with a real full or
read-only tmpfs where this process may mount one.
"""
from __future__ import annotations

import os
import resource
import shutil
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_subprocess import Outcome, assert_clean_failure, snapshot, topdown
from conftest import DATA
from test_output_hashes import output_hashes
from topdown.pipeline.cli import EXIT_CONFIG, EXIT_INPUT, EXIT_INTERRUPTED, EXIT_RUNDIR, EXIT_TERMINATED
from topdown.pipeline.execution.preflight import max_workers
from topdown.pipeline.runtime.rundir import LOCK

RUN = ("--workers", "1")  # and the demo preset's seed, as the session's demo_run and planted_run


def _fsize_limit(limit: int):
    """A ``preexec_fn``: every file write of this process and its children past ``limit`` bytes fails (EFBIG)."""
    def limit_writes() -> None:
        signal.signal(signal.SIGXFSZ, signal.SIG_IGN)  # fail the write instead of killing the process
        resource.setrlimit(resource.RLIMIT_FSIZE, (limit, limit))
    return limit_writes


def _outputs(path: Path) -> dict[str, str]:
    """A run directory's files by SHA-256, the manifest without what two identical runs write differently."""
    return output_hashes(path)


@pytest.fixture(scope="module")
def demo_reference(demo_run) -> dict[str, str]:
    """The outputs of one uninterrupted run of the demo input with the demo preset's seed (the session's, on two
    workers): what an interrupted run on one worker must reach once resumed."""
    return _outputs(demo_run)


def _resumed_equals(reference: dict[str, str], demo_input: Path, out: Path) -> None:
    assert not (out / LOCK).exists()
    done = topdown("run", "demo", "--input", demo_input, "--out", out, "--quiet", "--resume", *RUN)
    assert done.code == 0, str(done)
    assert _outputs(out) == reference


# -- worker-side input errors: one line, no worker traceback -------------------------------------------------------
def _bad_code(path: Path) -> None:
    frame = pd.read_parquet(path / "persons.parquet")
    frame.loc[3, "cenrace"] = 99
    frame.to_parquet(path / "persons.parquet")


def _duplicated_column(path: Path) -> None:
    table = pq.read_table(path / "units.parquet")
    pq.write_table(pa.Table.from_arrays([*table.columns, table.column("unit_type")],
                                        names=[*table.column_names, "unit_type"]), path / "units.parquet")


def _truncated(path: Path) -> None:
    data = (path / "persons.parquet").read_bytes()
    (path / "persons.parquet").write_bytes(data[: len(data) // 2])


@pytest.mark.parametrize("damage, fragments", [
    (_bad_code, ("persons.parquet", "column 'cenrace'", "value 99")),
    (_duplicated_column, ("units.parquet", "column 'unit_type'", "appears 2 times")),
    (_truncated, ("persons.parquet", "not a readable Parquet file")),
], ids=["code-out-of-range", "duplicated-column", "truncated-parquet"])
def test_worker_side_input_error_is_one_line(tmp_path, planted, damage, fragments):
    bad = tmp_path / "input"
    shutil.copytree(planted, bad)
    damage(bad)
    out = tmp_path / "run"
    assert_clean_failure(topdown("run", "demo", "--input", bad, "--out", out, *RUN), EXIT_INPUT, *fragments)
    assert not (out / "manifest.json").exists() and not (out / LOCK).exists()


def test_truncated_gzip_csv_is_an_input_error(tmp_path):
    source = tmp_path / "blocks.csv.gz"
    data = (DATA / "ri2010" / "ri_2010_block_demographics.csv.gz").read_bytes()
    source.write_bytes(data[: len(data) // 2])
    outcome = topdown("ingest", "blocks", source, "--out", tmp_path / "out")
    assert_clean_failure(outcome, EXIT_INPUT, "blocks.csv.gz", "Compressed file ended")
    assert snapshot(tmp_path / "out") == {}


def test_truncated_block_assignment_file_is_an_input_error(tmp_path):
    baf = tmp_path / "baf"
    shutil.copytree(DATA / "ri_baf2020", baf)
    damaged = baf / "BlockAssign_ST44_RI_INCPLACE_CDP.txt.gz"
    damaged.write_bytes(damaged.read_bytes()[:2000])
    outcome = topdown("spine", "--baf", baf, "--out", tmp_path / "out")
    assert_clean_failure(outcome, EXIT_INPUT, damaged.name, "not a readable block assignment file")


# -- refused writes: exit 4, the path named, nothing half-written ---------------------------------------------------
def _commands(run: Path, truth: Path, where: Path) -> dict[str, tuple]:
    return {"nmf": ("nmf", run, "--out", where / "nmf"),
            "uncertainty": ("uncertainty", run, "--out", where / "u.parquet", "--workers", "1"),
            "evaluate": ("evaluate", run, "--truth", truth, "--out", where / "evaluation"),
            "privacy": ("privacy", "demo", "--out", where / "certificate.json")}


@pytest.mark.parametrize("command", ["nmf", "uncertainty", "evaluate", "privacy"])
def test_refused_write_of_out_is_exit_4(tmp_path, planted_run, planted, command):
    where = tmp_path / "out"
    where.mkdir()
    argv = _commands(planted_run, planted, where)[command]
    before = snapshot(planted_run)
    limit = 20_000 if command == "uncertainty" else 600  # the embedded cluster writes a few kB starting up
    outcome = topdown(*argv, preexec_fn=_fsize_limit(limit))
    assert_clean_failure(outcome, EXIT_RUNDIR, str(where), "cannot write (File too large)")
    assert snapshot(where) == {} and list(where.iterdir()) == []  # no temporary file or folder either
    assert snapshot(planted_run) == before


@pytest.mark.parametrize("command", ["nmf", "uncertainty", "evaluate", "privacy", "run", "ingest"])
def test_out_beneath_a_file_is_exit_4(tmp_path, planted_run, planted, command):
    """``--out`` inside what is a file, not a folder: an error of --out naming it (not a bug, exit 6)."""
    blocker = tmp_path / "a-file"
    blocker.write_text("mine\n")
    argv = {**_commands(planted_run, planted, blocker),
            "run": ("run", "demo", "--input", planted, "--out", blocker / "run", "--quiet", *RUN),
            "ingest": ("ingest", "blocks", DATA / "ri2010" / "ri_2010_block_demographics.csv.gz", "--out",
                       blocker / "input")}[command]
    out = argv[argv.index("--out") + 1]
    outcome = topdown(*argv)
    assert outcome.code == EXIT_RUNDIR and str(blocker) in outcome.stderr, str(outcome)
    assert_clean_failure(outcome, EXIT_RUNDIR, str(out) if command != "ingest" else str(blocker))
    assert blocker.read_text() == "mine\n" and [p.name for p in tmp_path.iterdir()] == ["a-file"]


def _mount_tmpfs(path: Path, options: str) -> bool:
    path.mkdir(parents=True, exist_ok=True)
    return subprocess.run(["mount", "-t", "tmpfs", "-o", options, "tmpfs", str(path)],
                          capture_output=True).returncode == 0


@pytest.fixture
def tmpfs(tmp_path):
    """Mounts a tmpfs (skips where this process may not); unmounted after the test."""
    mounted = []

    def mount(name: str, options: str) -> Path:
        path = tmp_path / name
        if not _mount_tmpfs(path, options):
            pytest.skip("cannot mount a tmpfs here (needs root and CAP_SYS_ADMIN)")
        mounted.append(path)
        return path

    yield mount
    for path in mounted:
        subprocess.run(["umount", str(path)], check=False)


@pytest.mark.parametrize("command", ["nmf", "uncertainty", "evaluate", "privacy"])
def test_read_only_out_is_exit_4(tmpfs, planted_run, planted, command):
    where = tmpfs("ro", "size=1m,ro")
    outcome = topdown(*_commands(planted_run, planted, where)[command])
    assert_clean_failure(outcome, EXIT_RUNDIR, str(where), "Read-only file system")


def test_full_disk_run_is_exit_4_and_resumable(tmpfs, demo_input, demo_reference):
    where = tmpfs("full", "size=400k")
    out = where / "run"
    outcome = topdown("run", "demo", "--input", demo_input, "--out", out, *RUN)
    assert_clean_failure(outcome, EXIT_RUNDIR, str(out), "No space left on device")
    assert not (out / LOCK).exists()
    subprocess.run(["mount", "-o", "remount,size=8m", str(where)], check=True)
    _resumed_equals(demo_reference, demo_input, out)


def test_run_over_file_size_limit_is_exit_4_and_resumable(tmp_path, demo_input, demo_reference):
    out = tmp_path / "run"
    outcome = topdown("run", "demo", "--input", demo_input, "--out", out, *RUN, preexec_fn=_fsize_limit(20_000))
    assert_clean_failure(outcome, EXIT_RUNDIR, str(out), "cannot write (File too large)")
    assert not list(out.rglob(".*.tmp"))  # no half-written file
    _resumed_equals(demo_reference, demo_input, out)


def test_uncertainty_out_a_directory_is_exit_4(tmp_path, planted_run):
    (tmp_path / "u").mkdir()
    outcome = topdown("uncertainty", planted_run, "--out", tmp_path / "u", "--workers", "1")
    assert_clean_failure(outcome, EXIT_RUNDIR, str(tmp_path / "u"), "a folder")


@pytest.mark.parametrize("command", ["uncertainty", "evaluate", "verify"])
def test_not_a_run_directory_is_exit_4(tmp_path, planted, command):
    argv = {"uncertainty": ("uncertainty", planted, "--out", tmp_path / "u.parquet", "--workers", "1"),
            "evaluate": ("evaluate", planted, "--truth", planted, "--out", tmp_path / "e"),
            "verify": ("verify", planted)}[command]
    assert_clean_failure(topdown(*argv), EXIT_RUNDIR, str(planted), "no manifest.json")


# -- signals, locks, workers ----------------------------------------------------------------------------------------
@pytest.mark.parametrize("signum, code", [(signal.SIGTERM, EXIT_TERMINATED), (signal.SIGINT, EXIT_INTERRUPTED)],
                         ids=["SIGTERM", "SIGINT"])
def test_signal_stops_run_cleanly_and_resume_completes(tmp_path, demo_input, demo_reference, signum, code):
    out = tmp_path / "run"
    proc = subprocess.Popen([sys.executable, "-m", "topdown.pipeline.cli", "run", "demo", "--input", str(demo_input),
                             "--out", str(out), *RUN], stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True, start_new_session=True)
    seen = []
    for line in proc.stderr:  # mid-run: after a level of persons, as a scheduler's or a user's signal would come
        seen.append(line)
        if "Block_Group" in line and "tasks" in line:
            os.killpg(proc.pid, signum)  # the whole group, workers included, as Ctrl-C or a batch system does
            break
    stdout = proc.stdout.read()
    stderr = "".join(seen) + proc.stderr.read()
    proc.wait(timeout=120)
    outcome = Outcome(("run",), proc.returncode, stdout, stderr)
    assert_clean_failure(outcome, code, f"interrupted by {signal.Signals(signum).name}", "--resume")
    assert (out / "manifest.json").exists()  # stopped mid-run, not before it started
    _resumed_equals(demo_reference, demo_input, out)


@pytest.mark.parametrize("signum", [signal.SIGTERM, signal.SIGINT])
def test_signal_swallowed_by_a_finalizer_is_delivered_again(signum, capsys):
    """A signal whose handler runs inside a ``__del__`` (a Dask future's, as a CI run once saw) is dropped by
    Python with an "Exception ignored" traceback; the command must still stop, without that traceback."""
    import time

    from topdown.pipeline.execution.signals import Interrupted, signals_interrupt

    class TakesTheSignal:
        def __del__(self):
            signal.raise_signal(signum)

    before = (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), sys.unraisablehook)
    with pytest.raises(Interrupted) as stopped:
        with signals_interrupt():
            TakesTheSignal()  # dropped at once: the handler raises inside its finalizer
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                time.sleep(0.01)
    assert stopped.value.signum == signum
    assert "Exception ignored" not in capsys.readouterr().err
    assert (signal.getsignal(signal.SIGTERM), signal.getsignal(signal.SIGINT), sys.unraisablehook) == before


def test_workers_over_the_limit_is_exit_2(tmp_path, planted):
    outcome = topdown("run", "demo", "--input", planted, "--out", tmp_path / "run", "--workers", "100000",
                      "--seed", "1")
    assert_clean_failure(outcome, EXIT_CONFIG, "--workers 100000", f"at most {max_workers()}")
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("holder", ["dead", "empty"])
def test_lock_of_a_dead_process_is_taken_over(tmp_path, planted, planted_run, holder):
    """A lock whose process is gone, or an empty one (an earlier version left it on a full disk)."""
    dead = subprocess.Popen(["true"])
    dead.wait()
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).write_text(f"pid {dead.pid} on {socket.gethostname()} since 2026-01-01T00:00:00"
                            if holder == "dead" else "")
    done = topdown("run", "demo", "--input", planted, "--out", out, "--quiet", *RUN)
    assert done.code == 0, str(done)
    assert "took over the stale lock" in done.stderr and done.tracebacks() == []
    assert not (out / LOCK).exists()
    assert _outputs(out) == _outputs(planted_run)


def test_lock_of_a_live_process_refuses(tmp_path, planted):
    out = tmp_path / "run"
    out.mkdir()
    (out / LOCK).write_text(f"pid 1 on {socket.gethostname()} since 2026-01-01T00:00:00")
    outcome = topdown("run", "demo", "--input", planted, "--out", out, *RUN)
    assert_clean_failure(outcome, EXIT_RUNDIR, "is locked by another run", "pid 1")
    assert snapshot(out) == {LOCK: (out / LOCK).read_bytes()}
