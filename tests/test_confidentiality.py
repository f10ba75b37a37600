"""Confidentiality in operation, and production mode.

* No log line (CLI at DEBUG, and the Python logging of an in-process run, worker logs forwarded) shows a
  planted confidential count of ``rel_inputs``; only declared invariants may appear. (Every bad-input
  message is scanned the same way in ``test_bad_inputs``.)
* The embedded cluster listens on 127.0.0.1 only (scheduler, workers, dashboard).
* ``mode = "production"`` draws only from the OS CSPRNG (``OSSource``), refuses a seed (exit code 2),
  says so in ``certificate.json``, and two production runs give different noise. It refuses an infinite
  or zero budget and a zero level or query share that is still measured (exit code 2, file and key named).
* A seeded (test-mode) run prints a one-line warning and its certificate says it is not private.
"""
from __future__ import annotations

import json
import logging
import os
import subprocess
import sys

import pandas as pd
import pytest

from rel_inputs import SECRETS, STATE_TOTAL, leaked_secrets
from topdown.pipeline import load_config, run
from topdown.pipeline.configuration.config import ConfigError
from topdown.pipeline.privacy.rng import OSSource, SeededSource, make_source

PRODUCTION_TOML = 'include = "demo.toml"\n[run]\nname = "prod"\nmode = "production"\n'


@pytest.fixture(scope="module")
def production_config(tmp_path_factory):
    path = tmp_path_factory.mktemp("conf") / "production.toml"
    path.write_text(PRODUCTION_TOML)
    return path


def test_the_scanner_sees_planted_numbers():
    assert leaked_secrets("block 440070001001001 has 4,321 persons; tract 7138") == [
        (4321, "block 440070001001001 has 4,321 persons; tract 7138"),
        (7138, "block 440070001001001 has 4,321 persons; tract 7138")]
    assert leaked_secrets("took 14.321s, geoid 440070001001001, port 43210, total 8510, share 2748/8407049") == []
    assert leaked_secrets('"sha256": "' + "ab" * 10 + "e4321f" + "cd" * 19 + '"') == []
    assert leaked_secrets("'server_id': 'Worker-203e95c3-99ee-4333-ac6b-50be239c6bc9'") == []  # a Dask UUID
    assert [v for v, _ in leaked_secrets("part-4333 of 99ee-4333")] == [4333, 4333]  # not a UUID: still seen
    assert [v for v, _ in leaked_secrets("x = 4321.0; y = 1,357")] == [4321, 1357]
    assert leaked_secrets("DEBUG Message from 'tls://127.0.0.1:1': {'op': 'heartbeat_worker', 'metrics': "
                          "{'read_bytes': 1357, 'num_fds': 4321}}") == []
    assert STATE_TOTAL not in SECRETS


def test_cli_debug_log_discloses_no_confidential_count(tmp_path, planted):
    done = subprocess.run([sys.executable, "-m", "topdown.pipeline.cli", "-v", "run", "demo", "--out", str(tmp_path / "run"),
                           "--input", str(planted), "--workers", "2"], capture_output=True, text=True, timeout=300)
    text = done.stdout + done.stderr
    assert done.returncode == 0, text[-3000:]
    assert " DEBUG " in text and "persons Block:" in text  # it was a debug log of a whole run
    assert leaked_secrets(text) == []
    warnings = [line for line in text.splitlines() if line.startswith("topdown: WARNING")]
    assert len(warnings) == 1 and "seed 2021" in warnings[0] and "NO privacy" in warnings[0], warnings
    cert = json.loads((tmp_path / "run" / "certificate.json").read_text())
    assert cert["private"] is False and cert["noise_reproducible_from_seed"] is True and "NO privacy" in cert["warning"]


def _log_from_a_task() -> None:
    logging.getLogger("topdown").debug("forwarded from a worker task")


