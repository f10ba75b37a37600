"""The shipped example censuses: their declarations and run presets agree with each other and
with the published settings, ``topdown synth --census`` writes inputs of their shape (columns, ranges,
fan-outs, feasible units, structural zeros, deterministic, bounded batches), and each runs end to end."""
from __future__ import annotations

import html
import json
import re
import tomllib
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from cli_subprocess import assert_clean_failure, topdown
from topdown.pipeline.configuration.census import load_census as load
from topdown.pipeline.configuration.config import load_config
from topdown.pipeline.inputs import synth
from topdown.pipeline.inputs.synth import level_counts, synth_hints, synth_shape, synthetic_tree, write_census
from topdown.vocab.queries import build_query

CONF = Path(__file__).resolve().parent.parent / "conf"
CENSUSES = ("e2e_1940", "dhc_1940", "chile_2017")
#: Persons of the small inputs: a few leaves under several parents at every level.
SMALL = {"e2e_1940": 12_000, "dhc_1940": 12_000, "chile_2017": 40_000}
#: The end-to-end test's persons: dhc_1940's GLS uncertainty on 12,000 costs three times its cost on 3,000,
#: which still gives every level more than one node.
END_TO_END = {**SMALL, "dhc_1940": 3_000}


def _preset(name: str) -> dict:
    return tomllib.loads((CONF / f"{name}.toml").read_text())


def _frac(x: str) -> Fraction:
    return Fraction(x)


# ------------------------------------------------------------------------------------------- declarations

@pytest.mark.parametrize("name", CENSUSES)
def test_run_preset_matches_its_declaration(name):
    """Levels, queries, invariants and constraints of the run preset are those the census declares; budgets
    sum to one per product and per level."""
    census, run = load(name), _preset(name)
    assert run["run"]["census"] == name and run["run"]["mode"] == "production" and "seed" not in run["run"]
    product = census.product("persons")
    cfg = run["persons"]
    levels = list(census.hierarchy.names)
    assert list(cfg["budget"]["levels"]) == levels
    assert sum(map(_frac, cfg["budget"]["levels"].values())) == 1
    for level in levels:
        shares = cfg["budget"]["queries"][level]
        assert sum(map(_frac, shares.values())) == 1, level
        for q in shares:
            build_query(product.schema, q)
        assert {q for p in cfg["estimation"]["l2_passes"][level] for q in p} == set(shares)
        for p in cfg["estimation"]["rounder_passes"][level]:
            for q in p:
                build_query(product.schema, q)
    for table, declared in (("invariants", product.invariants), ("constraints", product.constraints)):
        for level, names in cfg[table].items():
            assert level in levels and set(names) <= set(declared), (table, level, names)
    for q in (*product.evaluation_queries, *product.uncertainty_queries):
        build_query(product.schema, q)


def test_e2e_1940_is_the_end_to_end_test():
    """192 cells in E2E order; National > State > County > Enumdist on a 10-digit geocode; epsilon 1/4, 1/4
    per level, 1/10 detailed, 9/40 hhgq, 27/40 age18plus x hispanic x race; the E2E invariants/constraints."""
    census, run = load("e2e_1940"), _preset("e2e_1940")
    p = census.product("persons")
    assert p.schema.dims == (("hhgq", 8), ("age18plus", 2), ("hispanic", 2), ("race", 6)) and p.schema.ncells == 192
    h = census.hierarchy
    assert h.names == ("National", "State", "County", "Enumdist")
    assert [lv.width for lv in h.levels] == [None, 2, 6, 10] and h.by_prefix and not h.us
    b = run["persons"]["budget"]
    assert b["mechanism"] == "geometric" and _frac(b["epsilon"]) == Fraction(1, 4)
    assert {_frac(v) for v in b["levels"].values()} == {Fraction(1, 4)}
    for shares in b["queries"].values():
        assert {q: _frac(v) for q, v in shares.items()} == {
            "detailed": Fraction(1, 10), "hhgq": Fraction(9, 40), "age18plus * hispanic * race": Fraction(27, 40)}
    assert run["persons"]["invariants"] == {"State": ["tot"], "Enumdist": ["gqhh_vect", "gqhh_tot"]}
    assert run["persons"]["constraints"] == {"National": ["total"],
                                             "State": ["total", "hhgq_total_lb", "hhgq_total_ub"],
                                             "Enumdist": ["hhgq_total_lb", "hhgq_total_ub"]}
    assert all(len(v) == 1 for v in run["persons"]["estimation"]["l2_passes"].values())
    assert all(v == [["detailed"]] for v in run["persons"]["estimation"]["rounder_passes"].values())
    assert p.unit_bounds.min_per_unit == (1,) * 8 and p.unit_bounds.cap == (99,) + (99999,) * 7
    assert census.units is not None and census.units.types == 8


