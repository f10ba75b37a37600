"""Production refuses what is not private, and each named waiver is recorded.

* Budget ceiling and floor (privacy/accounting.py ``check_noise``): in production the run's products composed above
  the release ceiling (rho 15.29, the Bureau's 2020 TopDown releases; pure DP as epsilon^2/2) or a measured
  query of the configured strategy whose noise is zero with probability above 1/2 is refused (exit 2 naming the
  file, key and value); what bypassing concentrates on single nodes is reported; in every mode a total too large for a float ("1e400") or noise
  beyond a standard deviation of 1e10 ("1e-44") is refused (exit 2), never a traceback.
* Input whose housing units ``topdown ingest blocks`` derived from the person counts (exit 3), and blocks
  missing from the block assignment files (exit 3, a count and one GEOID), are refused in production.
* ``[run] weaken_privacy`` waives each by name; the certificate then says ``private: false`` and lists them.
* The leak the derived-units refusal closes: a run on such input publishes block housing-unit invariants that
  bound every block's household population within 3 values; production refuses to write them.
"""
from __future__ import annotations

import json
import math
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from cli_subprocess import assert_clean_failure, snapshot, topdown
from conftest import DATA
from rel_inputs import write_planted_input
from topdown.pipeline.cli import EXIT_CONFIG, EXIT_INPUT, EXIT_OK
from topdown.pipeline.configuration.config import ConfigError, config_from_dict, load_config, preset_dir, read_toml
from topdown.pipeline.inputs.ingest import DERIVED_UNITS_KEY, derived_units, ingest_blocks
from topdown.pipeline.execution.levels import Shares
from topdown.pipeline.privacy.accounting import MAX_NOISE_SD, PRODUCTION_MAX_EXACT, allocate, bypass_report, check_noise
from topdown.pipeline.privacy.budget import RELEASE_CEILING
from topdown.pipeline.privacy.certificate import certificate, render_certificate
from topdown.pipeline.privacy.mechanisms import discrete_gaussian_zero_probability, geometric_zero_probability

RI2010 = DATA / "ri2010" / "ri_2010_block_demographics.csv.gz"
RI_BAF = DATA / "ri_baf2020"
PRODUCTION = 'include = "demo.toml"\n[run]\nname = "p"\nmode = "production"\nbuild_demo_input = false\n'


def _config(tmp_path: Path, text: str):
    path = tmp_path / "c.toml"
    path.write_text(text)
    return load_config(path)


# ------------------------------------------------------------------------------------ ceiling and floor
#: Production budgets refused: (case, TOML after the production header, the key, the value as shown, what it says).
REFUSED = [
    ("huge rho", '[persons.budget]\nrho = "100000000000000000000"\n', "persons.budget.rho",
     "100000000000000000000", "above the release ceiling of rho = 15.2939"),
    ("units above the ceiling", '[units.budget]\nrho = "16"\n', "units.budget.rho", "= 16)", "release ceiling"),
    ("each product below the ceiling, both above it", '[units.budget]\nrho = "13"\n', "units.budget.rho",
     "persons.budget.rho = 293764/114921 + units.budget.rho = 13)", "compose to rho = 1787737/114921"),
    ("floor: the State total exact more often than not", '[persons.budget]\nrho = "5"\n', "persons.budget.rho",
     '= 5 ', 'persons.budget.queries.State."total"'),
]


@pytest.mark.parametrize("case,toml,key,value,says", REFUSED, ids=[c[0] for c in REFUSED])
def test_production_refuses_budgets_above_the_ceiling_or_below_the_floor(tmp_path, case, toml, key, value, says):
    config = _config(tmp_path, PRODUCTION + toml)
    with pytest.raises(ConfigError) as err:
        check_noise(config)
    message = str(err.value)
    assert str(tmp_path / "c.toml") in message and key in message and value in message and says in message, message
    assert "weaken_privacy" in message and "budget_ceiling" in message
    # test mode keeps its behaviour (it is not private anyway, and says so); the waiver lets production through
    check_noise(config.with_overrides(mode="test", seed=1))
    waived = config.with_overrides(weaken_privacy=["budget_ceiling"])
    check_noise(waived)
    cert = certificate(waived)
    assert cert["private"] is False and cert["waivers"] == ["budget_ceiling"] and "budget_ceiling" in cert["warning"]
    assert "WARNING" in render_certificate(cert) and "NOT certified private" in render_certificate(cert)