def test_in_process_logs_with_worker_logs_disclose_no_confidential_count(tmp_path, planted, caplog):
    """Every logger at DEBUG in the client and (forwarded) in the workers, except Pyomo's component dump:
    at DEBUG Pyomo prints each model's index sets (0..n, which cover any number) and its data, which are
    noisy measurements and public invariants only (a ParentProblem holds no true count), so a chance
    equality with a planted number there is no disclosure. Pyomo stays at INFO on the workers."""
    from distributed import Client, LocalCluster

    def debug_everywhere() -> None:
        logging.getLogger().setLevel(logging.DEBUG)
        logging.getLogger("pyomo").setLevel(logging.INFO)

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        client.run(debug_everywhere)
        client.forward_logging(level=logging.DEBUG)
        with caplog.at_level(logging.DEBUG):
            client.submit(_log_from_a_task, pure=False).result()
            run(load_config("demo"), tmp_path / "run", input_dir=planted, client=client)
    assert any(r.getMessage() == "forwarded from a worker task" for r in caplog.records)  # forwarding works
    assert any(r.levelno == logging.DEBUG for r in caplog.records)
    assert any("persons Block:" in r.getMessage() for r in caplog.records)
    assert leaked_secrets("\n".join(f"{r.name} {r.getMessage()}" for r in caplog.records)) == []


def test_run_outputs_disclose_only_declared_invariants(planted_run):
    """The invariants file holds the declared invariants only: unit counts and the state/US total."""
    out = planted_run
    inv = pd.read_parquet(out / "invariants" / "persons.parquet")
    assert set(inv.loc[inv["tot"].notna(), "level"]) == {"US", "whole_state"}
    assert set(inv["tot"].dropna()) == {STATE_TOTAL}
    text = "\n".join(p.read_text() for p in (out / "manifest.json", out / "certificate.json", out / "config.json"))
    assert leaked_secrets(text) == []


def _listening(pids) -> set[tuple[str, int]]:
    import psutil

    return {(c.laddr.ip, c.laddr.port) for pid in pids for c in psutil.Process(pid).net_connections(kind="inet")
            if c.status == psutil.CONN_LISTEN}


def test_embedded_cluster_listens_on_localhost_only_and_refuses_other_clients():
    """Scheduler, dashboard, nannies (this process) and worker processes bind 127.0.0.1 only, speak TLS
    with the run's temporary credentials, and refuse a client without them (plain TCP, or TLS with
    credentials of its own)."""
    from distributed import Client, Security

    from topdown.pipeline.execution.runner import dask_client

    before = _listening([os.getpid()])
    with dask_client(workers=2) as client:
        assert client.dashboard_link.startswith("http://127.0.0.1:")
        address = client.scheduler.address
        assert address.startswith("tls://127.0.0.1:")
        assert all(addr.startswith("tls://127.0.0.1:") for addr in client.scheduler_info()["workers"])
        ours = (_listening([os.getpid()]) - before) | _listening(client.run(os.getpid).values())
        for intruder, security in ((address.replace("tls://", "tcp://"), None), (address, Security.temporary())):
            with pytest.raises(OSError):
                Client(intruder, security=security, timeout="5s")
        assert client.submit(sum, [1, 2]).result() == 3  # the run's own client still works
    assert len(ours) >= 4 and {ip for ip, _ in ours} == {"127.0.0.1"}, ours


# --------------------------------------------------------------------------------- production mode
def test_production_refuses_a_seed_and_certifies_its_randomness(production_config):
    config = load_config(production_config)
    assert config.run.mode == "production" and config.run.seed is None  # the preset's test seed is dropped
    with pytest.raises(ConfigError, match="refuses a seed"):
        config.with_overrides(seed=1)
    from topdown.pipeline.cli import EXIT_CONFIG, main

    assert main(["run", str(production_config), "--out", str(production_config.parent / "r"), "--seed", "1"]) == EXIT_CONFIG
    assert isinstance(make_source("production", None, "persons/44", "total"), OSSource)
    with pytest.raises(ValueError, match="refuses a seed"):
        make_source("production", 1, "persons/44", "total")