#: The Bureau's 1940 multi-pass file (ipums_1940_multipass.ini): query shares within a level and the L2 order.
BUREAU_1940_SHARES = {"hhgq": Fraction(1, 5), "age * hispanic * race * citizen": Fraction(1, 10),
                      "age * sex": Fraction(1, 5), "ageGroups4 * sex": Fraction(1, 10),
                      "ageGroups16 * sex": Fraction(1, 10), "ageGroups64 * sex": Fraction(1, 5),
                      "detailed": Fraction(1, 10)}
BUREAU_1940_L2 = [["hhgq", "ageGroups64 * sex"], ["ageGroups16 * sex"], ["ageGroups4 * sex"], ["age * sex"],
                  ["age * hispanic * race * citizen"], ["detailed"]]
#: Its level shares of epsilon 4 as the Bureau's code spent them: the first five of the file's seven (0.2, 0.2,
#: 0.12 x 5) from the top level down; the last two reach no level.
BUREAU_1940_LEVEL_SHARES_OF_4 = {"National": Fraction(1, 5), "State": Fraction(1, 5), "County": Fraction(3, 25),
                                 "Supdist": Fraction(3, 25), "Enumdist": Fraction(3, 25)}


def test_dhc_1940_age_bands_are_the_bureaus():
    """ageGroupsN: consecutive bands of N years from age 0, the last one what is left of 0..115 (29, 8, 2 bands)."""
    p = load("dhc_1940").product("persons")
    for width, n in ((4, 29), (16, 8), (64, 2)):
        attribute, groups = p.schema.recodes[f"ageGroups{width}"]
        assert attribute == "age" and len(groups) == n
        assert [list(g) for g in groups] == [list(range(a, min(a + width, 116))) for a in range(0, 116, width)]
        assert build_query(p.schema, f"ageGroups{width} * sex").groups.max() + 1 == 2 * n


def test_dhc_1940_is_the_bureaus_configuration():
    """44,544 cells; five levels; epsilon 4, geometric; the multi-pass file's queries, shares and L2 order; its
    level shares as the header states; one rounding pass; the file's invariants and constraints."""
    census, config = load("dhc_1940"), load_config("dhc_1940")
    p = census.product("persons")
    assert p.schema.shape == (8, 2, 116, 2, 6, 2) and p.schema.ncells == 44_544
    assert census.hierarchy.names == ("National", "State", "County", "Supdist", "Enumdist")
    cfg = config.product("persons")
    b = cfg.budget
    assert b.mechanism == "geometric" and b.epsilon == Fraction(76, 25)          # 4 x (0.2 + 0.2 + 3 x 0.12)
    assert {lv: b.epsilon * share for lv, share in b.levels.items()} == {
        lv: 4 * share for lv, share in BUREAU_1940_LEVEL_SHARES_OF_4.items()}
    for level in census.hierarchy.names:
        assert dict(b.queries[level]) == BUREAU_1940_SHARES, level
        assert [list(q) for q in cfg.estimation.l2_passes[level]] == BUREAU_1940_L2, level
        assert [list(q) for q in cfg.estimation.rounder_passes[level]] == [["detailed"]], level
    assert cfg.invariants == {"State": ["tot"], "Enumdist": ["gqhh_vect", "gqhh_tot"]}
    assert cfg.constraints["State"] == ["total", "hhgq_total_lb", "hhgq_total_ub"]
    assert cfg.constraints["Enumdist"] == ["hhgq_total_lb", "hhgq_total_ub"]
    # what makes it run at full size (benchmarks/RESULTS_dhc.md (j)): the answers in play, groups of 2,500 variables
    assert b.measure == "in_play" and cfg.estimation.split_cost == 2500


