"""The bad-input catalogue: every bad input file, configuration, command-line option or run directory stops
``topdown run`` (or ``verify``, ``ingest``) with its exit code (2 configuration/usage, 3 input, 4 run
directory; never 6, an internal error) and a one-line message naming the file, column or configuration key
and the offending value (a person or unit record by its block GEOID, never its row: in a GEOID-sorted file
the row is a cumulative count of persons). Nothing is written or changed (the run directory, or the ingest
output, is byte for byte as before; no histograms, measurements, MDF, invariants, spine, certificate or
manifest; the lock released), and neither the message nor the log discloses a planted confidential count.

Every case runs twice on the small planted input of ``rel_inputs``: in process, on the session's Dask cluster,
where the log is captured too; and through the command line in a subprocess with its own embedded cluster, as a
user meets it (several CPU seconds a case), where a worker's own report of an error would show on stderr. The
default run takes one case of each kind and exit code through the command line; the others are ``slow``.
"""
from __future__ import annotations

import gzip
import importlib.util
import json
import logging
import os
import re
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Callable

import pandas as pd
import pytest

from cli_subprocess import PROGRESS, topdown
from conftest import DATA, PL94_DIR
from rel_inputs import leaked_secrets, no_partial_output, persons_frame, units_frame, write_planted_input
from topdown.pipeline.privacy.certificate import NOT_PRIVATE_WARNING
from topdown.pipeline.runtime.outdir import new_marker
from topdown.pipeline.cli import EXIT_CONFIG, EXIT_INPUT, EXIT_INTERNAL, EXIT_RUNDIR, EXIT_VERIFY, input_errors, main
from topdown.pipeline.configuration.errors import InputError
from topdown.pipeline.inputs.ingest import BLOCK_GROUPS
from topdown.pipeline.configuration.config import ConfigError, load_config


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
    setup: Callable[[Path], None] | None = None  # more files in the case's folder (included configs...)
    argv: Callable[[Path, Path], tuple[list[str], Path]] | None = None  # (tmp, input) -> a whole command
    # line and the folder it must leave unchanged, for cases other than ``run``
    without_module: str | None = None  # the case holds only where this module is not installed


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
ROW = 4333  # the first person row of block 440070001001002 (household, adult, Hispanic): also the number of
# persons in the block before it, a planted secret, so a message that gave the row would fail the leak scan

def _write(path: Path, text: str) -> Callable[[Path], None]:
    """A setup step writing ``text`` to ``path`` (relative to the case's folder)."""
    return lambda tmp: (tmp / path).write_text(text)


#: The manifest of a run that stopped early (an earlier run directory: --out may name it).
#: A run directory's manifest (by its marker: outdir.read_marker) of a run in progress.
RUNNING = json.dumps({**new_marker("run"), "status": "running"})


def _planted_run_dir(**files: str) -> Callable[[Path], Path]:
    """A run directory holding the given files (``__`` in a name is a ``/``; a value of None makes a folder)."""
    def make(tmp: Path) -> Path:
        out = tmp / "run"
        out.mkdir()
        for name, text in files.items():
            path = out / name.replace("__", "/")
            path.parent.mkdir(parents=True, exist_ok=True)
            path.mkdir() if text is None else path.write_text(text)
        return out
    return make


def _verify(make: Callable[[Path], Path] | None) -> Callable[[Path, Path], tuple[list[str], Path]]:
    """``topdown verify`` on the folder ``make`` builds (None: a folder that does not exist)."""
    def argv(tmp: Path, _input: Path) -> tuple[list[str], Path]:
        out = make(tmp) if make else tmp / "no-such-run"
        return ["verify", str(out)], out
    return argv


def _block_row(geoid: str, persons: int, **extra) -> dict:
    """A block-table row whose ``persons`` are all White adults; ``extra`` adds or replaces columns."""
    row = {"GEOID": geoid, "pop": persons, "vap": persons}
    for g in BLOCK_GROUPS:
        row[f"pop_{g}"] = row[f"vap_{g}"] = persons if g == "white" else 0
    return {**row, **extra}


