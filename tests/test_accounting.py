"""Budget checks, allocations, zCDP conversions, certificates and the shipped presets."""
from __future__ import annotations

import json
import math
from fractions import Fraction

import numpy as np
import pytest

from topdown.pipeline.privacy.accounting import Allocation, allocate, check_budget
from topdown.pipeline.privacy.budget import (NEIGHBOURS, PureEpsilon, Rho, epsilon_delta_curve, rho_for_epsilon,
                                             of_config, zcdp_to_epsilon, zcdp_to_epsilon_bun_steinke)
from topdown.pipeline.privacy.certificate import certificate, check_path_condition, render_certificate
from topdown.pipeline.configuration.config import BudgetConfig, ConfigError, config_from_dict, load_config
from topdown.pipeline.privacy.mechanisms import discrete_gaussian_variance, geometric_variance
from topdown.pipeline.configuration.census import PERSONS, UNITS

PRODUCTION_RHO = Fraction(293764, 114921)
PRESETS = ("pl94_production_2021", "pl94_april2021", "e2e_1940", "dhc_1940", "dhc_1940_censusdp", "chile_2017")


def budget(**overrides) -> BudgetConfig:
    data = {"mechanism": "discrete_gaussian", "rho": "1",
            "levels": {"A": "1/2", "B": "1/2"},
            "queries": {"A": {"total": "1"}, "B": {"total": "1/4", "detailed": "3/4"}}}
    data.update(overrides)
    return BudgetConfig.model_validate(data)


# ------------------------------------------------------------------------------------------ allocation
def test_allocation_by_hand() -> None:
    a = allocate(budget(), "B", "detailed")
    assert a == Allocation("B", "detailed", Fraction(3, 8), Rho(Fraction(3, 8)))
    assert a.budget.sigma2() == Fraction(8, 3) and a.variance == discrete_gaussian_variance(Fraction(8, 3))
    assert a.measured and not a.noiseless
    moved = allocate(budget(), "B", "detailed", plb=Fraction(1, 4))          # budget moved by bypassing
    assert (moved.share, moved.budget, moved.budget.sigma2()) == (Fraction(3, 16), Rho(Fraction(3, 16)), Fraction(16, 3))
    assert allocate(budget(rho="1/10"), "A", "total").budget.sigma2() == 20


def test_unmeasured_and_infinite_allocations() -> None:
    off = allocate(budget(), "A", "total", plb=Fraction(0))
    assert not off.measured and off.variance == math.inf and off.budget == Rho(Fraction(0))
    assert off.budget.sigma2() is None and off.exact_probability == 0.0
    inf = allocate(budget(rho="inf"), "B", "total")
    assert inf.noiseless and inf.variance == 0.0 and inf.budget == Rho(None) and inf.budget.sigma2() is None
    assert inf.exact_probability == 1.0
    with pytest.raises(ValueError, match="outside"):
        allocate(budget(), "A", "total", plb=Fraction(3, 2))


def test_geometric_allocation() -> None:
    b = budget(mechanism="geometric", rho=None, epsilon="1/4")
    a = allocate(b, "B", "detailed")
    assert a.budget == PureEpsilon(Fraction(3, 32))
    assert a.budget.parameters() == {"epsilon": "3/32", "sensitivity": 2}
    q = math.exp(-3 / 64)
    assert a.variance == pytest.approx(2 * q / (1 - q) ** 2, rel=1e-12)
    assert a.variance == geometric_variance(Fraction(3, 32), 2)


def test_allocate_names_unknown_entries() -> None:
    with pytest.raises(ConfigError, match="'Tract'"):
        allocate(budget(), "Tract", "total")
    with pytest.raises(ConfigError, match=r"queries\.A: query 'hhgq'"):
        allocate(budget(), "A", "hhgq")


