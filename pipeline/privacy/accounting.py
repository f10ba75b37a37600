"""Privacy accounting in exact fractions: budget checks, per-query allocations, the release ceiling and the floor.

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

Both are one computation on the typed total (``budget.py``): a query's budget is ``total * (qprop * PLB)``.
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from functools import cached_property
from typing import Any, Mapping, Protocol

import numpy as np

from ..configuration.config import BudgetConfig, Config, ConfigError, shown, waiver_hint
from ..configuration.errors import query_hint
from .budget import MAX_NOISE_SD, NEIGHBOURS, PRODUCTION_MAX_EXACT, RELEASE_CEILING, Budget, compose, of_config
from .rng import RandomSource
from topdown.vocab.queries import QueryError, build_query
from topdown.vocab.schema import Schema



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
    seen: dict[tuple, str] = {}
    for name, prop in props.items():
        entry = f"{where}.\"{name}\""
        if prop < 0:
            raise ConfigError(f"{entry} = {prop} is negative")
        try:
            query = build_query(schema, name)
        except QueryError as exc:
            raise ConfigError(f"{entry}: {exc}{query_hint(exc)}") from None
        if not query.is_partition:
            raise ConfigError(f"{entry}: query does not count every cell exactly once (not a partition of the "
                              f"{schema.name} cells), so its sensitivity is not that of a marginal")
        key = query.key  # the per-axis factors: identical groupings have identical keys
        if key in seen:
            raise ConfigError(f"{entry}: the same query as \"{seen[key]}\" is measured twice at this level")
        seen[key] = name
    total = sum(props.values(), Fraction(0))
    if total != 1:
        raise ConfigError(f"{where}: query proportions sum to {total}, not exactly 1")


@dataclass(frozen=True)
class Allocation:
    """The budget of one query at one node.

    ``share`` is the query's fraction of the product's total budget (qprop * PLB), ``budget`` the query's
    (the total times ``share``: a :class:`~.budget.Rho` or a :class:`~.budget.PureEpsilon`). With an infinite
    budget there is no noise (variance 0); with share 0 the query is not measured (variance infinite).
    """

    level: str
    query: str
    share: Fraction
    budget: Budget

    @property
    def measured(self) -> bool:
        """False when the node has no budget for this query (PLB 0 after bypassing, or qprop 0)."""
        return self.share > 0

    @cached_property
    def variance(self) -> float:
        """The variance of the query's noise under :data:`~.budget.NEIGHBOURS`."""
        return self.budget.variance(NEIGHBOURS)

    @property
    def noiseless(self) -> bool:
        """True for an infinite-budget (zero-noise) test run."""
        return self.measured and self.variance == 0.0

    @property
    def exact_probability(self) -> float:
        """The probability that the noise is zero, i.e. that the published answer is the true one (1 without
        noise, 0 for a query not measured)."""
        return self.budget.exact_probability(NEIGHBOURS)

    def noise(self, sources: list[RandomSource], size: int) -> np.ndarray:
        """Noise rows for many (node, query) streams at once (row i from ``sources[i]``)."""
        return self.budget.draw(sources, size, NEIGHBOURS)


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
    return Allocation(level, query, share, of_config(budget) * share)


# ------------------------------------------------------------------------------ budget ceiling and floor
BUDGET_WAIVER = "budget_ceiling"


