"""Confidential files are their owner's alone (docs/reference/output-layout.md).

Every file and folder an ingest, an evaluation or an audit writes, a run's staging and a batch's credentials
are created private (0600 / 0700) even under a permissive umask; the embedded cluster serves no dashboard
unless asked, and then on 127.0.0.1 only.
"""
from __future__ import annotations

import os
import stat
from pathlib import Path

import pandas as pd
import pytest
from test_evaluate import OPTS, _write_run, _write_truth, RUN_A

from topdown.pipeline.runtime.outdir import MARKER
from topdown.pipeline.runtime.private_files import is_private, private_dir, private_file, seal


@pytest.fixture(autouse=True)
def open_umask():
    """Everything a test writes gets the most permissive usual umask (0644 files, 0755 folders)."""
    old = os.umask(0o022)
    yield
    os.umask(old)


def modes(root: Path) -> dict[str, str]:
    """Every path under ``root`` (itself included) with its permission bits, as octal text."""
    return {str(p.relative_to(root)): oct(stat.S_IMODE(os.lstat(p).st_mode)) for p in [root, *sorted(root.rglob("*"))]}


def assert_private(root: Path) -> None:
    found = modes(root)
    assert len(found) > 1, found
    want = {path: oct(0o700 if (root / path).is_dir() else 0o600) for path in found}
    assert found == want


def test_the_helpers_make_files_and_folders_private(tmp_path):
    d = private_dir(tmp_path / "a" / "b")
    f = private_file(d / "secret.txt")
    f.write_text("x")
    assert oct(stat.S_IMODE(d.stat().st_mode)) == "0o700" and oct(stat.S_IMODE(f.stat().st_mode)) == "0o600"
    (d / "sub").mkdir()
    (d / "sub" / "open.txt").write_text("y")
    assert not is_private(d / "sub" / "open.txt")  # the umask lets everybody read it ...
    seal(d)
    assert_private(d)  # ... until sealed
    existing = tmp_path / "open"
    existing.mkdir(mode=0o755)
    assert is_private(private_dir(existing))


def test_an_ingest_is_private(tmp_path):
    from topdown.pipeline.inputs.ingest import ingest_blocks
    from test_adversarial_silent import block_csv

    out = tmp_path / "cef"
    ingest_blocks(block_csv(tmp_path / "blocks.csv"), out)
    assert_private(out)
    assert sorted(p.name for p in out.iterdir()) == [MARKER, "persons.parquet", "units.parquet"]


def test_an_evaluation_is_private(tmp_path):
    from topdown.pipeline.evaluation.evaluate import evaluate

    truth = _write_truth(tmp_path / "input")
    run = _write_run(tmp_path / "run", RUN_A, 1)
    default = evaluate([run], truth, options=OPTS)
    assert default == run.with_name("run-evaluation-CONFIDENTIAL")
    assert_private(default)
    assert_private(evaluate([run], truth, out=tmp_path / "eval", options=OPTS))
    assert stat.S_IMODE((run / "histograms").stat().st_mode) == 0o755  # the run's published outputs: unchanged


def test_an_audit_is_private(tmp_path):
    from topdown.pipeline.evaluation.audit import AuditResult, write_audit

    table = pd.DataFrame({"level": ["US"], "geocode": ["US"], "query": ["total"], "epl_lower": [0.1]})
    out = write_audit(tmp_path / "audit", AuditResult(table, 1.0, 2), {"move": "a:b", "alpha": 0.05})
    assert_private(out)
    assert {p.name for p in out.iterdir()} == {"audit.parquet", "audit.json", "report.txt"}


def test_a_runs_staging_is_private_while_it_runs(tmp_path, dask_client, monkeypatch):
    """The staging folder is private from before the first chunk is written until the run removes it; the
    published outputs keep the umask."""
    import topdown.pipeline.execution.runner as runner
    from topdown.pipeline import load_config, run
    from topdown.pipeline.inputs.us_synth import write_synthetic

    seen = []
    estimate = runner.estimate_level

    def watched(dclient, rundir, *args, **kwargs):
        staging = rundir.root / ".staging"
        seen.append(modes(staging))
        result = estimate(dclient, rundir, *args, **kwargs)
        seen.append(modes(staging))
        return result

    monkeypatch.setattr(runner, "estimate_level", watched)
    write_synthetic(tmp_path / "input", blocks=12, seed=3)
    out = run(load_config("demo"), tmp_path / "run", input_dir=tmp_path / "input", client=dask_client)
    assert seen and all(m["."] == "0o700" for m in seen), seen
    assert any(len(m) > 1 for m in seen)  # chunk records and parts were there while it ran
    assert not (out / ".staging").exists()
    assert stat.S_IMODE((out / "histograms").stat().st_mode) == 0o755
    assert stat.S_IMODE((out / "manifest.json").stat().st_mode) == 0o644


def test_batch_credentials_are_private(tmp_path):
    from distributed import Security

    from topdown.pipeline.execution.cluster import credential_flags

    flags = credential_flags(Security.temporary(), tmp_path / "credentials")
    assert "--tls-cert" in flags
    assert_private(tmp_path / "credentials")


def _http_status(client) -> dict[int, int]:
    """The status of GET /status on the HTTP servers of the cluster's scheduler and workers, by port."""
    import urllib.error
    import urllib.request

    ports = [client.cluster.scheduler.http_server.port,
             *client.run(lambda dask_worker: dask_worker.http_server.port).values()]
    status = {}
    for port in ports:
        try:
            status[port] = urllib.request.urlopen(f"http://127.0.0.1:{port}/status", timeout=5).status
        except urllib.error.HTTPError as exc:
            status[port] = exc.code
    return status


def test_the_dashboard_is_off_unless_asked(capsys):
    """Off: the HTTP servers Dask starts anyway answer nothing (no dashboard, worker list or metrics page).
    On (--dashboard): served on 127.0.0.1, its address on stderr."""
    import dask

    from topdown.pipeline.execution.cluster import DASHBOARD_KEY
    from topdown.pipeline.execution.runner import dask_client

    with dask_client(workers=1) as client:
        status = _http_status(client)
        assert len(status) == 2 and set(status.values()) == {404}, status
    assert "dashboard" not in capsys.readouterr().err
    with dask.config.set({DASHBOARD_KEY: True}), dask_client(workers=1) as client:
        assert client.dashboard_link.startswith("http://127.0.0.1:")
        port = int(client.dashboard_link.split(":")[2].split("/")[0])
        assert _http_status(client)[port] == 200
    err = capsys.readouterr().err
    assert err.startswith("topdown: Dask dashboard at http://127.0.0.1:") and "127.0.0.1 only" in err


def test_every_cluster_command_has_the_dashboard_flag():
    from topdown.pipeline.cli import build_parser

    sub = build_parser()._subparsers._group_actions[0].choices
    with_cluster = sorted(name for name, p in sub.items() if any("--workers" in a.option_strings for a in p._actions))
    assert with_cluster == ["audit", "evaluate", "replicates", "reprocess", "run", "uncertainty"]
    for name in with_cluster:
        assert any("--dashboard" in a.option_strings for a in sub[name]._actions), name