def _ingest_blocks(rows: Callable[[], list[dict]]) -> Callable[[Path, Path], tuple[list[str], Path]]:
    """``topdown ingest blocks`` on a CSV of ``rows`` (values written as given)."""
    def argv(tmp: Path, _input: Path) -> tuple[list[str], Path]:
        pd.DataFrame(rows()).to_csv(tmp / "blocks.csv", index=False)
        return ["ingest", "blocks", str(tmp / "blocks.csv"), "--out", str(tmp / "ingested")], tmp / "ingested"
    return argv


PL_GEO, PL_SEG1 = "rigeo2018_2020Style.pl", "ri000012018_2020Style.pl"


def _ingest_pl94(edit: Callable[[dict[str, list[list[str]]], int], None]) -> Callable[[Path, Path], tuple[list[str], Path]]:
    """``topdown ingest pl94`` on the bundled files after ``edit(records, first block row)``."""
    def argv(tmp: Path, _input: Path) -> tuple[list[str], Path]:
        src = tmp / "pl94"
        src.mkdir()
        records = {f.name[:-3]: [ln.split("|") for ln in gzip.decompress(f.read_bytes()).decode("latin-1").splitlines()]
                   for f in PL94_DIR.glob("*.pl.gz")}
        edit(records, next(i for i, r in enumerate(records[PL_GEO]) if r[2] == "750"))
        for name, rows in records.items():
            (src / name).write_text("\n".join("|".join(r) for r in rows) + "\n", encoding="latin-1")
        return ["ingest", "pl94", str(src), "--out", str(tmp / "ingested")], tmp / "ingested"
    return argv


def _set_field(name: str, field_no: int, value: str) -> Callable[[dict[str, list[list[str]]], int], None]:
    def edit(records: dict[str, list[list[str]]], row: int) -> None:
        records[name][row][field_no] = value
    return edit


def _two_states(tmp: Path) -> None:
    """The planted input plus a block of vacant housing units in Massachusetts (state 25)."""
    extra = pd.DataFrame({"geoid": ["250010001001001"] * 2, "unit_type": [0, 0], "occupied": [False, False]})
    write_planted_input(tmp / "two-states", None, pd.concat([units_frame(), extra], ignore_index=True))


B1 = "440070001001001"


def _spine(aiannh_rows: str, units: bytes | None = None) -> Callable[[Path, Path], tuple[list[str], Path]]:
    """``topdown spine`` on a BAF directory holding an AIANNH file of ``aiannh_rows`` (BLOCKID|AIANNHCE|COMPTYP),
    with ``--units`` a file of the bytes ``units`` when given."""
    def argv(tmp: Path, _input: Path) -> tuple[list[str], Path]:
        baf = tmp / "baf"
        baf.mkdir()
        (baf / "BlockAssign_ST44_RI_AIANNH.txt").write_text("BLOCKID|AIANNHCE|COMPTYP\n" + aiannh_rows)
        more = [] if units is None else ["--units", str(tmp / "units.parquet")]
        if units is not None:
            (tmp / "units.parquet").write_bytes(units)
        return ["spine", "--baf", str(baf), *more, "--out", str(tmp / "spine")], tmp / "spine"
    return argv


def _uncertainty_entities(data: bytes) -> Callable[[Path, Path], tuple[list[str], Path]]:
    """``topdown uncertainty`` with ``--entities`` a Parquet file of the bytes ``data`` (read before the run)."""
    def argv(tmp: Path, _input: Path) -> tuple[list[str], Path]:
        (tmp / "entities.parquet").write_bytes(data)
        return (["uncertainty", str(tmp / "run"), "--out", str(tmp / "u.parquet"), "--entities",
                 str(tmp / "entities.parquet")], tmp / "u.parquet")
    return argv


def _snapshot(path: Path) -> dict[str, bytes]:
    """Every file (with its bytes) and folder under ``path``, or ``path`` itself: what a failed command must
    leave as it was."""
    if path.is_file():
        return {".": path.read_bytes()}
    if not path.is_dir():
        return {}
    return {str(f.relative_to(path)): f.read_bytes() if f.is_file() else b"<folder>" for f in sorted(path.rglob("*"))}