def test_the_floor_is_the_probability_of_an_exact_answer(tmp_path):
    """rho = 4 with the 2021 shares leaves the State total exact with probability below 1/2 (accepted), rho = 5
    above it (refused); the 2021 strategy itself is far inside both limits."""
    ok = _config(tmp_path, PRODUCTION + '[persons.budget]\nrho = "4"\n')
    check_noise(ok)
    budget = ok.product("persons").budget
    assert allocate(budget, "State", "total").exact_probability < PRODUCTION_MAX_EXACT
    refused = ok.product("persons").budget.model_copy(update={"rho": Fraction(5)})
    assert allocate(refused, "State", "total").exact_probability > PRODUCTION_MAX_EXACT
    production = load_config("pl94_production_2021")
    check_noise(production)
    assert max(allocate(production.product("persons").budget, lv, q).exact_probability
               for lv, qs in production.product("persons").budget.queries.items() for q in qs) < 0.37


def test_what_bypassing_concentrates_on_nodes_is_reported_not_refused():
    """Three State nodes holding the whole budget (their single-child levels bypassed onto them), two their
    level's share: the three are counted, and the State total's noise there is zero with probability 0.60 (the
    national run's figure); the configuration itself passes the floor."""
    budget = load_config("pl94_production_2021").product("persons").budget
    state = budget.levels["State"]
    report = bypass_report(budget, {"State": Shares(np.array([0, 1, 1, 0, 1]), [state, Fraction(1)]),
                                    "County": Shares(np.array([0, 0]), [budget.levels["County"]])})
    top = report["largest"]
    assert report["nodes"] == 3 and report["nodes_above_floor"] == 3 and report["floor"] == PRODUCTION_MAX_EXACT
    assert (top["level"], top["query"], top["node_share"]) == ("State", "total", "1")
    assert top["exact_probability"] == pytest.approx(allocate(budget, "State", "total", Fraction(1)).exact_probability)
    assert 0.55 < top["exact_probability"] < 0.65
    assert bypass_report(budget, {"State": Shares(np.array([0, 0]), [state])}) is None


def test_pure_dp_ceiling_counts_epsilon_as_zcdp(tmp_path):
    config = _config(tmp_path, 'include = "e2e_1940.toml"\n[persons.budget]\nepsilon = "6"\n')
    with pytest.raises(ConfigError, match=r"persons.budget.epsilon = 6 \(as zCDP: epsilon\^2/2 = 18\)\) compose to "
                                          r"rho = 18, above the release ceiling"):
        check_noise(config)
    check_noise(_config(tmp_path, 'include = "e2e_1940.toml"\n[persons.budget]\nepsilon = "5"\n'))
    assert Fraction(5) ** 2 / 2 < RELEASE_CEILING.rho < Fraction(6) ** 2 / 2


@pytest.mark.parametrize("mode", ["test", "production"])
@pytest.mark.parametrize("toml,says", [
    ('[persons.budget]\nrho = "1e-44"\n', "persons.budget.rho = 1e-44 is too small"),
    ('[persons.budget]\nrho = "1e-400"\n', "persons.budget.rho = 1e-400 is too small"),
    ('[units.budget]\nrho = "1/10000000000000000000000000"\n',
     "units.budget.rho = 1/10000000000000000000000000 is too small"),
], ids=["1e-44", "1e-400", "units 1e-25"])
def test_every_mode_refuses_noise_the_samplers_cannot_draw(tmp_path, mode, toml, says):
    text = PRODUCTION + toml if mode == "production" else 'include = "demo.toml"\n' + toml
    with pytest.raises(ConfigError, match=says + r".*standard deviation above 1e\+10"):
        check_noise(_config(tmp_path, text))


