"""Every request bounded, every failure mapped (configuration/limits.py, docs/reference/exit-codes.md):
numbers, nesting, include chains, file kinds, name lengths, counts and seeds beyond their limits are refused
before any work with one line and exit code 2; declarations and inputs that would be accepted silently (two
levels for one input value, a unit minimum above its cap, a header-only block table, a level's sums removed
from a manifest) are refused with their own exit code; and a few corners answer correctly (exact counts get
[v, v], a leaf-level total constraint where the total is invariant, the census's own level names in messages).

The command-line cases run ``main`` in this process (``cli``); those that hung before run ``topdown`` in a
subprocess (tests/cli_subprocess.py) with a timeout, so that a hang fails the test instead of holding it.
"""
from __future__ import annotations

import json
import os
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from cli_subprocess import Outcome, assert_clean_failure, snapshot, topdown
from test_bad_inputs import _block_row

from topdown.pipeline.configuration.census import census_dir
from topdown.pipeline.configuration.config import ConfigError, load_config, parse_fraction
from topdown.pipeline.configuration.limits import MAX_DEPTH, MAX_INCLUDES, depth, read_text

EXIT_VERIFY, EXIT_CONFIG, EXIT_INPUT, EXIT_RUNDIR = 1, 2, 3, 4
LONG = "x" * 300

pytestmark = pytest.mark.smoke  # refusals in process: in the default selection (its subprocess cases are slow)


@pytest.fixture
def cli(capsys, monkeypatch):
    """``topdown ARGV`` run by ``main`` in this process, in the folder ``cwd``: its :class:`Outcome`."""
    from topdown.pipeline.cli import main

    def command(*argv: str | Path, cwd: Path) -> Outcome:
        args = [str(a) for a in argv]
        capsys.readouterr()
        with monkeypatch.context() as mp:
            mp.chdir(cwd)
            code = main([*args, "--quiet"] if args[0] not in ("privacy", "verify", "demo-data", "synth", "spine")
                        else args)
        captured = capsys.readouterr()
        return Outcome(tuple(args), code, captured.out, captured.err)
    return command


def _write(path: Path, text: str) -> Path:
    path.write_text(text)
    return path


# ------------------------------------------------------------------------------------------------- numbers
@pytest.mark.parametrize("command", ["privacy", "run"])
@pytest.mark.parametrize("value, fragment", [("1e-5000", "exponent -5000"), ("1e99999999", "exponent 99999999"),
                                             ("1/" + "7" * 120, "a number of 122 characters")])
def test_numbers_too_long_or_large_are_refused(cli, tmp_path, command, value, fragment):
    _write(tmp_path / "big.toml", f'include = "demo.toml"\n[persons.budget]\nrho = "{value}"\n')
    argv = ["privacy", "big.toml"] if command == "privacy" else ["run", "big.toml", "--out", "run", "--workers", "1"]
    assert_clean_failure(cli(*argv, cwd=tmp_path), EXIT_CONFIG, "big.toml",
                         "persons.budget.rho", fragment)
    assert not (tmp_path / "run").exists()


def test_a_fraction_within_the_limits_is_exact():
    assert parse_fraction("1e-400") == Fraction(1, 10**400)
    with pytest.raises(ValueError, match="exponent 401"):
        parse_fraction("3e401")


# ----------------------------------------------------------------------------------- TOML files and includes
def test_deep_nesting_is_refused(cli, tmp_path):
    _write(tmp_path / "deep.toml", "a = " + "[" * 2000 + "]" * 2000 + "\n")  # Python's parser recurses: no limit
    _write(tmp_path / "nested.toml", "a = " + "[" * (MAX_DEPTH + 1) + "]" * (MAX_DEPTH + 1) + "\n")
    for name in ("deep.toml", "nested.toml"):
        assert_clean_failure(cli("privacy", name, cwd=tmp_path), EXIT_CONFIG, name, f"deeper than {MAX_DEPTH}")
    assert depth({"a": [[1], {"b": 2}]}) == 3 and depth(7) == 0


def test_a_long_include_chain_is_refused(cli, tmp_path):
    for i in range(1, 200):
        _write(tmp_path / f"i{i}.toml", f'include = "i{i + 1}.toml"\n')
    _write(tmp_path / "i200.toml", 'include = "demo.toml"\n')
    assert_clean_failure(cli("privacy", "i1.toml", cwd=tmp_path), EXIT_CONFIG, f"i{MAX_INCLUDES}.toml",
                         f"a chain of more than {MAX_INCLUDES} files")
    _write(tmp_path / f"i{MAX_INCLUDES - 2}.toml", 'include = "demo.toml"\n')  # + demo's own include: the longest
    assert cli("privacy", "i1.toml", cwd=tmp_path).code == 0


