"""Inputs and run directories on object storage (pipeline/runtime/storage.py; docs/how-to/clusters.md
"Object storage").

A local S3-compatible server (moto's, on 127.0.0.1) stands in for S3; the client finds it through the standard
``AWS_ENDPOINT_URL`` and takes test credentials from the standard environment variables, which no output, log
line or error may contain. The runs are compared byte for byte with the pinned outputs of the demo run
(tests/test_output_hashes.py): a run through ``s3://`` writes the same bytes as one on local disk.
"""
from __future__ import annotations

import io
import json
import logging
import os
import pickle
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from contextlib import redirect_stderr
from pathlib import Path

import pytest
from conftest import end_process_groups

from topdown.pipeline.configuration.config import ConfigError
from topdown.pipeline.runtime import storage
from topdown.pipeline.runtime.outdir import claimed
from topdown.pipeline.runtime.rundir import Locked, RunDir, RunDirError, held
from topdown.pipeline.runtime.storage import MissingExtra, StorePath, location
from test_output_hashes import PINNED, output_hashes

#: The test credentials: no file, log line or message may hold them.
KEY_ID, SECRET = "AKIATOPDOWNTESTKEY42", "topdown/Test+Secret/Access0Key0Never0Written"


@pytest.fixture(scope="module")
def s3_server():
    """A moto S3 server on 127.0.0.1, a process of its own (requests are not served under this process's GIL, which
    the in-process clusters' workers hold), and the standard environment that points every client at it."""
    pytest.importorskip("s3fs")
    pytest.importorskip("moto.server")
    port = _free_port()
    server = subprocess.Popen([sys.executable, "-m", "moto.server", "-H", "127.0.0.1", "-p", str(port)],
                              stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
    env = {"AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}", "AWS_ACCESS_KEY_ID": KEY_ID, "AWS_SECRET_ACCESS_KEY": SECRET,
           "AWS_DEFAULT_REGION": "us-east-1"}
    saved = {k: os.environ.get(k) for k in env}
    os.environ.update(env)
    storage.filesystem.cache_clear()
    try:
        _wait_for_port(port, server)
        yield env
    finally:
        end_process_groups([server])
        for k, v in saved.items():
            os.environ.pop(k, None) if v is None else os.environ.__setitem__(k, v)
        storage.filesystem.cache_clear()


def _free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _wait_for_port(port: int, proc: subprocess.Popen, timeout: float = 60) -> None:
    """Until a server listens on 127.0.0.1:``port`` (``proc``, which must not exit meanwhile)."""
    import socket

    end = time.monotonic() + timeout
    while True:
        assert proc.poll() is None, f"the server exited with {proc.returncode}"
        with socket.socket() as s:
            if s.connect_ex(("127.0.0.1", port)) == 0:
                return
        assert time.monotonic() < end, "the server did not start"
        time.sleep(0.1)


@pytest.fixture
def bucket(s3_server) -> str:
    """A new empty bucket's URL."""
    name = f"topdown-{uuid.uuid4().hex[:12]}"
    storage.filesystem("s3").mkdir(name)
    return f"s3://{name}"


@pytest.fixture(scope="module")
def s3_client(s3_server):
    """One in-process cluster of two workers for the module, at a TCP address (a batch's jobs join it), its
    workers reading the test credentials from this process's environment."""
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=False, protocol="tcp", host="127.0.0.1",
                      dashboard_address=None) as cluster, Client(cluster) as client:
        yield client


def assert_pinned(run: str) -> None:
    """The run's outputs are the pinned demo run's, byte for byte (as tests/test_output_hashes.py reads them:
    config.json and the manifest without the input's location)."""
    found = output_hashes(location(run))
    assert sorted(found) == sorted(PINNED), sorted(set(found) ^ set(PINNED))
    changed = [k for k in PINNED if found[k] != PINNED[k]]
    assert not changed, changed


def no_credentials(*texts: str) -> None:
    for text in texts:
        assert KEY_ID not in text and SECRET not in text


