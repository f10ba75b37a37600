"""The run-directory reader: typed manifest and certificate with a schema version, and a
run that reads its own spine back."""
from __future__ import annotations

import ast
import json
import shutil

import pytest
from conftest import REPO

from topdown.pipeline.runtime.rundir import SCHEMA_VERSION, RunDirError, RunReader


def test_a_run_reads_its_own_spine_and_typed_records_back(demo_run):
    reader = RunReader(demo_run)
    manifest = reader.complete_manifest()
    assert manifest.schema_version == SCHEMA_VERSION and manifest.complete
    assert manifest.products == ["persons", "units"] and manifest.seed == 2021
    spine = reader.spine()
    assert spine.levels == manifest.levels and spine.kind == manifest.spine
    assert spine.table[["geoid", *spine.levels]].astype(str).equals(reader.spine_table())
    cert = reader.certificate()
    assert cert.schema_version == SCHEMA_VERSION and cert.mode == "test" and not cert.private
    assert list(cert.products) == manifest.products == reader.config().run.products
    assert cert.products["persons"]["mechanism"] == "discrete_gaussian"
    assert reader.config().digest() == manifest.data["config_hash"]


def _copy_with_manifest(demo_run, tmp_path, **changes):
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    data = json.loads((run / "manifest.json").read_text())
    for key, value in changes.items():
        if value is None:
            data.pop(key)
        else:
            data[key] = value
    (run / "manifest.json").write_text(json.dumps(data))
    return RunReader(run)


def test_schema_versions(demo_run, tmp_path):
    """A manifest without ``schema_version`` is version 1 (written before the key); a newer one is refused,
    naming the file and the key."""
    assert _copy_with_manifest(demo_run, tmp_path / "a", schema_version=None).manifest().schema_version == 1
    with pytest.raises(RunDirError, match=r"manifest.json: key 'schema_version' is 99"):
        _copy_with_manifest(demo_run, tmp_path / "b", schema_version=99).manifest()
    with pytest.raises(RunDirError, match="holds no complete run"):
        _copy_with_manifest(demo_run, tmp_path / "c", status="running").complete_manifest()


def test_a_runs_spine_of_an_older_version_or_damaged(demo_run, tmp_path):
    """A standard spine written without metadata (an older version) is read back as the table; without metadata
    a spine that moves budget cannot be, and a spine.parquet that is not Parquet makes the run directory
    unusable (RunDirError, exit 4), naming the file."""
    import pyarrow.parquet as pq

    reader = _copy_with_manifest(demo_run, tmp_path / "a")
    assert reader.manifest().spine == "standard"
    table_only = pq.read_table(reader.spine_path).replace_schema_metadata(None)
    pq.write_table(table_only, reader.spine_path)
    spine = reader.spine()
    assert spine.kind == "standard" and spine.levels == reader.manifest().levels
    assert spine.table.equals(reader.spine_table())
    aian = _copy_with_manifest(demo_run, tmp_path / "b", spine="aian")
    pq.write_table(table_only, aian.spine_path)
    with pytest.raises(RunDirError, match=r"spine.parquet: not a spine file .*no budget moves for the 'aian' spine"):
        aian.spine()
    reader.spine_path.write_bytes(b"not a Parquet file")
    with pytest.raises(RunDirError, match=r"spine.parquet: not a readable spine file \(ArrowInvalid"):
        reader.spine()


#: The modules that read a run directory: verify, evaluate, nmf, uncertainty, replicates,
#: reprocess and release. They read through RunReader and construct no RunDir (the writer); the one exception
#: is reprocess's writer of the new run directory it makes (``RunDir(out)``).
READERS = ("pipeline/outputs/verify.py", "pipeline/evaluation/evaluate.py", "pipeline/execution/nmf.py",
           "pipeline/evaluation/uncertainty.py", "pipeline/evaluation/replicates.py",
           "pipeline/execution/reprocess.py", "pipeline/privacy/release.py")
WRITES_ITS_OWN = {("pipeline/execution/reprocess.py", "reprocess", "out")}


def _constructions(path, cls: str) -> list[tuple[str, str]]:
    """(enclosing function, first argument's source) of every call of ``cls`` (by name or attribute) in ``path``."""
    found = []

    def visit(node, func: str) -> None:
        for child in ast.iter_child_nodes(node):
            name = child.name if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)) else func
            if isinstance(child, ast.Call):
                f = child.func
                if (f.id if isinstance(f, ast.Name) else f.attr if isinstance(f, ast.Attribute) else None) == cls:
                    found.append((func, ast.unparse(child.args[0]) if child.args else ""))
            visit(child, name)

    visit(ast.parse(path.read_text()), "<module>")
    return found


@pytest.mark.parametrize("name", READERS)
def test_readers_read_through_the_reader_and_construct_no_writer(name):
    path = REPO / name
    writers = [c for c in _constructions(path, "RunDir") if (name, *c) not in WRITES_ITS_OWN]
    assert not writers, f"{name} constructs RunDir (read through RunReader): {writers}"
    assert _constructions(path, "RunReader"), f"{name} does not read through RunReader"


def test_the_construction_scan_sees_calls_inside_functions(tmp_path):
    src = tmp_path / "m.py"
    src.write_text("import x\n\ndef f(a):\n    r = x.RunDir(a)\n    return RunDir(a / 'b')\n")
    assert _constructions(src, "RunDir") == [("f", "a"), ("f", "a / 'b'")]