def test_dhc_1940_censusdp_is_censusdps_reconstruction():
    """The variant: epsilon 4, 1/5 per level, the single-pass file's shares (.2 / .5 / .05 x 4 / .1), one L2 pass
    over the seven queries; everything else the Bureau preset's."""
    bureau, variant = load_config("dhc_1940"), load_config("dhc_1940_censusdp")
    assert variant.run.name == "dhc_1940_censusdp" and variant.census.name == bureau.census.name == "dhc_1940"
    assert variant.run.mode == "production" and variant.run.seed is None
    b, v = bureau.product("persons"), variant.product("persons")
    assert v.budget.mechanism == "geometric" and v.budget.epsilon == 4
    assert set(v.budget.levels.values()) == {Fraction(1, 5)} and list(v.budget.levels) == list(b.budget.levels)
    shares = {"hhgq": Fraction(1, 5), "age * hispanic * race * citizen": Fraction(1, 2), "detailed": Fraction(1, 10),
              **{q: Fraction(1, 20) for q in ("age * sex", "ageGroups4 * sex", "ageGroups16 * sex",
                                               "ageGroups64 * sex")}}
    for level in v.budget.levels:
        assert dict(v.budget.queries[level]) == shares
        assert [set(q) for q in v.estimation.l2_passes[level]] == [set(shares)]
    assert (v.invariants, v.constraints) == (b.invariants, b.constraints)
    assert v.estimation.rounder_passes == b.estimation.rounder_passes
    assert (v.budget.measure, v.estimation.split_cost) == ("declared", 50000)  # as measured: RESULTS_dhc.md (g)


def test_dhc_1940_certificate_shows_the_bureaus_queries_and_shares(capsys):
    """`topdown privacy dhc_1940`: the age bands x sex, no age grouping of ours, total epsilon 76/25, and every
    query's epsilon is 4 x its level's share in the Bureau's file x its query share."""
    from topdown.pipeline.cli import main

    assert main(["privacy", "dhc_1940", "--json"]) == 0
    cert = json.loads(capsys.readouterr().out)["persons"]
    assert {row["level"]: Fraction(row["epsilon"]) for row in cert["levels"]} == {
        lv: 4 * share for lv, share in BUREAU_1940_LEVEL_SHARES_OF_4.items()}
    rows = {(row["level"], row["query"]): row for row in cert["queries"]}
    assert {q for _, q in rows} == set(BUREAU_1940_SHARES)
    for (level, query), row in rows.items():
        assert Fraction(row["epsilon"]) == 4 * BUREAU_1940_LEVEL_SHARES_OF_4[level] * BUREAU_1940_SHARES[query]
        assert row["sensitivity"] == 2
    assert main(["privacy", "dhc_1940"]) == 0
    text = capsys.readouterr().out
    assert "total epsilon = 76/25" in text and "ageGroups64 * sex" in text and "agecat" not in text


def test_chile_2017_is_a_column_hierarchy_without_units():
    """Four levels below the nation, each from its own column; persons only; at least four attributes; zCDP."""
    census, run = load("chile_2017"), _preset("chile_2017")
    h = census.hierarchy
    assert not h.by_prefix and not h.us and census.units is None
    assert len(h.levels) == 5 and all(lv.column and lv.width is None for lv in h.levels[1:])
    p = census.product("persons")
    assert len(p.attributes) >= 4 and p.unit_bounds is None
    assert run["persons"]["budget"]["mechanism"] == "discrete_gaussian" and _frac(run["persons"]["budget"]["rho"]) > 0
    assert run["persons"]["invariants"] == {"Nation": ["tot"]}
    assert all(len(q) >= 3 for q in run["persons"]["budget"]["queries"].values())
    zeros = [c for c in p.constraints.values() if c.rhs == "zero"]
    assert len(zeros) == 2


@pytest.mark.parametrize("name, full", [("e2e_1940", [51, 3108, 152_009]),
                                        ("dhc_1940", [51, 3108, 3205, 152_009])])
def test_full_size_fan_outs_are_the_1940_counts(name, full):
    """At the full count's number of enumeration districts the synthetic hierarchy has the 1940 file's nodes
    per level; a small one keeps every level, each no larger than the one below."""
    census = load(name)
    shape = synth_shape(census, census.product("persons"), synth_hints(census)["persons"])
    assert level_counts(census, shape, full[-1]) == full
    assert level_counts(census, shape, 10 * full[-1])[0] == 51                # never more states than codes
    small = level_counts(census, shape, 14)
    assert small[-1] == 14 and all(1 <= a <= b for a, b in zip(small, small[1:]))
    assert 1 < small[0] < small[-1]


# ------------------------------------------------------------------------------------------------- synth

