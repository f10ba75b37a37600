"""Typed exact budgets (pipeline/privacy/budget.py): composition, splits, exactness, the
certificate's conversions for the 2021 production budgets (recomputed here from the definitions), the noise
they buy, and that no module outside the budget module and config.py compares a mechanism's name."""
from __future__ import annotations

import ast
import math
import typing
from fractions import Fraction

import pytest
from conftest import REPO
from hypothesis import given, settings
from hypothesis import strategies as st

from topdown.pipeline.configuration.config import BUDGET_KEYS, INFINITE, BudgetConfig, load_config
from topdown.pipeline.privacy.budget import (KINDS, MAX_NOISE_SD, NEIGHBOURS, PRODUCTION_MAX_EXACT, RELEASE_CEILING,
                                             PureEpsilon, Rho, compose, of_config, of_entry)
from topdown.pipeline.privacy.certificate import certificate

#: The 2021 redistricting release (conf/pl94_production_2021.toml): persons and units rho, delta 1e-10.
PERSONS_RHO = Fraction(293764, 114921)
UNITS_RHO = Fraction(3379, 12343) ** 2
DELTA = Fraction(1, 10 ** 10)


def cks_epsilon(rho: float, delta: float) -> float:
    """The CKS (epsilon, delta) of rho-zCDP from its definition: the least epsilon with
    min_alpha exp((alpha-1)(alpha rho - epsilon)) / (alpha-1) (1 - 1/alpha)^alpha <= delta. For each alpha
    the epsilon that makes the bound equal delta is explicit; minimised over a fine grid in log(alpha - 1)
    and refined by ternary search (independent of the module's golden-section search)."""
    def eps(alpha: float) -> float:
        return alpha * rho + (math.log(1 / delta) + alpha * math.log1p(-1 / alpha) - math.log(alpha - 1)) / (alpha - 1)

    grid = [-12 + 20 * i / 20000 for i in range(20001)]
    best = min(grid, key=lambda s: eps(1 + math.exp(s)))
    lo, hi = best - 0.002, best + 0.002
    for _ in range(200):
        m1, m2 = lo + (hi - lo) / 3, hi - (hi - lo) / 3
        lo, hi = (lo, m2) if eps(1 + math.exp(m1)) < eps(1 + math.exp(m2)) else (m1, hi)
    return eps(1 + math.exp((lo + hi) / 2))


# ------------------------------------------------------------------------------------------ composition
def test_budgets_of_a_kind_add_exactly() -> None:
    assert Rho(Fraction(1, 2)) + Rho(Fraction(1, 3)) == Rho(Fraction(5, 6))
    assert sum([PureEpsilon(Fraction(1, 10)), PureEpsilon(Fraction(1, 5))]) == PureEpsilon(Fraction(3, 10))
    assert Rho(Fraction(1)) + Rho(None) == Rho(None) and (Rho(None) + Rho(Fraction(1))).infinite
    with pytest.raises(TypeError, match="compose"):
        Rho(Fraction(1)) + PureEpsilon(Fraction(1))


def test_compose_counts_pure_epsilon_as_zcdp_when_kinds_mix() -> None:
    """Pure epsilons add when all are pure; otherwise rhos add, epsilon-DP counted as epsilon^2/2-zCDP."""
    assert compose([PureEpsilon(Fraction(1, 4)), PureEpsilon(Fraction(1, 2))]) == PureEpsilon(Fraction(3, 4))
    assert compose([Rho(Fraction(1, 10)), PureEpsilon(Fraction(1, 2))]) == Rho(Fraction(1, 10) + Fraction(1, 8))
    assert compose([Rho(Fraction(1)), PureEpsilon(None)]) == Rho(None)
    assert PureEpsilon(Fraction(3, 5)).as_rho() == Rho(Fraction(9, 50)) and Rho(Fraction(2)).as_rho() == Rho(Fraction(2))
    with pytest.raises(ValueError, match="at least one"):
        compose([])


# ------------------------------------------------------------------------------------------ splits
def test_splits_are_exact_and_a_zero_share_is_zero() -> None:
    assert Rho(Fraction(3)) * Fraction(1, 4) == Rho(Fraction(3, 4)) == Fraction(1, 4) * Rho(Fraction(3))
    assert PureEpsilon(Fraction(1, 4)) * Fraction(27, 240) == PureEpsilon(Fraction(27, 960))
    assert Rho(None) * Fraction(1, 2) == Rho(None)                       # an infinite budget stays infinite
    assert Rho(None) * 0 == Rho(Fraction(0)) and (Rho(None) * 0).zero    # ... but a zero share measures nothing
    with pytest.raises(ValueError, match="non-negative"):
        Rho(Fraction(1)) * Fraction(-1, 2)
    with pytest.raises(TypeError, match="exact"):
        Rho(Fraction(1)) * 0.5