def test_every_mode_refuses_a_total_too_large_for_a_float(tmp_path):
    for text in (PRODUCTION, 'include = "demo.toml"\n'):
        with pytest.raises(ConfigError, match=r"persons.budget.*rho = 1e\+400 is too large to compute with"):
            _config(tmp_path, text + '[persons.budget]\nrho = "1e400"\n')
    # an exponent beyond the configuration's limits is refused when the number is read (configuration/limits.py)
    with pytest.raises(ConfigError, match=r"persons.budget.epsilon.*'1e999': exponent 999 is outside -400..400"):
        _config(tmp_path, 'include = "e2e_1940.toml"\n[persons.budget]\nepsilon = "1e999"\n')


def test_a_geometric_budget_too_small_for_the_sampler(tmp_path):
    config = _config(tmp_path, 'include = "e2e_1940.toml"\n[run]\nmode = "test"\nseed = 1\n'
                               '[persons.budget]\nepsilon = "1e-15"\n')
    with pytest.raises(ConfigError, match="persons.budget.epsilon = 1/1000000000000000 is too small"):
        check_noise(config)
    assert MAX_NOISE_SD == 10 ** 10


def test_zero_probabilities_match_their_sums():
    for s2 in ("1/3", "1/2", "2", "99", "150"):
        k = np.arange(-2000, 2001)
        direct = 1 / np.exp(-k * k / (2 * float(Fraction(s2)))).sum()
        assert discrete_gaussian_zero_probability(Fraction(s2)) == pytest.approx(direct, rel=1e-12)
    assert discrete_gaussian_zero_probability(Fraction(1, 10 ** 9)) == 1.0
    q = math.exp(-Fraction(1, 3) / 2)
    assert geometric_zero_probability(Fraction(1, 3), 2) == pytest.approx(1 / (1 + 2 * q / (1 - q)), rel=1e-12)


# ------------------------------------------------------------------------------------------ the waivers
def test_waivers_are_named_checks_listed_once_and_absent_from_unwaived_configs():
    data = read_toml(preset_dir() / "demo.toml")
    assert "weaken_privacy" not in load_config("demo").model_dump(mode="json")["run"]  # config.json, hash unchanged
    for bad, says in ((["budget_ceiling", "no_noise"], "weaken_privacy.1"),
                      (["budget_ceiling", "budget_ceiling"], "lists a waiver twice"), ("budget_ceiling", "list")):
        with pytest.raises(ConfigError, match=says):
            config_from_dict({**data, "run": {**data["run"], "weaken_privacy": bad}}, "w.toml")
    waived = config_from_dict({**data, "run": {**data["run"], "weaken_privacy": ["derived_housing_units"]}}, "w.toml")
    assert waived.waived("derived_housing_units") and not waived.waived("budget_ceiling")
    assert waived.digest() != load_config("demo").digest()
    cert = certificate(waived)  # a test-mode run: both warnings
    assert cert["private"] is False and cert["waivers"] == ["derived_housing_units"]
    assert "NO privacy" in cert["warning"] and "derived_housing_units" in cert["warning"]
    assert "waivers" not in certificate(load_config("demo")) and certificate(load_config("e2e_1940"))["private"] is True


# ------------------------------------------------------------------------------------ derived housing units
def _subset_csv(path: Path, blocks: int) -> Path:
    pd.read_csv(RI2010, dtype={"GEOID": str}, nrows=blocks).to_csv(path, index=False)
    return path


