"""Jobs started without blocking (jobs.py) and the progress of long commands (runtime/progress.py)."""
from __future__ import annotations

import io
import json
import re
import subprocess
import sys
import threading
import time
from pathlib import Path

import dask
import pytest

from rel_inputs import differing_outputs
from topdown.pipeline import Cancelled, Job, load_config, submit, submit_reprocess, submit_uncertainty
from topdown.pipeline.cli import main
from topdown.pipeline.runtime.progress import (Reporter, Steps, chain, compute, reporter, reporting, track)

BAR = re.compile(r"(?P<desc>[^\r\n]+?): +\d+%\|[^|]*\| (?P<n>\d+)/(?P<total>\d+) (?P<unit>\w+) \[")


def _bars(text: str) -> dict[str, tuple[int, int, str]]:
    """The last state of every bar in ``text``: desc -> (done, total, unit)."""
    return {m["desc"]: (int(m["n"]), int(m["total"]), m["unit"]) for m in BAR.finditer(text)}


def _manifest(run_dir: Path) -> dict:
    return json.loads((run_dir / "manifest.json").read_text())


# ------------------------------------------------------------------------------------------ the reporter
def test_reporter_draws_steps_tasks_and_tracks_and_stays_silent_when_disabled():
    out = io.StringIO()
    with reporting(Reporter(file=out)) as rep:
        steps = Steps("start-up", 2)
        steps.start("one")
        steps.start("two")
        steps.close()
        for done in range(4):
            rep.tasks("persons", "Block", done, 3)  # 3 of 3: closed
        assert list(track(["a", "b"], "items", unit="things")) == ["a", "b"]
    bars = _bars(out.getvalue())
    assert bars == {"start-up": (2, 2, "steps"), "persons Block": (3, 3, "tasks"), "items": (2, 2, "things")}
    assert "two" in out.getvalue()  # the current step is named

    quiet = io.StringIO()
    with reporting(Reporter(enabled=False, file=quiet)) as rep:
        Steps("start-up", 1).start("one")
        rep.tasks("persons", "US", 1, 1)
    assert quiet.getvalue() == ""
    assert reporter().enabled is False  # outside reporting(): the silent default


def test_reporting_closes_open_bars_on_an_error_so_a_message_starts_a_line():
    out = io.StringIO()
    with pytest.raises(KeyError), reporting(Reporter(file=out)):
        Steps("start-up", 3).start("ingest")
        raise KeyError("x")
    assert out.getvalue().endswith("\n")


def test_a_set_cancel_event_stops_at_the_next_step_or_task():
    cancel = threading.Event()
    with reporting(Reporter(enabled=False, cancel=cancel)) as rep:
        steps = Steps("start-up", 2)
        steps.start("one")
        rep.tasks("persons", "US", 0, 1)
        cancel.set()
        with pytest.raises(Cancelled):
            steps.start("two")
        with pytest.raises(Cancelled):
            rep.tasks("persons", "US", 1, 1)
        with pytest.raises(Cancelled):
            next(iter(track([1], "items")))


def test_compute_counts_the_tasks_on_local_threads():
    out = io.StringIO()
    tasks = [dask.delayed(pow)(i, 2) for i in range(5)]
    with reporting(Reporter(file=out)):
        assert compute(tasks, None, "squares") == [0, 1, 4, 9, 16]
    assert _bars(out.getvalue()) == {"squares": (5, 5, "tasks")}


def test_chain_calls_each_progress_function_in_order():
    seen: list = []
    chain(None, lambda *a: seen.append(("a", *a)), lambda *a: seen.append(("b", *a)))("persons", "US", 1, 2)
    assert seen == [("a", "persons", "US", 1, 2), ("b", "persons", "US", 1, 2)]


# ------------------------------------------------------------------------------------------------ jobs
def test_submit_returns_at_once_and_the_job_gives_the_run_directory(tmp_path, planted, planted_run, dask_client,
                                                                     capsys):
    out = tmp_path / "run"
    t0 = time.perf_counter()
    job = submit(load_config("demo"), out, input_dir=planted, client=dask_client)
    assert time.perf_counter() - t0 < 2 and not job.done() and job.status == "running"
    assert isinstance(job, Job) and "running" in repr(job)
    assert job.result(timeout=600) == out
    assert job.done() and job.status == "complete" and not job.cancelled() and job.exception() is None
    assert _manifest(out)["status"] == "complete"
    assert differing_outputs(planted_run, out) == []
    assert any("INFO persons Block: " in line for line in job.log), job.log
    bars = _bars(capsys.readouterr().err)
    assert bars["run start-up"] == (5, 5, "steps")
    levels = _manifest(out)["levels"]
    assert {d for d in bars if d.startswith("persons ")} == {f"persons {lv}" for lv in levels}
    # Counts of tasks and steps only: none is as large as a count of persons (the planted input has thousands).
    assert max(total for _, total, _ in bars.values()) < 50


def test_cancel_stops_the_job_and_leaves_a_resumable_run(tmp_path, planted, planted_run, dask_client):
    out = tmp_path / "run"
    holder: list[Job] = []
    ready = threading.Event()

    def cancel_after_tract(product: str, level: str, done: int, total: int) -> None:
        if (product, level) == ("persons", "Tract") and done == total:
            ready.wait(60)
            holder[0].cancel()

    job = submit(load_config("demo"), out, input_dir=planted, client=dask_client, progress=False,
                 on_progress=cancel_after_tract)
    holder.append(job)
    ready.set()
    with pytest.raises(Cancelled, match="resume"):
        job.result(timeout=600)
    assert job.cancelled() and job.status == "cancelled" and job.cancel() is False
    manifest = _manifest(out)
    assert manifest["status"] == "running"
    assert manifest["completed"]["persons"] == ["US", "State", "County", "Tract"]
    assert not (out / ".lock").exists()
    assert job.log[-1].startswith("Cancelled: ")

    resumed = submit(load_config("demo"), out, input_dir=planted, client=dask_client, resume=True, progress=False)
    assert resumed.result(timeout=600) == out
    assert differing_outputs(planted_run, out) == []