def test_values_stay_exact() -> None:
    """Fractions stay Fractions through splits, sums, conversions; floats are refused."""
    r = Rho(3)
    assert type(r.value) is Fraction
    for b in (r * Fraction(1, 7), r + Rho(Fraction(1, 3)), PureEpsilon(Fraction(1, 3)).as_rho(),
              compose([r, PureEpsilon(Fraction(2, 3))]), sum([r, r])):
        assert type(b.value) is Fraction, b
    with pytest.raises(TypeError, match="exact"):
        Rho(0.5)
    with pytest.raises(TypeError, match="exact"):
        PureEpsilon(True)
    with pytest.raises(ValueError, match="non-negative"):
        Rho(Fraction(-1))


@given(st.fractions(min_value=Fraction(1, 10 ** 6), max_value=Fraction(10 ** 6), max_denominator=10 ** 9),
       st.lists(st.integers(min_value=0, max_value=10 ** 6), min_size=1, max_size=12).filter(any),
       st.sampled_from([Rho, PureEpsilon]))
@settings(max_examples=200, deadline=None)
def test_splitting_by_shares_summing_to_one_composes_back_exactly(total, weights, kind) -> None:
    budget = kind(total)
    shares = [Fraction(w, sum(weights)) for w in weights]
    assert sum(shares) == 1
    parts = [budget * s for s in shares]
    assert sum(parts) == budget and compose(parts) == budget
    assert all(type(p) is kind and type(p.value) is Fraction for p in parts)
    # the parts of a pure budget, composed as zCDP, never cost more than the whole as zCDP
    assert compose([p.as_rho() for p in parts]).value <= budget.as_rho().value


@given(st.lists(st.integers(min_value=0, max_value=1000), min_size=1, max_size=8).filter(any))
@settings(max_examples=50, deadline=None)
def test_an_infinite_budget_splits_into_infinite_and_zero_parts(weights) -> None:
    parts = [Rho(None) * Fraction(w, sum(weights)) for w in weights]
    assert [p.infinite for p in parts] == [w > 0 for w in weights] and sum(parts) == Rho(None)


# ------------------------------------------------------------------------------ 2021 production figures
def test_conversions_for_the_2021_production_budgets() -> None:
    """CKS epsilon at delta 1e-10, recomputed from the definition; the Bureau published 17.14 (persons) and
    2.47 (units); Bun-Steinke rho + 2 sqrt(rho log(1/delta))."""
    for rho, published in ((PERSONS_RHO, 17.14), (UNITS_RHO, 2.47)):
        eps = Rho(rho).epsilon_at(DELTA)
        assert eps == pytest.approx(cks_epsilon(float(rho), 1e-10), rel=1e-9)
        assert round(eps, 2) == published
        entry = Rho(rho).certified(DELTA, [1e-10])
        assert entry["rho"] == str(rho) and entry["epsilon"] == eps and entry["curve"] == [{"delta": 1e-10, "epsilon": eps}]
        bs = float(rho) + 2 * math.sqrt(float(rho) * math.log(1e10))
        assert entry["epsilon_bun_steinke"] == pytest.approx(bs, rel=1e-12)
    cert = certificate(load_config("pl94_production_2021"))
    composed = cert["composed"]
    assert Fraction(composed["rho"]) == PERSONS_RHO + UNITS_RHO
    assert composed["epsilon"] == pytest.approx(cks_epsilon(float(PERSONS_RHO + UNITS_RHO), 1e-10), rel=1e-9)
    assert composed["epsilon_bureau"] == Rho(PERSONS_RHO).epsilon_at(DELTA) + Rho(UNITS_RHO).epsilon_at(DELTA)
    assert composed["epsilon_bureau"] == pytest.approx(17.14 + 2.47, abs=0.01)        # published: 19.61
    assert composed["epsilon_bureau_delta"] == "1/5000000000"


def test_the_2021_persons_state_total_noise() -> None:
    """The State total (level 1440/4099 x query 3773/4097): sigma2 = Delta_2^2 / (2 rho_q) = 1 / rho_q (about
    1.209); its noise is zero with probability 1 / sum_n exp(-n^2 / 2 sigma2) (about 0.36, under the
    production floor 1/2)."""
    b = load_config("pl94_production_2021").product("persons").budget
    q = of_config(b) * (b.levels["State"] * b.queries["State"]["total"])
    assert q == Rho(PERSONS_RHO * Fraction(1440, 4099) * Fraction(3773, 4097)) and q.sigma2() == 1 / q.value
    assert float(q.sigma2()) == pytest.approx(1.209, abs=1e-3)
    s2 = float(q.sigma2())
    weights = [math.exp(-n * n / (2 * s2)) for n in range(-60, 61)]
    assert q.variance() == pytest.approx(sum(n * n * w for n, w in zip(range(-60, 61), weights)) / sum(weights), rel=1e-12)
    assert q.exact_probability() == pytest.approx(1 / sum(weights), rel=1e-12) == pytest.approx(0.36, abs=0.005)
    assert not q.too_exact() and q.drawable()