# -------------------------------------------------------------------------------------- budget checks
@pytest.mark.parametrize("overrides, levels, message", [
    ({"levels": {"A": "-1/2", "B": "3/2"}}, ["A", "B"], r"budget\.levels\.A = -1/2 is negative"),
    ({"levels": {"A": "1/2", "B": "1/3"}}, ["A", "B"], r"level proportions sum to 5/6"),
    ({}, ["A", "B", "C"], r"no proportion for level 'C'"),
    ({}, ["A"], r"budget\.levels\.B: unknown level"),
    ({"queries": {"A": {"total": "1"}, "B": {"total": "1/2", "detailed": "1/3"}}}, ["A", "B"],
     r"budget\.queries\.B: query proportions sum to 5/6"),
    ({"queries": {"A": {"total": "1"}, "B": {"total": "-1/4", "detailed": "5/4"}}}, ["A", "B"],
     r"budget\.queries\.B\.\"total\" = -1/4 is negative"),
    ({"queries": {"A": {"total": "1"}, "B": {"agegroup": "1"}}}, ["A", "B"],
     r"budget\.queries\.B\.\"agegroup\": unknown query term"),
    ({"queries": {"A": {"total": "1"}, "B": {"voting": "1/2", "detailed": "1/2"}}}, ["A", "B"],
     r"budget\.queries\.B\.\"voting\": .*not a partition"),
    ({"queries": {"A": {"votingage * hispanic": "1/2", "hispanic * votingage": "1/2"}, "B": {"total": "1"}}},
     ["A", "B"], r"budget\.queries\.A\.\"hispanic \* votingage\": the same query as \"votingage \* hispanic\""),
    ({"queries": {"A": {"total": "1"}}}, ["A", "B"], r"budget\.queries\.B: no queries"),
])
def test_check_budget_names_the_offending_entry(overrides: dict, levels: list[str], message: str) -> None:
    with pytest.raises(ConfigError, match=message):
        check_budget(budget(**overrides), levels, PERSONS)


def test_check_budget_accepts_valid_and_prefixes_location() -> None:
    check_budget(budget(), ["A", "B"], PERSONS)
    with pytest.raises(ConfigError, match=r"^my\.toml: units\.budget\.queries\.A\.\"occupied\""):
        check_budget(budget(queries={"A": {"occupied": "1"}, "B": {"total": "1"}}), ["A", "B"], UNITS,
                     where="my.toml: units.budget")


# ---------------------------------------------------------------------------------------- conversions
def test_production_epsilon_and_bun_steinke_values_of_the_paper() -> None:
    assert round(zcdp_to_epsilon(PRODUCTION_RHO, Fraction(1, 10 ** 10)), 2) == 17.14      # DAS-2020 curve.py
    # Abowd et al. 2022, section 8.1, quotes the Bun-Steinke conversion for the April 2021 budgets
    assert round(zcdp_to_epsilon_bun_steinke(Fraction(1095, 1000), 1e-10), 2) == 11.14
    assert round(zcdp_to_epsilon_bun_steinke(Fraction(1885, 10000), 1e-10), 2) == 4.36
    assert zcdp_to_epsilon(Fraction(0), 1e-10) == 0.0


@pytest.mark.parametrize("rho", [Fraction(1, 100), Fraction(1), PRODUCTION_RHO, Fraction(50)])
def test_cks_epsilon_solves_the_delta_equation(rho: Fraction) -> None:
    """At the returned epsilon, min over alpha of the CKS delta(alpha) equals the target delta."""
    delta = 1e-10
    eps = zcdp_to_epsilon(rho, delta)
    alphas = 1 + np.exp(np.linspace(-12, 8, 400_001))
    r = float(rho)
    log_delta = ((alphas - 1) * (alphas * r - eps) - np.log(alphas - 1) + alphas * np.log1p(-1 / alphas))
    assert log_delta.min() == pytest.approx(math.log(delta), abs=1e-4)
    assert eps <= zcdp_to_epsilon_bun_steinke(rho, delta)


def test_epsilon_delta_curve_is_decreasing_in_delta() -> None:
    curve = epsilon_delta_curve(PRODUCTION_RHO, [1e-6, 1e-8, 1e-10, 1e-12, 1e-14])
    eps = [e for _, e in curve]
    assert eps == sorted(eps) and curve[2][1] == pytest.approx(17.1436, abs=1e-3)
    with pytest.raises(ValueError, match="delta"):
        zcdp_to_epsilon(PRODUCTION_RHO, 0)


