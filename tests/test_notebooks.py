"""Every notebook in notebooks/ executes headless (nbclient) in a temporary work directory, and is stored
with current outputs (notebooks/regenerate.py).

The notebooks read ``TOPDOWN_NOTEBOOK_DIR`` for their work directory. The kernel is this interpreter
(a kernel spec written to a temporary directory), so the notebooks see the installed ``topdown``.
All of them run in the default suite (on the demo data), so they cannot rot.
"""
from __future__ import annotations

import json
import shutil
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

nbformat = pytest.importorskip("nbformat")
nbclient = pytest.importorskip("nbclient")
pytest.importorskip("ipykernel")

NOTEBOOKS = Path(__file__).resolve().parents[1] / "notebooks"
sys.path.insert(0, str(NOTEBOOKS))
import regenerate  # noqa: E402  (notebooks/regenerate.py: how the stored notebooks are executed)

#: Figures each stored notebook shows.
IMAGES = {"quickstart.ipynb": 0, "cluster.ipynb": 1, "accuracy_study.ipynb": 4}


def _notebooks() -> list:
    return [pytest.param(p.name, id=p.stem) for p in sorted(NOTEBOOKS.glob("*.ipynb"))]


@pytest.fixture(scope="session")
def kernel_specs(tmp_path_factory):
    """A KernelSpecManager that knows one kernel: ``sys.executable -m ipykernel_launcher``."""
    return regenerate.kernel_specs(tmp_path_factory.mktemp("kernels"))


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
    nb = regenerate.execute(NOTEBOOKS / name, tmp_path, kernel_specs)
    work = tmp_path / "work"
    stored = nbformat.read(NOTEBOOKS / name, as_version=4)
    assert regenerate.output_kinds(nb) == regenerate.output_kinds(stored), \
        f"{name}: stored outputs differ in kind from a fresh execution; run python notebooks/regenerate.py {name}"
    assert (work / "input" / "persons.parquet").exists(), f"{name}: no demo input in TOPDOWN_NOTEBOOK_DIR"
    if name == "quickstart.ipynb":
        assert _complete(work / "run")
    elif name == "cluster.ipynb":
        assert _complete(work / "cluster-run")
        text = _stream_text(nb)
        assert "dashboard: http" in text
        for level in ("US", "State", "County", "Tract", "Block_Group", "Block"):  # the job's tqdm bars
            assert f"persons {level}: 100%|" in text, f"{name}: no progress bar for level {level}"
        assert "<Job cluster-run: running>" in text and "<Job cluster-run: complete> in" in text
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


@pytest.mark.parametrize("name", _notebooks())
def test_stored_notebook_has_current_outputs(name: str) -> None:
    """Stored as regenerate.py writes it: its code unchanged since (digest), every code cell executed in
    order, no error, its figures and results there."""
    nb = nbformat.read(NOTEBOOKS / name, as_version=4)
    meta = nb.metadata.get("topdown", {})
    assert meta.get("code_sha256") == regenerate.code_digest(nb), \
        f"{name}: code changed since its outputs were made; run python notebooks/regenerate.py {name}"
    code = [c for c in nb.cells if c.cell_type == "code"]
    assert [c.execution_count for c in code] == list(range(1, len(code) + 1)), f"{name}: not executed in order"
    kinds = regenerate.output_kinds(nb)
    assert not any("error" in k for k in kinds)
    assert not any("Traceback" in o.get("text", "") for c in code for o in c.outputs)
    assert _images(nb) == IMAGES[name]
    assert sum(any(k.startswith("execute_result") for k in ks) for ks in kinds) >= 3, f"{name}: too few results"
    assert "/tmp/" not in json.dumps([c.outputs for c in code]), f"{name}: a temporary path in the outputs"


def test_regenerate_normalises_streams_and_paths(tmp_path) -> None:
    from nbformat.v4 import new_code_cell, new_notebook, new_output

    work = tmp_path / "work"
    cell = new_code_cell("x", outputs=[new_output("stream", name="stderr", text="\rbar 0%\x1b[A"),
                                       new_output("stream", name="stderr", text="\rbar 100%\n"),
                                       new_output("stream", name="stdout", text=f"wrote {work}/run\n")])
    nb = regenerate.normalise(new_notebook(cells=[cell]), work)
    assert [o.text for o in nb.cells[0].outputs] == ["bar 100%\n", "wrote notebook-work/run\n"]
    assert nb.metadata["topdown"]["code_sha256"] == regenerate.code_digest(nb)


def test_notebook_data_is_in_the_wheel(tmp_path) -> None:
    """What a wheel installs (setuptools build_py of pyproject.toml) holds the BAF the accuracy notebook reads
    through demo_baf(), and no notebook reads the clone's data/ directly."""
    repo = NOTEBOOKS.parent
    src = tmp_path / "src"
    for name in ("pyproject.toml", "README.md"):
        (src / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copy(repo / name, src / name)
    for folder in ("pipeline", "geo", "solvers", "conf", "vocab", "data"):
        shutil.copytree(repo / folder, src / folder, ignore=shutil.ignore_patterns("__pycache__"))
    built = tmp_path / "built"
    done = subprocess.run([sys.executable, "-c", "from setuptools import setup; setup()", "-q", "build_py", "-d",
                           str(built)], cwd=src, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    check = ("from topdown.pipeline.inputs.demo_data import demo_baf; import sys; b = demo_baf(); "
             "print(b.relative_to(sys.argv[1]), sorted(p.name for p in b.iterdir())[0])")
    shown = subprocess.run([sys.executable, "-c", check, str(built)], env={"PYTHONPATH": str(built)},
                           capture_output=True, text=True, timeout=120)
    assert shown.stdout.split() == ["topdown/data/ri_baf2020", "BlockAssign_ST44_RI_AIANNH.txt.gz"], shown.stderr
    for path in NOTEBOOKS.glob("*.ipynb"):
        sources = "".join(c.source for c in nbformat.read(path, as_version=4).cells if c.cell_type == "code")
        assert "'data'" not in sources and "parents[1]" not in sources, f"{path.name} reads the clone's data/"