@pytest.mark.parametrize("kind", ["fifo", "device", "folder"])
def test_an_include_that_is_not_a_regular_file_is_refused(tmp_path, kind):
    target = tmp_path / "target.toml"
    if kind == "fifo":
        os.mkfifo(target)  # reading it would wait for a writer for ever
    elif kind == "device":
        target.symlink_to("/dev/zero")  # reading it would never end
    else:
        target.mkdir()
    _write(tmp_path / "main.toml", 'include = "target.toml"\n')
    assert_clean_failure(topdown("privacy", "main.toml", cwd=tmp_path, timeout=60), EXIT_CONFIG, "target.toml",
                         "not a regular file")


def test_read_text_limits(tmp_path):
    big = tmp_path / "big.toml"
    with open(big, "wb") as fh:
        fh.truncate(16 * 2**20 + 1)
    with pytest.raises(ConfigError, match="above the limit of 16,777,216"):
        read_text(big, "the configuration")
    _write(tmp_path / "latin.toml", "")
    (tmp_path / "latin.toml").write_bytes(b"name = '\xe9'\n")
    with pytest.raises(ConfigError, match="not UTF-8"):
        read_text(tmp_path / "latin.toml", "the configuration")


def test_a_census_declaration_that_is_not_a_regular_file_is_refused(tmp_path):
    os.mkfifo(tmp_path / "decl.toml")
    _write(tmp_path / "run.toml", 'include = "demo.toml"\n[run]\ncensus = "decl.toml"\n')
    assert_clean_failure(topdown("privacy", "run.toml", cwd=tmp_path, timeout=60), EXIT_CONFIG, "decl.toml",
                         "not a regular file")


# ------------------------------------------------------------------------------------------- name lengths
#: Every command with an output or a path argument, given a 300-byte name (the file system's limit is 255).
LONG_NAMES = {
    "synth": ["synth", "--blocks", "3", LONG],
    "demo-data": ["demo-data", LONG],
    "run": ["run", "demo", "--out", LONG, "--workers", "1"],
    "nmf": ["nmf", "RUN", "--out", LONG],
    "uncertainty": ["uncertainty", "RUN", "--out", LONG],
    "evaluate": ["evaluate", "RUN", "--truth", "IN", "--out", LONG],
    "reprocess": ["reprocess", "RUN", "--out", LONG],
    "replicates": ["replicates", "RUN", "--n", "1", "--out", LONG],
    "privacy": ["privacy", "demo", "--out", LONG],
    "ingest": ["ingest", "blocks", "x.csv", "--out", LONG],
    "spine": ["spine", "--baf", "baf", "--out", LONG],
    "verify": ["verify", LONG],
    "batch": ["batch", LONG],
}


@pytest.mark.parametrize("command", sorted(LONG_NAMES))
def test_a_name_too_long_is_a_usage_error(cli, tmp_path, demo_run, demo_input, command):
    argv = [str(demo_run) if a == "RUN" else str(demo_input) if a == "IN" else a for a in LONG_NAMES[command]]
    assert_clean_failure(cli(*argv, cwd=tmp_path), EXIT_CONFIG, "is 300 bytes long", "at most 255 per name")
    assert snapshot(tmp_path) == {}


def test_a_long_name_inside_a_configuration_is_a_usage_error(cli, tmp_path):
    _write(tmp_path / "long.toml", f'include = "demo.toml"\n[run]\ninput = "{LONG}"\n')
    outcome = cli("run", "long.toml", "--out", "run", "--workers", "1", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_CONFIG, "a name too long for the file system", "at most 255")


# ------------------------------------------------------------------------------------------ counts and seeds
@pytest.mark.parametrize("argv, fragments", [
    (["--census", "chile_2017", "--persons", "99999999999999"], ["--persons 99999999999999", "400,000,000"]),
    (["--census", "chile_2017", "--persons", "0"], ["--persons 0", "from 1 to"]),
    (["--blocks", "3", "--persons", "-5"], ["--persons -5", "from 1 to"]),
    (["--blocks", "3", "--persons", "0"], ["--persons 0"]),
    (["--blocks", "3", "--states", "0"], ["--states 0", "from 1 to 52"]),
    (["--blocks", "0"], ["--blocks 0", "from 1 to 10,000,000"]),
    (["--blocks", "-3"], ["--blocks -3"]),
    (["--blocks", "99999999999"], ["--blocks 99999999999"]),
    (["--blocks", "3", "--seed", "-1"], ["--seed -1", "from 0 to"]),
])
def test_synth_counts_are_bounded(cli, tmp_path, argv, fragments):
    hung = "99999999999999" in argv  # it hung: in a subprocess, with a timeout
    outcome = (topdown("synth", *argv, "out", cwd=tmp_path, timeout=60) if hung
               else cli("synth", *argv, "out", cwd=tmp_path))
    assert_clean_failure(outcome, EXIT_CONFIG, *fragments)
    assert snapshot(tmp_path) == {}


