"""Where the commands write (pipeline/runtime/outdir.py), one rule for all of them:

* nothing of the user's is removed or overwritten: an output path is absent, empty, or an earlier output of the
  same command by its own marker (a folder that merely holds a run's file names is not one);
* nothing confidential lands in a published tree, and no output inside a run directory; ``verify`` fails on
  any file of a run its manifest does not list;
* one writer per output, the second refused with exit code 4 naming the holder;
* names that become paths (a batch job's, a manifest's levels and products) stay in their folder.
"""
from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from cli_subprocess import assert_clean_failure, snapshot, topdown
from hypothesis import given, settings
from hypothesis import strategies as st
from rel_inputs import SECRETS, leaked_secrets
from test_adversarial_silent import block_csv

from topdown.pipeline.cli import EXIT_CONFIG, EXIT_OK, EXIT_RUNDIR, EXIT_VERIFY, build_parser, main
from topdown.pipeline.runtime.outdir import (MARKER, MARKER_KEY, WRITERS, check, claimed, claimed_file,
                                             new_marker, read_marker)
from topdown.pipeline.configuration.limits import MAX_NAME, unsafe_name
from topdown.pipeline.runtime.rundir import LOCK, RunDirError
from topdown.pipeline.outputs.verify import verify_run

MOVE = "440070001001001:440070001001002"


def _refused(argv: list, capsys, *fragments: str) -> str:
    """``topdown ARGV`` in process: exit code 4 and one ``topdown:`` line on stderr holding every fragment."""
    capsys.readouterr()
    code = main([str(a) for a in argv])
    lines = [ln for ln in capsys.readouterr().err.splitlines() if ln.startswith("topdown:") and "WARNING" not in ln]
    assert code == EXIT_RUNDIR and len(lines) == 1, (code, lines)
    for fragment in fragments:
        assert fragment in lines[0], (fragment, lines[0])
    return lines[0]


@pytest.fixture
def run_copy(demo_run, tmp_path) -> Path:
    copy = tmp_path / "run"
    shutil.copytree(demo_run, copy)
    return copy


# ------------------------------------------------------------------------------------- one table of writers
def test_every_command_that_writes_has_its_entry():
    """Each command with an output (``--out`` or a positional OUT) is a writer of the one table, so it follows
    the one rule; ``batch`` writes its logs and summary."""
    sub = next(a for a in build_parser()._actions if a.dest == "command")
    writing = {name for name, parser in sub.choices.items() if any(a.dest == "out" for a in parser._actions)}
    assert writing == {"run", "reprocess", "privacy", "demo-data", "synth", "ingest", "evaluate", "nmf", "uncertainty",
                       "replicates", "audit", "spine"}
    assert writing | {"batch"} == set(WRITERS)


# ------------------------------------------------------------------------ 1. nothing of the user's is touched
def _lookalike(tmp: Path, **files: str) -> Path:
    """A user's folder holding files with the names of an earlier output (``__`` in a name is a ``/``)."""
    folder = tmp / "mine"
    for name, text in files.items():
        path = folder / name.replace("__", "/")
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(text)
    return folder


RUN_LOOKALIKES = {
    "manifest with a status": {"manifest.json": '{"status": "complete", "levels": ["US"], "products": ["persons"]}',
                               "histograms__important.txt": "my notes", "config.json": '{"mine": 1}'},
    "staging folder": {".staging__chunks__x": "x", "histograms__important.txt": "my notes", "evaluation__a": "b"},
    "marker of another command": {"manifest.json": json.dumps({**new_marker("evaluate"), "status": "complete"}),
                                  "mdf__important.txt": "my notes"},
}


@pytest.mark.parametrize("flags", [(), ("--force",), ("--resume",)])
@pytest.mark.parametrize("kind", sorted(RUN_LOOKALIKES))
def test_a_folder_that_looks_like_a_run_is_never_cleared(kind, flags, demo_input, tmp_path, capsys):
    folder = _lookalike(tmp_path, **RUN_LOOKALIKES[kind])
    before = snapshot(folder)
    _refused(["run", "demo", "--input", demo_input, "--out", folder, "--workers", "1", "--quiet", *flags], capsys,
             str(folder), "not an earlier output of this command", "nothing was touched")
    assert snapshot(folder) == before