# -------------------------------------------------------------------------------------------- presets
@pytest.mark.parametrize("name", PRESETS)
def test_presets_load_and_pass_budget_checks(name: str) -> None:
    config = load_config(name)
    for spec in config.run_products:
        product = spec.name
        b = config.product(product).budget
        check_budget(b, list(b.levels), spec.schema)
        est = config.product(product).estimation
        for level, props in b.queries.items():       # every measured query is estimated in some L2 pass
            in_l2 = {q for pass_ in est.l2_passes[level] for q in pass_}
            assert set(props) <= in_l2, (name, product, level)
    assert (config.run.mode, config.run.seed) == ("production", None)  # safe default: OS CSPRNG, no seed
    cert = certificate(config)
    assert cert["private"] is True and cert["noise_reproducible_from_seed"] is False and "warning" not in cert


def test_production_preset_matches_the_facts() -> None:
    config = load_config("pl94_production_2021")
    b = config.product("persons").budget
    assert b.rho == PRODUCTION_RHO and config.run.products == ["persons", "units"]
    total = sum(allocate(b, lv, q).budget for lv in b.levels for q in b.queries[lv])
    assert total == of_config(b) == Rho(PRODUCTION_RHO)                              # strategies.py sanity
    assert "total" not in b.queries["US"]
    level_rho = {lv: float(b.levels[lv] * b.rho) for lv in b.levels}
    assert level_rho["US"] == pytest.approx(0.06486, abs=1e-5)
    assert level_rho["Block_Group"] == pytest.approx(0.78327, abs=1e-5)
    sigma2 = {(lv, q): float(allocate(b, lv, q).budget.sigma2()) for lv in b.levels for q in b.queries[lv]}
    assert sigma2[("State", "total")] == pytest.approx(1.209, abs=1e-3)
    assert sigma2[("Block", "total")] == pytest.approx(7963, abs=1)
    assert sigma2[("Tract", "hispanic * cenrace")] == pytest.approx(4.953, abs=1e-3)
    assert sigma2[("Block_Group", "detailed")] == pytest.approx(4.063, abs=1e-3)
    assert config.product("persons").invariants == {"State": ["tot"], "Block": ["gqhh_vect", "gqhh_tot"]}
    assert config.product("persons").constraints["Block"] == ["hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0"]
    u = config.product("units")
    assert u.budget.rho == Fraction(3379, 12343) ** 2 and u.invariants == {"Block": ["hu_tot"]}
    assert u.budget.levels["County"] == Fraction(7, 82) and u.budget.levels["Tract"] == Fraction(364, 1025)


def test_e2e_preset_is_pure_dp_geometric() -> None:
    config = load_config("e2e_1940")
    b = config.product("persons").budget
    assert (b.mechanism, b.epsilon, config.run.products) == ("geometric", Fraction(1, 4), ["persons"])
    a = allocate(b, "County", "age18plus * hispanic * race")
    assert a.budget == PureEpsilon(Fraction(1, 4) * Fraction(1, 4) * Fraction(27, 40))
    assert a.budget.parameters()["sensitivity"] == 2
    assert config.product("persons").constraints["Enumdist"] == ["hhgq_total_lb", "hhgq_total_ub"]


# ----------------------------------------------------------------------------------------- certificate
def test_certificate_of_the_production_preset() -> None:
    cert = certificate(load_config("pl94_production_2021"))
    json.dumps(cert)                                        # JSON-ready
    p = cert["persons"]
    assert p["rho"] == "293764/114921" and round(p["epsilon"], 2) == 17.14 and p["delta"] == "1/10000000000"
    assert [row["level"] for row in p["levels"]] == ["US", "State", "County", "Tract", "Block_Group", "Block"]
    assert sum(Fraction(row["rho"]) for row in p["queries"]) == PRODUCTION_RHO
    row = next(r for r in p["queries"] if (r["level"], r["query"]) == ("State", "total"))
    assert Fraction(row["sigma2"]) == 1 / (Fraction(3773, 4097) * Fraction(1440, 4099) * PRODUCTION_RHO)
    assert [c["delta"] for c in p["curve"]] == [10.0 ** -k for k in range(6, 15)]
    assert "units" in cert
    text = render_certificate(cert)
    assert "17.1436" in text and "293764/114921" in text and "Block_Group" in text


