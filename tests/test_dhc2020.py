"""The Bureau's 2020 DHC declared (conf/census/dhc2020.toml, conf/dhc2020.toml): the schemas' sizes, the strategy's
budget (rho 4.9622 persons, 7.7005 households with its unit histogram), the synthetic input's households and
group quarters, and a whole run that `topdown verify` accepts."""
from __future__ import annotations

import shutil
from fractions import Fraction

import numpy as np
import pandas as pd
import pytest

from topdown.pipeline.cli import main
from topdown.pipeline.configuration.census import load_census
from topdown.pipeline.configuration.config import load_config
from topdown.vocab.queries import build_query


@pytest.fixture(scope="module")
def census():
    return load_census("dhc2020")


def test_schemas_have_the_bureaus_sizes(census):
    """DHC-P 42 x 2 x 116 x 2 x 63, DHC-H 2 x 9 x 2 x 7 x 4 x 3 x 522 and the 35-cell unit histogram; the
    recodes' group counts of the fact sheet."""
    cells = {p.name: p.schema.ncells for p in census.products}
    assert cells == {"persons": 1_227_744, "households": 1_578_528, "units": 35}
    persons, households = census.product("persons").schema, census.product("households").schema
    assert dict(persons.dims) == {"relgq": 42, "sex": 2, "age": 116, "hispanic": 2, "cenrace": 63}
    answers = {"hispanic * sex * age_40_groups * relship_and_eight_level_GQ * cenrace": 252_000,
               "relgq * age_40_groups * hispanic * cenrace * sex": 423_360, "gq_constr_groups * age_10_groups": 60,
               "age_38_groups * sex": 76, "popSehsdTargetsRelship": 19}
    for q, n in answers.items():
        assert build_query(persons, q).n_answers == n, q
    answers = {"sex * hispanic * tenure * race * DetailedCoupleTypeMultGenDetOwnChildSize": 15_372,
               "sex * hispanic * tenure * race * hhage * DetailedCoupleTypeMultGenDetOwnChildSize": 138_348,
               "tenure * hhage * DetailedCoupleTypeMultGenDetOwnChildSize": 4_941,
               "partner_type_detailed_own_child_status * sex * hhtenshort_2lev": 48,
               "sex * hispanic * tenure * race * family_nonfamily_size": 1_092,
               "sex * hispanic * tenure * race * DetailedCoupleTypeDetOwnChildSize": 8_736}
    for q, n in answers.items():
        assert build_query(households, q).n_answers == n, q
    zeros = [c for c in census.product("persons").constraints.values() if c.rhs == "zero"]
    assert len(zeros) == 32


def test_the_preset_spends_the_bureaus_budget():
    """Experiment 23.1: rho 24811/5000 for DHC-P, 15401/2000 for DHC-H and its unit histogram together, the
    Bureau's rho at US, State, County, Block_Group and Block, Prim + Tract_Subset_Group + Tract_Subset at Tract."""
    config = load_config("dhc2020")
    assert config.run.mode == "production" and config.run.products == ["persons", "households", "units"]
    budget = {p: config.product(p).budget for p in config.run.products}
    assert budget["persons"].rho == Fraction(24811, 5000)
    assert budget["households"].rho + budget["units"].rho == Fraction(15401, 2000)
    level_rho = {lv: budget["persons"].rho * s for lv, s in budget["persons"].levels.items()}
    assert level_rho == {"US": Fraction(949, 10000), "State": Fraction(12987, 10000), "County": Fraction(496, 1000),
                         "Tract": Fraction(6214 * 2 + 13888, 10000), "Block_Group": Fraction(43, 100),
                         "Block": Fraction(11, 1000)}
    units = budget["units"]
    assert units.rho * units.levels["Block"] == Fraction(15, 10000)
    for p in ("persons", "households"):
        assert budget[p].measure == "in_play" and budget[p].root_support


def test_privacy_prints_the_accounting_within_the_ceiling(capsys):
    assert main(["privacy", "dhc2020"]) == 0
    out = capsys.readouterr().out
    assert "total rho = 24811/5000" in out and "rho = 126627/10000 = 12.6627" in out and "(within it)" in out