def test_pure_epsilon_noise_of_the_1940_e2e_preset() -> None:
    """Two-sided geometric with lambda = epsilon_q / Delta_1: variance 2q / (1 - q)^2, P(0) = tanh(lambda / 2)."""
    b = load_config("e2e_1940").product("persons").budget
    assert of_config(b) == PureEpsilon(Fraction(1, 4)) and of_config(b).as_rho() == Rho(Fraction(1, 32))
    level, queries = next(iter(b.queries.items()))
    share = b.levels[level] * next(iter(queries.values()))
    q = of_config(b) * share
    assert q == PureEpsilon(Fraction(1, 4) * share)
    lam = float(q.value) / NEIGHBOURS.l1_sensitivity
    assert q.variance() == pytest.approx(2 * math.exp(-lam) / (1 - math.exp(-lam)) ** 2, rel=1e-12)
    assert q.exact_probability() == pytest.approx(math.tanh(lam / 2), rel=1e-12)
    assert q.parameters() == {"epsilon": str(q.value), "sensitivity": 2} and q.epsilon_at(DELTA) == float(q.value)


def test_no_noise_and_no_measurement() -> None:
    for kind in (Rho, PureEpsilon):
        assert (kind(None).variance(), kind(None).exact_probability()) == (0.0, 1.0)
        assert (kind(Fraction(0)).variance(), kind(Fraction(0)).exact_probability()) == (math.inf, 0.0)
        with pytest.raises(ValueError, match="no noise"):
            kind(None).draw([], 1)
    assert Rho(None).parameters() == {"rho": INFINITE, "sigma2": INFINITE, "sigma2_float": None}
    assert PureEpsilon(Fraction(0)).parameters() == {"epsilon": "0", "sensitivity": None}


# ------------------------------------------------------------------------------ ceiling and floor
def test_release_ceiling_counts_pure_epsilon_as_zcdp() -> None:
    ceiling = RELEASE_CEILING.rho
    assert not Rho(ceiling).above_ceiling(ceiling) and Rho(ceiling + Fraction(1, 10 ** 9)).above_ceiling(ceiling)
    assert not PureEpsilon(Fraction(5)).above_ceiling(ceiling)      # 5^2 / 2 = 12.5
    assert PureEpsilon(Fraction(6)).above_ceiling(ceiling)          # 18
    assert Rho(None).above_ceiling(ceiling) and PureEpsilon(None).above_ceiling(ceiling)


def test_the_release_ceiling_is_the_bureaus_2020_topdown_budget() -> None:
    """Redistricting persons and units as the 2021 preset spends them, DHC persons 4.9622 and DHC households and
    units 7.7005: 15.2939 in all."""
    parts = dict(RELEASE_CEILING.parts)
    preset = load_config("pl94_production_2021")
    redistricting = [v for k, v in parts.items() if k.startswith("2020 redistricting")]
    assert redistricting == [of_config(preset.product(p).budget).value for p in ("persons", "units")]
    assert [v for k, v in parts.items() if "(DHC)" in k] == [Fraction(24811, 5000), Fraction(15401, 2000)]
    assert RELEASE_CEILING.rho == Fraction(2677677240811805083, 175081740127290000)
    assert round(float(RELEASE_CEILING.rho), 4) == 15.2939
    assert "DAS_2020_Redistricting_Production_Code" in RELEASE_CEILING.source
    assert "DAS_2020_DHC_Production_Code" in RELEASE_CEILING.source


def test_noise_floor_and_drawable_limit() -> None:
    # the discrete Gaussian is zero with probability 1/2 at sigma2 about 0.64: rho_q = 1 / sigma2
    assert Rho(Fraction(2)).too_exact() and not Rho(Fraction(3, 2)).too_exact()
    assert Rho(Fraction(2)).exact_probability() > PRODUCTION_MAX_EXACT > Rho(Fraction(3, 2)).exact_probability()
    # geometric: tanh(epsilon / 4) > 1/2 from epsilon = 4 artanh(1/2) = 2.197
    assert PureEpsilon(Fraction(23, 10)).too_exact() and not PureEpsilon(Fraction(21, 10)).too_exact()
    # at most a standard deviation of MAX_NOISE_SD: sigma2 = 1 / rho <= 10^20
    assert Rho(Fraction(1, 10 ** 20)).drawable() and not Rho(Fraction(1, 10 ** 20 + 1)).drawable()
    # geometric: sd < sqrt(2) / lambda, lambda = epsilon / 2, so epsilon >= 2 sqrt(2) / MAX_NOISE_SD suffices
    assert PureEpsilon(Fraction(3, MAX_NOISE_SD)).drawable() and not PureEpsilon(Fraction(2, MAX_NOISE_SD)).drawable()