def test_a_user_manifest_with_a_status_is_refused_as_a_process(demo_input, tmp_path):
    """The reported case, as a user meets it: exit 4, one line, every file kept."""
    folder = _lookalike(tmp_path, **RUN_LOOKALIKES["manifest with a status"])
    before = snapshot(folder)
    outcome = topdown("run", "demo", "--input", demo_input, "--out", folder, "--force", "--quiet", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_RUNDIR, str(folder), "not an earlier output of this command")
    assert snapshot(folder) == before


#: An earlier output's file names, without its marker, per command (the names a name-based check trusted).
NAMES_ONLY = {
    "evaluate": {"summary.parquet": "mine", "report.html": "mine"},
    "spine": {"report.json": "{}", "spine.parquet": "mine"},
    "replicates": {"replicates.json": '{"run": "x", "replicates": []}'},
    "audit": {"audit.json": "{}"},
    "ingest": {"persons.parquet": "mine", "units.parquet": "mine"},
    "nmf": {"nmf.json": "{}"},
}


def _argv(command: str, out: Path, run: Path, inp: Path, tmp: Path) -> list:
    """A valid command line of ``command`` writing ``out``."""
    (tmp / "baf").mkdir(exist_ok=True)
    return {
        "run": ["run", "demo", "--input", inp, "--out", out, "--workers", "1", "--quiet"],
        "reprocess": ["reprocess", run, "--out", out, "--workers", "1", "--quiet"],
        "nmf": ["nmf", run, "--out", out, "--quiet"],
        "uncertainty": ["uncertainty", run, "--out", out, "--workers", "1", "--quiet"],
        "evaluate": ["evaluate", run, "--truth", inp, "--out", out],
        "replicates": ["replicates", run, "--n", "1", "--out", out, "--workers", "1", "--quiet"],
        "audit": ["audit", "demo", "--input", inp, "--move", MOVE, "--runs", "1", "--out", out, "--workers", "1"],
        "ingest": ["ingest", "blocks", block_csv(tmp / "blocks.csv"), "--out", out, "--quiet"],
        "demo-data": ["demo-data", out],
        "synth": ["synth", "--blocks", "3", out],
        "spine": ["spine", "--baf", tmp / "baf", "--out", out],
        "privacy": ["privacy", "demo", "--out", out],
    }[command]


FILE_OUTPUTS = ("uncertainty", "privacy")


@pytest.mark.parametrize("command", sorted(NAMES_ONLY))
def test_file_names_of_an_earlier_output_are_not_its_marker(command, demo_run, demo_input, tmp_path, capsys):
    folder = _lookalike(tmp_path, **NAMES_ONLY[command])
    before = snapshot(folder)
    _refused(_argv(command, folder, demo_run, demo_input, tmp_path), capsys, str(folder),
             "not an earlier output of this command", "nothing was touched")
    assert snapshot(folder) == before


@pytest.mark.parametrize("command", sorted(set(WRITERS) - {"batch"}))
def test_an_output_of_another_command_is_not_replaced(command, demo_run, demo_input, tmp_path, capsys):
    """A marker names its command: an output of another command is refused like any folder of the user's."""
    other = "spine" if command == "evaluate" else "evaluate"
    out = tmp_path / ("other.json" if command in FILE_OUTPUTS else "other")
    if command in FILE_OUTPUTS:
        out.write_text(json.dumps({MARKER_KEY: {"format": "census-topdown", "command": other}}))
    else:
        out.mkdir()
        (out / MARKER).write_text(json.dumps(new_marker(other)))
        (out / "persons.parquet").write_text("of the other command")
    before = snapshot(out)
    _refused(_argv(command, out, demo_run, demo_input, tmp_path), capsys, str(out), "not an earlier output")
    assert snapshot(out) == before


