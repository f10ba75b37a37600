"""Privacy budgets as typed exact values: :class:`Rho` (zCDP, discrete Gaussian noise) and :class:`PureEpsilon`
(pure DP, two-sided geometric noise).

A budget is an exact ``Fraction`` (``value``), or None for an infinite budget (``"inf"``, a zero-noise test
run). It knows its mechanism, splits by a share (``budget * Fraction(1, 4)``), composes with budgets of its
kind (``+``, ``sum``; across kinds through :meth:`Budget.as_rho`, see :func:`compose`), compares with the
release ceiling and noise floor, converts for the certificate, and gives the variance and the draws of one
query's noise under the neighbour relation :data:`NEIGHBOURS`. This module is the one place that maps a
mechanism's name (``[*.budget] mechanism``, the certificate's ``mechanism``) to its budget type (:data:`KINDS`).

zCDP (discrete Gaussian, 2020 production): a query with rho_q gets noise N_Z(0, sigma2), sigma2 = Delta_2^2 /
(2 rho_q) (Canonne, Kamath and Steinke 2020). Pure DP (geometric, 2018 End-to-End): a query with epsilon_q gets
noise P(y) ~ exp(-epsilon_q |y| / Delta_1). Pure epsilon-DP implies epsilon^2/2-zCDP (Bun and Steinke 2016,
Proposition 1.4); rho-zCDP implies (epsilon, delta)-DP by the tight conversion of Canonne, Kamath and Steinke
(2020), the bound the Bureau's code reports.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from fractions import Fraction
from typing import Any, ClassVar, Iterable

import numpy as np

from ..configuration.config import BUDGET_KEYS, INFINITE, BudgetConfig
from .mechanisms import (discrete_gaussian_many, discrete_gaussian_variance, discrete_gaussian_zero_probability,
                         geometric_many, geometric_variance, geometric_zero_probability)
from .rng import RandomSource

@dataclass(frozen=True)
class NeighbourRelation:
    """The privacy unit: which databases are neighbours, and so how far one change moves a marginal's answers.

    Stated once here; the noise drawn, the variances and the certificate all take it from :data:`NEIGHBOURS`.
    """

    description: str
    l1_sensitivity: int  # sum over answers of |change|: the geometric mechanism's scale
    l2_sensitivity_squared: int  # sum over answers of change^2: the discrete Gaussian's sigma2 = this / (2 rho)

    def sigma2(self, rho: Fraction) -> Fraction:
        """The discrete Gaussian variance parameter giving ``rho``-zCDP: Delta_2^2 / (2 rho)."""
        return Fraction(self.l2_sensitivity_squared) / (2 * rho)


#: Bounded neighbours (change one record): a marginal counts the record in one answer before and one after,
#: so at most two answers move by one (L1 = 2, squared L2 = 2).
NEIGHBOURS = NeighbourRelation("bounded neighbours (change one record)", l1_sensitivity=2, l2_sensitivity_squared=2)

@dataclass(frozen=True)
class ReleaseCeiling:
    """A ceiling on the composed budget of every product of one run, as zCDP rho: the sum of ``parts`` (what each
    part is, its exact rho), from ``source``."""

    parts: tuple[tuple[str, Fraction], ...]
    source: str

    @property
    def rho(self) -> Fraction:
        return sum((rho for _, rho in self.parts), Fraction(0))

    def entry(self, composed: "Budget") -> dict[str, Any]:
        """The certificate's statement of ``composed`` (all products of a run) against this ceiling."""
        rho = composed.as_rho().value
        return {"rho": str(self.rho), "rho_float": float(self.rho),
                "composed_rho": INFINITE if rho is None else str(rho),
                "composed_rho_float": math.inf if rho is None else float(rho),
                "within": rho is not None and rho <= self.rho,
                "parts": {name: str(part) for name, part in self.parts}, "source": self.source}