def test_certificate_composes_persons_and_units() -> None:
    """Persons and units together: the rhos add; the tight epsilon is at the same delta, beside the Bureau's
    published accounting, 17.14 + 2.47 = 19.61 (the products' epsilons added, at the sum of the deltas)."""
    cert = certificate(load_config("pl94_production_2021"))
    c = cert["composed"]
    rho = PRODUCTION_RHO + Fraction(3379, 12343) ** 2
    assert c["products"] == ["persons", "units"] and Fraction(c["rho"]) == rho
    assert c["delta"] == "1/10000000000" and c["epsilon"] == pytest.approx(zcdp_to_epsilon(rho, Fraction(1, 10**10)))
    assert c["epsilon"] == pytest.approx(17.435, abs=1e-3)
    assert round(cert["persons"]["epsilon"], 2) == 17.14 and round(cert["units"]["epsilon"], 2) == 2.47
    assert c["epsilon_bureau"] == pytest.approx(cert["persons"]["epsilon"] + cert["units"]["epsilon"])
    assert math.floor(c["epsilon_bureau"] * 100) / 100 == 19.61 and c["epsilon_bureau_delta"] == "1/5000000000"
    assert c["epsilon"] < c["epsilon_bun_steinke"] and c["epsilon"] < c["epsilon_bureau"]
    assert "19.6182 at delta 2e-10" in render_certificate(cert)
    pure = certificate(load_config("e2e_1940"))["composed"]
    assert pure["epsilon"] == "1/4" and pure["delta"] == "0"


def test_certificate_of_pure_dp_and_infinite_budgets() -> None:
    cert = certificate(load_config("e2e_1940"))["persons"]
    assert cert["epsilon"] == "1/4" and cert["delta"] == "0" and all(c["epsilon"] == 0.25 for c in cert["curve"])
    assert "total epsilon = 1/4" in render_certificate(certificate(load_config("e2e_1940")))
    config = load_config("e2e_1940")
    data = config.model_dump(mode="json")
    data["persons"]["budget"]["epsilon"] = "inf"
    data["run"].update(mode="test", seed=0)  # production refuses an infinite budget
    whole = certificate(config_from_dict(data))
    inf = whole["persons"]
    assert inf["epsilon"] == "inf" and "NOT private" in inf["note"]
    assert whole["private"] is False and whole["composed"]["epsilon"] == "inf"
    assert all(r["variance"] == 0.0 for r in inf["queries"])


def test_path_condition() -> None:
    ok = {"440070001001000": {"US": Fraction(1, 4), "State": Fraction(3, 4)},
          "440070001001001": {"US": Fraction(1, 2), "State": Fraction(1, 2)}}
    summary = check_path_condition(ok, ["US", "State"])
    assert summary["blocks"] == 2 and summary["min_share"]["US"] == "1/4" and summary["max_share"]["State"] == "3/4"
    bad = {**ok, "440070001001002": {"US": Fraction(1, 4), "State": Fraction(1, 2)}}
    with pytest.raises(ConfigError, match="440070001001002's path sum to 3/4"):
        check_path_condition(bad)
    with pytest.raises(ConfigError, match="negative share"):
        check_path_condition({"b": {"US": Fraction(-1), "State": Fraction(2)}})
    cert = certificate(load_config("e2e_1940"), spine_budget={"persons": {
        "b": {lv: Fraction(1, 4) for lv in ["National", "State", "County", "Enumdist"]}}})
    assert cert["persons"]["path_condition"]["blocks"] == 1


def test_rho_for_epsilon_inverts_the_conversion():
    delta = Fraction(1, 10**10)
    for eps in (0.5, 1, 4, 10, 17.14):
        rho = rho_for_epsilon(eps, delta)
        assert isinstance(rho, Fraction) and zcdp_to_epsilon(rho, delta) == pytest.approx(eps, rel=1e-6)