# ------------------------------------------------------------------------------ names and the configuration
def test_kinds_cover_the_configurable_mechanisms_and_entries_parse_back() -> None:
    assert set(KINDS) == set(BUDGET_KEYS) == set(typing.get_args(BudgetConfig.model_fields["mechanism"].annotation))
    assert {name: kind.key for name, kind in KINDS.items()} == BUDGET_KEYS
    assert of_entry({"mechanism": "geometric", "epsilon": "1/4"}) == PureEpsilon(Fraction(1, 4))
    assert of_entry({"mechanism": "discrete_gaussian", "rho": "inf", "epsilon": "inf"}) == Rho(None)
    with pytest.raises(ValueError, match="unknown mechanism 'laplace'"):
        of_entry({"mechanism": "laplace", "epsilon": "1"})


@pytest.mark.parametrize("data, expected", [
    ({"rho": "1/3"}, Rho(Fraction(1, 3))),
    ({"rho": "inf"}, Rho(None)),
    ({"mechanism": "geometric", "epsilon": "2"}, PureEpsilon(Fraction(2))),
    ({"mechanism": "geometric", "epsilon": "Infinity"}, PureEpsilon(None)),
])
def test_budget_config_total_is_typed_and_serialization_is_unchanged(data, expected) -> None:
    b = BudgetConfig.model_validate({**data, "levels": {"A": "1"}, "queries": {"A": {"total": "1"}}})
    assert of_config(b) == expected and b.infinite == expected.infinite
    assert b.model_dump(mode="json")[of_config(b).key] == (None if expected.infinite else str(expected))
    assert set(b.model_dump(mode="json")) == {"mechanism", "rho", "epsilon", "delta", "levels", "queries", "infinite"}


def test_production_presets_have_typed_totals() -> None:
    config = load_config("pl94_production_2021")
    assert (of_config(config.product("persons").budget), of_config(config.product("units").budget)) == (Rho(PERSONS_RHO), Rho(UNITS_RHO))


# ------------------------------------------------------------------------------ no mechanism strings
def _mechanism_comparisons(source: str, where: str) -> list[str]:
    """Comparisons (==, !=, in, not in, is) with a mechanism's name or a ``mechanism`` attribute or key."""
    def named(e: ast.expr) -> bool:
        return ((isinstance(e, ast.Constant) and e.value in KINDS)
                or (isinstance(e, ast.Attribute) and e.attr == "mechanism")
                or (isinstance(e, ast.Subscript) and isinstance(e.slice, ast.Constant) and e.slice.value == "mechanism")
                or (isinstance(e, ast.Call) and isinstance(e.func, ast.Attribute) and e.func.attr == "get"
                    and any(isinstance(a, ast.Constant) and a.value == "mechanism" for a in e.args)))

    out = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            elts = [e for o in operands for e in (o.elts if isinstance(o, (ast.Tuple, ast.List, ast.Set)) else [o])]
            if any(named(e) for e in elts):
                out.append(f"{where}:{node.lineno}")
    return out


def test_the_checker_sees_the_old_comparisons() -> None:
    old = ('zcdp = budget.mechanism == "discrete_gaussian"\n'
           'if p["mechanism"] != m.get("mechanism"): pass\n'
           'x = kind in ("geometric", "other")\n'
           'y = d.get("mechanism", "discrete_gaussian") == z\n')
    assert len(_mechanism_comparisons(old, "old")) == 4
    assert not _mechanism_comparisons('kind = KINDS[budget.mechanism]\nok = isinstance(total, kind)\n', "new")


def test_no_module_compares_a_mechanism_name() -> None:
    """Budgets are typed (pipeline/privacy/budget.py): only the budget module and BudgetConfig's validation
    (config.py) may name a mechanism; every other module calls the budget object."""
    allowed = {REPO / "pipeline" / "privacy" / "budget.py", REPO / "pipeline" / "configuration" / "config.py"}
    files = [f for top in ("pipeline", "solvers", "geo", "vocab") for f in sorted((REPO / top).rglob("*.py"))
             if f not in allowed]
    assert len(files) > 50
    found = [hit for f in files for hit in _mechanism_comparisons(f.read_text(), str(f.relative_to(REPO)))]
    assert not found, found