#: Production ceiling on the budget of all products of a run composed, as zCDP rho (a pure-DP epsilon counts as
#: epsilon^2 / 2): the Census Bureau's whole 2020 budget for its TopDown releases, about 15.29 (epsilon 51.6 at
#: delta = 1e-10). Redistricting data: persons 1 / (339/542)^2 (prod_default.ini's global scale), housing units
#: (3379/12343)^2 (the "0.07" of Abowd et al. 2022, section 8.2); DHC: the per-query rho of the production
#: strategies (iteration 23.1, named by das_decennial/configs/production/dhc/*_US.ini) summed exactly.
RELEASE_CEILING = ReleaseCeiling(
    parts=(("2020 redistricting data (P.L. 94-171), persons", Fraction(293764, 114921)),
           ("2020 redistricting data (P.L. 94-171), housing units", Fraction(11417641, 152349649)),
           ("2020 Demographic and Housing Characteristics (DHC), persons", Fraction(24811, 5000)),
           ("2020 Demographic and Housing Characteristics (DHC), households and housing units", Fraction(15401, 2000))),
    source=("U.S. Census Bureau, 2020 Census production code: GitHub uscensusbureau/DAS_2020_Redistricting_Production_Code "
            "(source/configs/production/pl94/; Abowd et al. 2022, \"The 2020 Census Disclosure Avoidance System TopDown "
            "Algorithm\", Harvard Data Science Review, section 8.2) and uscensusbureau/DAS_2020_DHC_Production_Code "
            "(das_decennial/configs/production/dhc/, das_decennial/programs/strategies/dhcp_strategies.py and "
            "dhch_strategies.py, iteration 23.1; Cumings-Menon et al. 2024, \"Disclosure Avoidance for the 2020 Census "
            "Demographic and Housing Characteristics File\", Harvard Data Science Review)"))

#: Production floor on every measured query's noise: the probability that it is zero (the published answer
#: is the true count) is at most this. The 2021 persons strategy's least noisy query (the State total,
#: sigma2 1.21) is exact with probability 0.36; the discrete Gaussian reaches 1/2 at sigma2 about 0.64.
PRODUCTION_MAX_EXACT = 0.5
#: In every mode, the largest noise the samplers (int64 draws) and the solvers (float64, integers exact below
#: 2^53) handle: a standard deviation of 10^10, thirty times the U.S. population. Measured with more noise,
#: a count says nothing; the budget is mistyped (rho = "1e-44").
MAX_NOISE_SD = 10 ** 10


def _exact(value: Any, what: str) -> Fraction:
    if isinstance(value, bool) or not isinstance(value, (int, Fraction)):
        raise TypeError(f"{what} must be an exact Fraction or int, got {value!r}")
    return Fraction(value)


