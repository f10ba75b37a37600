"""Reaching a Dask scheduler (cluster.py): a bad --scheduler address or missing TLS credentials is a usage
error found before anything is written, and a run through a TLS scheduler with --tls-* files works.
(The embedded cluster's TLS is tested in test_confidentiality.py.)"""
from __future__ import annotations

from pathlib import Path

import dask
import pytest
from distributed import LocalCluster, Security

from rel_inputs import differing_outputs
from topdown.pipeline.cli import EXIT_CONFIG, EXIT_OK, main
from topdown.pipeline.execution.cluster import check_scheduler
from topdown.pipeline.configuration.config import ConfigError


def _write_credentials(folder: Path, security: Security) -> dict[str, str]:
    """The PEM texts of in-memory credentials as files, by CLI flag."""
    folder.mkdir(parents=True, exist_ok=True)
    files = {"--tls-ca-file": security.tls_ca_file, "--tls-cert": security.tls_client_cert,
             "--tls-key": security.tls_client_key}
    for flag, pem in files.items():
        (folder / f"{flag[2:]}.pem").write_text(pem)
    return {flag: str(folder / f"{flag[2:]}.pem") for flag in files}


def _flags(files: dict[str, str]) -> list[str]:
    return [item for pair in files.items() for item in pair]


@pytest.fixture
def pem_files(tmp_path) -> dict[str, str]:
    return _write_credentials(tmp_path / "creds", Security.temporary())


BAD_SCHEDULERS = [
    (["--scheduler", "foo://127.0.0.1:8786"], "unknown address scheme 'foo'"),
    (["--scheduler", "inproc://127.0.0.1/1/1"], "unknown address scheme 'inproc'"),
    (["--scheduler", "tcp://"], "no host:port after the scheme"),
    (["--scheduler", "tls://127.0.0.1:8786"], "needs the cluster's CA certificate and a client certificate"),
    (["--scheduler", "tls://127.0.0.1:8786", "--tls-ca-file", "{tmp}/missing.pem"], "missing.pem: file not found"),
    (["--scheduler", "tcp://127.0.0.1:8786", "{creds}"], "TLS credentials were given for a plain tcp:// address"),
    (["{creds}"], "for a --scheduler tls:// address"),
]


@pytest.mark.parametrize("args,words", BAD_SCHEDULERS, ids=[" ".join(a[:2]) for a, _ in BAD_SCHEDULERS])
def test_bad_scheduler_is_a_usage_error_and_writes_nothing(tmp_path, planted, pem_files, capsys, args, words):
    out = tmp_path / "run"
    config = tmp_path / "production.toml"  # production: no test-mode warning beside the one-line error
    config.write_text('include = "demo.toml"\n\n[run]\nmode = "production"\n')
    expanded = [x for a in args for x in (_flags(pem_files) if a == "{creds}" else [a.format(tmp=tmp_path)])]
    code = main(["run", str(config), "--out", str(out), "--input", str(planted), "--quiet", *expanded])
    err = capsys.readouterr().err.strip()
    assert code == EXIT_CONFIG and words in err and len(err.splitlines()) == 1, err
    assert not out.exists()


def test_tls_credentials_from_the_dask_configuration(pem_files):
    config = {"distributed.comm.tls.ca-file": pem_files["--tls-ca-file"],
              "distributed.comm.tls.client.cert": pem_files["--tls-cert"],
              "distributed.comm.tls.client.key": pem_files["--tls-key"]}
    with dask.config.set(config):
        security = check_scheduler("tls://127.0.0.1:8786")
    assert security.tls_ca_file == pem_files["--tls-ca-file"] and security.tls_client_key == pem_files["--tls-key"]
    with pytest.raises(ConfigError, match="--tls-ca-file"):
        check_scheduler("tls://127.0.0.1:8786")


def test_cli_run_through_a_tls_scheduler(tmp_path, planted, planted_run, capsys):
    """A scheduler and worker that accept only their CA's certificates: the run with the --tls-* files
    equals the reference run; credentials of another CA are refused (exit 2, nothing written)."""
    security = Security.temporary()
    files = _write_credentials(tmp_path / "creds", security)
    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, host="127.0.0.1",
                      dashboard_address="127.0.0.1:0", security=security) as cluster:
        address = cluster.scheduler_address
        assert address.startswith("tls://")
        base = ["run", "demo", "--input", str(planted), "--quiet", "--scheduler", address]
        assert main([*base, "--out", str(tmp_path / "run"), *_flags(files)]) == EXIT_OK
        stranger = _write_credentials(tmp_path / "stranger", Security.temporary())
        with dask.config.set({"distributed.comm.timeouts.connect": "3s"}):  # the refusal waits this long
            assert main([*base, "--out", str(tmp_path / "refused"), *_flags(stranger)]) == EXIT_CONFIG
    assert "cannot reach the Dask scheduler" in capsys.readouterr().err
    assert differing_outputs(planted_run, tmp_path / "run") == []
    assert not (tmp_path / "refused").exists()  # refused before it started: no --out folder left behind


def test_embedded_workers_sample_no_profile_unless_the_dashboard_is_on():
    """Without the dashboard nothing shows a profile: the workers do not sample their task's stack every 10 ms
    (about 3.5 % of a busy worker's CPU); with ``--dashboard`` they do."""
    import dask

    from topdown.pipeline.execution.cluster import DASHBOARD_KEY
    from topdown.pipeline.execution.runner import dask_client

    def profiling(dask_worker):
        return "profile" in dask_worker.periodic_callbacks

    with dask_client(workers=1) as client:
        assert list(client.run(profiling).values()) == [False]
    with dask.config.set({DASHBOARD_KEY: True}), dask_client(workers=1) as client:
        assert list(client.run(profiling).values()) == [True]

