"""The bad-input catalogue: every bad input file, configuration or run directory stops ``topdown run``
with its exit code (2 configuration, 3 input, 4 run directory) and a message naming the file, column,
row or configuration key, writes no output (no histograms, measurements, MDF, invariants, spine,
certificate or manifest; the lock released), and discloses none of the planted confidential counts.

All cases run on the small planted input of ``rel_inputs`` and fail before a Dask cluster starts.
"""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from rel_inputs import leaked_secrets, no_partial_output, persons_frame, units_frame, write_planted_input
from topdown.pipeline.cli import EXIT_CONFIG, EXIT_INPUT, EXIT_RUNDIR, main
from topdown.pipeline.config import ConfigError, load_config


@dataclass
class Case:
    """One bad case: how to break the input/config/output, the exit code, and message fragments."""

    name: str
    code: int
    expect: tuple[str, ...]
    persons: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    units: Callable[[pd.DataFrame], pd.DataFrame] | None = None
    toml: str | None = None  # configuration text (including the demo preset) instead of "demo"
    files: Callable[[Path], None] | None = None  # damage the written input files
    args: tuple[str, ...] = ()
    out: Callable[[Path], Path] | None = None  # a bad run directory
    input_dir: Callable[[Path], Path] | None = None
    extra: dict = field(default_factory=dict)


def _set(frame: pd.DataFrame, row: int, **values) -> pd.DataFrame:
    frame = frame.copy()
    for col, value in values.items():
        if frame[col].dtype != object and not isinstance(value, (int, bool)):
            frame[col] = frame[col].astype(object)
        frame.loc[row, col] = value
    return frame