# ------------------------------------------------------------------------------------ the privacy unit
@pytest.mark.parametrize("preset", ["demo", "e2e_1940"])
def test_noise_drawn_and_certificate_state_the_same_neighbour_relation(preset, monkeypatch):
    """The noise ``measure`` actually draws has the scale the certificate claims: the
    geometric mechanism's sensitivity is the certificate's, and the discrete Gaussian's sigma2 is
    Delta_2^2 / (2 rho) with the certificate's rho under the relation the certificate names."""
    import scipy.sparse as sp

    from topdown.pipeline.privacy import budget as B
    from topdown.pipeline.privacy import measure as M

    cfg = load_config(preset)
    drawn = []
    monkeypatch.setattr(B, "geometric_many", lambda srcs, eps, sens, size: drawn.append(("geometric", eps, sens))
                        or np.zeros((len(srcs), size), dtype=np.int64))
    monkeypatch.setattr(B, "discrete_gaussian_many", lambda srcs, sigma2, size: drawn.append(("dg", sigma2, None))
                        or np.zeros((len(srcs), size), dtype=np.int64))
    cert = certificate(cfg)
    product = cfg.run.products[0]
    pcfg = cfg.product(product)
    level = next(iter(pcfg.budget.levels))
    schema = cfg.run_products[0].schema
    M.measure(cfg.run_products[0], pcfg.budget, level, ["x"], [pcfg.budget.levels[level]],
              sp.csr_matrix(np.ones((1, schema.ncells), dtype=np.int64)), "test", 1)
    rows = {r["query"]: r for r in cert[product]["queries"] if r["level"] == level}
    assert drawn and len(drawn) == len(rows)
    assert cert[product]["framework"].endswith(NEIGHBOURS.description)
    for (kind, scale, sens), query in zip(drawn, pcfg.budget.queries[level]):
        row = rows[query]
        if kind == "geometric":
            assert (Fraction(row["epsilon"]), row["sensitivity"]) == (scale, sens) == (scale, NEIGHBOURS.l1_sensitivity)
        else:
            assert scale == Fraction(row["sigma2"]) == Fraction(NEIGHBOURS.l2_sensitivity_squared) / (2 * Fraction(row["rho"]))


def test_path_condition_of_a_spine_checks_each_distinct_path_once_at_its_first_block() -> None:
    """runner.PathShares: the check over distinct paths gives the summary of the check over every block."""
    import pandas as pd

    from topdown.geo.spine import build_spine, bypass
    from topdown.pipeline.execution.runner import PathShares

    # Single-child chains (bypassed: budget moves) beside ordinary branches, in two states.
    geoids = ["440010001001000", "440010001001001", "440010002001000", "440030001001000",
              "250010001001000", "250010001002000", "250010001002001", "250010002001000"]
    spine = bypass(build_spine("standard", pd.Series(geoids, name="geoid")))
    budget = load_config("pl94_production_2021").product("persons").budget
    shares = PathShares(spine, budget)
    distinct = shares.distinct()
    every = dict(shares.items())
    assert 1 < len(distinct) < len(every)
    vectors = [tuple(s[lv] for lv in spine.levels) for s in every.values()]
    assert {tuple(s[lv] for lv in spine.levels) for s in distinct.values()} == set(vectors)
    for block, s in distinct.items():  # each at the first block holding its path
        assert next(b for b, v in zip(every, vectors) if v == tuple(s[lv] for lv in spine.levels)) == block
    assert list(distinct) == [b for b in every if b in distinct]
    assert check_path_condition(shares, spine.levels) == check_path_condition(every, spine.levels)


def test_the_products_path_shares_share_the_blocks_node_codes() -> None:
    """runner.path_shares: one PathShares per product, equal to one built alone, with each level's node codes
    (4 bytes a block and level) made once for the spine, not once per product."""
    import pandas as pd

    from topdown.geo.spine import build_spine, bypass
    from topdown.pipeline.execution.runner import PathShares, path_shares

    geoids = ["440010001001000", "440010001001001", "440010002001000", "440030001001000",
              "250010001001000", "250010001002000", "250010001002001", "250010002001000"]
    spine = bypass(build_spine("standard", pd.Series(geoids, name="geoid")))
    config = load_config("pl94_production_2021")
    both = path_shares(spine, config)
    assert list(both) == ["persons", "units"]
    for product, shares in both.items():
        alone = PathShares(spine, config.product(product).budget)
        assert dict(shares.items()) == dict(alone.items())
    assert dict(both["persons"].items()) != dict(both["units"].items())  # the budgets differ
    for (p_codes, _), (u_codes, _) in zip(both["persons"].shares, both["units"].shares):
        assert p_codes is u_codes