@pytest.mark.parametrize("n", ["100000000000000000000", "1001", "0", "-1"])
def test_replicates_count_is_bounded(cli, tmp_path, demo_run, n):
    argv = ("replicates", demo_run, "--n", n, "--out", "reps", "--workers", "1")
    outcome = topdown(*argv, cwd=tmp_path, timeout=60) if len(n) > 10 else cli(*argv, cwd=tmp_path)  # it hung
    assert_clean_failure(outcome, EXIT_CONFIG, f"--n {n}", "from 1 to 1,000")
    assert snapshot(tmp_path) == {}


def test_negative_seeds_are_refused(cli, tmp_path, demo_input):
    outcome = cli("run", "demo", "--input", demo_input, "--out", "run", "--seed", "-1", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_CONFIG, "--seed -1")
    _write(tmp_path / "seed.toml", 'include = "demo.toml"\n[run]\nseed = -5\n')
    assert_clean_failure(cli("privacy", "seed.toml", cwd=tmp_path), EXIT_CONFIG, "seed.toml", "seed -5")
    outcome = cli("audit", "demo", "--input", demo_input, "--move", "440070001023003:440070001011006", "--runs",
                      "1", "--seed", "-2", "--out", "audit", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_CONFIG, "--seed -2")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["seed.toml"]


def test_an_empty_queries_list_is_refused(cli, tmp_path, demo_input):
    outcome = cli("audit", "demo", "--input", demo_input, "--move", "440070001023003:440070001011006", "--runs",
                      "1", "--queries", " , ", "--out", "audit", "--workers", "1", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_CONFIG, "--queries", "name at least one query")
    assert snapshot(tmp_path) == {}


# ------------------------------------------------------------------------------------- files of other kinds
def test_an_uncertainty_file_that_is_not_parquet_is_refused_before_the_evaluation(cli, tmp_path, demo_run, demo_input):
    _write(tmp_path / "u.parquet", "not Parquet\n")
    outcome = cli("evaluate", demo_run, "--truth", demo_input, "--uncertainty", "u.parquet", "--out", "ev",
                      "--workers", "1", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_INPUT, "u.parquet", "not a readable Parquet file")
    pd.DataFrame({"product": ["persons"]}).to_parquet(tmp_path / "u.parquet")
    outcome = cli("evaluate", demo_run, "--truth", demo_input, "--uncertainty", "u.parquet", "--out", "ev",
                      "--workers", "1", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_INPUT, "u.parquet", "not a `topdown uncertainty` file", "'level'")
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u.parquet"]


def _edited_run(demo_run: Path, tmp_path: Path, edit) -> Path:
    run = tmp_path / "run"
    shutil.copytree(demo_run, run)
    manifest = json.loads((run / "manifest.json").read_text())
    edit(manifest)
    (run / "manifest.json").write_text(json.dumps(manifest, indent=2))
    return run


def test_a_manifest_whose_levels_are_not_the_census_levels_is_refused(cli, demo_run, tmp_path):
    def rename(manifest):
        manifest["levels"][2] = "Nope"
    run = _edited_run(demo_run, tmp_path, rename)
    for argv in (["verify", run], ["nmf", run, "--out", "nmf"]):
        assert_clean_failure(cli(*argv, cwd=tmp_path), EXIT_RUNDIR, "manifest.json", "'Nope'",
                             "not the levels of census 'pl94'")
    assert not (tmp_path / "nmf").exists()


def test_verify_fails_a_completed_level_whose_sums_were_removed(cli, demo_run, tmp_path):
    run = _edited_run(demo_run, tmp_path, lambda m: m["sha256"]["persons"].pop("Tract"))
    outcome = cli("verify", run, cwd=tmp_path)
    assert outcome.code == EXIT_VERIFY, str(outcome)
    assert "persons Tract: a completed level whose SHA-256 sums the manifest does not record" in outcome.stdout


# -------------------------------------------------------------------------------------- silent acceptance
def _decl(tmp_path: Path, old: str, new: str, census: str = "e2e_1940") -> Path:
    text = (census_dir() / f"{census}.toml").read_text()
    assert old in text
    return _write(tmp_path / "decl.toml", text.replace(old, new))