# ------------------------------------------------------------------------------------------- no server


def test_location_keeps_local_paths_and_names_store_objects():
    assert location("runs/demo") == Path("runs/demo") and type(location("runs/demo")) is type(Path("x"))
    assert location("file:///tmp/run") == Path("/tmp/run")
    p = Path("x")
    assert location(p) is p
    pytest.importorskip("s3fs")
    run = location("s3://bucket/prefix/run/")
    assert isinstance(run, StorePath) and str(run) == "s3://bucket/prefix/run"
    assert str(run / "histograms" / "level=US") == "s3://bucket/prefix/run/histograms/level=US"
    assert (run / "a/b.parquet").relative_to(run).as_posix() == "a/b.parquet"
    assert run.parent == location("s3://bucket/prefix") and run.name == "run"
    assert pickle.loads(pickle.dumps(run)) == run  # a worker gets the URL alone, never a credential
    assert KEY_ID not in repr(pickle.dumps(run))


def test_unknown_scheme_is_a_configuration_error():
    with pytest.raises(ConfigError, match="unknown storage scheme 'ftp'"):
        location("ftp://host/run")
    with pytest.raises(ConfigError, match="names a bucket"):
        location("s3://")


@pytest.mark.parametrize("url, extra", [("s3://bucket/run", "s3"), ("gs://bucket/run", "gcs"),
                                        ("abfs://container/run", "azure")])
