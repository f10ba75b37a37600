"""Privacy accounting in exact fractions: budget checks, per-query allocations, zCDP -> (epsilon, delta).

zCDP (discrete Gaussian, 2020 production): a query q at a node with geolevel budget share PLB gets
rho_q = qprop * PLB * rho_total and noise N_Z(0, sigma2), sigma2 = 1 / rho_q. Every query is a marginal
(each cell counted by exactly one answer), so changing one record moves at most two answers by one:
squared L2 sensitivity 2 under bounded neighbours, and 2 / (2 sigma2) = rho_q (the Bureau's
``source/programs/engine/curve.py`` in GitHub uscensusbureau/DAS_2020_Redistricting_Production_Code;
Abowd et al. 2022, Appendix B, Theorem 2). Composition over the queries of a node and over the nodes on a block's
path sums to rho_total when the proportions sum to one (Theorem 2, conditions 3 and 4).

Pure DP (geometric, 2018 End-to-End): epsilon_q = qprop * PLB * epsilon_total with L1 sensitivity 2
(bounded neighbours; uscensusbureau/census2020-das-e2e ``programs/engine/primitives.py``), noise ~
exp(-epsilon_q |y| / 2).
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Iterable, Mapping

from ..configuration.config import BudgetConfig, Config, ConfigError, shown, waiver_hint
from .mechanisms import (discrete_gaussian_variance, discrete_gaussian_zero_probability, geometric_variance,
                         geometric_zero_probability)
from topdown.vocab.queries import QueryError, build_query
from topdown.vocab.schema import Schema



@dataclass(frozen=True)
class NeighbourRelation:
    """The privacy unit: which databases are neighbours, and so how far one change moves a marginal's answers.

    Stated once here; the noise drawn (``measure.py``, through :class:`Allocation`), the variances and the
    certificate all take it from :data:`NEIGHBOURS`.
    """

    description: str
    l1_sensitivity: int  # sum over answers of |change|: the geometric mechanism's scale
    l2_sensitivity_squared: int  # sum over answers of change^2: the discrete Gaussian's sigma2 = this / (2 rho)

    def sigma2(self, rho: Fraction) -> Fraction:
        """The discrete Gaussian variance parameter giving ``rho``-zCDP: Delta_2^2 / (2 rho)."""
        return Fraction(self.l2_sensitivity_squared) / (2 * rho)


#: Bounded neighbours (change one record): a marginal counts the record in one answer before and one after,
#: so at most two answers move by one (L1 = 2, squared L2 = 2; the Bureau's ``curve.py`` and the E2E ``primitives.py``).
NEIGHBOURS = NeighbourRelation("bounded neighbours (change one record)", l1_sensitivity=2, l2_sensitivity_squared=2)


def check_budget(budget: BudgetConfig, levels: list[str], schema: Schema, where: str = "budget") -> None:
    """Raise :class:`ConfigError` naming the offending entry unless ``budget`` is a valid strategy for
    ``levels`` on ``schema`` (the Bureau's ``source/programs/engine/budget.py``; Theorem 2 conditions 1-3)."""
    known = set(levels)
    for section, keys in (("levels", budget.levels), ("queries", budget.queries)):
        for level in keys:
            if level not in known:
                raise ConfigError(f"{where}.{section}.{level}: unknown level (levels of this run: {', '.join(levels)})")
    for level in levels:
        if level not in budget.levels:
            raise ConfigError(f"{where}.levels: no proportion for level {level!r}")
        if level not in budget.queries or not budget.queries[level]:
            raise ConfigError(f"{where}.queries.{level}: no queries for level {level!r}")
    for level, prop in budget.levels.items():
        if prop < 0:
            raise ConfigError(f"{where}.levels.{level} = {prop} is negative")
    total = sum(budget.levels.values(), Fraction(0))
    if total != 1:
        raise ConfigError(f"{where}.levels: level proportions sum to {total}, not exactly 1")
    for level in levels:
        _check_level_queries(budget.queries[level], schema, f"{where}.queries.{level}")


def _check_level_queries(props: dict[str, Fraction], schema: Schema, where: str) -> None:
    seen: dict[bytes, str] = {}
    for name, prop in props.items():
        entry = f"{where}.\"{name}\""
        if prop < 0:
            raise ConfigError(f"{entry} = {prop} is negative")
        try:
            query = build_query(schema, name)
        except QueryError as exc:
            raise ConfigError(f"{entry}: {exc}") from None
        if not query.is_partition:
            raise ConfigError(f"{entry}: query does not count every cell exactly once (not a partition of the "
                              f"{schema.name} cells), so its sensitivity is not that of a marginal")
        key = query.groups.tobytes()
        if key in seen:
            raise ConfigError(f"{entry}: the same query as \"{seen[key]}\" is measured twice at this level")
        seen[key] = name
    total = sum(props.values(), Fraction(0))
    if total != 1:
        raise ConfigError(f"{where}: query proportions sum to {total}, not exactly 1")


@dataclass(frozen=True)
class Allocation:
    """The budget of one query at one node.

    ``share`` is the query's fraction of the product's total budget (qprop * PLB). For zCDP ``rho`` and
    ``sigma2`` are set; for pure DP ``epsilon`` and ``sensitivity`` (both from :data:`NEIGHBOURS`). With an infinite budget there is no
    noise (all three None, variance 0); with share 0 the query is not measured (variance infinite).
    """

    level: str
    query: str
    mechanism: str
    share: Fraction
    rho: Fraction | None
    epsilon: Fraction | None
    sigma2: Fraction | None
    sensitivity: int | None
    variance: float

    @property
    def measured(self) -> bool:
        """False when the node has no budget for this query (PLB 0 after bypassing, or qprop 0)."""
        return self.share > 0

    @property
    def noiseless(self) -> bool:
        """True for an infinite-budget (zero-noise) test run."""
        return self.measured and self.variance == 0.0

    @property
    def exact_probability(self) -> float:
        """The probability that the noise is zero, i.e. that the published answer is the true one (1 without
        noise, 0 for a query not measured)."""
        if not self.measured:
            return 0.0
        if self.rho is None and self.epsilon is None:
            return 1.0
        if self.sigma2 is not None:
            return discrete_gaussian_zero_probability(self.sigma2)
        assert self.epsilon is not None and self.sensitivity is not None
        return geometric_zero_probability(self.epsilon, self.sensitivity)


def allocate(budget: BudgetConfig, level: str, query: str, plb: Fraction | None = None) -> Allocation:
    """The allocation of ``query`` at a node of ``level`` whose geolevel budget share is ``plb``
    (default: the level's proportion; the spine may move budget between levels by bypassing)."""
    if level not in budget.levels or level not in budget.queries:
        raise ConfigError(f"budget: no proportions for level {level!r}")
    if query not in budget.queries[level]:
        raise ConfigError(f"budget.queries.{level}: query {query!r} is not measured at this level "
                          f"(measured: {', '.join(budget.queries[level])})")
    plb = budget.levels[level] if plb is None else Fraction(plb)
    if not 0 <= plb <= 1:
        raise ValueError(f"allocate({level!r}, {query!r}): node budget share {plb} is outside [0, 1]")
    share = budget.queries[level][query] * plb
    dg = budget.mechanism == "discrete_gaussian"
    empty = Allocation(level, query, budget.mechanism, share, None, None, None, None, 0.0)
    if share == 0:
        zero = Fraction(0)
        return Allocation(level, query, budget.mechanism, share, zero if dg else None, None if dg else zero,
                          None, None, math.inf)
    if budget.infinite:
        return empty
    if dg:
        assert budget.rho is not None
        rho = share * budget.rho
        sigma2 = NEIGHBOURS.sigma2(rho)
        return Allocation(level, query, budget.mechanism, share, rho, None, sigma2, None,
                          discrete_gaussian_variance(sigma2))
    assert budget.epsilon is not None
    eps = share * budget.epsilon
    return Allocation(level, query, budget.mechanism, share, None, eps, None, NEIGHBOURS.l1_sensitivity,
                      geometric_variance(eps, NEIGHBOURS.l1_sensitivity))


def pure_dp_as_zcdp(epsilon: Fraction) -> Fraction:
    """The zCDP rho implied by pure epsilon-DP: epsilon^2 / 2 (Bun and Steinke 2016, Proposition 1.4)."""
    return epsilon ** 2 / 2


# ------------------------------------------------------------------------------ budget ceiling and floor
#: Production ceiling on one product's total budget, as zCDP rho (a pure-DP epsilon counts as epsilon^2 / 2,
#: as the certificate composes it): 39 times the 2021 persons budget (rho 2.56), 1,300 times the units budget
#: (0.075), 95 times the April 2021 demonstration's persons budget (1.05). At rho = 100 the tight (epsilon,
#: delta = 1e-10) is about 194: e^194 bounds nothing a reader can use.
PRODUCTION_MAX_RHO = Fraction(100)
#: Production floor on every measured query's noise: the probability that it is zero (the published answer
#: is the true count) is at most this. The 2021 persons strategy's least noisy query (the State total,
#: sigma2 1.21) is exact with probability 0.36; the discrete Gaussian reaches 1/2 at sigma2 about 0.64.
PRODUCTION_MAX_EXACT = 0.5
#: In every mode, the largest noise the samplers (int64 draws) and the solvers (float64, integers exact below
#: 2^53) handle: a standard deviation of 10^10, thirty times the U.S. population. Measured with more noise,
#: a count says nothing; the budget is mistyped (rho = "1e-44").
MAX_NOISE_SD = 10 ** 10
BUDGET_WAIVER = "budget_ceiling"


def check_noise(config: Config, max_shares: Mapping[str, Mapping[str, Fraction]] | None = None) -> None:
    """Refuse budgets whose noise the samplers cannot draw (every mode: a standard deviation above
    :data:`MAX_NOISE_SD`) and, in production unless ``[run] weaken_privacy`` waives ``budget_ceiling``, a
    product's total above :data:`PRODUCTION_MAX_RHO` or a measured query whose noise is zero with probability
    above :data:`PRODUCTION_MAX_EXACT`. ``max_shares`` gives per product the largest node share of each level
    (a spine that bypasses levels moves budget to nodes); default the level's share. Raises
    :class:`ConfigError` naming the file, the key and its value."""
    guarded = config.run.mode == "production" and not config.waived(BUDGET_WAIVER)
    waive = waiver_hint(BUDGET_WAIVER)
    for product in config.run.products:
        budget = config.product(product).budget
        if budget.infinite:
            continue  # refused in production by check_production
        zcdp = budget.mechanism == "discrete_gaussian"
        total = budget.rho if zcdp else budget.epsilon
        assert total is not None
        key = f"{config.source}: {product}.budget.{'rho' if zcdp else 'epsilon'} = {shown(total)}"
        as_rho = total if zcdp else pure_dp_as_zcdp(total)
        if guarded and as_rho > PRODUCTION_MAX_RHO:
            raise ConfigError(f"{key} is above the production ceiling of rho = {PRODUCTION_MAX_RHO} per product"
                              f"{'' if zcdp else f' (as zCDP: epsilon^2/2 = {shown(as_rho)})'}: it publishes "
                              f"near-exact counts and bounds no privacy loss; lower it, {waive}")
        for level, queries in budget.queries.items():
            plb = (max_shares or {}).get(product, {}).get(level, budget.levels.get(level, Fraction(0)))
            for query, qprop in queries.items():
                if qprop <= 0 or not 0 < plb <= 1 or level not in budget.levels:
                    continue  # not measured; a negative or unknown entry is check_budget's to name
                entry = f"{product}.budget.queries.{level}.\"{query}\""
                a = allocate(budget, level, query, plb) if _drawable(budget, qprop * plb) else None
                if a is None:
                    raise ConfigError(f"{key} is too small: {entry} (share {shown(qprop * plb)} of it) would get "
                                      f"noise with a standard deviation above {MAX_NOISE_SD:.0e}, more than the "
                                      "samplers and solvers handle; raise the budget")
                if guarded and a.exact_probability > PRODUCTION_MAX_EXACT:
                    raise ConfigError(f"{key} is refused in mode = \"production\": {entry} (share "
                                      f"{shown(a.share)} of it) would get noise that is zero with probability "
                                      f"{a.exact_probability:.2f}, so its published answer would be the true count "
                                      f"more often than not (the floor: at most {PRODUCTION_MAX_EXACT}); lower the "
                                      f"budget or the query's share, {waive}")


def _drawable(budget: BudgetConfig, share: Fraction) -> bool:
    """Whether a query with ``share`` of ``budget`` gets noise of standard deviation at most :data:`MAX_NOISE_SD`
    (the geometric distribution's is below sqrt(2) / lambda, lambda = epsilon / sensitivity)."""
    if budget.mechanism == "discrete_gaussian":
        assert budget.rho is not None
        return NEIGHBOURS.sigma2(share * budget.rho) <= MAX_NOISE_SD ** 2
    assert budget.epsilon is not None
    lam = share * budget.epsilon / NEIGHBOURS.l1_sensitivity
    return lam * lam * MAX_NOISE_SD ** 2 >= 2


def _zcdp_epsilon_at(alpha: float, rho: float, log_inv_delta: float) -> float:
    """epsilon(alpha) = alpha rho + (log(1/delta) - log alpha) / (alpha - 1) + log(1 - 1/alpha)."""
    return alpha * rho + (log_inv_delta - math.log(alpha)) / (alpha - 1) + math.log1p(-1 / alpha)


def zcdp_to_epsilon(rho: Fraction, delta: Fraction | float) -> float:
    """Smallest epsilon with rho-zCDP => (epsilon, delta)-DP by the tight conversion of Canonne, Kamath &
    Steinke (2020), the bound the Bureau's code reports (``source/programs/engine/curve.py``, ``zCDPEpsDeltaCurve``):
    delta = exp((alpha-1)(alpha rho - epsilon)) / (alpha-1) * (1 - 1/alpha)^alpha, minimised over alpha > 1."""
    r, lid = _check_rho_delta(rho, delta)
    if r == 0:
        return 0.0
    # epsilon(alpha) is unimodal on alpha > 1; golden-section search on log(alpha - 1).
    f = lambda s: _zcdp_epsilon_at(1 + math.exp(s), r, lid)  # noqa: E731
    lo, hi = -30.0, math.log(10 + 10 * math.sqrt(lid / r))
    phi = (math.sqrt(5) - 1) / 2
    a, b = hi - phi * (hi - lo), lo + phi * (hi - lo)
    fa, fb = f(a), f(b)
    for _ in range(200):
        if fa < fb:
            hi, b, fb = b, a, fa
            a = hi - phi * (hi - lo)
            fa = f(a)
        else:
            lo, a, fa = a, b, fb
            b = lo + phi * (hi - lo)
            fb = f(b)
    return max(0.0, min(fa, fb))


def zcdp_to_epsilon_bun_steinke(rho: Fraction, delta: Fraction | float) -> float:
    """The looser Bun-Steinke (2016) conversion epsilon = rho + 2 sqrt(rho log(1/delta)) (Abowd et al. 2022, App. B)."""
    r, lid = _check_rho_delta(rho, delta)
    return r + 2 * math.sqrt(r * lid)


def epsilon_delta_curve(rho: Fraction, deltas: Iterable[float]) -> list[tuple[float, float]]:
    """(delta, epsilon) pairs of the CKS conversion for each delta."""
    return [(float(d), zcdp_to_epsilon(rho, d)) for d in deltas]


def _check_rho_delta(rho: Fraction, delta: Fraction | float) -> tuple[float, float]:
    if rho < 0:
        raise ValueError(f"rho must be non-negative, got {rho}")
    if not 0 < delta < 1:
        raise ValueError(f"delta must be in (0, 1), got {delta}")
    return float(rho), -math.log(float(delta))


def rho_for_epsilon(epsilon: float, delta: Fraction) -> Fraction:
    """The rho whose tight conversion (:func:`zcdp_to_epsilon`) at ``delta`` is ``epsilon``, as a fraction
    (bisection on log rho to 1e-12 relative, then the nearest fraction with denominator <= 1e9): for studies
    that scale a preset's budget to a chosen epsilon."""
    lo, hi = 1e-9, 1e3
    for _ in range(200):
        mid = math.sqrt(lo * hi)
        lo, hi = (mid, hi) if zcdp_to_epsilon(Fraction(mid), delta) < epsilon else (lo, mid)
    return Fraction(hi).limit_denominator(10**9)