#: Production configurations that are refused: (case, TOML, the key the message names, what it says).
REFUSED = [
    ("infinite rho", 'include = "pl94_production_2021.toml"\n[persons.budget]\nrho = "inf"\n',
     "persons.budget.rho", "infinite budget"),
    ("infinite units rho", 'include = "pl94_production_2021.toml"\n[units.budget]\nrho = "infinity"\n',
     "units.budget.rho", "infinite budget"),
    ("infinite epsilon", 'include = "e2e_1940.toml"\n[persons.budget]\nepsilon = "inf"\n',
     "persons.budget.epsilon", "infinite budget"),
    ("zero rho", 'include = "pl94_production_2021.toml"\n[persons.budget]\nrho = "0"\n',
     "persons.budget", "rho must be positive"),
    ("zero epsilon", 'include = "e2e_1940.toml"\n[persons.budget]\nepsilon = "0"\n',
     "persons.budget", "epsilon must be positive"),
    ("zero level share", 'include = "e2e_1940.toml"\n[persons.budget.levels]\nNational = "0"\nState = "1/2"\n',
     "persons.budget.levels.National", "would not be measured"),
    ("zero query share", 'include = "e2e_1940.toml"\n[persons.budget.queries.County]\n"detailed" = "0"\n'
     '"hhgq" = "13/40"\n', 'persons.budget.queries.County."detailed"', "not measured"),
    ("seed", 'include = "pl94_production_2021.toml"\n[run]\nseed = 7\n', "run", "refuses a seed"),
]


@pytest.mark.parametrize("case,toml,key,says", REFUSED, ids=[c[0] for c in REFUSED])
def test_production_refuses_unsafe_settings(tmp_path, capsys, case, toml, key, says):
    from topdown.pipeline.cli import EXIT_CONFIG, main

    path = tmp_path / "refused.toml"
    path.write_text(toml)
    assert main(["run", str(path), "--out", str(tmp_path / "run")]) == EXIT_CONFIG
    err = capsys.readouterr().err
    assert str(path) in err and key in err and says in err and "Traceback" not in err, err
    assert not (tmp_path / "run").exists()
    test_mode = toml + ("" if "[run]" in toml else "[run]\n") + 'mode = "test"\n' + ("" if "seed" in toml else "seed = 1\n")
    if "must be positive" not in says:  # the same settings are accepted in test mode (not private, and it says so)
        path.write_text(test_mode)
        assert load_config(path).run.mode == "test"


def _count_os_words() -> None:
    """On a worker: fail on any seeded source, count the OS CSPRNG's words."""
    import topdown.pipeline.privacy.rng as rng

    def refuse(self, *args, **kwargs):
        raise AssertionError("a seeded source was used in production mode")

    original = rng.OSSource.uint64

    def counted(self, n):
        rng.OS_WORDS = getattr(rng, "OS_WORDS", 0) + int(n)
        return original(self, n)

    rng.SeededSource.__init__ = refuse
    rng.OSSource.uint64 = counted
    rng.OS_WORDS = 0


def _os_words() -> int:
    import topdown.pipeline.privacy.rng as rng

    return getattr(rng, "OS_WORDS", 0)


def test_production_runs_use_only_the_os_csprng_and_differ(tmp_path, planted, production_config):
    from distributed import Client, LocalCluster

    config = load_config(production_config)
    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        client.run(_count_os_words)
        for name in ("a", "b"):
            run(config, tmp_path / name, input_dir=planted, client=client)
        assert sum(client.run(_os_words).values()) > 0
    for name in ("a", "b"):
        cert = json.loads((tmp_path / name / "certificate.json").read_text())
        assert cert["mode"] == "production" and "os.urandom" in cert["randomness"] and "seed" in cert["randomness"]
        manifest = json.loads((tmp_path / name / "manifest.json").read_text())
        assert manifest["seed_mode"] == "production" and manifest["seed"] is None
    a = pd.read_parquet(tmp_path / "a" / "noisy_measurements" / "persons" / "level=Block")
    b = pd.read_parquet(tmp_path / "b" / "noisy_measurements" / "persons" / "level=Block")
    key = ["geocode", "query", "answer"]
    a, b = a.sort_values(key).reset_index(drop=True), b.sort_values(key).reset_index(drop=True)
    assert a[key].equals(b[key])
    # About 1e5 discrete-Gaussian draws; two independent runs agree everywhere with probability ~0.
    assert (a["value"] != b["value"]).mean() > 0.5


def test_seeded_source_is_untouched_by_the_patch_here():
    """The worker-side patch above never leaks into this process."""
    assert SeededSource(1, "g", "q").uint64(2).shape == (2,)
