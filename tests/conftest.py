"""Shared fixtures: the demo and planted inputs (built once), one embedded Dask cluster for the session,
and one reference run of the demo configuration on each input; and each collected test marked with its
kind, ``unit``, ``system`` or ``cli``, and all but a sample of the command-line cases ``slow`` (markers.py);
under pytest-xdist, the files in the order CI's processes should take them (file_order.py)."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")


@pytest.hookimpl(tryfirst=True)  # before ``-m`` selects on the marks
def pytest_collection_modifyitems(config, items) -> None:
    from markers import mark_items

    mark_items(items)


def pytest_configure(config) -> None:
    if hasattr(config, "workerinput"):  # a pytest-xdist process: the files longest first (file_order.py)
        from file_order import LongestFirst

        config.pluginmanager.register(LongestFirst(), "topdown-file-order")


@pytest.fixture(scope="session")
def demo_input(tmp_path_factory) -> Path:
    from topdown.pipeline.inputs.demo_data import write_demo_input

    path = tmp_path_factory.mktemp("demo-input")
    write_demo_input(path)
    return path


@pytest.fixture(scope="session")
def dask_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                      host="127.0.0.1", security=True) as cluster, Client(cluster) as client:  # TLS, as a run's own
        yield client


def _run_preset(tmp_path_factory, input_dir: Path, client, name: str, preset: str = "demo") -> Path:
    """One uninterrupted run of a shipped preset on ``input_dir``."""
    from topdown.pipeline import load_config, run

    out = tmp_path_factory.mktemp("runs") / name
    run(load_config(preset), out, input_dir=input_dir, client=client)
    return out


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory, demo_input, dask_client) -> Path:
    """One uninterrupted run of the demo configuration (seed 2021) on the demo data, shared read-only."""
    return _run_preset(tmp_path_factory, demo_input, dask_client, "demo")


@pytest.fixture(scope="session")
def zero_noise_run(tmp_path_factory, demo_input, dask_client) -> Path:
    """One run of the zero-noise preset on the demo data (tests/test_e2e.py)."""
    return _run_preset(tmp_path_factory, demo_input, dask_client, "zero", preset="zero_noise")


@pytest.fixture(scope="session")
def planted(tmp_path_factory) -> Path:
    """The small input with planted confidential counts (rel_inputs.py)."""
    from rel_inputs import write_planted_input

    return write_planted_input(tmp_path_factory.mktemp("planted"))


@pytest.fixture(scope="session")
def planted_run(tmp_path_factory, planted, dask_client) -> Path:
    """One uninterrupted run of the demo configuration (seed 2021) on the planted input, shared read-only."""
    return _run_preset(tmp_path_factory, planted, dask_client, "planted")


def end_process_groups(procs) -> None:
    """End subprocesses started with ``start_new_session=True`` (their whole process groups): SIGTERM,
    then SIGKILL after 10 s."""
    import signal
    import subprocess

    for p in procs:
        if p.poll() is None:
            os.killpg(p.pid, signal.SIGTERM)
    for p in procs:
        try:
            p.wait(timeout=10)
        except subprocess.TimeoutExpired:
            os.killpg(p.pid, signal.SIGKILL)
            p.wait()


REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "data"
"""The real census datasets the tests use, bundled gzipped (data/README.md gives their provenance)."""
PL94_DIR = REPO / "pipeline" / "data"
"""The 2018 End-to-End prototype P.L. 94-171 files (gzipped), which the demo input is built from."""