@dataclass(frozen=True)
class Budget:
    """A privacy budget: ``value`` an exact non-negative fraction, or None for an infinite budget (no noise,
    not private; test mode only). A zero budget measures nothing (infinite variance)."""

    value: Fraction | None

    #: The noise mechanism's name, as configured and certified.
    mechanism: ClassVar[str]
    #: The TOML key of the total and the certificate's unit ("rho", "epsilon").
    key: ClassVar[str]
    #: The privacy definition, as the certificate names it.
    framework: ClassVar[str]
    #: True for pure DP (delta = 0).
    pure: ClassVar[bool]
    #: The certificate's per-query noise column besides the variance.
    noise_column: ClassVar[str]

    def __post_init__(self) -> None:
        if type(self) is Budget:
            raise TypeError("Budget is abstract: use Rho (zCDP) or PureEpsilon (pure DP)")
        if self.value is not None:
            value = _exact(self.value, self.key)
            if value < 0:
                raise ValueError(f"{self.key} must be non-negative, got {value}")
            object.__setattr__(self, "value", value)

    @classmethod
    def parse(cls, text: str | Fraction | int | None) -> "Budget":
        """The budget written ``text`` (``"104/4099"``, ``"inf"``; None is infinite)."""
        if text is None or (isinstance(text, str) and text.strip().lower() in (INFINITE, "infinity")):
            return cls(None)
        return cls(Fraction(text) if isinstance(text, str) else text)

    @property
    def infinite(self) -> bool:
        return self.value is None

    @property
    def zero(self) -> bool:
        """Nothing to spend: a query with this budget is not measured."""
        return self.value == 0

    def __str__(self) -> str:
        return INFINITE if self.value is None else str(self.value)

    # ----------------------------------------------------------------------------- splitting and composing
    def __mul__(self, share: Fraction | int) -> "Budget":
        """The part ``share`` (exact, in [0, 1] for a split) of this budget; a zero share of any budget is zero."""
        share = _exact(share, "a budget share")
        if share < 0:
            raise ValueError(f"a budget share must be non-negative, got {share}")
        if share == 0:
            return type(self)(Fraction(0))
        return type(self)(None if self.value is None else self.value * share)

    __rmul__ = __mul__

    def __add__(self, other: "Budget | int") -> "Budget":
        """Sequential composition of two budgets of the same kind (their values add; ``0 + b`` is ``b`` so that
        ``sum`` works). Budgets of different kinds compose through :func:`compose`."""
        if isinstance(other, int) and not isinstance(other, bool) and other == 0:
            return self
        if type(other) is not type(self):
            raise TypeError(f"cannot add {type(self).__name__} and {type(other).__name__}: compose() converts "
                            "pure epsilon-DP to zCDP first")
        if self.value is None or other.value is None:
            return type(self)(None)
        return type(self)(self.value + other.value)

    __radd__ = __add__

    def as_rho(self) -> "Rho":
        """The same guarantee stated as zCDP."""
        raise NotImplementedError

    # ------------------------------------------------------------------------------- ceiling and floor
    def above_ceiling(self, ceiling: Fraction) -> bool:
        """Whether this budget, as zCDP rho, exceeds ``ceiling`` (an infinite one does)."""
        rho = self.as_rho().value
        return rho is None or rho > ceiling

    def exact_probability(self, neighbours: NeighbourRelation = NEIGHBOURS) -> float:
        """The probability that one query's noise is zero (its published answer the true one): 1 without noise,
        0 for a query not measured."""
        if self.value is None:
            return 1.0
        return 0.0 if self.value == 0 else self._zero_probability(neighbours)

    def too_exact(self, neighbours: NeighbourRelation = NEIGHBOURS, floor: float = PRODUCTION_MAX_EXACT) -> bool:
        """Whether one query's noise is zero with probability above the production ``floor``."""
        return self.exact_probability(neighbours) > floor

    def drawable(self, neighbours: NeighbourRelation = NEIGHBOURS, max_sd: int = MAX_NOISE_SD) -> bool:
        """Whether one query's noise has a standard deviation of at most ``max_sd`` (what the samplers and
        solvers handle); true without noise and for a query not measured."""
        return self.value is None or self.value == 0 or self._drawable(neighbours, max_sd)

    # ------------------------------------------------------------------------------------ one query's noise
    def variance(self, neighbours: NeighbourRelation = NEIGHBOURS) -> float:
        """The variance of one query's noise: 0 without noise, infinite for a query not measured."""
        if self.value is None:
            return 0.0
        return math.inf if self.value == 0 else self._variance(neighbours)

    def draw(self, sources: list[RandomSource], size: int, neighbours: NeighbourRelation = NEIGHBOURS) -> np.ndarray:
        """Noise rows for many streams at once (row i from ``sources[i]``): int64[len(sources), size]."""
        if self.value is None or self.value == 0:
            raise ValueError(f"no noise to draw for {self.key} = {self}")
        return self._draw(sources, size, neighbours)

    def parameters(self, neighbours: NeighbourRelation = NEIGHBOURS) -> dict[str, Any]:
        """One query's row of the certificate: its budget and its noise's parameters (strings for exact values)."""
        raise NotImplementedError

    # ---------------------------------------------------------------------------------- the certificate
    def epsilon_at(self, delta: Fraction | float) -> float:
        """The (epsilon, delta)-DP epsilon this budget implies at ``delta`` (pure DP: its own epsilon)."""
        raise NotImplementedError

    def certified(self, delta: Fraction, curve_deltas: Iterable[float]) -> dict[str, Any]:
        """A finite total's entries in the certificate: the exact total, its float, delta, epsilon, the curve."""
        raise NotImplementedError

    # Mechanism-specific parts of the methods above, for a finite positive value.
    def _zero_probability(self, neighbours: NeighbourRelation) -> float:
        raise NotImplementedError

    def _drawable(self, neighbours: NeighbourRelation, max_sd: int) -> bool:
        raise NotImplementedError

    def _variance(self, neighbours: NeighbourRelation) -> float:
        raise NotImplementedError

    def _draw(self, sources: list[RandomSource], size: int, neighbours: NeighbourRelation) -> np.ndarray:
        raise NotImplementedError


