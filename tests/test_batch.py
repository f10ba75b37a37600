"""``topdown batch``: jobs on one cluster, skipped when done, a failing job isolated, one batch at a time;
input hashes in every manifest and checked by ``--resume``.

The batch connects to the session's cluster (``scheduler`` in the jobs file) instead of starting one.
"""
from __future__ import annotations

import io
import json
from pathlib import Path
from unittest import mock

import pytest

from rel_inputs import leaked_secrets
from topdown.pipeline.execution import batch
from topdown.pipeline.execution.batch import Batch, Job, expected, load_jobs, plan
from topdown.pipeline.execution.cluster import credential_flags
from topdown.pipeline.runtime.progress import Reporter, reporting
from topdown.pipeline.cli import EXIT_CONFIG, EXIT_RUNDIR, main
from topdown.pipeline.configuration.config import ConfigError
from topdown.pipeline.runtime.outdir import claimed, new_marker
from topdown.pipeline.runtime.rundir import RunDir, RunDirError, sha256_file
from topdown.pipeline.execution.runner import configure_run, run


def _jobs(tmp_path: Path, client, source: Path, chained: bool) -> Path:
    """A jobs file on the session's TLS cluster: its credentials written for the jobs as a user would keep them."""
    tls = dict(zip(*[iter(credential_flags(client.security, tmp_path / "tls"))] * 2))
    (tmp_path / "bad.toml").write_text('[run]\nseed = 99\n')
    path = tmp_path / "jobs.toml"
    path.write_text(f"""
[batch]
scheduler = "{client.scheduler.address}"
tls_ca_file = "{tls['--tls-ca-file']}"
tls_cert = "{tls['--tls-cert']}"
tls_key = "{tls['--tls-key']}"
concurrent = 2

[[job]]
name = "again"
kind = "reprocess"
input = "{source}"
out = "out/again"

[[job]]
name = "broken"
kind = "reprocess"
input = "{source}"
config = "bad.toml"
out = "out/broken"
""" + ("""
[[job]]
name = "chained"
kind = "reprocess"
input = "out/again"
out = "out/chained"
verify = false
""" if chained else ""))
    return path


def _first_batch(tmp_path: Path, jobs: Path) -> dict:
    bars, n = io.StringIO(), len(load_jobs(jobs).job)
    with reporting(Reporter(file=bars)), mock.patch.object(batch, "TICK", 0.5):
        assert Batch(jobs).run() == EXIT_CONFIG  # the first failed job's exit code
    # a bar of the jobs finished, naming the running ones with their time so far
    assert "batch: 100%" in bars.getvalue() and f"{n}/{n} jobs" in bars.getvalue() and "again 0m0" in bars.getvalue()
    summary = json.loads((tmp_path / "jobs.summary.json").read_text())
    by_name = {r["name"]: r for r in summary["jobs"]}
    assert summary["status"] == "failed" and summary["exit_code"] == EXIT_CONFIG
    assert by_name["again"]["status"] == "complete" and by_name["again"]["exit_code"] == 0
    assert by_name["broken"]["status"] == "failed" and by_name["broken"]["exit_code"] == EXIT_CONFIG
    assert "run.seed changes what was measured" in by_name["broken"]["message"]
    assert "verify: OK" in (tmp_path / "jobs.logs" / "again.log").read_text()
    for r in summary["jobs"]:
        assert r["wall_seconds"] >= 0 and r["cpu_seconds"] >= 0 and r["action"] == "run"
    # a job's CPU: its processes' and the cluster workers' while it ran (a reprocessing's solves run there)
    again = by_name["again"]
    assert again["driver_cpu_seconds"] > 0 and again["workers_cpu_seconds"] > 0
    assert again["cpu_seconds"] == pytest.approx(again["driver_cpu_seconds"] + again["workers_cpu_seconds"], abs=0.01)
    assert summary["cluster"]["workers"] == 2 and summary["cluster"]["cpu_seconds"] >= again["workers_cpu_seconds"] > 0
    return by_name


@pytest.mark.slow
def test_a_job_waits_for_the_job_whose_output_it_reads(tmp_path, demo_run, dask_client):
    by_name = _first_batch(tmp_path, _jobs(tmp_path, dask_client, demo_run, chained=True))
    assert by_name["chained"]["status"] == "complete"
    assert json.loads((tmp_path / "out" / "chained" / "manifest.json").read_text())["status"] == "complete"