def test_synthetic_households_fit_their_members(tmp_path, census):
    """One householder per occupied housing unit, none elsewhere; the household's size, elderly presence and
    tenure agree with its members and its unit; every record outside the structural zeros; the same seed
    gives the same files."""
    out = tmp_path / "input"
    assert main(["synth", "--census", "dhc2020", "--persons", "2000", "--seed", "5", str(out)]) == 0
    persons, units = pd.read_parquet(out / "persons"), pd.read_parquet(out / "units")
    assert 1800 <= len(persons) <= 2200
    heads = persons[persons["relgq"] <= 1]
    occupied = units[units["tenvacgq"] <= 3]
    assert len(heads) == len(occupied)
    assert heads.groupby("geoid").size().equals(occupied.groupby("geoid").size())
    assert units["occupied"].to_numpy().sum() == len(occupied) + (units["tenvacgq"] >= 11).sum()
    hh = census.product("households").schema
    size_of = np.zeros(hh.dims[-1][1], np.int64)
    for g, levels in enumerate(hh.recodes["hh_size"][1]):
        size_of[list(levels)] = g + 1
    in_households = persons[persons["relgq"] < 18]
    sizes = occupied.assign(size=size_of[occupied["hh_type"]]).groupby("geoid")["size"].sum()  # 7 = "7 or more"
    members = in_households.groupby("geoid").size()
    assert (members.reindex(sizes.index, fill_value=0) >= sizes).all() and members.sum() <= 1.01 * sizes.sum()
    alone_persons = persons.loc[persons["relgq"] == 0].groupby("geoid").size()
    assert (alone_persons <= occupied.groupby("geoid").size().reindex(alone_persons.index)).all()
    alone = occupied[size_of[occupied["hh_type"]] == 1]
    age_group = np.searchsorted([60, 65, 75], alone["hh_age"].to_numpy(), side="right")
    assert (alone["hh_elderly"].to_numpy() == age_group).all()
    gq = persons[persons["relgq"] >= 18]
    assert len(gq) and set(gq["relgq"]) <= set(range(18, 42))
    for product, frame, columns in ((census.product("persons"), persons, ["relgq", "sex", "age", "hispanic", "cenrace"]),):
        cells = product.schema.cell_index(*(frame[c].to_numpy() for c in columns))
        for spec in product.constraints.values():
            if spec.rhs == "zero":
                assert not (build_query(product.schema, spec.query).groups >= 0)[cells].any(), spec.name
    again = tmp_path / "again"
    assert main(["synth", "--census", "dhc2020", "--persons", "2000", "--seed", "5", str(again)]) == 0
    assert pd.read_parquet(again / "units").equals(units)


@pytest.mark.slow
def test_a_dhc_run_end_to_end_verifies(tmp_path):
    """`topdown run dhc2020` (test mode, no noise) on a tiny synthetic input: all three products at every level,
    and `topdown verify` (children sum to parents, non-negative integers, invariants and structural zeros)."""
    data = tmp_path / "input"
    assert main(["synth", "--census", "dhc2020", "--persons", "400", "--seed", "1", str(data)]) == 0
    config = tmp_path / "dhc.toml"
    config.write_text(f'include = "dhc2020"\n[run]\nmode = "test"\nseed = 3\ninput = "{data}"\n'
                      '[persons.budget]\nrho = "inf"\nroot_threshold = 0.5\n'
                      '[households.budget]\nrho = "inf"\nroot_threshold = 0.5\n[units.budget]\nrho = "inf"\n')
    run = tmp_path / "run"
    assert main(["run", str(config), "--out", str(run), "--workers", "1", "--quiet"]) == 0
    assert main(["verify", str(run)]) == 0
    persons = pd.read_parquet(data / "persons")
    block = pd.read_parquet(run / "histograms" / "persons" / "level=Block")
    assert block["count"].sum() == len(persons) and (block["count"] > 0).all()
    households = pd.read_parquet(run / "histograms" / "households" / "level=US")
    assert households["count"].sum() == (pd.read_parquet(data / "units")["tenvacgq"] <= 3).sum()