def test_ingest_records_derived_housing_units(tmp_path):
    csv = _subset_csv(tmp_path / "b.csv", 20)
    summary = ingest_blocks(csv, tmp_path / "derived")
    units = tmp_path / "derived" / "units.parquet"
    assert DERIVED_UNITS_KEY in pq.read_schema(units).metadata and derived_units((units,)) == units
    assert any("derived_housing_units" in line for line in summary.lines())
    frame = pd.read_csv(csv, dtype={"GEOID": str})
    frame["hu"] = frame["pop"] // 2 + 1  # the table's own housing units: nothing derived from persons for them
    frame.to_csv(tmp_path / "hu.csv", index=False)
    assert not any("derived_housing_units" in line for line in ingest_blocks(tmp_path / "hu.csv", tmp_path / "given").lines())
    assert derived_units((tmp_path / "given" / "units.parquet",)) is None
    assert DERIVED_UNITS_KEY not in (pq.read_schema(tmp_path / "given" / "units.parquet").metadata or {})


def household_bounds(block_units: pd.Series) -> pd.DataFrame:
    """What the published block housing-unit invariants (``u0`` by block GEOID) tell about each block's household
    population when ingest derived them (occupied o = ceil(p / 2.5); vacant: floor(C_b / 9) - floor(C_{b-1} / 9)
    over the running total C of occupied units in GEOID order): the running totals H of the published units are
    g(C) = C + floor(C / 9), which is one to one, so C and every block's o are recovered exactly, and
    ceil(p / 2.5) = o leaves p in [ceil((5o - 4) / 2), floor(5o / 2)]: 2 or 3 values."""
    units = block_units.sort_index()
    h = units.cumsum().to_numpy()
    assert (h % 10 != 9).all()  # in the image of g: the derivation is the one described
    c = 9 * (h // 10) + h % 10
    occupied = np.diff(np.concatenate([[0], c]))
    return pd.DataFrame({"low": np.where(occupied > 0, (5 * occupied - 3) // 2, 0), "high": 5 * occupied // 2},
                        index=units.index)


def test_derived_units_leak_household_population_and_production_refuses_it(tmp_path):
    csv = _subset_csv(tmp_path / "b.csv", 150)
    ingest_blocks(csv, tmp_path / "input")
    truth = pd.read_csv(csv, dtype={"GEOID": str}).set_index("GEOID")["pop"]
    refused_toml, waived_toml = tmp_path / "prod.toml", tmp_path / "waived.toml"
    refused_toml.write_text(PRODUCTION)
    waived_toml.write_text(PRODUCTION + 'weaken_privacy = ["derived_housing_units"]\n')

    # after: production refuses the input before anything is written
    out = topdown("run", refused_toml, "--input", tmp_path / "input", "--out", tmp_path / "refused", "--workers", "1",
                  cwd=tmp_path)
    assert_clean_failure(out, EXIT_INPUT, "units.parquet", "derived from the person counts", "derived_housing_units")
    assert snapshot(tmp_path / "refused") == {}

    # before (the waiver): the published invariants bound every block's household population within 3 values
    done = topdown("run", waived_toml, "--input", tmp_path / "input", "--out", tmp_path / "waived", "--workers", "1",
                   "--quiet", cwd=tmp_path)
    assert done.code == EXIT_OK, str(done)
    assert sum("derived_housing_units" in ln and "WARNING" in ln for ln in done.stderr.splitlines()) == 1
    cert = json.loads((tmp_path / "waived" / "certificate.json").read_text())
    assert cert["mode"] == "production" and cert["private"] is False and cert["waivers"] == ["derived_housing_units"]
    invariants = pd.read_parquet(tmp_path / "waived" / "invariants" / "units.parquet")
    blocks = invariants[invariants["level"] == "Block"].set_index("geocode")["u0"]
    bounds = household_bounds(blocks)
    pop = truth.reindex(bounds.index)
    assert ((bounds["low"] <= pop) & (pop <= bounds["high"])).all()  # the inference is always right
    within3 = int((bounds["high"] - bounds["low"] + 1 <= 3).sum())
    assert within3 == len(bounds) == int((truth > 0).sum())
    print(f"derived units: {within3} of {len(bounds)} published blocks have their household population bounded "
          f"within 3 values by the invariants (waived); production: refused, no file written")


# ------------------------------------------------------------------------------ blocks missing from the BAF
def test_production_refuses_blocks_missing_from_the_baf_unless_waived(tmp_path):
    write_planted_input(tmp_path / "input")  # 6 blocks, 3 of them (2010 GEOIDs) not in the 2020 files
    header = PRODUCTION + f'spine = "aian"\nbaf = "{RI_BAF}"\n'
    (tmp_path / "prod.toml").write_text(header)
    out = topdown("run", "prod.toml", "--input", "input", "--out", "refused", "--workers", "1", cwd=tmp_path)
    assert_clean_failure(out, EXIT_INPUT, "units.parquet", "3 of 6 blocks", "440070001001001", "ri_baf2020",
                         "blocks_missing_from_baf")
    assert snapshot(tmp_path / "refused") == {}

    (tmp_path / "waived.toml").write_text(header + 'weaken_privacy = ["blocks_missing_from_baf"]\n')
    done = topdown("run", "waived.toml", "--input", "input", "--out", "waived", "--workers", "1", "--quiet",
                   cwd=tmp_path)
    assert done.code == EXIT_OK, str(done)
    cert = json.loads((tmp_path / "waived" / "certificate.json").read_text())
    assert cert["private"] is False and cert["waivers"] == ["blocks_missing_from_baf"]


# ------------------------------------------------------------------------------------------- the CLI
@pytest.mark.parametrize("rho,fragments", [
    ("100000000000000000000", ("persons.budget.rho = 100000000000000000000", "release ceiling")),
    ("1e400", ("persons.budget", "rho = 1e+400", "too large")),
    ("1e-44", ("persons.budget.rho = 1e-44", "too small")),
], ids=["1e20", "1e400", "1e-44"])
def test_cli_refuses_budgets_with_one_line_and_exit_2(tmp_path, rho, fragments):
    write_planted_input(tmp_path / "input")
    (tmp_path / "c.toml").write_text(PRODUCTION + f'[persons.budget]\nrho = "{rho}"\n')
    out = topdown("run", "c.toml", "--input", "input", "--out", "run", "--workers", "1", cwd=tmp_path)
    assert_clean_failure(out, EXIT_CONFIG, "c.toml", *fragments)
    assert not (tmp_path / "run").exists()


def test_cli_waived_ceiling_publishes_exact_counts_and_says_so(tmp_path):
    """The loud opt-in: rho = 1e20 runs, its published totals are the true ones, and its certificate says so."""
    write_planted_input(tmp_path / "input")
    (tmp_path / "c.toml").write_text(PRODUCTION + 'weaken_privacy = ["budget_ceiling"]\n'
                                     '[persons.budget]\nrho = "100000000000000000000"\n')
    done = topdown("run", "c.toml", "--input", "input", "--out", "run", "--workers", "1", "--quiet", cwd=tmp_path)
    assert done.code == EXIT_OK, str(done)
    assert any("WARNING" in ln and "budget_ceiling" in ln for ln in done.stderr.splitlines())
    cert = json.loads((tmp_path / "run" / "certificate.json").read_text())
    assert cert["private"] is False and cert["waivers"] == ["budget_ceiling"]
    persons = pd.read_parquet(tmp_path / "input" / "persons.parquet")
    mdf = pd.read_parquet(tmp_path / "run" / "mdf" / "persons")
    geoid = (mdf["TABBLKST"] + mdf["TABBLKCOU"] + mdf["TABTRACTCE"] + mdf["TABBLK"]).astype(str)
    published = geoid.value_counts().sort_index()
    true = persons["geoid"].astype(str).value_counts().sort_index()
    assert published.index.tolist() == true.index.tolist() and (published.to_numpy() == true.to_numpy()).all()


# ------------------------------------------------------------------------- the 2021 settings on the nation
#: State-equivalents of the synthetic nation kept for the production run: Delaware, the District of Columbia
#: (one county: its single children are bypassed onto the State node) and Rhode Island.
NATION_STATES = ("10", "11", "44")


@pytest.mark.slow
def test_the_2021_production_settings_run_in_production_on_the_national_shape(tmp_path):
    """``synth --shape us2020`` (three of its state-equivalents), the optimized spine with its block assignment
    files: ``pl94_production_2021`` runs in production mode. Bypassing puts the State total's budget on single
    nodes (noise zero with probability 0.60 there, above the floor): reported on stderr and in the certificate,
    not refused; the certificate states the release ceiling and says private."""
    done = topdown("synth", "--shape", "us2020", "--scale", "0.00001", "--seed", "1", "nation", cwd=tmp_path)
    assert done.code == EXIT_OK, str(done)
    for kind in ("persons", "units"):
        (tmp_path / "input" / kind).mkdir(parents=True)
        for state in NATION_STATES:
            (tmp_path / "nation" / kind / f"state={state}").rename(tmp_path / "input" / kind / f"state={state}")
    (tmp_path / "input" / "baf").mkdir()
    for state in NATION_STATES:
        for f in (tmp_path / "nation" / "baf").glob(f"BlockAssign_ST{state}_*"):
            f.rename(tmp_path / "input" / "baf" / f.name)
    (tmp_path / "c.toml").write_text('include = "pl94_production_2021.toml"\n[run]\nname = "nation"\nbaf = "input/baf"\n')
    done = topdown("run", "c.toml", "--input", "input", "--out", "run", "--workers", "1", "--quiet", cwd=tmp_path,
                   timeout=900)
    assert done.code == EXIT_OK, str(done)
    warned = [ln for ln in done.stderr.splitlines() if "WARNING" in ln]
    assert len(warned) == 1 and "persons: the spine's bypassing gives" in warned[0], done.stderr
    assert 'largest 0.60: State "total"' in warned[0] and "certificate.json: persons.bypassing" in warned[0]
    cert = json.loads((tmp_path / "run" / "certificate.json").read_text())
    assert cert["mode"] == "production" and cert["private"] is True and "warning" not in cert
    bypassing = cert["persons"]["bypassing"]
    assert bypassing["nodes_above_floor"] >= 1 and bypassing["nodes"] >= bypassing["nodes_above_floor"]
    assert bypassing["largest"]["exact_probability"] > PRODUCTION_MAX_EXACT
    assert bypassing["largest"]["level"] == "State" and bypassing["largest"]["query"] == "total"
    ceiling = cert["composed"]["ceiling"]
    assert ceiling["within"] is True and ceiling["rho"] == str(RELEASE_CEILING.rho)
    assert ceiling["composed_rho"] == cert["composed"]["rho"] and "DAS_2020_DHC_Production_Code" in ceiling["source"]


def test_configuration_errors_come_before_the_input_is_read(tmp_path):
    """A level the passes do not name, found by the level check before the spine is built: exit 2 although
    the input is not even Parquet (reading it would be exit 3)."""
    (tmp_path / "input").mkdir()
    for kind in ("persons", "units"):
        (tmp_path / "input" / f"{kind}.parquet").write_text("not parquet\n")
    (tmp_path / "c.toml").write_text(PRODUCTION + '[persons.estimation.l2_passes]\nBlock = [["total"]]\n')
    out = topdown("run", "c.toml", "--input", "input", "--out", "run", "--workers", "1", cwd=tmp_path)
    assert_clean_failure(out, EXIT_CONFIG, "c.toml", "[persons.estimation.l2_passes].Block does not list measured")
    assert not (tmp_path / "run").exists()
