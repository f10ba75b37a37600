"""The clusters how-to's set-ups (docs/how-to/clusters.md) give their workers what its "What every set-up needs"
states: the environment of the embedded cluster's workers (the runner's constants), one thread per worker
process, room beside Dask's memory limit for the QP helper, TLS, the client's version, and no credential
written down. The page's files are read from the page itself (its ``<!-- readme-walk: file NAME -->`` blocks):
the hand-started workers' ``worker-env.sh``, the SLURM script (whose job script dask-jobqueue writes without
SLURM) and the Dask Helm chart's values. The single machine's commands are run by the docs walk."""
from __future__ import annotations

import importlib.util
import re
import shlex
import sys
from contextlib import contextmanager
from importlib.metadata import version
from pathlib import Path
from types import ModuleType
from typing import Iterator

import dask
import pytest
import yaml
from dask.utils import parse_bytes

from conftest import REPO
from test_readme import blocks
from topdown.pipeline.execution.runner import GLIBC_ENV, SINGLE_THREAD_ENV, WORKER_ENV

PAGE = REPO / "docs" / "how-to" / "clusters.md"
#: The variables every worker process must see, with their values (the embedded cluster's own).
REQUIRED_ENV = {**SINGLE_THREAD_ENV, **WORKER_ENV}


def page_file(name: str) -> str:
    """The text of the page's block that the walk writes to ``name``."""
    (body,) = [b.body for b in blocks(PAGE.read_text()) if b.verb == "file" and b.arg == name]
    return body


def exports(script: str) -> dict[str, str]:
    """The variables a shell script's ``export NAME=VALUE ...`` lines set."""
    env: dict[str, str] = {}
    for line in script.splitlines():
        words = shlex.split(line, comments=True)
        if words[:1] == ["export"]:
            env.update(word.split("=", 1) for word in words[1:])
    return env


@contextmanager
def dask_config_of(env: dict[str, str]) -> Iterator[None]:
    """The Dask configuration a process started with ``env`` reads (its ``DASK_*`` variables over this one's)."""
    with dask.config.set(dask.config.merge(dask.config.config, dask.config.collect_env(env))):
        yield


def worker_environment(env: dict[str, str]) -> dict[str, str]:
    """What a worker process that its nanny starts under ``env`` sees: ``env`` and the nanny's pre-spawn
    variables (``distributed.nanny.pre-spawn-environ``: one already set keeps its value, one set to None is
    not set)."""
    with dask_config_of(env):
        spawn = dask.config.get("distributed.nanny.pre-spawn-environ")
    return {**{name: str(value) for name, value in spawn.items() if value is not None}, **env}


def assert_worker_env(env: dict[str, str]) -> None:
    seen = worker_environment(env)
    assert {name: seen.get(name) for name in REQUIRED_ENV} == REQUIRED_ENV
    assert not set(GLIBC_ENV) & set(seen), f"a worker would start with {set(GLIBC_ENV) & set(seen)}"


def test_the_check_sees_the_nannys_default():
    """Without the page's variables a worker gets Dask's malloc setting and misses Arrow's pool."""
    assert "MALLOC_TRIM_THRESHOLD_" in worker_environment({})
    with pytest.raises(AssertionError):
        assert_worker_env(SINGLE_THREAD_ENV)


def test_hand_started_workers_environment():
    assert_worker_env(exports(page_file("worker-env.sh")))


# -- HPC: the SLURM script ---------------------------------------------------------------------------------------

def slurm_script(tmp_path: Path) -> ModuleType:
    """The page's ``slurm_run.py``, imported (its run is under ``if __name__ == "__main__":``)."""
    path = tmp_path / "slurm_run.py"
    path.write_text(page_file("slurm_run.py"))
    spec = importlib.util.spec_from_file_location("slurm_run", path)
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def flags(words: list[str]) -> dict[str, str]:
    """``--flag value`` pairs of a command line (the last of a repeated flag wins, as for Dask's commands)."""
    return {word: value for word, value in zip(words, words[1:] + [""]) if word.startswith("--")}