@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> dict[str, Path]:
    """A small synthetic input of each example census (seed 7)."""
    root = tmp_path_factory.mktemp("census-inputs")
    for name in CENSUSES:
        write_census(root / name, load(name), SMALL[name], seed=7)
    return {name: root / name for name in CENSUSES}


def _read(folder: Path):
    files = sorted(folder.rglob("*.parquet"))
    return files, pq.read_table(files, partitioning=None).to_pandas() if files else None


def _levels(attribute, column):
    """Input values back to levels (the declared ``values``, else the value itself)."""
    if attribute.values is None:
        return column.to_numpy()
    table = dict(attribute.values)
    return column.map(table).to_numpy()


@pytest.mark.parametrize("name", CENSUSES)
def test_synth_writes_the_declared_columns_and_ranges(inputs, name):
    census = load(name)
    product = census.product("persons")
    files, persons = _read(inputs[name] / "persons")
    h = census.hierarchy
    geo = [h.geocode] if h.by_prefix else [lv.column for lv in h.levels[1:]]
    assert list(persons.columns) == geo + [a.column for a in product.attributes]
    assert len(persons) == SMALL[name]                                        # exactly --persons
    for a in product.attributes:
        lv = _levels(a, persons[a.column])
        assert not np.isnan(lv.astype(float)).any(), a.name                 # every value declared
        assert lv.min() >= 0 and lv.max() < a.size, a.name
    top = h.levels[1]
    parts = {f.parent.name for f in files}
    codes = persons[h.geocode].str[:top.width] if h.by_prefix else persons[top.column]
    hive = f"{top.name.lower()}=" if h.by_prefix else ""       # a column hierarchy's records hold the level's column
    assert parts == {f"{hive}{c}" for c in codes.unique()}                    # partitioned by the first level
    assert len(pd.read_parquet(inputs[name] / "persons")) == SMALL[name]     # pandas reads the folder as one table
    for f in files:                                                          # each file holds its partition only
        value = f.parent.name.split("=", 1)[-1]
        t = pq.read_table(f, columns=[h.geocode if h.by_prefix else top.column]).column(0).to_pylist()
        assert {c[:top.width] if h.by_prefix else c for c in t} == {value}
    assert (inputs[name] / "units").is_dir() == (census.units is not None)


@pytest.mark.parametrize("name", CENSUSES)
def test_synth_fan_outs_and_codes(inputs, name):
    """Every level has the scaled node count, codes nest (one parent each), a prefix hierarchy's leaf codes
    match the pattern, a column hierarchy's codes have unequal lengths and letters."""
    census = load(name)
    h = census.hierarchy
    shape = synth_shape(census, census.product("persons"), synth_hints(census)["persons"])
    _, persons = _read(inputs[name] / "persons")
    if h.by_prefix:
        leaf = persons[h.geocode]
        assert leaf.str.fullmatch(h.pattern).all()
        columns = [leaf.str[:lv.width] for lv in h.levels[1:]]
    else:
        columns = [persons[lv.column] for lv in h.levels[1:]]
    leaves = columns[-1].nunique()
    assert leaves == max(1, round(SMALL[name] / shape.persons_per_leaf))
    assert [c.nunique() for c in columns] == level_counts(census, shape, leaves)
    for parent, child in zip(columns, columns[1:]):
        assert (persons.assign(p=parent, c=child).groupby("c")["p"].nunique() == 1).all()
    if not h.by_prefix:
        lengths = [c.str.len() for c in columns]
        assert len({int(x.max()) for x in lengths}) == len(lengths)          # unequal lengths by level
        assert all(c.str.contains("[A-Z]").any() for c in columns)           # codes with letters


@pytest.mark.parametrize("name", ["e2e_1940", "dhc_1940"])
def test_synth_units_make_the_unit_bounds_feasible(inputs, name):
    """Per enumeration district and type: units x min_per_unit <= persons <= units x cap; a facility of every
    group-quarters type somewhere; households are most units."""
    census = load(name)
    product = census.product("persons")
    b = product.unit_bounds
    _, persons = _read(inputs[name] / "persons")
    _, units = _read(inputs[name] / "units")
    assert units[census.units.occupied_column].all()                         # vacant units are not records
    geo = census.hierarchy.geocode
    p = persons.groupby([geo, b.attribute]).size().unstack(fill_value=0).reindex(columns=range(8), fill_value=0)
    u = units.groupby([geo, census.units.type_column]).size().unstack(fill_value=0)
    u = u.reindex(index=p.index, columns=range(8), fill_value=0)
    assert set(units[geo]) == set(persons[geo])
    assert (p.to_numpy() >= u.to_numpy() * np.array(b.min_per_unit)).all()
    assert (p.to_numpy() <= u.to_numpy() * np.array(b.cap)).all()
    assert (u[0] > 0).all() and u[0].sum() > 0.9 * len(units)
    household_size = p[0].sum() / u[0].sum()
    assert 3.0 < household_size < 4.6