def test_the_rule_in_one_function(tmp_path):
    """``check``: absent, empty, a lock alone, or an earlier output of the same command (when it replaces one)."""
    def verdict(path: Path, command: str, file: bool = False) -> str:
        try:
            return "earlier" if check(path, command, file=file)[1] else "new"
        except RunDirError as exc:
            return "locked" if "locked by another" in str(exc) else "refused"

    (tmp_path / "empty").mkdir()
    stale = tmp_path / "stale-lock"
    stale.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    (stale / LOCK).write_text(f"pid {dead.pid} on {os.uname().nodename} since 2026-01-01T00:00:00")
    live = tmp_path / "live-lock"
    live.mkdir()
    (live / LOCK).write_text(f"pid {os.getpid()} on {os.uname().nodename} since 2026-01-01T00:00:00")
    with claimed(tmp_path / "ev", "evaluate"):
        pass
    with claimed(tmp_path / "nmf", "nmf"):
        pass
    with claimed_file(tmp_path / "u.parquet", "uncertainty"):
        pass  # nothing written: no file
    (tmp_path / "cert.json").write_text(json.dumps({MARKER_KEY: {"format": "census-topdown", "command": "privacy"}}))
    bad_id = tmp_path / "bad-id"
    bad_id.mkdir()
    (bad_id / MARKER).write_text(json.dumps({**new_marker("evaluate"), "output_id": "../../x"}))
    cases = [("absent", "evaluate", False, "new"), ("empty", "evaluate", False, "new"),
             ("stale-lock", "evaluate", False, "new"), ("live-lock", "evaluate", False, "locked"),
             ("ev", "evaluate", False, "earlier"), ("ev", "audit", False, "refused"),
             ("nmf", "nmf", False, "refused"),  # an earlier noisy measurement file is never replaced
             ("u.parquet", "uncertainty", True, "new"), ("cert.json", "privacy", True, "earlier"),
             ("cert.json", "uncertainty", True, "refused"), ("ev", "privacy", True, "refused"),
             ("bad-id", "evaluate", False, "refused")]
    assert [verdict(tmp_path / name, cmd, file) for name, cmd, file, _ in cases] == [want for *_, want in cases]
    assert not (tmp_path / "u.parquet").exists() and not (tmp_path / f".u.parquet{LOCK}").exists()


def test_a_failed_command_leaves_no_marker_where_it_found_nothing(tmp_path):
    empty = tmp_path / "empty"
    empty.mkdir()
    for out in (empty, tmp_path / "new" / "deeper"):
        with pytest.raises(KeyError), claimed(out, "evaluate"):
            assert read_marker(out)["command"] == "evaluate"
            raise KeyError("the command failed before writing")
    assert list(empty.iterdir()) == [] and not (tmp_path / "new").exists()


def test_force_and_resume_keep_a_runs_marker(run_copy, demo_input, capsys):
    """A run directory stays its run's: ``--force`` recomputes it with the same marker, a file of the user's in it
    is left alone (verify then names it), and the earlier run's outputs are gone before the new ones come."""
    marker = read_marker(run_copy)
    assert marker["command"] == "run" and json.loads((run_copy / "manifest.json").read_text())["output_id"] == \
        marker["output_id"]
    (run_copy / "notes.txt").write_text("mine")
    code = main(["run", "demo", "--input", str(demo_input), "--out", str(run_copy), "--force", "--quiet",
                 "--workers", "1"])
    assert code == EXIT_OK and read_marker(run_copy) == marker and (run_copy / "notes.txt").read_text() == "mine"
    report = verify_run(run_copy)
    assert report.failures == ["notes.txt: not listed in the manifest (not an output of the run)"]


# ---------------------------------------------------------------- 2. nothing confidential in a published tree
CONFIDENTIAL = sorted(c for c, w in WRITERS.items() if w.confidential)


def _published_places(run: Path, tmp: Path) -> dict[str, Path]:
    """Paths inside published outputs: in a run directory, deep in it, through a link into it, in a noisy
    measurement file, in a folder of replicates."""
    (tmp / "link").symlink_to(run / "histograms")
    for name, command in (("nmf", "nmf"), ("reps", "replicates")):
        (tmp / name).mkdir()
        (tmp / name / MARKER).write_text(json.dumps(new_marker(command)))
    return {"in the run": run / "eval", "deep in the run": run / "histograms" / "persons" / "eval",
            "through a link": tmp / "link" / "eval", "in a noisy measurement file": tmp / "nmf" / "eval",
            "in replicates": tmp / "reps" / "eval"}


@pytest.mark.parametrize("command", CONFIDENTIAL)
def test_confidential_output_never_lands_in_a_published_tree(command, run_copy, demo_input, tmp_path, capsys):
    before = snapshot(run_copy)
    for where, out in _published_places(run_copy, tmp_path).items():
        line = _refused(_argv(command, out, run_copy, demo_input, tmp_path), capsys, str(out), "nothing was touched")
        assert ("inside the run directory" in line) if "run" in where or "link" in where else (
            "holds confidential counts" in line), (where, line)
        assert leaked_secrets(line, SECRETS) == []
    assert snapshot(run_copy) == before and verify_run(run_copy).ok