def test_missing_extra_exits_2_naming_it(monkeypatch, url, extra):
    """The store's client not installed: one line naming the extra to install, exit 2, nothing started."""
    from topdown.pipeline import cli

    real = storage.importlib.import_module

    def without_clients(name, *args):
        if name in ("s3fs", "gcsfs", "adlfs"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(storage.importlib, "import_module", without_clients)
    storage.filesystem.cache_clear()
    try:
        with pytest.raises(MissingExtra, match=rf"\[{extra}\]"):
            location(url)
        err = io.StringIO()
        with redirect_stderr(err):
            code = cli.main(["verify", url])
    finally:
        storage.filesystem.cache_clear()
    lines = err.getvalue().strip().splitlines()
    assert code == 2 and len(lines) == 1, err.getvalue()
    assert f"pip install 'census-topdown[{extra}]'" in lines[0] and url.split(":")[0] in lines[0]


def test_url_refused_by_a_command_that_writes_locally_only(tmp_path, capsys, monkeypatch):
    from topdown.pipeline import cli

    monkeypatch.chdir(tmp_path)
    assert cli.main(["synth", "--blocks", "10", "--seed", "1", "s3://bucket/synth"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "takes a local path there, not a storage URL" in err[0]
    assert list(tmp_path.iterdir()) == []  # no local folder named like the URL


# ------------------------------------------------------------------------------------------- S3 server


def test_lock_is_a_conditional_create(bucket):
    """One writer: the lock is created only if absent (If-None-Match); a live holder refuses the second writer,
    a dead process's lock of this host is taken over, and the lock is gone after the run."""
    run = RunDir(f"{bucket}/run")
    lock = run.root / ".lock"
    with run.lock():
        assert "pid" in lock.read_text()
        with pytest.raises(Locked, match="locked by another run"):
            with held(lock, run.root, "run"):
                pass
    assert not lock.exists()
    dead = subprocess.run([sys.executable, "-c", "import os; print(os.getpid())"], capture_output=True, text=True)
    lock.write_text(f"pid {dead.stdout.strip()} on {os.uname().nodename} since 2026-01-01T00:00:00")
    with run.lock():
        assert f"pid {os.getpid()}" in lock.read_text()
    lock.write_text("pid 1 on another-host since 2026-01-01T00:00:00")
    with pytest.raises(Locked, match="another-host"):
        with run.lock():
            pass


def test_store_without_conditional_create_is_refused(bucket, monkeypatch):
    def cannot(self, data):
        raise NotImplementedError(f"{self}: the store cannot create an object only if absent")

    monkeypatch.setattr(StorePath, "create", cannot)
    with pytest.raises(RunDirError) as info:
        with RunDir(f"{bucket}/run").lock():
            pass
    assert "lock cannot be held" in str(info.value) and "\n" not in str(info.value)
    assert not location(f"{bucket}/run").exists()


def test_a_folder_is_written_in_place_on_a_store(bucket, tmp_path):
    """A store has no rename: a folder is written where it belongs, not staged and copied; what an earlier version
    left there is removed first, but for the parts kept (an interrupted level's verified ones), and the commit
    leaves it in place. On local disk the staging twin is written and renamed into place, as before."""
    run = RunDir(f"{bucket}/run")
    level = run.histograms("persons", "US")
    assert run.staging(level) == level
    for name in ("part-00000.parquet", "part-00001.parquet", "sub/stale.parquet"):
        (level / name).write_bytes(b"x")
    run.clear_place(level, keep=["part-00001.parquet"])
    assert [p.relative_to(level).as_posix() for p in level.rglob("*")] == ["part-00001.parquet"]
    run.commit(level)
    assert [p.name for p in level.rglob("*")] == ["part-00001.parquet"]
    assert objects(f"{bucket}/run") == ["histograms/persons/level=US/part-00001.parquet"]
    local = RunDir(tmp_path / "run")
    final = local.histograms("persons", "US")
    assert local.staging(final) == tmp_path / "run" / ".staging" / "histograms" / "persons" / "level=US"
    local.staging(final).mkdir(parents=True)
    (local.staging(final) / "part-00000.parquet").write_bytes(b"x")
    local.clear_place(final)
    local.commit(final)
    assert [p.name for p in final.iterdir()] == ["part-00000.parquet"]


def test_demo_through_s3_is_byte_identical_and_leaks_no_credential(bucket, s3_client, caplog):
    """The smoke test: demo input written to the bucket, the demo run from and to ``s3://`` on an in-process
    cluster, verified; its outputs are the pinned local run's bytes, every object was written with server-side
    encryption requested, and no object, log line or error holds the credentials."""
    from topdown.pipeline import load_config, run
    from topdown.pipeline.inputs.demo_data import write_demo_input
    from topdown.pipeline.outputs.verify import verify_run

    caplog.set_level(logging.DEBUG)
    write_demo_input(f"{bucket}/in")
    out = run(load_config("demo"), f"{bucket}/run", input_dir=f"{bucket}/in", client=s3_client)
    assert str(out) == f"{bucket}/run"
    assert verify_run(out).ok
    assert_pinned(f"{bucket}/run")
    fs = storage.filesystem("s3")
    objects = fs.find(bucket.removeprefix("s3://"))
    assert any(o.endswith("in/persons.parquet") for o in objects) and not any(".staging" in o for o in objects)
    for key in objects:  # the confidential input included
        b, _, k = key.partition("/")
        assert fs.call_s3("head_object", Bucket=b, Key=k).get("ServerSideEncryption") == "AES256", key
    with pytest.raises(RunDirError) as missing:
        verify_run(f"{bucket}/no-such-run")
    no_credentials(caplog.text, str(missing.value), *(fs.cat_file(o).decode("latin-1") for o in objects))


# ------------------------------------------------------------------------------------------- no shared disk


def assert_verified(run: str, capsys) -> None:
    """`topdown verify` of ``run``, in this process: exit 0 and its OK line."""
    from topdown.pipeline import cli

    capsys.readouterr()
    code = cli.main(["verify", run])
    out = capsys.readouterr().out
    assert code == 0 and "verify: OK" in out, out


def _topdown(*args: str, env: dict, cwd: Path, **kwargs) -> subprocess.Popen:
    return subprocess.Popen([sys.executable, "-m", "topdown.pipeline.cli", *args], env=env, cwd=cwd,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, start_new_session=True,
                            **kwargs)


def _completed(run: str) -> int:
    """Levels the run's manifest records as complete (0: none yet, or no manifest)."""
    manifest = location(run) / "manifest.json"
    try:
        data = json.loads(manifest.read_text())
    except (OSError, ValueError):
        return 0
    return sum(len(v) for v in data.get("completed", {}).values())


def _wait_for(predicate, proc: subprocess.Popen, timeout: float = 240) -> None:
    end = time.monotonic() + timeout
    while not predicate():
        assert proc.poll() is None, proc.stdout.read()
        assert time.monotonic() < end, "timed out"
        time.sleep(0.2)


def _kill(proc: subprocess.Popen) -> None:
    os.killpg(proc.pid, signal.SIGKILL)
    proc.wait()


@pytest.mark.slow
def test_workers_that_share_no_disk(bucket, s3_server, tmp_path, monkeypatch, capsys):
    """A `dask scheduler` process and two `dask worker` processes, each in its own working and temporary
    directory, and clients in another (this process, and the runs and the reprocessing, each a process of its
    own): the demo input, the run and everything read after it go through ``s3://`` alone. The first run is killed (SIGKILL) mid-way; `--resume` finishes it while one worker is killed; the
    outputs are the pinned demo run's bytes and `topdown verify` passes; `topdown nmf` and `topdown reprocess`
    read it from the bucket and write theirs there."""
    env = {**os.environ, **s3_server, "PYTHONUNBUFFERED": "1"}
    dask = str(Path(sys.executable).with_name("dask"))
    address = f"tcp://127.0.0.1:{_free_port()}"
    places = {name: tmp_path / name for name in ("scheduler", "w0", "w1", "client")}
    for place in places.values():
        (place / "tmp").mkdir(parents=True)
    procs: list[subprocess.Popen] = []
    try:
        procs.append(subprocess.Popen([dask, "scheduler", "--host", "127.0.0.1", "--port", address.rsplit(":", 1)[1],
                                       "--no-dashboard"], cwd=places["scheduler"], env=env, start_new_session=True,
                                      stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL))
        workers = [subprocess.Popen([dask, "worker", address, "--nthreads", "1", "--no-nanny", "--no-dashboard",
                                     "--name", name, "--local-directory", str(places[name] / "work")],
                                    cwd=places[name], env={**env, "TMPDIR": str(places[name] / "tmp")},
                                    start_new_session=True, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
                   for name in ("w0", "w1")]
        procs += workers
        from distributed import Client

        from topdown.pipeline import cli

        cwd = places["client"]  # this process, as a client that shares no disk either, works there
        monkeypatch.chdir(cwd)
        monkeypatch.setattr(tempfile, "tempdir", str(cwd / "tmp"))
        assert cli.main(["demo-data", f"{bucket}/in"]) == 0  # while the cluster starts
        with Client(address, timeout=60) as client:
            client.wait_for_workers(2, timeout=120)
        run_args = ("run", "demo", "--input", f"{bucket}/in", "--out", f"{bucket}/run", "--scheduler", address)

        first = _topdown(*run_args, env=env, cwd=cwd)
        procs.append(first)
        _wait_for(lambda: _completed(f"{bucket}/run") >= 3, first)
        _kill(first)  # its lock stays behind, held by a process that no longer exists

        resumed = _topdown(*run_args, "--resume", env=env, cwd=cwd)
        procs.append(resumed)
        _wait_for(lambda: _completed(f"{bucket}/run") >= 5, resumed)
        _kill(workers[1])
        out, _ = resumed.communicate(timeout=300)
        assert resumed.returncode == 0, out
        assert "took over the stale lock" in out
        no_credentials(out)

        # a reprocessing on the cluster, a process of its own, while this process verifies the run and writes its NMF
        again = _topdown("reprocess", f"{bucket}/run", "--out", f"{bucket}/reprocessed", "--scheduler", address,
                         env=env, cwd=cwd)
        procs.append(again)
        assert_verified(f"{bucket}/run", capsys)
        assert_pinned(f"{bucket}/run")
        assert cli.main(["nmf", f"{bucket}/run", "--out", f"{bucket}/nmf"]) == 0, capsys.readouterr()
        assert location(f"{bucket}/nmf/nmf.json").is_file()
        out, _ = again.communicate(timeout=300)
        assert again.returncode == 0, out
        assert_verified(f"{bucket}/reprocessed", capsys)
        for place in places.values():  # nothing of the run on any process's disk
            assert not any(p.suffix == ".parquet" or p.name == "manifest.json" for p in place.rglob("*"))
    finally:
        end_process_groups(procs)


def test_confidential_output_refused_in_a_public_bucket(bucket):
    """A bucket whose ACL lets everyone read is refused for the input and for a run (its staging holds
    confidential chunks), before anything is written."""
    from topdown.pipeline.inputs.demo_data import write_demo_input

    fs = storage.filesystem("s3")
    fs.call_s3("put_bucket_acl", Bucket=bucket.removeprefix("s3://"), ACL="public-read")
    with pytest.raises(RunDirError, match="grants READ to everyone; nothing was written"):
        write_demo_input(f"{bucket}/in")
    with pytest.raises(RunDirError, match="a run's staging"):
        with claimed(f"{bucket}/run", "run"):
            pass
    assert fs.find(bucket.removeprefix("s3://")) == []


# ------------------------------------------------------------------------------- post-processing commands
#
# One bucket for the module: the planted input (rel_inputs.py) in it and on disk, and the demo configuration run
# on it once through s3:// and once on disk, on the module's in-process cluster (``s3_client``).


@pytest.fixture(scope="module")
def shared(s3_server, s3_client, tmp_path_factory):
    from types import SimpleNamespace

    from rel_inputs import write_planted_input
    from topdown.pipeline import load_config, run

    name = f"topdown-{uuid.uuid4().hex[:12]}"
    storage.filesystem("s3").mkdir(name)
    url, disk = f"s3://{name}", tmp_path_factory.mktemp("shared")
    planted = write_planted_input(disk / "in")
    storage.copy_files(planted, location(f"{url}/in"))
    run(load_config("demo"), disk / "planted", input_dir=planted, client=s3_client)
    run(load_config("demo"), f"{url}/planted", input_dir=f"{url}/in", client=s3_client)
    return SimpleNamespace(url=url, disk=disk, input=planted, run=disk / "planted", s3run=f"{url}/planted")


def objects(url: str) -> list[str]:
    """The keys below ``url``, relative to it."""
    prefix = location(url)
    return sorted(k.removeprefix(prefix.key + "/") for k in prefix.fs.find(prefix.key))


def written(url: str, into: Path) -> Path:
    """A local copy of every object below ``url`` (what a command wrote there), each checked to have been
    written with server-side encryption requested and to hold no credential."""
    fs, prefix = storage.filesystem("s3"), location(url)
    for key in fs.find(prefix.key):
        b, _, k = key.partition("/")
        assert fs.call_s3("head_object", Bucket=b, Key=k).get("ServerSideEncryption") == "AES256", key
        target = into / key.removeprefix(prefix.key + "/")
        target.parent.mkdir(parents=True, exist_ok=True)
        target.write_bytes(fs.cat_file(key))
        no_credentials(target.read_bytes().decode("latin-1"))
    return into


def same_files(a: Path, b: Path, but: tuple[str, ...] = ()) -> None:
    """The folders hold the same files with the same bytes (``but``: names compared for presence only)."""
    files = {p.relative_to(a).as_posix() for p in a.rglob("*") if p.is_file()}
    assert files == {p.relative_to(b).as_posix() for p in b.rglob("*") if p.is_file()}
    changed = [f for f in sorted(files) if f not in but and (a / f).read_bytes() != (b / f).read_bytes()]
    assert not changed, changed


def test_a_run_from_and_to_s3_is_the_run_on_disk(shared):
    assert output_hashes(location(shared.s3run)) == output_hashes(shared.run)


def test_uncertainty_through_s3(shared, s3_client, tmp_path):
    """From a run in the bucket into it: the table on disk's rows and schema, one object (the marker inside; no
    parts, no lock left), nothing but noisy-measurement figures in it."""
    from rel_inputs import SECRETS, scan_run_dir
    from topdown.pipeline.evaluation.uncertainty import uncertainty
    from topdown.pipeline.runtime.outdir import read_marker

    before = objects(shared.url)
    uncertainty(shared.run, tmp_path / "u.parquet", client=s3_client)
    uncertainty(shared.s3run, f"{shared.url}/u.parquet", client=s3_client)
    assert sorted(set(objects(shared.url)) - set(before)) == ["u.parquet"]
    got, want = (storage.read_table(p) for p in (f"{shared.url}/u.parquet", tmp_path / "u.parquet"))
    assert got.replace_schema_metadata(None).equals(want.replace_schema_metadata(None))
    assert read_marker(location(f"{shared.url}/u.parquet"))["command"] == "uncertainty"
    copy = tmp_path / "copy"
    (copy / "u").mkdir(parents=True)
    (copy / "u" / "u.parquet").write_bytes(location(f"{shared.url}/u.parquet").read_bytes())
    numbers = [f.name for f in got.schema if pa_numeric(f.type)]  # estimates from the noisy measurements alone
    findings, scanned = scan_run_dir(copy, SECRETS, checked={"u/u.parquet": numbers})
    assert scanned and not findings, findings


def pa_numeric(kind) -> bool:
    import pyarrow as pa

    return pa.types.is_integer(kind) or pa.types.is_floating(kind)


def test_evaluate_through_s3(shared, s3_client, tmp_path):
    """The run and the truth read from the bucket, the evaluation written there: the files on disk, byte for byte
    (the marker's id aside), each written with the store's private settings, the spill of true counts gone."""
    from topdown.pipeline.evaluation.evaluate import EvalOptions, evaluate

    opts = EvalOptions(sampling_rates=(0.5,), figures=False)
    evaluate([shared.run], shared.input, out=tmp_path / "eval", client=s3_client, options=opts)
    out = evaluate([shared.s3run], f"{shared.url}/in", out=f"{shared.url}/eval", client=s3_client, options=opts)
    assert str(out) == f"{shared.url}/eval"
    copy = written(f"{shared.url}/eval", tmp_path / "copy")
    assert not any(".groups-tmp" in k or k.endswith(".lock") for k in objects(f"{shared.url}/eval"))
    same_files(copy, tmp_path / "eval", but=(".topdown-output.json",))


@pytest.mark.slow
def test_replicates_and_their_intervals_through_s3(shared, s3_client, tmp_path):
    """Replicates of the run in the bucket, into it: each replicate the one on disk, byte for byte, listed by
    replicates.json once complete; the uncertainty with their ``amc`` rows the same as on disk; nothing written
    holds a planted count outside the protected outputs."""
    from rel_inputs import SECRETS, scan_run_dir
    from topdown.pipeline.evaluation.replicates import replicates
    from topdown.pipeline.evaluation.uncertainty import uncertainty

    record = replicates(shared.s3run, 2, f"{shared.url}/reps", client=s3_client)
    replicates(shared.run, 2, tmp_path / "reps", client=s3_client)
    assert [r["dir"] for r in record["replicates"]] == ["rep-000", "rep-001"]
    for rep in ("rep-000", "rep-001"):
        assert output_hashes(location(f"{shared.url}/reps/{rep}")) == output_hashes(tmp_path / "reps" / rep)
    same_files(written(f"{shared.url}/reps/input", tmp_path / "input"), tmp_path / "reps" / "input")
    for rep in ("rep-000", "rep-001"):
        findings, _ = scan_run_dir(written(f"{shared.url}/reps/{rep}", tmp_path / rep), SECRETS)
        assert not findings, findings
    uncertainty(shared.run, tmp_path / "amc.parquet", replicates=tmp_path / "reps", client=s3_client)
    uncertainty(shared.s3run, f"{shared.url}/amc.parquet", replicates=f"{shared.url}/reps", client=s3_client)
    got, want = (storage.read_table(p) for p in (f"{shared.url}/amc.parquet", tmp_path / "amc.parquet"))
    assert set(got.column("method").to_pylist()) == {"gls", "amc"}
    assert got.replace_schema_metadata(None).equals(want.replace_schema_metadata(None))


@pytest.mark.slow
def test_batch_jobs_read_and_write_s3(shared, s3_client, tmp_path):
    """A batch whose jobs read and write the bucket: a reprocessing of the run there, and one of its output (which
    waits for it); a second batch skips both; the first job's output is the one on disk."""
    from topdown.pipeline.execution.batch import Batch
    from topdown.pipeline.execution.reprocess import reprocess

    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f"""[batch]
scheduler = "{s3_client.scheduler.address}"

[[job]]
name = "again"
kind = "reprocess"
input = "{shared.s3run}"
out = "{shared.url}/again"

[[job]]
name = "chained"
kind = "reprocess"
input = "{shared.url}/again"
out = "{shared.url}/chained"
verify = false
""")
    assert Batch(jobs).run() == 0
    summary = json.loads((tmp_path / "jobs.summary.json").read_text())
    assert [r["status"] for r in summary["jobs"]] == ["complete", "complete"], summary
    assert "verify: OK" in (tmp_path / "jobs.logs" / "again.log").read_text()
    reprocess(shared.run, tmp_path / "again", client=s3_client)
    got, want = output_hashes(location(f"{shared.url}/again")), output_hashes(tmp_path / "again")
    assert sorted(got) == sorted(want)
    assert {k for k in got if got[k] != want[k]} == {"certificate.json", "manifest.json"}  # they name what was read
    certificates = [json.loads(location(p).read_text()) for p in (f"{shared.url}/again/certificate.json",
                                                                   tmp_path / "again" / "certificate.json")]
    assert [c["reprocessing_of"].pop("run") for c in certificates] == [shared.s3run, str(shared.run)]
    assert certificates[0] == certificates[1]
    assert Batch(jobs).run() == 0
    summary = json.loads((tmp_path / "jobs.summary.json").read_text())
    assert [r["action"] for r in summary["jobs"]] == ["skip", "skip"]
    no_credentials(*(p.read_bytes().decode("latin-1") for p in tmp_path.rglob("*") if p.is_file()))


def test_batch_plans_jobs_whose_input_and_output_are_urls(shared, tmp_path):
    """A job's input and out taken as URLs, not as paths under the jobs file's folder: a run job whose output
    in the bucket is complete with the same configuration and input is skipped, and a job reading another's
    output waits for it."""
    from topdown.pipeline.execution.batch import Batch, Job, plan

    job = Job(name="planted", kind="run", config="demo", input=f"{shared.url}/in", out=shared.s3run)
    assert plan(job, tmp_path) == ("skip", [])
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f'[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\ninput = "{shared.url}/in"\n'
                    f'out = "{shared.url}/a"\n\n[[job]]\nname = "b"\nkind = "reprocess"\ninput = "{shared.url}/a"\n'
                    f'out = "{shared.url}/b"\n')
    batch = Batch(jobs)
    assert [r["out"] for r in batch.records] == [f"{shared.url}/a", f"{shared.url}/b"]
    assert batch._dependencies(1) == [0]


def _one_line(capsys, *args: str) -> tuple[int, str]:
    from topdown.pipeline import cli

    code = cli.main(list(args))
    err = [ln for ln in capsys.readouterr().err.strip().splitlines()
           if not ln.startswith("127.0.0.1 - - [")]  # the test server's own request log
    assert len(err) == 1, err
    no_credentials(err[0])
    return code, err[0]


@pytest.mark.smoke  # refusals in process, before any cluster or store is reached: in the default selection
@pytest.mark.parametrize("scheme, extra", [("gs", "gcs"), ("abfs", "azure")])
@pytest.mark.parametrize("command", ["uncertainty", "uncertainty --out", "evaluate", "evaluate --truth",
                                     "evaluate --out", "replicates", "replicates --out", "batch"])
def test_each_command_names_a_missing_extra(monkeypatch, tmp_path, capsys, command, scheme, extra):
    """A URL whose store's client is not installed, in each argument of each command that takes URLs: exit 2, one
    line naming the extra, nothing written."""
    real = storage.importlib.import_module

    def without(name, *args):
        if name in ("gcsfs", "adlfs"):
            raise ModuleNotFoundError(f"No module named {name!r}")
        return real(name, *args)

    monkeypatch.setattr(storage.importlib, "import_module", without)
    monkeypatch.chdir(tmp_path)
    storage.filesystem.cache_clear()
    url = f"{scheme}://bucket/x"
    (tmp_path / "run").mkdir()
    args = {"uncertainty": ["uncertainty", url, "--out", "u.parquet"],
            "uncertainty --out": ["uncertainty", "run", "--out", url],
            "evaluate": ["evaluate", url, "--truth", "run"], "evaluate --truth": ["evaluate", "run", "--truth", url],
            "evaluate --out": ["evaluate", "run", "--truth", "run", "--out", url],
            "replicates": ["replicates", url, "--out", "r"], "replicates --out": ["replicates", "run", "--out", url],
            "batch": ["batch", "jobs.toml"]}[command]
    (tmp_path / "jobs.toml").write_text(f'[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\nout = "{url}"\n')
    try:
        code, line = _one_line(capsys, *args)
    finally:
        storage.filesystem.cache_clear()
    assert code == 2 and f"pip install 'census-topdown[{extra}]'" in line and f"{scheme}://" in line, line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.toml", "run"]


def test_post_processing_refusals_on_a_store(shared, bucket, monkeypatch, capsys, tmp_path):
    """Where a guarantee cannot hold, one line and nothing written: the confidential evaluation into a bucket
    anyone can read (exit 4), an uncertainty table or replicates where the one-writer lock cannot be held (exit 4),
    a URL where a command or a batch job takes a local path (exit 2)."""
    fs = storage.filesystem("s3")
    fs.call_s3("put_bucket_acl", Bucket=bucket.removeprefix("s3://"), ACL="public-read")
    code, line = _one_line(capsys, "evaluate", shared.s3run, "--truth", f"{shared.url}/in", "--out", f"{bucket}/eval")
    assert code == 4 and "grants READ to everyone; nothing was written" in line and "evaluation" in line

    def cannot(self, data):
        raise NotImplementedError(f"{self}: the store cannot create an object only if absent")

    monkeypatch.setattr(StorePath, "create", cannot)
    code, line = _one_line(capsys, "uncertainty", shared.s3run, "--out", f"{bucket}/u.parquet")
    assert code == 4 and "lock cannot be held" in line
    code, line = _one_line(capsys, "replicates", shared.s3run, "--n", "2", "--out", f"{bucket}/reps")
    assert code == 4 and "lock cannot be held" in line
    assert fs.find(bucket.removeprefix("s3://")) == []
    code, line = _one_line(capsys, "uncertainty", shared.s3run, "--out", str(tmp_path / "u.parquet"),
                           "--entities", f"{bucket}/entities.csv")
    assert code == 2 and "takes a local path there" in line
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f'[[job]]\nname = "a"\nkind = "reprocess"\ninput = "{shared.s3run}"\nspine = "{bucket}/s.parquet"\n'
                    f'out = "{bucket}/a"\n')
    code, line = _one_line(capsys, "batch", str(jobs))
    assert code == 2 and "job 'a': spine" in line and "a local path" in line
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.toml"]