def test_synth_1940_distributions(inputs):
    """1940-like: mostly households, about 10 % not white, few Hispanic, ages declining, mostly citizens."""
    census = load("dhc_1940")
    attrs = {a.name: a for a in census.product("persons").attributes}
    _, persons = _read(inputs["dhc_1940"] / "persons")
    share = lambda name, levels: np.isin(_levels(attrs[name], persons[attrs[name].column]), levels).mean()  # noqa: E731
    assert share("hhgq", [0]) > 0.9
    assert 0.07 < 1 - share("race", [0]) < 0.13
    assert share("hispanic", [1]) < 0.03
    assert share("citizen", [1]) > 0.9
    age = persons[attrs["age"].column].to_numpy()
    assert np.mean(age < 20) > np.mean((age >= 40) & (age < 60)) > np.mean(age >= 60) > 0.05
    assert age.max() <= 115


def test_synth_respects_structural_zeros(inputs):
    """No record in a declared structural zero (chile_2017: marital status only from age 15)."""
    census = load("chile_2017")
    product = census.product("persons")
    _, persons = _read(inputs["chile_2017"] / "persons")
    levels = [_levels(a, persons[a.column]) for a in product.attributes]
    cells = np.asarray(product.schema.cell_index(*levels))
    for spec in product.constraints.values():
        if spec.rhs == "zero":
            zero = build_query(product.schema, spec.query).groups >= 0
            assert zero.any() and not zero[cells].any(), spec.name
    age = levels[1]
    assert (age < 3).any() and (age >= 3).any()


def test_synth_is_deterministic_and_seeded(tmp_path, inputs):
    census = load("e2e_1940")
    write_census(tmp_path / "again", census, SMALL["e2e_1940"], seed=7)
    write_census(tmp_path / "other", census, SMALL["e2e_1940"], seed=8)
    for kind in ("persons", "units"):
        a, b = (sorted((d / kind).rglob("*.parquet")) for d in (inputs["e2e_1940"], tmp_path / "again"))
        assert [f.relative_to(inputs["e2e_1940"]) for f in a] == [f.relative_to(tmp_path / "again") for f in b]
        assert all(x.read_bytes() == y.read_bytes() for x, y in zip(a, b))
    assert not _read(tmp_path / "other" / "persons")[1].equals(_read(inputs["e2e_1940"] / "persons")[1])


def test_synth_writes_in_bounded_batches(tmp_path, monkeypatch):
    """Persons are generated and written a batch of leaves at a time (one row group each), so memory does not
    grow with --persons; nothing but the records folders is left in the output."""
    monkeypatch.setattr(synth, "CHUNK_PERSONS", 2_000)
    write_census(tmp_path / "in", load("e2e_1940"), 20_000, seed=1)
    files = sorted((tmp_path / "in" / "persons").rglob("*.parquet"))
    groups = [pq.ParquetFile(f).metadata.row_group(g).num_rows for f in files
              for g in range(pq.ParquetFile(f).metadata.num_row_groups)]
    assert len(groups) > len(files) and sum(groups) == 20_000
    assert max(groups) < 2_000 + 3 * 870 * 3                                  # a batch of leaves: about the chunk
    assert sorted(p.name for p in (tmp_path / "in").iterdir()) == [".topdown-output.json", "persons", "units"]