def check_noise(config: Config) -> None:
    """Refuse budgets whose noise the samplers cannot draw (every mode: a standard deviation above
    :data:`MAX_NOISE_SD`) and, in production unless ``[run] weaken_privacy`` waives ``budget_ceiling``, the
    products' budgets composed above :data:`RELEASE_CEILING` or a measured query of the configured strategy (at
    its level's share) whose noise is zero with probability above :data:`PRODUCTION_MAX_EXACT`. What a spine's
    bypassing moves onto single nodes is reported, not refused (:func:`bypass_report`). Raises
    :class:`ConfigError` naming the file, the key and its value."""
    guarded = config.run.mode == "production" and not config.waived(BUDGET_WAIVER)
    waive = waiver_hint(BUDGET_WAIVER)
    if guarded:
        check_release_ceiling(config)
    for product in config.run.products:
        budget = config.product(product).budget
        if budget.infinite:
            continue  # refused in production by check_production
        total = of_config(budget)
        assert total.value is not None
        key = f"{config.source}: {product}.budget.{total.key} = {shown(total.value)}"
        for level, queries in budget.queries.items():
            plb = budget.levels.get(level, Fraction(0))
            for query, qprop in queries.items():
                if qprop <= 0 or not 0 < plb <= 1 or level not in budget.levels:
                    continue  # not measured; a negative or unknown entry is check_budget's to name
                entry = f"{product}.budget.queries.{level}.\"{query}\""
                a = allocate(budget, level, query, plb)
                if not a.budget.drawable(NEIGHBOURS, MAX_NOISE_SD):
                    raise ConfigError(f"{key} is too small: {entry} (share {shown(qprop * plb)} of it) would get "
                                      f"noise with a standard deviation above {MAX_NOISE_SD:.0e}, more than the "
                                      "samplers and solvers handle; raise the budget")
                if guarded and a.budget.too_exact(NEIGHBOURS, PRODUCTION_MAX_EXACT):
                    raise ConfigError(f"{key} is refused in mode = \"production\": {entry} (share "
                                      f"{shown(a.share)} of it) would get noise that is zero with probability "
                                      f"{a.exact_probability:.2f}, so its published answer would be the true count "
                                      f"more often than not (the floor: at most {PRODUCTION_MAX_EXACT}); lower the "
                                      f"budget or the query's share, {waive}")


def composed_budget(config: Config) -> Budget:
    """The budgets of every product of ``config``'s run composed (:func:`~.budget.compose`)."""
    return compose(of_config(config.product(p).budget) for p in config.run.products)


def check_release_ceiling(config: Config) -> None:
    """Refuse a run whose products' budgets compose above :data:`RELEASE_CEILING` (its caller decides the mode)."""
    total = composed_budget(config)
    if total.infinite or not total.above_ceiling(RELEASE_CEILING.rho):
        return  # an infinite budget is check_production's to refuse
    parts = []
    for product in config.run.products:
        b = of_config(config.product(product).budget)
        parts.append(f"{product}.budget.{b.key} = {shown(b.value)}"
                     + (f" (as zCDP: epsilon^2/2 = {shown(b.as_rho().value)})" if b.pure else ""))
    raise ConfigError(f"{config.source}: the run's budgets ({' + '.join(parts)}) compose to rho = "
                      f"{shown(total.as_rho().value)}, above the "
                      f"release ceiling of rho = {float(RELEASE_CEILING.rho):.4f}, the Census Bureau's whole 2020 budget "
                      "for its TopDown releases (redistricting data and DHC; docs/how-to/production.md); lower "
                      f"the budgets, {waiver_hint(BUDGET_WAIVER)}")


class NodeShares(Protocol):
    """Each node's budget share of one level, as a code per node into a few distinct shares
    (``execution.levels.Shares``)."""

    codes: np.ndarray
    values: list[Fraction]


def bypass_report(budget: BudgetConfig, level_shares: Mapping[str, NodeShares]) -> dict[str, Any] | None:
    """What a spine's bypassing concentrates on single nodes: a node that carries a bypassed level's share
    besides its own gets less noise than its level's queries. ``level_shares`` gives each node's share per
    level. Returns the number of such nodes, how many of them have a query whose noise is zero with probability
    above the production floor, and the largest such probability (its level, query and node share); None when
    no node holds more than its level's share."""
    nodes = above = 0
    largest: dict[str, Any] | None = None
    for level, shares in level_shares.items():
        configured = budget.levels.get(level, Fraction(0))
        counts = np.bincount(np.asarray(shares.codes), minlength=len(shares.values))
        for code, share in enumerate(shares.values):
            if share <= configured or not counts[code]:
                continue
            nodes += int(counts[code])
            top = max((allocate(budget, level, q, share) for q, prop in budget.queries[level].items() if prop > 0),
                      key=lambda a: a.exact_probability)
            if top.budget.too_exact(NEIGHBOURS, PRODUCTION_MAX_EXACT):
                above += int(counts[code])
            if largest is None or top.exact_probability > largest["exact_probability"]:
                largest = {"exact_probability": top.exact_probability, "level": level, "query": top.query,
                           "node_share": str(share), "level_share": str(configured)}
    if largest is None:
        return None
    return {"nodes": nodes, "nodes_above_floor": above, "floor": PRODUCTION_MAX_EXACT, "largest": largest}