@pytest.mark.slow
def test_the_commands_after_a_dhc_run(tmp_path, capsys, monkeypatch):
    """A noisy run (test mode, the preset's budgets and root thresholds) of 3,000 synthetic persons: `verify`,
    `evaluate` (the declared queries of each product), `nmf`, `reprocess` (verified); `uncertainty` writes the
    unit histogram's rows and says in a warning a product why it computes no GLS for DHC-P and DHC-H (their
    covariances would be 1.4 GiB and 599 MiB a node), exit 3 where no product fits; `replicates`
    rebuilds the unit records that two products' MDFs share with the published unit counts ([census.units.detail]),
    and its replicates verify; `uncertainty --replicates` adds AMC rows for every product, GLS or not."""
    import pyarrow.parquet as pq

    from topdown.pipeline.evaluation import gls

    data = tmp_path / "input"
    assert main(["synth", "--census", "dhc2020", "--persons", "3000", "--seed", "1", str(data)]) == 0
    config = tmp_path / "dhc.toml"
    config.write_text(f'include = "dhc2020"\n[run]\nmode = "test"\nseed = 3\ninput = "{data}"\n')
    run = tmp_path / "run"
    assert main(["run", str(config), "--out", str(run), "--workers", "1", "--quiet"]) == 0
    assert main(["verify", str(run)]) == 0
    assert main(["evaluate", str(run), "--truth", str(data), "--out", str(tmp_path / "eval"), "--workers", "1",
                 "--quiet"]) == 0
    summary = pq.read_table(tmp_path / "eval" / "summary.parquet").to_pandas()
    for product in load_census("dhc2020").products:
        assert set(product.evaluation_queries) <= set(summary.loc[summary["product"] == product.name, "query"])
    assert main(["nmf", str(run), "--out", str(tmp_path / "nmf")]) == 0
    assert main(["reprocess", str(run), "--out", str(tmp_path / "again"), "--workers", "1", "--quiet"]) == 0
    assert main(["verify", str(tmp_path / "again")]) == 0
    capsys.readouterr()
    assert main(["uncertainty", str(run), "--out", str(tmp_path / "u.parquet"), "--workers", "1", "--quiet"]) == 0
    warned = [line for line in capsys.readouterr().err.splitlines() if "GLS is not computed" in line]
    assert len(warned) == 2 and all(f"uncertainty: product '{name}': GLS is not computed for it" in line
                                    for name, line in zip(("persons", "households"), warned))
    rows = pq.read_table(tmp_path / "u.parquet").to_pandas()
    assert set(rows["product"]) == {"units"} and set(rows["query"]) == {"total", "tenvacgq"} and len(rows)
    monkeypatch.setattr(gls, "MAX_MATRIX_BYTES", 0)  # no product fits: nothing to write
    assert main(["uncertainty", str(run), "--out", str(tmp_path / "none.parquet"), "--workers", "1", "--quiet"]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert err[-1].startswith("topdown: input error: product 'persons': GLS is not computed for it")
    assert not (tmp_path / "none.parquet").exists()
    monkeypatch.undo()
    reps = tmp_path / "reps"
    shutil.move(data, tmp_path / "away")  # replicates read published files only: the confidential input is gone
    assert main(["replicates", str(run), "--n", "2", "--out", str(reps), "--workers", "1", "--quiet"]) == 0
    shutil.move(tmp_path / "away", data)
    units = pd.read_parquet(reps / "input" / "units.parquet")
    assert len(units) and (units["unit_type"] == load_census("dhc2020").units.detail.type_of(units["tenvacgq"])).all()
    households = pd.read_parquet(run / "mdf" / "households")  # the rebuilt households: the MDF's, in its order
    occupied = units[units["occupied"] & (units["unit_type"] == 0)]
    per_block = occupied.groupby("geoid").size()
    published = households.groupby("Block").size().reindex(per_block.index, fill_value=0)
    assert (per_block <= published).all() and occupied["hh_type"].isin(households["hhtype"].astype(int)).all()
    for rep in ("rep-000", "rep-001"):
        assert main(["verify", str(reps / rep)]) == 0
        for product in ("persons", "households", "units"):  # the replicate input keeps the published invariants
            assert pd.read_parquet(reps / rep / "invariants" / f"{product}.parquet").equals(
                pd.read_parquet(run / "invariants" / f"{product}.parquet")), (rep, product)
    capsys.readouterr()
    assert main(["uncertainty", str(run), "--replicates", str(reps), "--out", str(tmp_path / "amc.parquet"),
                 "--workers", "1", "--quiet"]) == 0
    assert sum("its gls rows are left out, its amc rows are written" in line
               for line in capsys.readouterr().err.splitlines()) == 2
    rows = pq.read_table(tmp_path / "amc.parquet").to_pandas()
    methods = rows.groupby("product")["method"].unique().map(sorted).to_dict()
    assert methods == {"persons": ["amc"], "households": ["amc"], "units": ["amc", "gls"]}
    census = load_census("dhc2020")
    for product in census.products:  # every published count of the declared queries at every node
        amc = rows[(rows["product"] == product.name) & (rows["method"] == "amc")]
        for query in product.uncertainty_queries:
            n = build_query(product.schema, query).n_answers
            assert len(amc[amc["query"] == query]) == n * sum(
                pd.read_parquet(run / "spine.parquet")[level].nunique() for level in census.hierarchy.names)
    assert (rows["rep_n"][rows["method"] == "amc"] == 2).all() and rows["published"].notna().all()


def test_verify_holds_the_unit_histogram_to_its_units_of_each_type():
    """DHC-H's gq_vect (a unit_counts constraint on the unit histogram's hhgq_vect): verify counts a node's records
    of each unit type against its published units, and finds a facility turned into a vacant housing unit."""
    from topdown.pipeline.outputs.verify import VerifyReport, verify_declared

    census = load_census("dhc2020")
    units = census.product("units")
    config = type("Cfg", (), {"constraints": {"Block": ["gq_vect"]}})()
    reader = type("Reader", (), {"config": lambda self: type("C", (), {"product": lambda _, name: config})()})()
    inv = pd.DataFrame({"level": "Block", "geocode": ["b1", "b2"], "u0": [3, 2], "u1": [1, 0],
                        **{f"u{k}": [0, 0] for k in range(2, 8)}})
    spine = pd.DataFrame({"geoid": ["b1", "b2"], "Block": ["b1", "b2"]})
    good = pd.DataFrame({"geocode": ["b1", "b1", "b2"], "cell": [0, 12, 4], "count": [3, 1, 2]})
    for hist, ok in ((good, True), (good.assign(cell=[0, 5, 4]), False)):
        rep = VerifyReport()
        verify_declared(reader, {"Block": hist}, inv, spine, rep, True, units, census.hierarchy, check_mdf=False,
                        state=None)
        assert rep.ok == ok and rep.checks >= 1, rep.failures
    assert rep.failures == ["units Block: gq_vect: hhgq_vect == the node's units of each type broken"]
