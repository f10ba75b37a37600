"""Execute the notebooks on the bundled demo data and store them with their outputs.

    python notebooks/regenerate.py [NAME.ipynb ...]     (default: every notebook here)

Each notebook runs headless (nbclient) with this interpreter as its kernel, in a temporary work directory
(``TOPDOWN_NOTEBOOK_DIR``), so nothing is written into the repository but the notebook itself. Stored outputs
are normalised: a stream's carriage-return redraws (progress bars) are kept at their last state, the
temporary work directory reads ``notebook-work``, and the digest of the code cells is recorded in the
notebook's metadata (``topdown.code_sha256``): tests/test_notebooks.py fails when code changed without a
regeneration, when an output is an error, and when executing a notebook gives other kinds of output.
"""
from __future__ import annotations

import hashlib
import json
import os
import re
import sys
import tempfile
from pathlib import Path

import nbclient
import nbformat

HERE = Path(__file__).resolve().parent
KERNEL = "topdown-notebooks-python"
WORK_NAME = "notebook-work"


def kernel_specs(prefix: Path):
    """A KernelSpecManager that knows one kernel, ``KERNEL``: this interpreter's ipykernel."""
    from ipykernel.kernelspec import install
    from jupyter_client.kernelspec import KernelSpecManager

    install(kernel_name=KERNEL, prefix=str(prefix))
    spec_dir = Path(prefix) / "share" / "jupyter" / "kernels"
    spec = json.loads((spec_dir / KERNEL / "kernel.json").read_text())
    if spec["argv"][0] != sys.executable:
        raise RuntimeError(f"{spec_dir / KERNEL}: kernel runs {spec['argv'][0]}, not {sys.executable}")
    return KernelSpecManager(kernel_dirs=[str(spec_dir)])


def execute(path: Path, cwd: Path, specs) -> nbformat.NotebookNode:
    """The notebook at ``path`` executed with its cwd in ``cwd`` (its work directory is ``TOPDOWN_NOTEBOOK_DIR``
    of this process's environment); raises on any cell error."""
    from jupyter_client import KernelManager

    nb = nbformat.read(path, as_version=4)
    km = KernelManager(kernel_name=KERNEL, kernel_spec_manager=specs)
    nbclient.NotebookClient(nb, km=km, timeout=900, record_timing=False,
                            resources={"metadata": {"path": str(cwd)}}).execute()
    return nb


def code_digest(nb: nbformat.NotebookNode) -> str:
    """SHA-256 of the notebook's code cells' sources, in order."""
    sources = [c.source for c in nb.cells if c.cell_type == "code"]
    return hashlib.sha256(json.dumps(sources).encode()).hexdigest()


def output_kinds(nb: nbformat.NotebookNode) -> list[list[str]]:
    """Per code cell, the sorted kinds of its outputs (stdout, a result's or a display's MIME types, error);
    stderr (progress bars, warnings) is left out: its chunks depend on timing."""
    out = []
    for cell in (c for c in nb.cells if c.cell_type == "code"):
        kinds = set()
        for o in cell.outputs:
            if o.output_type == "stream":
                if o.name == "stdout":
                    kinds.add("stdout")
            elif o.output_type == "error":
                kinds.add("error")
            else:
                kinds |= {f"{o.output_type}:{mime}" for mime in o.get("data", {})}
        out.append(sorted(kinds))
    return out


def _last_state(text: str) -> str:
    """``text`` as a terminal shows it: each line at its last carriage-return redraw, without the cursor
    movements of nested bars."""
    text = re.sub(r"\x1b\[[0-9;]*[A-Za-z]", "", text)
    lines = []
    for line in text.split("\n"):
        parts = [p for p in line.split("\r") if p.strip()]
        lines.append(parts[-1] if parts else "")
    return "\n".join(lines)


def normalise(nb: nbformat.NotebookNode, work: Path) -> nbformat.NotebookNode:
    """Streams merged, their redraws at their last state; the work directory's path as ``notebook-work`` and the
    repository's left out (warnings name their source file); the code digest."""
    paths = sorted({str(work), str(work.resolve())}, key=len, reverse=True)
    repo = f"{HERE.parent}/"  # where the package is installed from, in a warning's source location

    def clean(text: str) -> str:
        for p in paths:
            text = text.replace(p, WORK_NAME)
        return text.replace(repo, "")

    for cell in (c for c in nb.cells if c.cell_type == "code"):
        merged: list = []  # consecutive chunks of one stream as one output, as a notebook shows them
        for o in cell.outputs:
            if o.output_type == "stream" and merged and merged[-1].output_type == "stream" \
                    and merged[-1].name == o.name:
                merged[-1].text += o.text
            else:
                merged.append(o)
        cell.outputs = merged
        for o in cell.outputs:
            if o.output_type == "stream":
                o.text = clean(_last_state(o.text))
            for mime, value in o.get("data", {}).items():
                if mime.startswith("text/") and isinstance(value, str):
                    o.data[mime] = clean(value)
    nb.metadata["topdown"] = {"code_sha256": code_digest(nb), "regenerated_by": "notebooks/regenerate.py"}
    return nb


def main(argv: list[str]) -> int:
    names = argv or sorted(p.name for p in HERE.glob("*.ipynb"))
    with tempfile.TemporaryDirectory(prefix="topdown-notebooks-") as tmp:
        specs = kernel_specs(Path(tmp) / "kernels")
        for name in names:
            work = Path(tmp) / name.removesuffix(".ipynb") / WORK_NAME
            os.environ["TOPDOWN_NOTEBOOK_DIR"] = str(work)
            os.environ.pop("TOPDOWN_SCHEDULER", None)  # the cluster notebook starts its own LocalCluster
            work.parent.mkdir(parents=True)
            nb = normalise(execute(HERE / name, work.parent, specs), work)
            nbformat.write(nb, HERE / name)
            print(f"{name}: executed and stored with its outputs", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
