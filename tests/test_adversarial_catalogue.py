"""The adversarial catalogue (tests/adversarial_catalogue.py) run case by case, each in its own subprocess as a
user or an attacker meets it: the documented exit code; for a failure one line naming what is wrong (``topdown:
...``, or argparse's usage and its one error line), no traceback (the embedded cluster's workers included);
no hang (each process has a time limit); nothing written, removed or half-written in the case's folder; the
shared runs and inputs untouched; no planted confidential count in what it printed.

The shared runs are built once: the U.S. planted run and input (conftest.py), and here a Chilean synthetic input,
a test-mode run of it, and a second run whose census is declared by a path relative to its configuration, made in
its own folder and then moved (a run directory must stand alone). The default selection takes every 32nd case
(``smoke``); ``-m slow`` the others (``python tests/adversarial_tally.py`` counts them by class and outcome).
"""
from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
from adversarial_catalogue import EXIT_OK, EXIT_VERIFY, Case, catalogue, sample
from cli_subprocess import Outcome, api, topdown
from conftest import DATA, PL94_DIR
from rel_inputs import leaked_secrets
from test_adversarial_silent import block_csv
from test_bad_inputs import _snapshot

CASES = catalogue()
SAMPLE = sample(CASES)
CHILE_TEST = 'include = "chile_2017.toml"\n[run]\nmode = "test"\nseed = 7\n'
_ARGPARSE = re.compile(r"^topdown [\w-]+: error: ")


@pytest.fixture(scope="module")
def fields(planted, planted_run, tmp_path_factory) -> dict[str, str]:
    """The shared runs, inputs and sources a case's command line names (adversarial_catalogue.FIELDS)."""
    from topdown.pipeline.configuration.census import census_dir

    base = tmp_path_factory.mktemp("adversarial")
    conf = base / "chile_test.toml"
    conf.write_text(CHILE_TEST)
    for argv in (("synth", "--census", "chile_2017", "--persons", "20000", "--seed", "1", base / "cinput"),
                 ("run", conf, "--input", base / "cinput", "--out", base / "crun", "--workers", "1", "--quiet")):
        done = topdown(*argv)
        assert done.code == EXIT_OK, str(done)
    made = base / "made"
    made.mkdir()
    shutil.copy(census_dir() / "chile_2017.toml", made / "mine.toml")
    (made / "c.toml").write_text(CHILE_TEST.replace("[run]\n", '[run]\ncensus = "mine.toml"\n'))
    done = topdown("run", "c.toml", "--input", base / "cinput", "--out", "run", "--workers", "1", "--quiet", cwd=made)
    assert done.code == EXIT_OK, str(done)
    (base / "elsewhere").mkdir()
    shutil.move(made / "run", base / "elsewhere" / "moved")
    shutil.rmtree(made)
    return {"run": str(planted_run), "input": str(planted), "crun": str(base / "crun"), "cinput": str(base / "cinput"),
            "cconf": str(conf), "moved": str(base / "elsewhere" / "moved"),
            "blocks": str(block_csv(base / "blocks.csv")), "pl94": str(PL94_DIR), "baf": str(DATA / "ri_baf2020")}


def _fingerprint(paths: list[str]) -> dict[str, tuple]:
    """Each shared folder's files by name, size and modification time (a cheap check that nothing changed)."""
    found = {}
    for path in paths:
        for f in sorted(Path(path).rglob("*")):
            st = f.lstat()
            found[str(f)] = (st.st_size, st.st_mtime_ns, f.is_dir())
    return found


def the_line(outcome: Outcome) -> str:
    """A failure's one message line: ``topdown: ...`` alone, or argparse's usage lines and its one error line."""
    lines = outcome.message_lines()
    assert lines, f"no message:\n{outcome}"
    if _ARGPARSE.match(lines[-1]):
        assert all(ln.startswith("usage: ") or ln.startswith(" ") for ln in lines[:-1]), f"not one line:\n{outcome}"
    else:
        assert len(lines) == 1 and lines[0].startswith("topdown: "), f"not a one-line message:\n{outcome}"
    return lines[-1]


def _marks(case: Case) -> list:
    marks = [pytest.mark.smoke] if case.id in SAMPLE else []  # a sample in the default selection
    if case.xfail:
        marks.append(pytest.mark.xfail(reason=case.xfail, strict=True))
    return marks


@pytest.mark.parametrize("case", [pytest.param(c, id=c.id, marks=_marks(c)) for c in CASES])
def test_case(case: Case, fields: dict[str, str], tmp_path: Path):
    values = {**fields, "tmp": str(tmp_path)}
    if case.setup:
        case.setup(tmp_path, values)
    before = _snapshot(tmp_path)
    shared = [fields[k] for k in ("run", "input", "crun", "cinput", "moved")]
    shared_before = _fingerprint(shared)
    cwd = Path(case.cwd.format_map(values))
    try:
        if case.argv[0] == "api":
            outcome = api(case.argv[1].format_map(values), cwd=cwd, timeout=case.timeout)
        else:
            outcome = topdown(*(a.format_map(values) for a in case.argv), cwd=cwd, timeout=case.timeout,
                              env=dict(case.env))
    except subprocess.TimeoutExpired:
        pytest.fail(f"hang: {case.id} ran past {case.timeout} s")
    assert outcome.code == case.code, str(outcome)
    assert outcome.tracebacks() == [], str(outcome)
    if case.code not in (EXIT_OK, EXIT_VERIFY):
        line = the_line(outcome)
        for fragment in case.says:
            assert fragment.format_map(values) in line, f"{fragment!r} not in the message:\n{outcome}"
        assert leaked_secrets(outcome.text) == [], str(outcome)
    if case.writes:
        case.check(tmp_path)
    else:
        assert _snapshot(tmp_path) == before, f"{tmp_path} changed:\n{outcome}"
    assert _fingerprint(shared) == shared_before, f"a shared run or input changed:\n{outcome}"


def test_the_catalogue_is_large_covers_every_command_and_class_and_the_sample_is_small():
    from topdown.pipeline.cli import build_parser
    from adversarial_catalogue import CLASSES

    commands = set(next(a for a in build_parser()._actions if a.dest == "command").choices)
    assert len(CASES) >= 400 and len({c.id for c in CASES}) == len(CASES)
    assert {c.target.split("/")[0] for c in CASES} == commands | {"api"}
    assert {c.klass for c in CASES} == set(CLASSES)
    assert sum("chile" in c.target or "{c" in " ".join(c.argv) for c in CASES) >= 100
    assert 0 < len(SAMPLE) <= len(CASES) // 20