@dataclass(frozen=True)
class Rho(Budget):
    """A zCDP budget rho, spent with discrete Gaussian noise."""

    mechanism: ClassVar[str] = "discrete_gaussian"
    key: ClassVar[str] = BUDGET_KEYS[mechanism]
    framework: ClassVar[str] = "rho-zCDP"
    pure: ClassVar[bool] = False
    noise_column: ClassVar[str] = "sigma2_float"

    def as_rho(self) -> "Rho":
        return self

    def sigma2(self, neighbours: NeighbourRelation = NEIGHBOURS) -> Fraction | None:
        """The discrete Gaussian's variance parameter for one query with this budget (None: no noise or not
        measured)."""
        return None if self.value is None or self.value == 0 else neighbours.sigma2(self.value)

    def parameters(self, neighbours: NeighbourRelation = NEIGHBOURS) -> dict[str, Any]:
        sigma2 = self.sigma2(neighbours)
        return {"rho": str(self), "sigma2": INFINITE if sigma2 is None else str(sigma2),
                "sigma2_float": None if sigma2 is None else float(sigma2)}

    def epsilon_at(self, delta: Fraction | float) -> float:
        if self.value is None:
            return math.inf
        return zcdp_to_epsilon(self.value, delta)

    def certified(self, delta: Fraction, curve_deltas: Iterable[float]) -> dict[str, Any]:
        assert self.value is not None
        return {"rho": str(self.value), "rho_float": float(self.value), "delta": str(delta),
                "delta_float": float(delta), "epsilon": zcdp_to_epsilon(self.value, delta),
                "epsilon_bun_steinke": zcdp_to_epsilon_bun_steinke(self.value, delta),
                "conversion": "Canonne-Kamath-Steinke 2020 (tight); Bun-Steinke 2016 for comparison",
                "curve": [{"delta": d, "epsilon": e} for d, e in epsilon_delta_curve(self.value, curve_deltas)]}

    def _zero_probability(self, neighbours: NeighbourRelation) -> float:
        return discrete_gaussian_zero_probability(neighbours.sigma2(self.value))

    def _drawable(self, neighbours: NeighbourRelation, max_sd: int) -> bool:
        return neighbours.sigma2(self.value) <= max_sd ** 2

    def _variance(self, neighbours: NeighbourRelation) -> float:
        return discrete_gaussian_variance(neighbours.sigma2(self.value))

    def _draw(self, sources: list[RandomSource], size: int, neighbours: NeighbourRelation) -> np.ndarray:
        return discrete_gaussian_many(sources, neighbours.sigma2(self.value), size)