def _truncate(path: Path) -> None:
    data = (path / "persons.parquet").read_bytes()
    (path / "persons.parquet").write_bytes(data[: len(data) // 2])


def _file_parent(tmp: Path) -> Path:
    (tmp / "a-file").write_text("not a directory")
    return tmp / "a-file" / "run"


def _existing_file(tmp: Path) -> Path:
    (tmp / "run-file").write_text("x")
    return tmp / "run-file"


DEMO = 'include = "demo.toml"\n'
ROW = 5000  # a person row in block 440070001001002 (household, adult, Hispanic)

CASES = [
    # ---- input files (exit 3) ------------------------------------------------------------------
    Case("truncated_parquet", EXIT_INPUT, ("persons.parquet", "not a readable Parquet file"), files=_truncate),
    Case("missing_column", EXIT_INPUT, ("persons.parquet", "'cenrace'", "required column missing"),
         persons=lambda p: p.drop(columns="cenrace")),
    Case("wrong_type_code", EXIT_INPUT, ("persons.parquet", "'hhgq'", "wrong type", "expected an integer"),
         persons=lambda p: p.astype({"hhgq": str})),
    Case("wrong_type_geoid", EXIT_INPUT, ("units.parquet", "'geoid'", "wrong type"),
         units=lambda u: u.astype({"geoid": "int64"})),
    Case("wrong_type_flag", EXIT_INPUT, ("units.parquet", "'occupied'", "expected bool"),
         units=lambda u: u.astype({"occupied": str})),
    Case("short_geoid", EXIT_INPUT, ("persons.parquet", "'geoid'", f"row {ROW}", "malformed GEOID", "'44007000100100'"),
         persons=lambda p: _set(p, ROW, geoid="44007000100100")),
    Case("letters_in_geoid", EXIT_INPUT, ("units.parquet", "'geoid'", "row 7", "malformed GEOID"),
         units=lambda u: _set(u, 7, geoid="44007000100100X")),
    Case("cenrace_out_of_range", EXIT_INPUT, ("persons.parquet", "'cenrace'", f"row {ROW}", "0..62", "63"),
         persons=lambda p: _set(p, ROW, cenrace=63)),
    Case("negative_code", EXIT_INPUT, ("persons.parquet", "'hispanic'", "row 3", "0..1", "-1"),
         persons=lambda p: _set(p, 3, hispanic=-1)),
    Case("unit_type_out_of_range", EXIT_INPUT, ("units.parquet", "'unit_type'", "row 0", "0..7"),
         units=lambda u: _set(u, 0, unit_type=8)),
    Case("null_value", EXIT_INPUT, ("persons.parquet", "'votingage'", "row 10", "null"),
         persons=lambda p: p.astype({"votingage": "Int64"}).pipe(lambda q: _set(q, 10, votingage=pd.NA))),
    Case("person_in_block_without_units", EXIT_INPUT,
         ("persons.parquet", "'hhgq'", f"row {ROW}", "440070002001009", "no housing unit"),
         persons=lambda p: _set(p, ROW, geoid="440070002001009")),
    Case("gq_person_without_facility", EXIT_INPUT,
         ("persons.parquet", "'hhgq'", f"row {ROW}", "440070001001002", "no GQ facility of type 6"),
         persons=lambda p: _set(p, ROW, hhgq=6)),
    Case("gq_facility_without_residents", EXIT_INPUT, ("units.parquet", "'unit_type'", "440070001001001", "hhgq_total_lb"),
         units=lambda u: pd.concat([pd.DataFrame({"geoid": ["440070001001001"], "unit_type": [7], "occupied": [True]}), u],
                                   ignore_index=True)),
    Case("unoccupied_gq", EXIT_INPUT, ("units.parquet", "'occupied'", "GQ facility of type 3", "unoccupied"),
         units=lambda u: u.assign(occupied=u["occupied"] & (u["unit_type"] != 3))),
    Case("minor_in_nursing_facility", EXIT_INPUT, ("persons.parquet", "'votingage'", "nurse_nva_0"),
         persons=lambda p: p.assign(votingage=p["votingage"].where(p["hhgq"] != 3, 0))),
    Case("missing_input_directory", EXIT_INPUT, ("no-such-input", "persons.parquet", "not found"),
         input_dir=lambda tmp: tmp / "no-such-input"),
    Case("infeasible_invariants", EXIT_INPUT, ("hh_lb_occupied", "Block", "440070002001002", "infeasible"),
         units=lambda u: u.assign(occupied=u["occupied"] | (u["geoid"] == "440070002001002")),
         toml=DEMO + '[persons.constraints]\nBlock = ["hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0", "hh_lb_occupied"]\n'),
    # ---- configuration (exit 2) ----------------------------------------------------------------
    Case("malformed_toml", EXIT_CONFIG, ("bad.toml", "not valid TOML"), toml=DEMO + "[run\nname = 'x'\n"),
    Case("unknown_key", EXIT_CONFIG, ("run.nmae", "Extra inputs are not permitted"), toml=DEMO + '[run]\nnmae = "x"\n'),
    Case("unknown_preset", EXIT_CONFIG, ("no_such_preset", "no such configuration file or shipped preset"),
         extra={"config": "no_such_preset"}),
    Case("float_budget", EXIT_CONFIG, ("persons.budget.levels.US", "exact fractions"),
         toml=DEMO + "[persons.budget.levels]\nUS = 0.025\n"),
    Case("malformed_fraction", EXIT_CONFIG, ("persons.budget.levels.US", "not an exact fraction"),
         toml=DEMO + '[persons.budget.levels]\nUS = "1//40"\n'),
    Case("levels_not_summing_to_one", EXIT_CONFIG, ("persons.budget.levels", "sum to", "not exactly 1"),
         toml=DEMO + '[persons.budget.levels]\nUS = "1/2"\n'),
    Case("queries_not_summing_to_one", EXIT_CONFIG, ("units.budget.queries.Block", "sum to", "not exactly 1"),
         toml=DEMO + '[units.budget.queries.Block]\noccupancy = "1/2"\n'),
    Case("negative_proportion", EXIT_CONFIG, ("persons.budget.levels.US", "negative"),
         toml=DEMO + '[persons.budget.levels]\nUS = "-104/4099"\nState = "1648/4099"\n'),
    Case("zero_rho", EXIT_CONFIG, ("persons.budget", "rho must be positive"), toml=DEMO + '[persons.budget]\nrho = "0"\n'),
    Case("unknown_mechanism", EXIT_CONFIG, ("units.budget.mechanism", "laplace"),
         toml=DEMO + '[units.budget]\nmechanism = "laplace"\n'),
    Case("unknown_query", EXIT_CONFIG, ("persons.budget.queries.US", "votingage * hispanics", "unknown query term"),
         toml=DEMO + '[persons.budget.queries.US]\n"votingage * hispanics" = "0"\n'),
    Case("query_not_a_partition", EXIT_CONFIG, ("units.budget.queries.US", "occupied", "not a partition"),
         toml=DEMO + '[units.budget.queries.US]\noccupancy = "1/2"\noccupied = "1/2"\n'),
    Case("unknown_level", EXIT_CONFIG, ("persons.budget.levels.Blok", "unknown level"),
         toml=DEMO + '[persons.budget.levels]\nBlok = "0"\n'),
    Case("unknown_constraint", EXIT_CONFIG, ("[persons.constraints].Block", "nurse_nva_1", "unknown constraint"),
         toml=DEMO + '[persons.constraints]\nBlock = ["nurse_nva_1"]\n'),
    Case("unknown_invariant", EXIT_CONFIG, ("[persons.invariants].State", "population", "unknown invariant"),
         toml=DEMO + '[persons.invariants]\nState = ["population"]\n'),
    Case("constraint_without_its_invariant", EXIT_CONFIG, ("constraint 'total' at US", "invariant 'tot'"),
         toml=DEMO + "[persons.invariants]\nState = []\n"),
    Case("l2_passes_missing_a_measured_query", EXIT_CONFIG, ("[persons.estimation.l2_passes].US", "does not list"),
         toml=DEMO + '[persons.estimation.l2_passes]\nUS = [["detailed"]]\n'),
    Case("unknown_product", EXIT_CONFIG, ("run.products", "households"), toml=DEMO + '[run]\nproducts = ["households"]\n'),
    Case("production_with_seed", EXIT_CONFIG, ("mode = \"production\"", "refuses a seed"),
         toml=DEMO + '[run]\nmode = "production"\nseed = 7\n'),
    Case("production_with_seed_option", EXIT_CONFIG, ("mode = \"production\"", "refuses a seed"),
         toml=DEMO + '[run]\nmode = "production"\n', args=("--seed", "7")),
    Case("non_integer_seed", EXIT_CONFIG, ("run.seed",), toml=DEMO + "[run]\nseed = 1.5\n"),
    # ---- run directory (exit 4) ----------------------------------------------------------------
    Case("output_parent_is_a_file", EXIT_RUNDIR, ("a-file", "cannot write the run directory"), out=_file_parent),
    Case("output_is_a_file", EXIT_RUNDIR, ("run-file", "cannot write the run directory"), out=_existing_file),
]


@pytest.fixture(scope="module")
def planted(tmp_path_factory) -> Path:
    return write_planted_input(tmp_path_factory.mktemp("planted"))


def run_case(case: Case, tmp: Path, planted: Path, capsys) -> tuple[int, str, Path]:
    """Run ``topdown run`` in-process for a case; returns (exit code, stderr+stdout, run directory)."""
    if case.persons or case.units or case.files:
        inp = write_planted_input(tmp / "input", None if case.persons is None else case.persons(persons_frame()),
                                  None if case.units is None else case.units(units_frame()))
        if case.files:
            case.files(inp)
    else:
        inp = planted
    if case.input_dir:
        inp = case.input_dir(tmp)
    config = case.extra.get("config", "demo")
    if case.toml is not None:
        config = str(tmp / "bad.toml")
        Path(config).write_text(case.toml)
    out = case.out(tmp) if case.out else tmp / "run"
    capsys.readouterr()
    code = main(["run", config, "--out", str(out), "--input", str(inp), "--workers", "1", "--quiet", *case.args])
    captured = capsys.readouterr()
    return code, captured.err + captured.out, out


def test_the_catalogue_is_large_and_distinct():
    assert len(CASES) >= 20 and len({c.name for c in CASES}) == len(CASES)


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_case(case: Case, tmp_path: Path, planted: Path, capsys):
    code, text, out = run_case(case, tmp_path, planted, capsys)
    assert code == case.code, text
    assert "Traceback" not in text
    for fragment in case.expect:
        assert fragment in text, f"{fragment!r} not in message:\n{text}"
    if out.is_dir():
        assert no_partial_output(out) == [], text
    assert leaked_secrets(text) == [], text


def test_test_mode_without_seed_is_a_config_error():
    with pytest.raises(ConfigError, match="needs an integer 'seed'"):
        load_config("demo").with_overrides(seed=None)


@pytest.mark.skipif(os.geteuid() == 0, reason="root can write anywhere")
def test_unwritable_output_directory(tmp_path: Path, planted: Path, capsys):
    locked = tmp_path / "ro"
    locked.mkdir()
    locked.chmod(0o500)
    try:
        code = main(["run", "demo", "--out", str(locked / "run"), "--input", str(planted), "--quiet"])
    finally:
        locked.chmod(0o700)
    assert code == EXIT_RUNDIR
    assert "cannot write the run directory" in capsys.readouterr().err