def test_synth_refuses_a_used_folder_and_bad_hints(tmp_path):
    from topdown.pipeline.configuration.config import ConfigError
    from topdown.pipeline.runtime.rundir import RunDirError

    census = load("e2e_1940")
    (tmp_path / "used").mkdir()
    (tmp_path / "used" / "mine.txt").write_text("keep")
    with pytest.raises(RunDirError, match="not an earlier output"):
        write_census(tmp_path / "used", census, 1000, seed=1)
    assert [p.name for p in (tmp_path / "used").iterdir()] == ["mine.txt"]
    product = census.product("persons")
    for hints, key in (({"weights": {"race": [1, 2]}}, "weights.race"), ({"weights": {"nope": [1]}}, "nope"),
                       ({"nodes": {"Block": 5}}, "Block"), ({"persons_per_leaf": 0}, "persons_per_leaf"),
                       ({"unit_size": [1]}, "unit_size"), ({"colour": 1}, "colour"), ({"codes": [1]}, "codes"),
                       ({"codes": {"State": ["01", "01"]}}, "codes.State")):
        with pytest.raises(ConfigError, match=key):
            synth_shape(census, product, hints)
    with pytest.raises(ConfigError, match="persons"):
        write_census(tmp_path / "none", census, 0, seed=1)
    rng = np.random.default_rng(0)
    for codes, says in (({"County": "{bogus}"}, "codes.County: format"), ({"County": "{n}"}, "not 4 characters"),
                        ({"County": ["0010", "0030"]}, r"codes.County: \d+ nodes needed, 2 codes listed")):
        shape = synth_shape(census, product, {"nodes": {"State": 20, "County": 50}, "codes": codes})
        with pytest.raises(ConfigError, match=says):
            synthetic_tree(census, shape, 400, rng)


def test_synth_census_usage_errors_exit_2(tmp_path):
    """Usage errors of `synth --census` are one line, exit 2, nothing written; an unknown census lists the
    shipped ones."""
    out = tmp_path / "out"
    outcome = topdown("synth", "--census", "atlantis", "--persons", "100", out)
    assert_clean_failure(outcome, 2, "atlantis", *CENSUSES)
    assert_clean_failure(topdown("synth", "--census", "e2e_1940", "--blocks", "5", "--persons", "9", out), 2,
                         "--blocks")
    assert_clean_failure(topdown("synth", "--census", "e2e_1940", out), 2, "--persons")
    assert_clean_failure(topdown("synth", out), 2, "--blocks", "--census")
    assert not out.exists()


# --------------------------------------------------------------------------------------------- end to end

@pytest.fixture(scope="module")
def cluster() -> list[str]:
    """``--scheduler ADDRESS`` of one local cluster of one worker, which the end-to-end commands of this file share
    (an embedded cluster a command costs a few seconds to start; the embedded path has tests of its own)."""
    from distributed import LocalCluster

    with LocalCluster(n_workers=1, threads_per_worker=1, processes=True, dashboard_address=":0",
                      host="127.0.0.1") as local:
        yield ["--scheduler", local.scheduler_address]


def _example_config(tmp_path: Path, name: str, input_dir: Path) -> Path:
    config = tmp_path / f"{name}-test.toml"
    config.write_text(f'include = "{name}.toml"\n[run]\nmode = "test"\nseed = 11\ninput = "{input_dir}"\n')
    return config


