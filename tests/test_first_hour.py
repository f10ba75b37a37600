"""What a new user meets in the first hour: errors that name keys as written and suggest the key, preset or census
meant; ``include`` of a preset by name; a command piped into ``head``; a declared census's synthetic input read by
pandas; the test-mode warning from Python; ``submit`` from a plain script."""
from __future__ import annotations

import subprocess
import sys
import textwrap
import warnings
from pathlib import Path

import pandas as pd
import pytest

from topdown.pipeline.cli import EXIT_CLOSED_PIPE, EXIT_CONFIG, main
from topdown.pipeline.configuration.census import load_census
from topdown.pipeline.configuration.config import ConfigError, load_config
from topdown.pipeline.configuration.errors import did_you_mean
from topdown.pipeline.execution.batch import load_jobs
from topdown.pipeline.execution.cluster import _guarded
from topdown.pipeline.inputs.synth import partition_folder, write_census
from topdown.pipeline.privacy.certificate import NOT_PRIVATE_WARNING, NotPrivateWarning, warn_not_private

from conftest import REPO

TINY = """
[census]
name = "tiny"
[census.hierarchy]
root_code = "N"
levels = [{ name = "Nation" }, { name = "Region", column = "region" }, { name = "District", column = "district" }]
[census.products.people]
[[census.products.people.attributes]]
name = "sex"
size = 2
"""


def _error(tmp_path: Path, text: str, name: str = "bad.toml") -> str:
    (tmp_path / name).write_text(text)
    with pytest.raises(ConfigError) as err:
        load_config(tmp_path / name)
    return str(err.value)


# -- errors name keys as written, and suggest what was meant -------------------------------------------------
@pytest.mark.parametrize("toml, fragments", [
    ('include = "demo"\n[persons.budget]\nrhoo = "1"\n', ("persons.budget.rhoo: unknown key", "did you mean 'rho'?")),
    ('include = "demo"\n[run]\nmod = "test"\n', ("run.mod: unknown key", "did you mean 'mode'?")),
    ('include = "demo"\n[persns.budget]\nrho = "1"\n', ("[persns]: not a product", "did you mean 'persons'?")),
    ('include = "demo"\n[persons.budget.levels]\nBlok = "1"\n', ("persons.budget.levels.Blok: unknown level",
                                                               "did you mean 'Block'?")),
    ('include = "demo"\n[persons.invariants]\nStat = ["tot"]\n', ("names level 'Stat'", "did you mean 'State'?")),
    ('include = "demo"\n[persons.constraints]\nState = ["totl"]\n', ("unknown constraint 'totl'",
                                                                    "did you mean 'total'?")),
    ('include = "demo"\n[run]\nproducts = ["persns"]\n', ("run.products", "did you mean 'persons'?")),
    ('include = "demo"\n[run]\ncensus = "e2e1940"\n', ("bad.toml: run.census 'e2e1940'", "no such census",
                                                       "did you mean 'e2e_1940'?")),
    ('include = "dmeo"\n', ("'include'", "shipped preset", "did you mean 'demo'?")),
])
def test_a_misspelling_names_the_key_as_written_and_what_was_meant(tmp_path, toml, fragments):
    message = _error(tmp_path, toml)
    assert message.startswith(str(tmp_path / "bad.toml")) and "products." not in message and "\n" not in message
    for fragment in fragments:
        assert fragment in message, message


def test_a_misspelt_query_term_in_a_budget_gets_a_suggestion(tmp_path):
    from topdown.pipeline.privacy.certificate import certificate

    (tmp_path / "bad.toml").write_text('include = "demo"\n[persons.budget.queries.US]\n"totl" = "1"\n')
    with pytest.raises(ConfigError, match=r"bad.toml: persons.budget.queries.US.\"totl\": unknown query term .*"
                                          r"; did you mean 'total'\?$"):
        certificate(load_config(tmp_path / "bad.toml"))


def test_a_misspelt_required_key_is_reported_once_not_as_missing(tmp_path):
    """``l2_pass`` for ``l2_passes``: one line, the misspelling and its fix, not also "l2_passes: Field required"."""
    text = (REPO / "conf" / "pl94_production_2021.toml").read_text()
    message = _error(tmp_path, text.replace("[persons.estimation.l2_passes]", "[persons.estimation.l2_pass]"))
    assert "persons.estimation.l2_pass: unknown key" in message and "did you mean 'l2_passes'?" in message
    assert "Field required" not in message and "\n" not in message and "products." not in message


def test_a_missing_product_table_key_is_named_as_written(tmp_path):
    message = _error(tmp_path, '[run]\nproducts = ["persons"]\nmode = "test"\nseed = 1\n[persons.budget]\nrho = "1"\n')
    assert "persons.budget.levels: Field required" in message and "products." not in message


def test_misspelt_presets_censuses_and_declaration_keys_get_a_suggestion(tmp_path, capsys, monkeypatch):
    with pytest.raises(ConfigError, match=r"dmeo: no such configuration file.*; did you mean 'demo'\?"):
        load_config("dmeo")
    (tmp_path / "mine.toml").write_text(TINY)
    monkeypatch.chdir(tmp_path)
    with pytest.raises(ConfigError, match=r"mine_.toml: no such census declaration.*; did you mean 'mine.toml'\?"):
        load_census("mine_.toml")
    (tmp_path / "typo.toml").write_text(TINY.replace('root_code = "N"', 'root_cod = "N"'))
    with pytest.raises(ConfigError, match=r"census.hierarchy.root_cod: unknown key .*; did you mean 'root_code'\?"):
        load_census("typo.toml")
    (tmp_path / "jobs.toml").write_text('[[job]]\nname = "a"\nkind = "run"\nout = "x"\nconfg = "demo"\n')
    with pytest.raises(ConfigError, match=r"job.0.confg: unknown key .*; did you mean 'config'\?"):
        load_jobs(tmp_path / "jobs.toml")
    assert main(["synth", "--census", "e2e1940", "--persons", "10", "--seed", "1", str(tmp_path / "s")]) == EXIT_CONFIG
    assert "--census 'e2e1940': no such census declaration" in capsys.readouterr().err
    assert did_you_mean("zzzz", ["rho", "epsilon"]) == ""  # nothing close: no suggestion