RI_BAF = DATA / "ri_baf2020"
L2_US = '"cenrace", "hispanic", "votingage", "hhinstlevels", "hhgq", "hispanic * cenrace", "votingage * cenrace", ' \
        '"votingage * hispanic", "votingage * hispanic * cenrace", "detailed"'
COMPLETE = '{"status": "complete", "levels": ["US"], "products": ["persons"]}'

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
    Case("short_geoid", EXIT_INPUT, ("persons.parquet", "'geoid'", "malformed GEOID", "'44007000100100'"),
         persons=lambda p: _set(p, ROW, geoid="44007000100100")),
    Case("letters_in_geoid", EXIT_INPUT, ("units.parquet", "'geoid'", "malformed GEOID", "'44007000100100X'"),
         units=lambda u: _set(u, 7, geoid="44007000100100X")),
    Case("cenrace_out_of_range", EXIT_INPUT, ("persons.parquet", "'cenrace'", "block 440070001001002", "0..62", "63"),
         persons=lambda p: _set(p, ROW, cenrace=63)),
    Case("negative_code", EXIT_INPUT, ("persons.parquet", "'hispanic'", "block 440070001001001", "0..1", "-1"),
         persons=lambda p: _set(p, 3, hispanic=-1)),
    Case("unit_type_out_of_range", EXIT_INPUT, ("units.parquet", "'unit_type'", "block 440070001001001", "0..7"),
         units=lambda u: _set(u, 0, unit_type=8)),
    Case("null_value", EXIT_INPUT, ("persons.parquet", "'votingage'", "block 440070001001001", "null"),
         persons=lambda p: p.astype({"votingage": "Int64"}).pipe(lambda q: _set(q, 10, votingage=pd.NA))),
    Case("person_in_block_without_units", EXIT_INPUT,
         ("persons.parquet", "'hhgq'", "block 440070002001009", "no housing unit"),
         persons=lambda p: _set(p, ROW, geoid="440070002001009")),
    Case("gq_person_without_facility", EXIT_INPUT,
         ("persons.parquet", "'hhgq'", "block 440070001001002", "no GQ facility of type 6"),
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
    Case("unknown_key", EXIT_CONFIG, ("run.nmae", "unknown key", "did you mean 'name'"), toml=DEMO + '[run]\nnmae = "x"\n'),
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
    Case("constraint_without_its_invariant", EXIT_CONFIG,
         ("[persons.constraints] US", "rhs = \"total\" needs the total invariant at US"),
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
    # ---- command line (exit 2) -----------------------------------------------------------------
    Case("workers_negative", EXIT_CONFIG, ("--workers", "positive", "-1"), args=("--workers", "-1")),
    Case("workers_zero", EXIT_CONFIG, ("--workers", "positive", "got 0"), args=("--workers", "0")),
    # ---- configuration found before the first write (exit 2) ------------------------------------
    Case("unknown_query_in_l2_passes", EXIT_CONFIG, ("[persons.estimation.l2_passes].US", "'nosuch'", "unknown query term"),
         toml=DEMO + f'[persons.estimation.l2_passes]\nUS = [["total", "nosuch"], [{L2_US}]]\n'),
    Case("unknown_query_in_rounder_passes", EXIT_CONFIG,
         ("[persons.estimation.rounder_passes].Block", "pass 1", "'nosuch'", "unknown query term"),
         toml=DEMO + '[persons.estimation.rounder_passes]\nBlock = [["total"], ["hhgq * nosuch", "detailed"]]\n'),
    Case("empty_pass", EXIT_CONFIG, ("[units.estimation.rounder_passes].Tract", "pass 0 is empty"),
         toml=DEMO + '[units.estimation.rounder_passes]\nTract = [[]]\n'),
    Case("gurobi_without_gurobipy", EXIT_CONFIG, ("[units.estimation] backend = \"gurobi\"", "gurobipy"),
         toml=DEMO + '[units.estimation]\nbackend = "gurobi"\n', without_module="gurobipy"),
    Case("include_itself", EXIT_CONFIG, ("bad.toml", "'include'", "cycle"), toml='include = "bad.toml"\n'),
    Case("include_cycle_of_two", EXIT_CONFIG, ("'include'", "cycle", "other.toml", "bad.toml"),
         toml='include = "other.toml"\n', setup=_write(Path("other.toml"), 'include = "bad.toml"\n')),
    Case("include_a_number", EXIT_CONFIG, ("bad.toml", "'include'", ".toml file", "got 5"), toml="include = 5\n"),
    Case("include_not_toml", EXIT_CONFIG, ("bad.toml", "'include'", ".toml file", "'notes.txt'"),
         toml='include = "notes.txt"\n', setup=_write(Path("notes.txt"), '[run]\nname = "leaked-4321"\n')),
    Case("include_missing", EXIT_CONFIG, ("nope.toml", "no such configuration file"), toml='include = "nope.toml"\n'),
    Case("config_is_a_directory", EXIT_CONFIG, ("a-dir", "cannot read the configuration"),
         setup=lambda tmp: (tmp / "a-dir").mkdir(), extra={"config": "a-dir"}),
    Case("tau_slack_nan", EXIT_CONFIG, ("persons.estimation.tau_slack", "finite"),
         toml=DEMO + "[persons.estimation]\ntau_slack = nan\n"),
    Case("tau_slack_negative", EXIT_CONFIG, ("units.estimation.tau_slack", "greater than or equal to 0", "-0.5"),
         toml=DEMO + "[units.estimation]\ntau_slack = -0.5\n"),
    Case("split_cost_negative", EXIT_CONFIG, ("persons.estimation.split_cost", "greater than or equal to 0", "-1"),
         toml=DEMO + "[persons.estimation]\nsplit_cost = -1\n"),
    Case("split_cost_fractional", EXIT_CONFIG, ("units.estimation.split_cost", "valid integer", "2.5"),
         toml=DEMO + "[units.estimation]\nsplit_cost = 2.5\n"),
    Case("seed_true", EXIT_CONFIG, ("run.seed", "valid integer", "True"), toml=DEMO + "[run]\nseed = true\n"),
    Case("products_empty", EXIT_CONFIG, ("run.products", "at least 1 item"), toml=DEMO + "[run]\nproducts = []\n"),
    Case("products_twice", EXIT_CONFIG, ("run", "products", "twice"),
         toml=DEMO + '[run]\nproducts = ["units", "units"]\n'),
    Case("aian_spine_without_baf", EXIT_CONFIG, ("bad.toml", "[run] spine = 'aian'", "baf ="),
         toml=DEMO + '[run]\nspine = "aian"\n'),
    Case("optimized_spine_without_baf", EXIT_CONFIG, ("bad.toml", "[run] spine = 'optimized'", "baf ="),
         toml=DEMO + '[run]\nspine = "optimized"\n'),
    Case("missing_baf_directory", EXIT_CONFIG, ("[run] baf", "no-such-baf", "no such directory"),
         toml=DEMO + '[run]\nspine = "aian"\nbaf = "no-such-baf"\n'),
    Case("baf_directory_without_files", EXIT_CONFIG, ("[run] baf", "empty-baf", "no block assignment files"),
         toml=DEMO + '[run]\nspine = "optimized"\nbaf = "empty-baf"\n', setup=lambda tmp: (tmp / "empty-baf").mkdir()),
    # ---- input against the configuration (exit 3) ----------------------------------------------
    Case("two_states_for_one_state_baf", EXIT_INPUT, ("units.parquet", "'geoid'", "250010001001001", "state 25",
                                                       "[run] baf", "ri_baf2020"),
         toml=DEMO + f'[run]\nspine = "aian"\nbaf = "{RI_BAF}"\n', setup=_two_states,
         input_dir=lambda tmp: tmp / "two-states"),
    # ---- run directory (exit 4) ----------------------------------------------------------------
    Case("manifest_not_json", EXIT_RUNDIR, ("manifest.json", "not a readable manifest"),
         out=_planted_run_dir(**{"manifest.json": '{"status": "comp'})),
    Case("manifest_not_an_object", EXIT_RUNDIR, ("manifest.json", "JSON object", "list"),
         out=_planted_run_dir(**{"manifest.json": "[1, 2]"})),
    Case("manifest_wrong_shape", EXIT_RUNDIR, ("manifest.json", "'completed'", "object"),
         out=_planted_run_dir(**{"manifest.json": '{"status": "running", "completed": [1]}'}), args=("--resume",)),
    Case("manifest_wrong_status_type", EXIT_RUNDIR, ("manifest.json", "'status'", "string"),
         out=_planted_run_dir(**{"manifest.json": '{"status": 1}'})),
    Case("manifest_is_a_folder", EXIT_RUNDIR, ("not an earlier output of this command",),
         out=_planted_run_dir(**{"manifest.json": None})),
    Case("histograms_is_a_file", EXIT_RUNDIR, ("histograms", "a file where the run directory needs a folder"),
         out=_planted_run_dir(histograms="x", **{"manifest.json": RUNNING})),
    Case("staging_is_a_file", EXIT_RUNDIR, (".staging", "a file where the run directory needs a folder"),
         out=_planted_run_dir(**{".staging": "x", "manifest.json": RUNNING})),
    Case("mdf_product_is_a_file", EXIT_RUNDIR, ("mdf/units", "a file where the run directory needs a folder"),
         out=_planted_run_dir(mdf__units="x", **{"manifest.json": RUNNING})),
    Case("verify_missing_directory", EXIT_RUNDIR, ("no-such-run", "no such run directory"), argv=_verify(None)),
    Case("verify_no_manifest", EXIT_RUNDIR, ("no manifest.json",), argv=_verify(_planted_run_dir())),
    Case("verify_incomplete", EXIT_RUNDIR, ("no complete run", "'running'", "--resume"),
         argv=_verify(_planted_run_dir(**{"manifest.json": '{"status": "running"}'}))),
    Case("verify_corrupt_manifest", EXIT_RUNDIR, ("manifest.json", "not a readable manifest"),
         argv=_verify(_planted_run_dir(**{"manifest.json": "{"}))),
    Case("verify_manifest_without_levels", EXIT_RUNDIR, ("manifest.json", "'levels'", "missing"),
         argv=_verify(_planted_run_dir(**{"manifest.json": '{"status": "complete"}'}))),
    # ---- published tables (exit 3; a table row counts blocks, which is public) -------------------
    Case("blocks_count_overflows_int64", EXIT_INPUT, ("blocks.csv", "column pop,", "row 1", "exceeds the cap"),
         argv=_ingest_blocks(lambda: [_block_row("440070001001001", 5),
                                      _block_row("440070001001002", 3, pop="9" * 25)])),
    Case("blocks_count_above_cap", EXIT_INPUT, ("blocks.csv", "column pop,", "row 0", "2000000000", "1,000,000"),
         argv=_ingest_blocks(lambda: [_block_row("440070001001001", 2_000_000_000)])),
    Case("blocks_need_more_memory_than_the_machine", EXIT_INPUT, ("blocks.csv", "GiB", "more than half of this machine"),
         argv=_ingest_blocks(lambda: [_block_row(f"4400700{i:08d}", 1_000_000) for i in range(20_000)])),
    Case("blocks_float_count", EXIT_INPUT, ("blocks.csv", "column pop,", "not a non-negative integer", "'2e9'"),
         argv=_ingest_blocks(lambda: [_block_row("440070001001001", 5, pop="2e9")])),
    Case("blocks_two_geoid_columns", EXIT_INPUT, ("blocks.csv", "exactly one block GEOID column", "GEOID20"),
         argv=_ingest_blocks(lambda: [_block_row("440070001001001", 5, GEOID20="440070001001001")])),
    Case("blocks_hu_and_hu_occupied", EXIT_INPUT, ("blocks.csv", "column hu", "either hu, or hu_occupied and hu_vacant"),
         argv=_ingest_blocks(lambda: [_block_row("440070001001001", 5, hu=3, hu_occupied=2)])),
    Case("blocks_occupied_units_without_persons", EXIT_INPUT,
         ("blocks.csv", "column hu_occupied", "row 0", "440070001001001", "more occupied housing units than persons"),
         argv=_ingest_blocks(lambda: [_block_row("440070001001001", 0, hu_occupied=2, hu_vacant=0)])),
    Case("blocks_persons_without_units", EXIT_INPUT, ("blocks.csv", "column hu,", "440070001001001", "no occupied"),
         argv=_ingest_blocks(lambda: [_block_row("440070001001001", 4, hu=0)])),
    Case("pl94_25_digit_count", EXIT_INPUT, (PL_SEG1, "column P0010001", "exceeds the cap", "1" * 25),
         argv=_ingest_pl94(_set_field(PL_SEG1, 5, "1" * 25))),
    Case("pl94_25_digit_logrecno", EXIT_INPUT, (PL_SEG1, "column LOGRECNO", "overflows int64"),
         argv=_ingest_pl94(_set_field(PL_SEG1, 4, "1" * 25))),
    Case("pl94_geocode_disagrees_with_stusab", EXIT_INPUT, (PL_GEO, "column GEOCODE", "state 25", "STUSAB 'RI'"),
         argv=_ingest_pl94(lambda recs, row: recs[PL_GEO][row].__setitem__(9, "25" + recs[PL_GEO][row][9][2:]))),
    Case("ingest_output_is_a_file", EXIT_RUNDIR, ("run-file", "a file is in the way"),
         argv=lambda tmp, inp: (_ingest_blocks(lambda: [_block_row("440070001001001", 5)])(tmp, inp)[0][:-1]
                                + [str(_existing_file(tmp))], tmp / "run-file")),
    Case("demo_data_output_is_a_file", EXIT_RUNDIR, ("run-file", "a file is in the way"),
         argv=lambda tmp, _inp: (["demo-data", str(_existing_file(tmp))], tmp / "run-file")),
    Case("spine_missing_baf_directory", EXIT_CONFIG, ("--baf", "no-such-baf", "no such directory"),
         argv=lambda tmp, _inp: (["spine", "--baf", str(tmp / "no-such-baf"), "--out", str(tmp / "spine")], tmp / "spine")),
    Case("pl94_unknown_stusab", EXIT_INPUT, (PL_GEO, "column STUSAB", "unknown state abbreviation", "'XX'"),
         argv=_ingest_pl94(_set_field(PL_GEO, 1, "XX"))),
    # ---- geography and command-line values (exit 3 and 2) --------------------------------------
    Case("spine_baf_short_blockid", EXIT_INPUT, ("BlockAssign_ST44_RI_AIANNH.txt", "row 3", "'4400100'", "not 15 digits"),
         argv=_spine(f"{B1}|0001|\n4400100|0001|\n")),
    Case("spine_baf_forbidden_aiannhce", EXIT_INPUT, ("AIANNHCE 4995", B1, "forbidden range 4990-4999"),
         argv=_spine(f"{B1}|4995|\n")),
    Case("spine_baf_ragged_row", EXIT_INPUT, ("BlockAssign_ST44_RI_AIANNH.txt", "not a readable block assignment file",
                                               "Expected 3 fields in line 3, saw 5"),
         argv=_spine(f"{B1}|0001|\n440070001001002|0001|a|b|c\n")),
    Case("spine_units_not_parquet", EXIT_INPUT, ("units.parquet", "not a readable units table", "ArrowInvalid"),
         argv=_spine(f"{B1}|0001|\n", units=b"not a Parquet file")),
    Case("entities_not_parquet", EXIT_INPUT, ("entities.parquet", "not a readable entities table", "ArrowInvalid"),
         argv=_uncertainty_entities(b"not a Parquet file")),
    Case("synth_zero_blocks", EXIT_CONFIG, ("--blocks 0", "from 1 to 10,000,000"),
         argv=lambda tmp, _inp: (["synth", "--blocks", "0", str(tmp / "synth")], tmp / "synth")),
    Case("delta_outside_0_1", EXIT_CONFIG, ("persons.budget", "delta must be in (0, 1)", "got 2"),
         toml=DEMO + '[persons.budget]\ndelta = "2"\n'),
]


Command = Callable[[list[str], Path], tuple[int, str, list[str]]]


def in_process(capsys) -> Command:
    """Run a command line with ``main`` in this process (in ``cwd``): (exit code, stderr+stdout, message lines)."""
    def command(argv: list[str], cwd: Path) -> tuple[int, str, list[str]]:
        capsys.readouterr()
        old = os.getcwd()
        os.chdir(cwd)  # relative paths in a case's configuration are the case's own
        try:
            code = main(argv)
        except SystemExit as exc:  # argparse's usage errors
            code = exc.code
        finally:
            os.chdir(old)
        captured = capsys.readouterr()
        text = captured.err + captured.out
        return code, text, [ln for ln in text.splitlines()  # not the progress bars nor the test-mode warning
                            if ln.strip() and not PROGRESS.match(ln) and NOT_PRIVATE_WARNING not in ln]
    return command


def in_a_subprocess(argv: list[str], cwd: Path) -> tuple[int, str, list[str]]:
    """Run a command line as a user does, in its own process with its own embedded cluster (whose workers print
    to the same stderr); no line of a traceback or of a worker's failure report may appear."""
    outcome = topdown(*argv, cwd=cwd, timeout=300)
    assert outcome.tracebacks() == [], str(outcome)
    return outcome.code, outcome.stderr + outcome.stdout, outcome.message_lines()


def run_case(case: Case, tmp: Path, planted: Path, command: Command) -> tuple[int, str, list[str], Path, dict]:
    """Run the case's command line with ``command``; returns (exit code, stderr+stdout, message lines, the folder
    it must not change, that folder's files before the command)."""
    if case.setup:
        case.setup(tmp)
    if case.persons or case.units or case.files:
        inp = write_planted_input(tmp / "input", None if case.persons is None else case.persons(persons_frame()),
                                  None if case.units is None else case.units(units_frame()))
        if case.files:
            case.files(inp)
    else:
        inp = planted
    if case.input_dir:
        inp = case.input_dir(tmp)
    if case.argv:
        argv, out = case.argv(tmp, inp)
    else:
        config = case.extra.get("config", "demo")
        if case.toml is not None:
            config = str(tmp / "bad.toml")
            Path(config).write_text(case.toml)
        elif config != "demo":
            config = str(tmp / config)
        out = case.out(tmp) if case.out else tmp / "run"
        argv = ["run", config, "--out", str(out), "--input", str(inp), "--workers", "1", "--quiet", *case.args]
    before = _snapshot(out)
    code, text, lines = command(argv, tmp)
    return code, text, lines, out, before


def test_the_catalogue_is_large_and_distinct():
    assert len(CASES) >= 85 and len({c.name for c in CASES}) == len(CASES)


def test_no_case_is_an_internal_error():
    """Exit 6 means a bug: no bad input may end there (test_bad_case checks each case's actual exit code)."""
    assert [c.name for c in CASES if c.code == EXIT_INTERNAL] == []
    assert {c.code for c in CASES} == {EXIT_CONFIG, EXIT_INPUT, EXIT_RUNDIR}


@pytest.mark.smoke  # in process: the default selection's sample of refusals
@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_case(case: Case, tmp_path: Path, planted: Path, capsys, caplog, dask_client, monkeypatch):
    if case.without_module and importlib.util.find_spec(case.without_module):
        pytest.skip(f"{case.without_module} is installed here")
    import topdown.pipeline.execution.runner as runner

    @contextmanager
    def shared(*args, **kwargs):
        yield dask_client

    monkeypatch.setattr(runner, "dask_client", shared)
    caplog.set_level(logging.DEBUG, logger="topdown")
    judge(case, *run_case(case, tmp_path, planted, in_process(capsys)))
    assert leaked_secrets(caplog.text) == [], caplog.text


@pytest.mark.parametrize("case", CASES, ids=[c.name for c in CASES])
def test_bad_case_through_the_command_line(case: Case, tmp_path: Path, planted: Path):
    """The same case as a user meets it: its own process and cluster, whose workers print to the same stderr (in
    process, a worker's copy of an error is not seen); the documented code, one line, no traceback, nothing
    changed, nothing leaked (outside the default selection: ``-m slow``)."""
    if case.without_module and importlib.util.find_spec(case.without_module):
        pytest.skip(f"{case.without_module} is installed here")
    judge(case, *run_case(case, tmp_path, planted, in_a_subprocess))


def judge(case: Case, code: int, text: str, lines: list[str], out: Path, before: dict) -> None:
    """The case's documented code and one-line message with its fragments; nothing changed or leaked."""
    assert code != EXIT_INTERNAL, text
    assert code == case.code, text
    assert "Traceback" not in text
    assert len(lines) == 1, f"not a one-line message:\n{text}"
    for fragment in case.expect:
        assert fragment in text, f"{fragment!r} not in message:\n{text}"
    assert _snapshot(out) == before, f"{out} changed:\n{text}"
    if out.is_dir() and not before:
        assert no_partial_output(out) == [], text
    if case.persons or case.units or case.files:  # a record's position is a cumulative count of persons
        assert not re.search(r"\brow \d", text), text
    assert "leaked-4321" not in text  # an included non-TOML file is not echoed
    assert leaked_secrets(text) == [], text


def test_declared_input_errors_are_value_errors():
    """Library callers that catch ValueError keep catching every declared input error."""
    assert input_errors() and all(issubclass(c, ValueError) and c is not ValueError for c in input_errors())


@pytest.mark.parametrize("error, code", [(ValueError, EXIT_INTERNAL), (InputError, EXIT_INPUT)])
def test_only_declared_input_errors_exit_3(error, code, tmp_path: Path, capsys, monkeypatch):
    """A plain ValueError raised inside a command is a bug, not bad input: exit 6 with its traceback and the
    "internal error" line. An InputError raised at the same place is bad input: exit 3, one line, no traceback."""
    import topdown.pipeline.inputs.ingest as ingest

    def broken(*args, **kwargs):
        raise error("operands could not be broadcast together with shapes (3,) (4,)")

    monkeypatch.setattr(ingest, "cef_tables", broken)  # called by write_cef, inside `topdown ingest blocks`
    argv, out = _ingest_blocks(lambda: [_block_row(B1, 5)])(tmp_path, tmp_path)
    capsys.readouterr()
    got = main(argv)
    err = capsys.readouterr().err
    assert got == code, err
    assert "shapes (3,) (4,)" in err
    if code == EXIT_INTERNAL:
        assert "Traceback (most recent call last)" in err and "in broken" in err
        assert "topdown: internal error (ValueError); please report it with the traceback above" in err
        assert "input error" not in err
    else:
        assert "Traceback" not in err and "internal error" not in err
        assert [ln for ln in err.splitlines() if ln.strip() and not PROGRESS.match(ln)] == [
            "topdown: input error: operands could not be broadcast together with shapes (3,) (4,)"]
    assert _snapshot(out) == {}  # nothing written


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


def test_verify_reports_a_deleted_output_of_a_complete_run(planted_run: Path, tmp_path: Path, capsys):
    """A complete run that lost a level fails verification (exit 1), with a message naming the missing files."""
    import shutil

    copy = tmp_path / "run"
    shutil.copytree(planted_run, copy)
    shutil.rmtree(copy / "histograms" / "persons" / "level=Block")
    capsys.readouterr()
    code = main(["verify", str(copy)])
    text = "".join(capsys.readouterr())
    assert code == EXIT_VERIFY, text
    assert "missing or unreadable output" in text and "level=Block" in text and "Traceback" not in text
    assert leaked_secrets(text) == []
