"""Shared fixtures: the demo input (built once) and one embedded Dask cluster for the session."""
from __future__ import annotations

import os
from pathlib import Path

import pytest

os.environ.setdefault("OMP_NUM_THREADS", "1")
os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
os.environ.setdefault("RAYON_NUM_THREADS", "1")


@pytest.fixture(scope="session")
def demo_input(tmp_path_factory) -> Path:
    from topdown.pipeline.demo_data import write_demo_input

    path = tmp_path_factory.mktemp("demo-input")
    write_demo_input(path)
    return path


@pytest.fixture(scope="session")
def dask_client():
    from distributed import Client, LocalCluster

    with LocalCluster(n_workers=2, threads_per_worker=1, processes=True, dashboard_address="127.0.0.1:0",
                      host="127.0.0.1") as cluster, Client(cluster) as client:
        yield client


@pytest.fixture(scope="session")
def demo_run(tmp_path_factory, demo_input, dask_client) -> Path:
    """One uninterrupted run of the demo configuration (seed 2021) on the demo data, shared read-only."""
    from topdown.pipeline import load_config, run

    out = tmp_path_factory.mktemp("runs") / "demo"
    run(load_config("demo"), out, input_dir=demo_input, client=dask_client)
    return out


def _shared() -> Path:
    """The project's shared/ folder: $TOPDOWN_SHARED, or beside the checkout (as in CI)."""
    env = os.environ.get("TOPDOWN_SHARED")
    return Path(env) if env else Path(__file__).resolve().parents[2] / "shared"


SHARED = _shared()
