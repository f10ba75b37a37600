"""The command line explains itself: ``--version``, and every command's help has an example that parses, the
exit codes, and a help text for each argument."""
from __future__ import annotations

import argparse
import json
import shlex
import subprocess
import sys

import pytest

from topdown.pipeline.cli import EXAMPLES, EXIT_OK, build_parser, main
from topdown.pipeline.runtime.outdir import MARKER_KEY

PARSER = build_parser()
COMMANDS = next(a for a in PARSER._actions if isinstance(a, argparse._SubParsersAction)).choices


def test_version_names_the_installed_distribution(capsys):
    with pytest.raises(SystemExit) as stop:
        main(["--version"])
    assert stop.value.code == 0
    out = capsys.readouterr().out
    assert out.startswith("topdown (census-topdown) ") and out.split()[-1][0].isdigit()


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_command_shows_an_example_that_parses_and_the_exit_codes(name):
    text = COMMANDS[name].format_help()
    assert f"example:\n  {EXAMPLES[name]}\n" in text
    assert "exit codes: 0 success;" in text and "4 run directory unusable" in text.replace("\n", " ")
    argv = shlex.split(EXAMPLES[name])
    assert argv[:2] == ["topdown", name]
    assert PARSER.parse_args(argv[1:]).command == name


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_every_argument_says_what_it_is(name):
    undocumented = [a.dest for a in COMMANDS[name]._actions if not a.help]
    assert undocumented == [], f"topdown {name}: arguments without help: {undocumented}"


def test_privacy_prints_and_writes_a_file_only_when_asked(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    assert main(["privacy", "demo", "--json"]) == EXIT_OK
    printed = json.loads(capsys.readouterr().out)
    assert list(tmp_path.iterdir()) == []
    assert main(["privacy", "demo", "--out", "cert.json"]) == EXIT_OK
    written = json.loads((tmp_path / "cert.json").read_text())
    assert written.pop(MARKER_KEY) == {"format": "census-topdown", "command": "privacy"} and written == printed
    assert [p.name for p in tmp_path.iterdir()] == ["cert.json"]


@pytest.mark.parametrize("argv", [["verify", "{run}"], ["privacy", "demo"], ["nmf", "--help"]])
def test_commands_without_a_cluster_start_without_dask(demo_run, argv):
    """``distributed`` costs seconds to import under load; verify, privacy and every --help do without it."""
    argv = [a.format(run=demo_run) for a in argv]
    code = ("import sys\nfrom topdown.pipeline.cli import main\n"
            f"try:\n    code = main({argv!r})\nexcept SystemExit as stop:\n    code = stop.code\n"
            "print(code, sorted(m for m in ('distributed', 'dask', 'pyomo') if m in sys.modules))")
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    assert done.stdout.splitlines()[-1] == "0 []", done.stdout + done.stderr