@pytest.mark.parametrize("command", sorted(set(WRITERS) - {"batch"} - set(CONFIDENTIAL)))
def test_no_output_goes_inside_a_run_directory(command, run_copy, demo_input, tmp_path, capsys):
    out = run_copy / "histograms" / ("x.json" if command in FILE_OUTPUTS else "x")
    before = snapshot(run_copy)
    _refused(_argv(command, out, run_copy, demo_input, tmp_path), capsys, "inside the run directory")
    assert snapshot(run_copy) == before


def test_a_confidential_folder_holding_a_run_is_not_written(demo_run, demo_input, tmp_path, capsys):
    out = tmp_path / "eval"
    with claimed(out, "evaluate"):
        pass
    shutil.copytree(demo_run, out / "a-run")  # a run put inside an evaluation afterwards
    _refused(_argv("evaluate", out, demo_run, demo_input, tmp_path), capsys, "holds the run directory",
             "confidential")


def test_evaluate_into_a_run_is_refused_and_verify_stays_ok(run_copy, demo_input, tmp_path):
    """The reported case: ``evaluate --out RUN/histograms/eval`` as a process."""
    outcome = topdown("evaluate", run_copy, "--truth", demo_input, "--out", run_copy / "histograms" / "eval",
                      cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_RUNDIR, "inside the run directory", "nothing was touched")
    assert not (run_copy / "histograms" / "eval").exists() and verify_run(run_copy).ok


def test_evaluate_by_default_writes_beside_the_run(run_copy, demo_input, tmp_path, capsys):
    assert main(["evaluate", str(run_copy), "--truth", str(demo_input)]) == EXIT_OK
    out = tmp_path / "run-evaluation-CONFIDENTIAL"
    assert (out / "summary.parquet").is_file() and read_marker(out)["command"] == "evaluate"
    assert all(os.lstat(p).st_mode & 0o077 == 0 for p in (out, *out.rglob("*")))
    assert verify_run(run_copy).ok  # the run holds nothing but its outputs
    assert main(["evaluate", str(run_copy), "--truth", str(demo_input)]) == EXIT_OK  # an earlier one: replaced


def test_verify_fails_on_every_file_the_manifest_does_not_list(run_copy, capsys):
    (run_copy / "histograms" / "eval").mkdir()
    (run_copy / "histograms" / "eval" / "summary.parquet").write_bytes(b"confidential")
    (run_copy / "notes.txt").write_text("x")
    (run_copy / MARKER).write_text(json.dumps(new_marker("evaluate")))
    assert main(["verify", str(run_copy)]) == EXIT_VERIFY
    out = capsys.readouterr().out
    for name in ("histograms/eval/summary.parquet", "notes.txt", MARKER):
        assert f"{name}: not listed in the manifest" in out, out


def test_verify_fails_when_a_levels_sums_are_removed(run_copy):
    manifest = json.loads((run_copy / "manifest.json").read_text())
    del manifest["sha256"]["persons"]["Block"]
    (run_copy / "manifest.json").write_text(json.dumps(manifest))
    failures = verify_run(run_copy).failures
    assert any(f.startswith("histograms/persons/level=Block/part-00000.parquet: not listed") for f in failures)
    assert any(f.startswith("noisy_measurements/persons/level=Block/") for f in failures)


# ---------------------------------------------------------------------------------------- 5. one writer
@pytest.mark.parametrize("command", sorted(WRITERS))
def test_a_second_writer_is_refused_naming_the_first(command, demo_run, demo_input, tmp_path, capsys):
    if command == "batch":
        jobs = tmp_path / "jobs.toml"
        jobs.write_text(f'[[job]]\nname = "a"\nkind = "run"\nconfig = "demo"\ninput = "{demo_input}"\nout = "a"\n')
        out, argv = tmp_path / "jobs.logs", ["batch", jobs]
    else:
        out = tmp_path / ("out.json" if command in FILE_OUTPUTS else "out")
        argv = _argv(command, out, demo_run, demo_input, tmp_path)
    holder = claimed_file(out, command) if command in FILE_OUTPUTS else claimed(out, command)
    with holder:
        before = snapshot(out)
        said = "another batch over these jobs is running" if command == "batch" else "is locked by another"
        _refused(argv, capsys, said, f"pid {os.getpid()} on ")
        assert snapshot(out) == before
    assert not (out / LOCK).exists() and not (out.parent / f".{out.name}{LOCK}").exists()