@pytest.mark.parametrize("old, new, fragments", [
    ("values = [[1, 0], [2, 1], [3, 2], [4, 3], [5, 4], [6, 5]]", "values = [[1, 0], [1, 1], [3, 2], [4, 3]]",
     ["census.products.persons.attributes[3].values[1]", "input value 1 is already mapped", "values[0]"]),
    ("min_per_unit = [1, 1, 1, 1, 1, 1, 1, 1]", "min_per_unit = [100, 1, 1, 1, 1, 1, 1, 1]",
     ["census.products.persons.unit_bounds.min_per_unit[0]", "above cap[0] = 99", "got 100"]),
])
def test_declarations_accepted_silently_before_are_refused(cli, tmp_path, old, new, fragments):
    _decl(tmp_path, old, new)
    assert_clean_failure(cli("synth", "--census", "decl.toml", "--persons", "100", "out", cwd=tmp_path),
                         EXIT_CONFIG, "decl.toml", *fragments)
    assert not (tmp_path / "out").exists()


def test_a_header_only_block_table_is_refused(cli, tmp_path):
    pd.DataFrame([_block_row("440070001001001", 5)]).iloc[:0].to_csv(tmp_path / "blocks.csv", index=False)
    outcome = cli("ingest", "blocks", "blocks.csv", "--out", "in", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_INPUT, "blocks.csv", "no blocks (a header without rows)")
    assert not (tmp_path / "in").exists()


@pytest.mark.parametrize("source", ["a-file.txt", "absent"])
def test_ingest_pl94_blames_a_bad_source(cli, tmp_path, source):
    _write(tmp_path / "a-file.txt", "hello\n")
    outcome = cli("ingest", "pl94", source, "--out", "in", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_INPUT, source, "directory of")
    assert not (tmp_path / "in").exists()


# ------------------------------------------------------------------------------------------------- corners
def test_an_exact_count_gets_a_degenerate_interval():
    from topdown.pipeline.evaluation.bounded import count_interval

    est = np.array([9.999999999999998, 10.000000000000002, 3000.0000000000005, 0.4, 7.0])
    sd = np.array([0.0, 1e-12, 0.0, 0.0, 2.0])
    lo, hi = count_interval(est, sd, 0.90)
    assert lo[:4].tolist() == [10, 10, 3000, 0] and hi[:4].tolist() == [10, 10, 3000, 0]
    assert lo[4] < 7 < hi[4]


def _chile(tmp_path: Path, toml: str) -> Path:
    return _write(tmp_path / "chile.toml", 'include = "chile_2017.toml"\n' + toml)


LEAF = ('[persons.invariants]\nDistrict = ["tot"]\n[persons.constraints]\nNation = ["total"]\nRegion = ["total"]\n'
        'Province = ["total"]\nCommune = ["total"]\nDistrict = ["total"]\n')


def test_a_leaf_total_constraint_is_accepted_where_the_total_is_invariant(tmp_path):
    config = load_config(_chile(tmp_path, LEAF))
    assert config.product("persons").constraints["District"] == ["total"]


@pytest.mark.parametrize("toml, fragments", [
    ('[persons.invariants]\nDistrict = ["tot"]\n[persons.constraints]\nNation = ["total"]\nDistrict = ["total"]\n',
     ["[persons.invariants] District", "Region, Province, Commune have no constraint", "'total'"]),
    ('[persons.constraints]\nNation = ["total"]\nProvince = ["total"]\n',
     ["[persons.constraints] Province", "needs the total invariant at Province", "(tot)"]),
])
def test_a_total_the_configuration_cannot_bind_is_refused_at_load(tmp_path, toml, fragments):
    with pytest.raises(ConfigError) as err:
        load_config(_chile(tmp_path, toml))
    for fragment in fragments:
        assert fragment in str(err.value), str(err.value)


def test_a_us_total_below_state_is_refused(tmp_path):
    path = _write(tmp_path / "us.toml", 'include = "demo.toml"\n[persons.invariants]\nState = ["tot"]\n'
                                        'County = ["tot"]\n')
    with pytest.raises(ConfigError, match="invariant down to State at most"):
        load_config(path)


def test_configuration_errors_come_before_the_input(cli, tmp_path):
    """A configuration that cannot be bound is refused (exit 2) though its input does not even exist."""
    _chile(tmp_path, '[persons.constraints]\nNation = ["total"]\nProvince = ["total"]\n')
    outcome = cli("run", "chile.toml", "--input", "no-such-input", "--out", "run", "--workers", "1", cwd=tmp_path)
    assert_clean_failure(outcome, EXIT_CONFIG, "chile.toml", "[persons.constraints] Province")


def test_messages_use_the_census_level_names():
    from topdown.geo import GeographyError
    from topdown.geo.spine import Spine

    table = pd.DataFrame({"geoid": ["A-1", "A-1"], "Nation": ["CL", "CL"], "Region": ["A", "A"],
                          "District": ["A-1", "A-1"]})
    with pytest.raises(GeographyError, match="spine table: District A-1 appears twice"):
        Spine(["Nation", "Region", "District"], table, kind="standard", state=None)