#: dhc_1940's 44,544 cells in six L2 passes take minutes through every command: slow; its fast check is
#: test_dhc_1940_runs_the_bureaus_passes_and_verifies.
@pytest.mark.parametrize("name", [pytest.param(n, marks=pytest.mark.slow) if n == "dhc_1940" else n for n in CENSUSES])
def test_example_census_end_to_end(tmp_path, name, cluster):
    """synth --census, then run (test mode), verify, uncertainty, evaluate (with the intervals), nmf, reprocess,
    replicates and uncertainty with them, each exit 0."""
    from topdown.pipeline.cli import main

    data = tmp_path / "input"
    assert main(["synth", "--census", name, "--persons", str(END_TO_END[name]), "--seed", "3", str(data)]) == 0
    config = _example_config(tmp_path, name, data)
    run = tmp_path / "run"
    assert main(["run", str(config), "--out", str(run), *cluster, "--quiet"]) == 0
    assert main(["verify", str(run)]) == 0
    assert main(["uncertainty", str(run), "--out", str(tmp_path / "u.parquet"), *cluster, "--quiet"]) == 0
    assert main(["evaluate", str(run), "--truth", str(data), "--out", str(tmp_path / "eval"), *cluster,
                 "--uncertainty", str(tmp_path / "u.parquet"), "--quiet"]) == 0
    _check_evaluation_speaks_the_census(tmp_path / "eval", load(name))
    _check_audit_speaks_the_census(tmp_path, config, data, run, load(name), cluster)
    assert main(["nmf", str(run), "--out", str(tmp_path / "nmf")]) == 0
    assert main(["reprocess", str(run), "--out", str(tmp_path / "again"), *cluster, "--quiet"]) == 0
    assert main(["verify", str(tmp_path / "again")]) == 0
    assert main(["replicates", str(run), "--n", "2", "--out", str(tmp_path / "reps"), *cluster]) == 0
    assert main(["uncertainty", str(run), "--replicates", str(tmp_path / "reps"), "--out", str(tmp_path / "r.parquet"),
                 *cluster, "--quiet"]) == 0
    reps = pq.read_table(tmp_path / "r.parquet").to_pandas()
    assert reps["method"].value_counts().to_dict() == {"gls": len(reps) // 2, "amc": len(reps) // 2}
    assert reps.loc[reps["method"] == "amc", "rep_n"].eq(2).all() and reps["published"].notna().all()
    product = load(name).product("persons")
    summary = pq.read_table(tmp_path / "eval" / "summary.parquet").to_pandas()
    assert set(product.evaluation_queries) <= set(summary["query"])  # the declared queries, not P.L. 94-171's
    unc = pq.read_table(tmp_path / "u.parquet").to_pandas()
    assert set(unc["query"]) == set(product.uncertainty_queries) and set(unc["level"]) >= set(load(name).hierarchy.names)
    coverage = pq.read_table(tmp_path / "eval" / "intervals_coverage.parquet").to_pandas()
    assert set(coverage["level"]) <= set(load(name).hierarchy.names) and len(coverage)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["levels"] == list(load(name).hierarchy.names) and manifest["status"] == "complete"
    leaf = load(name).hierarchy.leaf
    assert (run / "histograms" / "persons" / f"level={leaf}").is_dir()


#: Words of the U.S. P.L. 94-171 product that no other census's evaluation or audit may show (unless it declares
#: a name of its own so spelled: dhc_1940's votingage recode).
PL_WORDS = ("votingage", "cenrace", "majorRaces", "94-171", "P.L.")


def _foreign_words(census) -> list[str]:
    own = {n for p in census.products for n in (*p.schema.dim_names, *p.schema.recodes)}
    return [w for w in PL_WORDS if w not in own]


def _check_evaluation_speaks_the_census(out: Path, census) -> None:
    """evaluate's tables and report name the census's own queries: its declared studies are computed (the
    sampling baselines of its sample queries), an undeclared one is left out with a one-line note, and no
    P.L. 94-171 word appears."""
    roles = census.products[0].evaluation
    sampling = pq.read_table(out / "sampling.parquet").to_pandas()
    assert (set(sampling["query"]) if len(sampling) else set()) == set(roles.sample_queries)
    assert (pq.read_table(out / "blau.parquet").num_rows > 0) == bool(roles.diversity_query)
    assert (pq.read_table(out / "homogeneity.parquet").num_rows > 0) == roles.homogeneity
    report = re.sub(r"data:image/png;base64,[^\"]+", "", (out / "report.html").read_text())
    summary = pq.read_table(out / "summary.parquet").to_pandas()
    for word in _foreign_words(census):
        assert word not in report and not summary["query"].str.contains(word, regex=False).any(), word
    notes = re.findall(r"<p><em>(.*?)</em></p>", report)
    undeclared = [n for n in notes if "declares no" in n]
    assert len(undeclared) == (not roles.diversity_query) + (not roles.homogeneity) + (not roles.share_query) + (
        not roles.sample_queries or not roles.tradeoff_query)
    assert all(html.unescape(n).count(census.name) == 1 for n in undeclared)


def _check_audit_speaks_the_census(tmp_path: Path, config: Path, data: Path, run: Path, census,
                                   cluster: list[str]) -> None:
    """`topdown audit` moves one record between the run's two most populous leaves and audits a query of the
    census's own (named on its first product's schema)."""
    from topdown.pipeline.cli import main

    leaf = census.hierarchy.leaf
    totals = pq.read_table(run / "histograms" / "persons" / f"level={leaf}").to_pandas().groupby(
        "geocode", observed=True)["count"].sum().sort_values(ascending=False, kind="stable")
    src, dst = (str(g) for g in totals.index[:2])
    query = next(q for q in census.products[0].evaluation_queries if q not in ("total", "detailed"))
    out = tmp_path / "audit"
    assert main(["audit", str(config), "--input", str(data), "--move", f"{src}:{dst}", "--runs", "2",
                 "--queries", f"total,{query}", "--out", str(out), *cluster]) == 0
    table = pq.read_table(out / "audit.parquet").to_pandas()
    assert set(table["query"]) == {"total", query} and set(table["level"]) <= set(census.hierarchy.names)
    assert not any(word in (out / "report.txt").read_text() for word in _foreign_words(census))


def _synth_run_verify(tmp_path: Path, preset: str, persons: int) -> Path:
    """`topdown synth --census dhc_1940`, `topdown run PRESET` (test mode) and `topdown verify`, each exit 0."""
    from topdown.pipeline.cli import main

    data = tmp_path / "input"
    assert main(["synth", "--census", "dhc_1940", "--persons", str(persons), "--seed", "3", str(data)]) == 0
    run = tmp_path / "run"
    config = _example_config(tmp_path, preset, data)
    assert main(["run", str(config), "--out", str(run), "--workers", "1", "--quiet"]) == 0
    assert main(["verify", str(run)]) == 0
    return run


def test_dhc_1940_runs_the_bureaus_passes_and_verifies(tmp_path):
    """A small run of the Bureau's preset: verified, its noisy measurements hold the seven queries at every
    level, and the run's configuration records the six L2 passes."""
    run = _synth_run_verify(tmp_path, "dhc_1940", 3_000)
    nm = pq.read_table(run / "noisy_measurements" / "persons").to_pandas()
    levels = load("dhc_1940").hierarchy.names
    assert set(nm["level"].astype(str)) == set(levels)
    for level, queries in nm.groupby(nm["level"].astype(str))["query"]:
        assert set(queries.astype(str)) == set(BUREAU_1940_SHARES), level
    passes = json.loads((run / "config.json").read_text())["persons"]["estimation"]["l2_passes"]
    assert passes == {level: BUREAU_1940_L2 for level in levels}


@pytest.mark.slow
@pytest.mark.parametrize("preset", ["dhc_1940", "dhc_1940_censusdp"])
def test_dhc_1940_presets_run_20000_persons(tmp_path, preset):
    """Both 1940 DHC presets on 20,000 synthetic persons (several parents at every level), verified."""
    run = _synth_run_verify(tmp_path, preset, 20_000)
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["name"] == preset


@pytest.mark.parametrize("name", CENSUSES)
def test_synth_census_command_line(tmp_path, name):
    """`topdown synth --census NAME` through the declaration loader writes what write_census writes."""
    out = tmp_path / "cli"
    outcome = topdown("synth", "--census", name, "--persons", "3000", "--seed", "5", out)
    assert outcome.code == 0, outcome
    write_census(tmp_path / "lib", load(name), 3000, seed=5)
    for f in sorted((tmp_path / "lib").rglob("*.parquet")):
        assert (out / f.relative_to(tmp_path / "lib")).read_bytes() == f.read_bytes()
    assert_clean_failure(topdown("synth", "--census", name, "--persons", "3000", out), 4, str(out))


def test_a_declared_census_run_discloses_no_confidential_count(tmp_path, capsys):
    """The non-U.S. example's run directory (outside its protected outputs) and its log show no true total of a
    node below the root, whose total alone is invariant; the invariants file holds that one total."""
    import pandas as pd
    from rel_inputs import scan_run_dir
    from topdown.pipeline.cli import main

    name = "chile_2017"
    census = load(name)
    data = tmp_path / "input"
    assert main(["synth", "--census", name, "--persons", str(SMALL[name]), "--seed", "3", str(data)]) == 0
    persons = pd.concat([pq.read_table(f).to_pandas() for f in sorted((data / "persons").rglob("*.parquet"))])
    columns = [level.column for level in census.hierarchy.levels[1:]]
    secrets = {int(n) for c in columns for n in persons.groupby(c, observed=True).size()} - {len(persons)}
    secrets = {n for n in secrets if n >= 100}  # small numbers occur in any manifest by chance
    assert len(secrets) > 10
    capsys.readouterr()
    run = tmp_path / "run"
    assert main(["run", str(_example_config(tmp_path, name, data)), "--out", str(run), "--workers", "1"]) == 0
    log = capsys.readouterr()
    findings, scanned = scan_run_dir(run, secrets, strip=str(tmp_path))
    assert any(s.startswith("invariants/") for s in scanned) and any(s.startswith("manifest.json") for s in scanned)
    assert not findings, findings
    assert not [line for line in (log.out + log.err).splitlines()
                if any(str(n) in line.split() for n in secrets)]
    inv = pd.read_parquet(run / "invariants" / "persons.parquet")
    assert set(inv["tot"].dropna()) == {len(persons)} and set(inv.loc[inv["tot"].notna(), "level"]) == {"Nation"}
