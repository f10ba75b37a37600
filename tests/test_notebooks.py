"""Every notebook in notebooks/ executes headless (nbclient) in a temporary work directory.

The notebooks read ``TOPDOWN_NOTEBOOK_DIR`` for their work directory. The kernel is this interpreter
(a kernel spec written to a temporary directory), so the notebooks see the installed ``topdown``.
All of them run in the default suite (on the demo data), so they cannot rot.
"""
from __future__ import annotations

import json
import sys
from pathlib import Path

import pandas as pd
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
KERNEL = "topdown-test-python"


def _notebooks() -> list:
    return [pytest.param(p.name, id=p.stem) for p in sorted(NOTEBOOKS.glob("*.ipynb"))]


@pytest.fixture(scope="session")
def kernel_specs(tmp_path_factory):
    """A KernelSpecManager that knows one kernel: ``sys.executable -m ipykernel_launcher``."""
    from ipykernel.kernelspec import install
    from jupyter_client.kernelspec import KernelSpecManager

    prefix = tmp_path_factory.mktemp("kernels")
    install(kernel_name=KERNEL, prefix=str(prefix))
    spec_dir = prefix / "share" / "jupyter" / "kernels"
    spec = json.loads((spec_dir / KERNEL / "kernel.json").read_text())
    assert spec["argv"][0] == sys.executable, f"{spec_dir / KERNEL}: kernel runs {spec['argv'][0]}, not {sys.executable}"
    return KernelSpecManager(kernel_dirs=[str(spec_dir)])


def execute(name: str, work: Path, kernel_specs) -> "nbformat.NotebookNode":
    """Execute notebooks/<name> with its cwd and TOPDOWN_NOTEBOOK_DIR in ``work``; raise on any cell error."""
    from jupyter_client import KernelManager

    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=kernel_specs)
    client = nbclient.NotebookClient(nb, km=km, timeout=600, resources={"metadata": {"path": str(work)}})
    client.execute()
    return nb


def _stream_text(nb) -> str:
    return "".join(o.get("text", "") for c in nb.cells if c.cell_type == "code" for o in c.outputs
                   if o.output_type == "stream")


def _images(nb) -> int:
    return sum("image/png" in o.get("data", {}) for c in nb.cells if c.cell_type == "code" for o in c.outputs)


def _complete(run: Path) -> bool:
    return json.loads((run / "manifest.json").read_text())["status"] == "complete"


@pytest.mark.parametrize("name", _notebooks())
def test_notebook_executes(name: str, tmp_path: Path, monkeypatch, kernel_specs) -> None:
    monkeypatch.setenv("TOPDOWN_NOTEBOOK_DIR", str(tmp_path / "work"))
    monkeypatch.delenv("TOPDOWN_SCHEDULER", raising=False)  # the cluster notebook starts its own LocalCluster
    nb = execute(name, tmp_path, kernel_specs)
    work = tmp_path / "work"
    assert (work / "input" / "persons.parquet").exists(), f"{name}: no demo input in TOPDOWN_NOTEBOOK_DIR"
    if name == "quickstart.ipynb":
        assert _complete(work / "run")
    elif name == "cluster.ipynb":
        assert _complete(work / "cluster-run")
        text = _stream_text(nb)
        assert "dashboard: http" in text
        for level in ("US", "State", "County", "Tract", "Block_Group", "Block"):
            assert f"persons  {level:12s} [" in text, f"{name}: no progress line for level {level}"
    elif name == "accuracy_study.ipynb":
        runs = sorted(p.name for p in (work / "runs").iterdir())
        assert runs == ["block_by_block-s1", "block_by_block-s2", "topdown-eps1", "topdown-eps4", "topdown-s1",
                        "topdown-s2"]
        assert all(_complete(work / "runs" / r) for r in runs)
        for table in ("summary", "errors_by_bin", "epl", "sampling"):
            assert (work / "evaluation" / f"{table}.parquet").exists()
        tradeoff = pd.read_parquet(work / "evaluation-tradeoff" / "epl.parquet")  # Petti & Flaxman Figure 2
        sc = tradeoff[(tradeoff["level"] == "Block") & (tradeoff["query"] == "votingage * hispanic * cenrace")]
        assert len(sc) == 3 and (sc["status"] == "estimated").all()
        assert _images(nb) == 4, f"{name}: expected 4 figures"


def test_every_notebook_is_collected() -> None:
    names = {p.name for p in NOTEBOOKS.glob("*.ipynb")}
    assert {"quickstart.ipynb", "cluster.ipynb", "accuracy_study.ipynb"} <= names