def test_a_failed_job_raises_its_error_from_result(tmp_path, dask_client):
    config = load_config("demo").with_overrides(build_demo_input=False)
    job = submit(config, tmp_path / "run", input_dir=tmp_path / "no-such-input", client=dask_client, progress=False)
    with pytest.raises(FileNotFoundError, match="no-such-input"):
        job.result(timeout=120)
    assert job.status == "failed" and isinstance(job.exception(), FileNotFoundError)


def test_reprocessing_and_uncertainty_jobs(tmp_path, demo_run, dask_client):
    changes = tmp_path / "changes.toml"
    changes.write_text('[persons.estimation.rounder_passes]\nBlock = [["total"], ["hhgq"], ["detailed"]]\n')
    rep = submit_reprocess(demo_run, tmp_path / "again", changes, client=dask_client, progress=False)
    unc = submit_uncertainty(demo_run, tmp_path / "unc.parquet", levels=["Tract"], client=dask_client, progress=False)
    assert rep.result(timeout=600) == tmp_path / "again"
    assert _manifest(tmp_path / "again")["status"] == "complete"
    assert unc.result(timeout=600).rows > 0 and (tmp_path / "unc.parquet").exists()


SCRIPT = """
import sys, time
from topdown.pipeline import load_config, submit
job = submit(load_config('demo'), sys.argv[1], input_dir=sys.argv[2], workers=1)
print('returned', job.status, flush=True)
while not job.done():
    time.sleep(0.5)
print('result', job.result(), job.status, flush=True)
"""


def test_submit_from_a_plain_script_with_an_embedded_cluster(tmp_path, planted):
    out = tmp_path / "run"
    done = subprocess.run([sys.executable, "-c", SCRIPT, str(out), str(planted)], capture_output=True, text=True,
                          timeout=600)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines() == ["returned running", f"result {out} complete"]
    bars = _bars(done.stderr)
    assert bars["run start-up"] == (5, 5, "steps") and bars["units Block"][0] == bars["units Block"][1]
    assert _manifest(out)["status"] == "complete"


# ------------------------------------------------------------------------------- the command line's bars
def test_commands_show_progress_on_stderr_and_quiet_silences_it(tmp_path, demo_run, capsys):
    assert main(["nmf", str(demo_run), "--out", str(tmp_path / "nmf")]) == 0
    bars = _bars(capsys.readouterr().err)
    levels = _manifest(demo_run)["levels"]
    assert bars["nmf persons"] == (len(levels), len(levels), "levels") and "nmf units" in bars
    assert main(["nmf", str(demo_run), "--out", str(tmp_path / "nmf2"), "--quiet"]) == 0
    assert _bars(capsys.readouterr().err) == {}


DATA = Path(__file__).resolve().parents[1] / "data"
SLOW = pytest.mark.slow


@pytest.mark.parametrize("argv, bar, unit", [
    (["ingest", "blocks", str(DATA / "ri2010" / "ri_2010_block_demographics.csv.gz"), "--out", "{tmp}/in"],
     "ingest blocks", "steps"),
    (["ingest", "pl94", str(Path(__file__).resolve().parents[1] / "pipeline" / "data"), "--out", "{tmp}/pl"],
     "ingest pl94", "steps"),
    (["uncertainty", "{run}", "--out", "{tmp}/u.parquet", "--levels", "Tract"], "uncertainty persons Block (pass 2)",
     "tasks"),
    pytest.param(["evaluate", "{run}", "--truth", "{truth}", "--out", "{tmp}/ev"], "write the evaluation", "steps",
                 marks=SLOW),
    pytest.param(["replicates", "{run}", "--n", "1", "--out", "{tmp}/rep"], "replicates", "replicates", marks=SLOW),
    pytest.param(["audit", "demo", "--input", "{truth}", "--move", "440070001023003:440070001011006", "--runs", "2",
                  "--out", "{tmp}/audit"], "audit runs", "batches", marks=SLOW),
], ids=["ingest", "ingest-pl94", "uncertainty", "evaluate", "replicates", "audit"])
def test_long_commands_show_their_bars(argv, bar, unit, tmp_path, demo_run, demo_input, dask_client, monkeypatch,
                                       capsys):
    import topdown.pipeline.execution.runner as runner

    monkeypatch.setattr(runner, "dask_client", lambda *a, **k: _shared(dask_client))
    (tmp_path / "quiet").mkdir()
    assert main([a.format(tmp=tmp_path, run=demo_run, truth=demo_input) for a in argv]) == 0
    bars = _bars(capsys.readouterr().err)
    assert bar in bars and bars[bar][0] == bars[bar][1] and bars[bar][2] == unit, bars
    assert main([a.format(tmp=tmp_path / "quiet", run=demo_run, truth=demo_input) for a in argv] + ["--quiet"]) == 0
    assert _bars(capsys.readouterr().err) == {}


class _shared:
    """The session's client in place of an embedded cluster (a context manager, as runner.dask_client)."""

    def __init__(self, client) -> None:
        self.client = client

    def __enter__(self):
        return self.client

    def __exit__(self, *exc) -> None:
        return None