@dataclass(frozen=True)
class PureEpsilon(Budget):
    """A pure-DP budget epsilon, spent with two-sided geometric noise."""

    mechanism: ClassVar[str] = "geometric"
    key: ClassVar[str] = BUDGET_KEYS[mechanism]
    framework: ClassVar[str] = "pure epsilon-DP"
    pure: ClassVar[bool] = True
    noise_column: ClassVar[str] = "sensitivity"

    def as_rho(self) -> Rho:
        """epsilon-DP implies epsilon^2/2-zCDP (Bun and Steinke 2016, Proposition 1.4)."""
        return Rho(None if self.value is None else pure_dp_as_zcdp(self.value))

    def parameters(self, neighbours: NeighbourRelation = NEIGHBOURS) -> dict[str, Any]:
        return {"epsilon": str(self),
                "sensitivity": None if self.value is None or self.value == 0 else neighbours.l1_sensitivity}

    def epsilon_at(self, delta: Fraction | float) -> float:
        return math.inf if self.value is None else float(self.value)

    def certified(self, delta: Fraction, curve_deltas: Iterable[float]) -> dict[str, Any]:
        assert self.value is not None
        return {"epsilon": str(self.value), "epsilon_float": float(self.value), "delta": "0", "delta_float": 0.0,
                "curve": [{"delta": d, "epsilon": float(self.value)} for d in curve_deltas]}

    def _zero_probability(self, neighbours: NeighbourRelation) -> float:
        return geometric_zero_probability(self.value, neighbours.l1_sensitivity)

    def _drawable(self, neighbours: NeighbourRelation, max_sd: int) -> bool:
        # the geometric distribution's standard deviation is below sqrt(2) / lambda, lambda = epsilon / Delta_1
        lam = self.value / neighbours.l1_sensitivity
        return lam * lam * max_sd ** 2 >= 2

    def _variance(self, neighbours: NeighbourRelation) -> float:
        return geometric_variance(self.value, neighbours.l1_sensitivity)

    def _draw(self, sources: list[RandomSource], size: int, neighbours: NeighbourRelation) -> np.ndarray:
        return geometric_many(sources, self.value, neighbours.l1_sensitivity, size)


#: Budget types by mechanism name (the one lookup from a configured or recorded name to a type).
KINDS: dict[str, type[Budget]] = {kind.mechanism: kind for kind in (Rho, PureEpsilon)}


def of_entry(entry: dict[str, Any]) -> Budget:
    """The budget a certificate entry or draw summary records (``mechanism`` and the total under its key)."""
    kind = KINDS.get(entry.get("mechanism"))  # type: ignore[arg-type]
    if kind is None:
        raise ValueError(f"unknown mechanism {entry.get('mechanism')!r} (known: {', '.join(KINDS)})")
    return kind.parse(entry[kind.key])


def of_config(budget: BudgetConfig) -> Budget:
    """A product's configured total budget: :class:`Rho` for the discrete Gaussian, :class:`PureEpsilon` for
    the geometric mechanism; infinite for "inf"."""
    kind = KINDS[budget.mechanism]
    return kind(None if budget.infinite else getattr(budget, kind.key))


def compose(budgets: Iterable[Budget]) -> Budget:
    """Sequential composition: pure epsilons add when all are pure; otherwise the rhos add, a pure epsilon
    counted as epsilon^2/2-zCDP. Infinite if any is."""
    budgets = list(budgets)
    if not budgets:
        raise ValueError("compose() needs at least one budget")
    if all(b.pure for b in budgets):
        return sum(budgets, PureEpsilon(Fraction(0)))
    return sum((b.as_rho() for b in budgets), Rho(Fraction(0)))


# ------------------------------------------------------------------------------------------ conversions
def pure_dp_as_zcdp(epsilon: Fraction) -> Fraction:
    """The zCDP rho implied by pure epsilon-DP: epsilon^2 / 2 (Bun and Steinke 2016, Proposition 1.4)."""
    return epsilon ** 2 / 2


def _zcdp_epsilon_at(alpha: float, rho: float, log_inv_delta: float) -> float:
    """epsilon(alpha) = alpha rho + (log(1/delta) - log alpha) / (alpha - 1) + log(1 - 1/alpha)."""
    return alpha * rho + (log_inv_delta - math.log(alpha)) / (alpha - 1) + math.log1p(-1 / alpha)


def zcdp_to_epsilon(rho: Fraction, delta: Fraction | float) -> float:
    """Smallest epsilon with rho-zCDP => (epsilon, delta)-DP by the tight conversion of Canonne, Kamath &
    Steinke (2020), the bound the Bureau's code reports (its ``curve.py``):
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
    """The looser Bun-Steinke (2016) conversion epsilon = rho + 2 sqrt(rho log(1/delta))."""
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