def test_batch_runs_skips_isolates_a_failure_and_refuses_a_second_batch(tmp_path, planted_run, dask_client,
                                                                           capsys):
    jobs = _jobs(tmp_path, dask_client, planted_run, chained=False)
    _first_batch(tmp_path, jobs)
    # Nothing the batch or the reprocessing wrote beside the protected outputs shows a planted true count.
    texts = [(tmp_path / "jobs.summary.json").read_text(), *(f.read_text() for f in (tmp_path / "jobs.logs").iterdir())]
    texts += [(tmp_path / "out" / "again" / name).read_text() for name in ("manifest.json", "certificate.json")]
    assert leaked_secrets("\n".join(texts)) == []
    # Again: the complete job is skipped (same configuration and input hashes); the broken one fails again.
    assert Batch(jobs).run() == EXIT_CONFIG
    summary = json.loads((tmp_path / "jobs.summary.json").read_text())
    assert [(r["name"], r["status"]) for r in summary["jobs"]] == [("again", "skipped"), ("broken", "failed")]

    # A second batch over the same jobs while one holds its lock: exit code 4 at once, nothing touched.
    before = (tmp_path / "jobs.summary.json").read_bytes()
    with claimed(tmp_path / "jobs.logs", "batch"):  # the batch's logs, held as every command holds its output
        assert main(["batch", str(jobs)]) == EXIT_RUNDIR
    assert "another batch over these jobs is running" in capsys.readouterr().err
    assert (tmp_path / "jobs.summary.json").read_bytes() == before


def test_plan_skips_resumes_and_protects_a_release(tmp_path, demo_input):
    job = Job(name="r", kind="run", config="demo", input=str(demo_input), out="out")
    assert plan(job, tmp_path) == ("run", [])  # nothing there yet
    digest, hashes = expected(job, tmp_path)
    assert hashes == {n: sha256_file(demo_input / n) for n in ("persons.parquet", "units.parquet")}
    rd = RunDir(tmp_path / "out")
    rd.prepare()
    rd.write_manifest({"status": "complete", "config_hash": digest, "input_sha256": hashes})
    assert plan(job, tmp_path) == ("skip", [])
    rd.write_manifest({"status": "complete", "config_hash": digest, "input_sha256": {**hashes, "units.parquet": "0"}})
    assert plan(job, tmp_path) == ("refuse", [])  # new input, new noise: only with force = true
    assert plan(job.model_copy(update={"force": True}), tmp_path) == ("force", ["--force"])
    rd.write_manifest({"status": "running", "config_hash": digest, "input_sha256": hashes})
    assert plan(job, tmp_path) == ("resume", ["--resume"])


def test_a_command_line_run_is_the_batch_jobs_run_however_the_input_is_spelled(tmp_path, demo_input, monkeypatch):
    """The documented steps then their batch: `topdown run --input ri2010-input` (relative, from the shell) and a job
    whose input is resolved against the jobs file (absolute), or reached through a link, are the same
    configuration, so the batch skips the complete run instead of refusing it as another configuration."""
    import shutil

    work = tmp_path / "work"
    shutil.copytree(demo_input, work / "ri2010-input")
    (tmp_path / "link").symlink_to(work / "ri2010-input")
    monkeypatch.chdir(work)
    typed = configure_run("demo", "ri2010-input")
    job = Job(name="r", kind="run", config="demo", input="ri2010-input", out="out")
    digest, hashes = expected(job, work)
    assert typed.run.input == "ri2010-input" and digest == typed.digest()
    assert configure_run("demo", tmp_path / "link").digest() == digest
    assert configure_run("demo", (work / "ri2010-input").resolve()).digest() == digest
    rd = RunDir(work / "out")
    rd.prepare()
    rd.write_manifest({"status": "complete", "config_hash": typed.digest(), "input_sha256": hashes})
    assert plan(job, work) == ("skip", [])
    assert configure_run("demo", "ri2010-input", seed=7).digest() != digest  # what configures the run still counts


def test_every_run_records_its_input_hashes_and_resume_checks_them(tmp_path, demo_run, demo_input):
    manifest = json.loads((demo_run / "manifest.json").read_text())
    assert manifest["input_sha256"] == {n: sha256_file(demo_input / n) for n in ("persons.parquet", "units.parquet")}
    config = configure_run("demo", demo_input)
    rd = RunDir(tmp_path / "interrupted")
    rd.prepare()
    rd.write_manifest({**new_marker("run"), "status": "running", "config_hash": config.digest(),
                       "input_sha256": {**manifest["input_sha256"], "persons.parquet": "0" * 64}})
    with pytest.raises(RunDirError, match=r"different input files \(persons.parquet changed\)"):
        run(config, rd.root, resume=True)


def test_jobs_file_errors_name_the_file_and_key(tmp_path, capsys):
    path = tmp_path / "jobs.toml"
    path.write_text('[[job]]\nname = "a"\nkind = "rerun"\nout = "x"\n')
    with pytest.raises(ConfigError, match=r"job\.0\.kind"):
        load_jobs(path)
    path.write_text('[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\nout = "x"\n'
                    '[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\nout = "y"\n')
    assert main(["batch", str(path)]) == EXIT_CONFIG
    assert "two jobs have the same name 'a'" in capsys.readouterr().err


def test_a_second_batch_waits_for_the_lock_then_gives_up(tmp_path):
    path = tmp_path / "jobs.toml"
    path.write_text('[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\nout = "x"\n')
    with claimed(tmp_path / "jobs.logs", "batch"):
        with pytest.raises(RunDirError, match="another batch over these jobs is running"):
            Batch(path).run(wait=0.3)
    assert not (tmp_path / "jobs.summary.json").exists() and not (tmp_path / "x").exists()