@pytest.mark.parametrize("command", ["nmf", "uncertainty"])
def test_the_second_nmf_or_uncertainty_is_told_who_writes(command, demo_run, tmp_path):
    """As processes: the second writer exits 4 with one line naming the first (it reported an input error)."""
    out = tmp_path / ("u.parquet" if command == "uncertainty" else "nmf")
    with (claimed_file(out, command) if command == "uncertainty" else claimed(out, command)):
        outcome = topdown(*_argv(command, out, demo_run, tmp_path, tmp_path), cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_RUNDIR, str(out), f"is locked by another `topdown {command}` (pid {os.getpid()}")


def test_a_stale_lock_of_another_command_is_taken_over(demo_run, tmp_path, caplog):
    out = tmp_path / "nmf"
    out.mkdir()
    dead = subprocess.Popen([sys.executable, "-c", ""])
    dead.wait()
    (out / LOCK).write_text(f"pid {dead.pid} on {os.uname().nodename} since 2026-01-01T00:00:00")
    assert main(["nmf", str(demo_run), "--out", str(out), "--quiet"]) == EXIT_OK
    assert "took over the stale lock" in caplog.text and (out / "nmf.json").is_file() and not (out / LOCK).exists()
    assert read_marker(out)["command"] == "nmf"


# --------------------------------------------------------------------------- names that become paths
@given(st.text(max_size=MAX_NAME + 20))
@settings(max_examples=300, deadline=None)
def test_a_name_accepted_for_a_path_stays_in_its_folder(name):
    base = Path("/base/folder")
    if unsafe_name(name, "name") is None:
        assert os.path.normpath(base / name) == str(base / name) and (base / name).parent == base
        assert 1 <= len(name) <= MAX_NAME
    if "/" in name or name in ("", ".", "..") or len(name) > MAX_NAME:
        assert unsafe_name(name, "name") is not None


@pytest.mark.parametrize("name", ["../escape", "a/b", "..", "x" * (MAX_NAME + 1), "tab\there"])
def test_a_batch_job_name_that_would_leave_the_logs_folder_is_refused(name, tmp_path):
    jobs = tmp_path / "jobs.toml"
    jobs.write_text(f'[[job]]\nname = {json.dumps(name)}\nkind = "run"\nconfig = "demo"\nout = "out"\n')
    outcome = topdown("batch", jobs, cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_CONFIG, "jobs.toml", "job.0.name", "the job name")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["jobs.toml"]


@pytest.mark.parametrize("key, value", [("levels", ["US", "../../escape"]), ("products", ["persons", "a/b"]),
                                        ("completed", {"../x": ["US"]}), ("completed", {"persons": [".."]})])
def test_a_manifest_naming_a_path_outside_the_run_is_refused(key, value, run_copy, tmp_path, capsys):
    manifest = json.loads((run_copy / "manifest.json").read_text())
    manifest[key] = value
    (run_copy / "manifest.json").write_text(json.dumps(manifest))
    for argv in (["verify", run_copy], ["nmf", run_copy, "--out", tmp_path / "nmf"],
                 ["uncertainty", run_copy, "--out", tmp_path / "u.parquet", "--workers", "1"]):
        _refused(argv, capsys, "manifest.json", f"key '{key}", "would leave its folder")
    assert not (tmp_path / "nmf").exists() and not (tmp_path / "u.parquet").exists()


# --------------------------------------------------------------------------------------- confidentiality
def test_markers_locks_and_refusals_show_no_true_count(tmp_path, demo_run, capsys):
    """The new outputs (a marker, a lock, a refusal's line) of a confidential command over planted counts."""
    csv = block_csv(tmp_path / "planted.csv", persons=SECRETS[0])
    out = tmp_path / "input"
    assert main(["ingest", "blocks", str(csv), "--out", str(out), "--quiet"]) == EXIT_OK
    texts = [(out / MARKER).read_text()]
    with claimed(out, "ingest"):
        texts.append((out / LOCK).read_text())
        texts.append(_refused(["ingest", "blocks", csv, "--out", out, "--quiet"], capsys))
    texts.append(_refused(["ingest", "blocks", csv, "--out", demo_run / "input", "--quiet"], capsys))
    assert texts[-1] and all(leaked_secrets(t, SECRETS) == [] for t in texts), texts
    assert os.lstat(out / MARKER).st_mode & 0o077 == 0