@pytest.mark.system  # a scheduler without workers, in process: dask-jobqueue writes the job script from it
@pytest.mark.smoke  # seconds: in the default selection
def test_slurm_job_script(tmp_path: Path, monkeypatch):
    monkeypatch.setenv("HOME", str(tmp_path))  # the script's shared_temp_directory, "~": the credentials go there
    script = slurm_script(tmp_path)
    with script.slurm_cluster() as cluster:
        job = cluster.job_script()
        scheduler = cluster.scheduler_address
    assert scheduler.startswith("tls://")
    assert_worker_env(exports(job))
    (command,) = [shlex.split(line) for line in job.splitlines() if "dask_worker" in line]
    assert command[0] == sys.executable  # the login node's Python, so this package's version
    worker = flags(command)
    assert worker["--nthreads"] == "1" and worker["--nworkers"] == str(script.CORES)
    assert worker["--protocol"] == "tls://" and all(worker.get(f) for f in ("--tls-ca-file", "--tls-cert", "--tls-key"))
    (job_mem,) = re.findall(r"^#SBATCH --mem=(\S+)$", job, re.M)
    assert parse_bytes(worker["--memory-limit"]) * script.CORES < parse_bytes(job_mem), "no room for the QP helpers"
    shown = re.search(r"`dask_worker \.\.\. (.*?) \.\.\.`", PAGE.read_text(), re.S)[1].split()
    assert flags(shown) == {f: worker[f] for f in flags(shown)}, "the page quotes another job script"


# -- Kubernetes: the Dask Helm chart's values --------------------------------------------------------------------

def helm_values() -> dict:
    return yaml.safe_load(page_file("dask-values.yaml"))


def env_of(section: dict, secrets: dict[str, str] | None = None) -> dict[str, str]:
    """A chart section's ``env``: literal values, and those read from a secret's keys (given in ``secrets``)."""
    out = {}
    for entry in section["env"]:
        if "value" in entry:
            out[entry["name"]] = entry["value"]
        elif secrets is not None:
            out[entry["name"]] = secrets[entry["valueFrom"]["secretKeyRef"]["key"]]
    return out


def test_helm_workers_one_thread_environment_and_room():
    values = helm_values()
    worker, scheduler = values["worker"], values["scheduler"]
    assert worker["threads_per_worker"] == 1 == worker["resources"]["limits"]["cpu"]  # the chart's --nthreads
    assert not {"--nthreads", "--nworkers"} & set(worker["extraArgs"])
    limits = flags(["--memory-limit", worker["resources"]["limits"]["memory"], *worker["extraArgs"]])
    assert parse_bytes(limits["--memory-limit"]) < parse_bytes(worker["resources"]["limits"]["memory"])
    assert_worker_env(env_of(worker))
    assert worker["image"]["tag"] == scheduler["image"]["tag"] == version("census-topdown")
    assert worker["image"]["repository"] == scheduler["image"]["repository"]
    assert values["jupyter"]["enabled"] is False


@pytest.mark.unit  # in process: Security() built from the configuration (imports distributed, starts nothing)
@pytest.mark.parametrize("role", ["scheduler", "worker"])
def test_helm_tls(role: str):
    """The chart's environment makes the scheduler and the workers TLS-only with the secret's credentials (the
    keys ``kubectl create secret`` puts in it), and the workers dial the scheduler's TLS address."""
    from distributed import Security

    values = helm_values()
    made = Security.temporary()
    pem = {"ca.pem": made.tls_ca_file, f"{role}.pem": getattr(made, f"tls_{role}_cert"),
           f"{role}.key": getattr(made, f"tls_{role}_key")}
    assert set(pem) <= set(re.findall(r"--from-file=(\S+)", PAGE.read_text()))
    with dask_config_of(env_of(values[role], pem)):
        security = Security()
        assert security.require_encryption
        assert security.get_listen_args(role)["ssl_context"] is not None
    scheduler = values["scheduler"]
    assert flags(scheduler["extraArgs"])["--protocol"] == "tls"
    assert values["worker"]["custom_scheduler_url"] == (
        f"tls://{values['fullnameOverride']}-scheduler:{scheduler.get('servicePort', 8786)}")


def test_no_credential_is_written_down():
    """Credentials come from the secret and the workers' service account (its cloud role), never from the files."""
    for name in ("dask-values.yaml", "slurm_run.py", "worker-env.sh"):
        text = page_file(name)
        assert "-----BEGIN" not in text and not re.search(r"\b(AKIA|ASIA)[0-9A-Z]{16}\b", text), name
        assert not re.search(r"AWS_(SECRET_ACCESS_KEY|ACCESS_KEY_ID|SESSION_TOKEN)", text), name
    values = helm_values()
    for role in ("scheduler", "worker"):
        literal = env_of(values[role])
        assert not [n for n in literal if re.search(r"KEY|SECRET|TOKEN|PASSWORD|CERT|CA_FILE", n)], literal
    assert values["worker"]["serviceAccountName"]