def test_include_takes_a_preset_name(tmp_path):
    """``include = "demo"`` as presets are named everywhere else; a file that is not TOML is still refused."""
    (tmp_path / "by_name.toml").write_text('include = "demo"\n[run]\nseed = 5\n')
    (tmp_path / "by_file.toml").write_text('include = "demo.toml"\n[run]\nseed = 5\n')
    assert load_config(tmp_path / "by_name.toml").digest() == load_config(tmp_path / "by_file.toml").digest()
    (tmp_path / "notes.txt").write_text('[run]\nname = "x"\n')
    assert "'notes.txt'" in _error(tmp_path, 'include = "notes.txt"\n')


# -- a closed pipe ------------------------------------------------------------------------------------------------
@pytest.mark.parametrize("argv", [["privacy", "demo", "--json"], ["privacy", "demo"]])
def test_a_command_whose_reader_left_stops_quietly(argv):
    """``topdown privacy demo --json | head -2``: stdout closed before the command writes: no traceback, exit 141
    (as the shell reports a tool stopped by SIGPIPE)."""
    proc = subprocess.Popen([sys.executable, "-m", "topdown.pipeline.cli", *argv], stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE)
    proc.stdout.close()  # the reader has gone before the first write
    err = proc.stderr.read().decode()
    assert proc.wait(timeout=120) == EXIT_CLOSED_PIPE and err == "", err


# -- synthetic input readable by pandas ------------------------------------------------------------------------
def test_a_column_hierarchys_synthetic_input_is_read_by_pandas(tmp_path):
    """The records hold the first level's column, so its partitions are folders named by code, not hive keys of
    the same name (pyarrow: "Unable to merge: Field region has incompatible types")."""
    (tmp_path / "tiny.toml").write_text(TINY)
    write_census(tmp_path / "input", load_census(tmp_path / "tiny.toml"), persons=3000, seed=1)
    frame = pd.read_parquet(tmp_path / "input" / "people")
    assert len(frame) == 3000 and list(frame.columns) == ["region", "district", "sex"]
    assert sorted(p.name for p in (tmp_path / "input" / "people").iterdir()) == sorted(frame["region"].unique())
    assert partition_folder("state", "06", ["geocode", "sex"]) == "state=06"
    assert partition_folder("region", "06", ["region", "sex"]) == "06"


# -- the test-mode warning from Python -------------------------------------------------------------------------
def test_run_warns_of_test_mode_once_per_run(tmp_path):
    """``run`` (and so ``submit``) warns before it starts, every run (warnings.warn would show it once per line)."""
    from topdown.pipeline import run

    config = load_config("demo").with_overrides(build_demo_input=False)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("default")
        for _ in range(2):
            with pytest.raises(FileNotFoundError):  # stops at the missing input, after the warning
                run(config, tmp_path / "out", input_dir=tmp_path / "missing", workers=1)
    shown = [w for w in caught if issubclass(w.category, NotPrivateWarning)]
    assert len(shown) == 2 and all(NOT_PRIVATE_WARNING in str(w.message) and "seed 2021" in str(w.message)
                                   for w in shown)
    assert shown[0].filename == __file__  # it points at the caller's line
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        warn_not_private(load_config("pl94_production_2021"))
    assert caught == []


# -- a plain script --------------------------------------------------------------------------------------------
def _script(tmp_path: Path, body: str) -> subprocess.CompletedProcess:
    path = tmp_path / "script.py"
    path.write_text(textwrap.dedent(body))
    return subprocess.run([sys.executable, str(path)], cwd=tmp_path, capture_output=True, text=True, timeout=300)


def test_submit_from_an_unguarded_script_says_what_to_do(tmp_path):
    """Without ``if __name__ == "__main__":`` the embedded cluster's spawned workers would run the script again
    (each submitting the run, finding it locked, never starting: "Nanny failed to start"); it is refused at once,
    before anything is written, in one line that says what to do."""
    done = _script(tmp_path, """\
        from topdown.pipeline import load_config, submit

        job = submit(load_config("demo"), "runs/demo", workers=1)
        print(job.result())
        """)
    last = done.stderr.strip().splitlines()[-1]
    assert done.returncode == 1 and "ConfigError" in last, done.stderr
    assert f"{tmp_path / 'script.py'}, line 3" in last and 'if __name__ == "__main__":' in last
    assert "Nanny" not in done.stderr and not (tmp_path / "runs").exists()


def test_the_guard_check_passes_a_guarded_script_and_code_it_imports(tmp_path):
    done = _script(tmp_path, """\
        from topdown.pipeline.execution.cluster import check_main_guarded

        def main():
            check_main_guarded()

        if __name__ == "__main__":
            main()
            print("ok")
        """)
    assert done.returncode == 0 and done.stdout == "ok\n", done.stderr
    tree = __import__("ast").parse('x = 1\nif "__main__" == __name__:\n    y()\nelse:\n    z()\n')
    assert [_guarded(tree, line) for line in (1, 3, 5)] == [False, True, False]
