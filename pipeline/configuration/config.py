"""Run configuration: TOML files validated with pydantic, budgets as exact fractions.

Layout of a configuration file (see ``conf/demo.toml``)::

    [run]                      name, census, products, spine, mode, seed, input, baf, algorithm, weaken_privacy
    [census.*]                 the census inline, instead of [run] census (docs/reference/census.md)
    [persons.budget]           mechanism, rho (zCDP) or epsilon (pure DP), delta, measure
    [persons.budget.levels]    geolevel proportions, top-down
    [persons.budget.queries.<Level>]   query proportions within a level
    [persons.estimation]       l2_passes.<Level>, rounder_passes.<Level> (lists of lists of query names), tau_slack,
                               split_above, split_cost, split_group, backend; compiler = "pyomo" with solver,
                               qp_solver, solver_options (the Pyomo path); match_published (an earlier run's
                               published marginal, held equal)
    [persons.invariants]       <Level> = [invariant names]
    [persons.constraints]      <Level> = [constraint names]
    [units.*]                  the same for the housing-unit product (one table per product of the census)

A preset may be included with ``include = "pl94_production_2021"`` (or a ``.toml`` file) at the top level;
tables of the including file override the preset's key by key.
"""
from __future__ import annotations

import hashlib
import json
import math
import os
import sys
from fractions import Fraction
from pathlib import Path
from types import UnionType
from typing import Annotated, Any, Literal, Union, get_args, get_origin

from pydantic import (BaseModel, BeforeValidator, ConfigDict, Field, PlainSerializer, SerializerFunctionWrapHandler,
                      SkipValidation, Strict, StrictBool, StrictFloat, StrictInt, StrictStr, ValidationError,
                      model_serializer, model_validator)

from topdown.vocab.census import Census, Hierarchy, Product

from .census import (DEFAULT_CENSUS, census_from_dict, default_census,
                     read_declaration)
from .errors import ConfigError, closest, did_you_mean, toml_files_beside
from .limits import MAX_INCLUDES, MAX_SEED, check_number_text, read_toml_file, unsafe_name


def parse_fraction(value: Any) -> Fraction:
    """An exact fraction from ``"p/q"``, an integer, or a decimal string. Floats are refused."""
    if isinstance(value, Fraction):
        return value
    if isinstance(value, bool):
        raise ValueError(f"expected a fraction such as \"1/3\", got {value!r}")
    if isinstance(value, int):
        return Fraction(value)
    if isinstance(value, float):
        raise ValueError(f"write budgets as exact fractions in quotes (e.g. \"1/10\"), not the float {value!r}")
    if isinstance(value, str):
        check_number_text(value.strip())
        try:
            return Fraction(value.strip())
        except (ValueError, ZeroDivisionError) as exc:
            raise ValueError(f"{value!r} is not an exact fraction such as \"104/4099\"") from exc
    raise ValueError(f"expected a fraction such as \"1/3\", got {value!r}")


#: How an infinite budget is written (TOML, certificate).
INFINITE = "inf"

#: The configurable noise mechanisms (``[<product>.budget] mechanism``), each with the key of its total: the
#: budget types of ``privacy/budget.py`` take their names and keys from here.
BUDGET_KEYS: dict[str, str] = {"discrete_gaussian": "rho", "geometric": "epsilon"}


def _parse_budget_total(value: Any) -> Fraction | None:
    """A total budget: an exact fraction, or ``"inf"`` (returned as None) for a zero-noise test run."""
    if isinstance(value, str) and value.strip().lower() in (INFINITE, "infinity"):
        return None
    return parse_fraction(value)


FractionField = Annotated[Fraction, BeforeValidator(parse_fraction), PlainSerializer(str, return_type=str)]
TotalBudget = Annotated[Fraction | None, BeforeValidator(_parse_budget_total),
                        PlainSerializer(lambda v: INFINITE if v is None else str(v), return_type=str)]


#: The largest finite budget total: above it a float conversion (the certificate's epsilon) overflows.
MAX_FLOAT = sys.float_info.max


def shown(value: Fraction) -> str:
    """A fraction as written (\"104/4099\"), or in scientific notation when that would be long (1e400)."""
    text = str(value)
    if len(text) <= 30:
        return text
    exponent = len(str(abs(value.numerator))) - len(str(value.denominator))
    scaled = value / Fraction(10) ** exponent  # in [0.1, 10)
    if abs(scaled) < 1:
        scaled, exponent = scaled * 10, exponent - 1
    return f"{float(scaled):.4g}e{exponent:+d}"


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


class BudgetConfig(_Strict):
    """Privacy budget of one product: total, mechanism, level and query proportions. The total, typed:
    :func:`~topdown.pipeline.privacy.budget.of_config`."""

    mechanism: Literal["discrete_gaussian", "geometric"] = Field(default="discrete_gaussian", description=(
        "discrete_gaussian (zCDP, budget rho) or geometric (pure DP, budget epsilon)"))
    rho: TotalBudget | None = Field(default=None, description="total rho (zCDP), or 'inf' for no noise")
    epsilon: TotalBudget | None = Field(default=None, description="total epsilon (pure DP, geometric)")
    delta: FractionField = Field(default=Fraction(1, 10**10), description=(
        "the delta at which the certificate states epsilon, in (0, 1)"))
    levels: dict[str, FractionField] = Field(description="each level's share of the total, top-down, by level name")
    queries: dict[str, dict[str, FractionField]] = Field(description=(
        "per level, each measured query's share of the level's budget (queries.<Level>.\"<query>\")"))
    infinite: bool = Field(default=False, description="set from rho = \"inf\": no noise (test mode only)")
    measure: Literal["declared", "in_play"] = Field(default="declared", description=(
        "declared: every answer of every measured query; in_play: below the root, only the answers that count "
        "a cell of the parent's published estimate (the same noise and budget per answer; DESIGN.md item 30)"))
    root_support: list[str] = Field(default_factory=list, description=(
        "with measure = in_play: root queries measured first on every answer; the root's other queries are then "
        "measured, and its histogram estimated, only on the cells whose every answer in these is above "
        "root_threshold (a choice from noisy output: DESIGN.md item 31). Empty: every cell is in play at the root"))
    root_threshold: float = Field(default=0.5, description=(
        "a cell stays in play at the root when each root_support query's noisy answer counting it is above this"))

    @model_serializer(mode="wrap")
    def _omit_declared(self, handler: SerializerFunctionWrapHandler) -> dict:
        """No ``measure`` key when every answer is measured (config.json and the config hash stay those of a
        configuration written before the key existed)."""
        data = handler(self)
        if data.get("measure") == "declared":
            data.pop("measure")
        if not data.get("root_support"):
            data.pop("root_support", None)
            if data.get("root_threshold") == 0.5:
                data.pop("root_threshold")
        return data

    @property
    def key(self) -> str:
        """The key of the total under the configured mechanism (:data:`BUDGET_KEYS`: "rho" or "epsilon")."""
        return BUDGET_KEYS[self.mechanism]

    @model_validator(mode="before")
    @classmethod
    def _mark_infinite(cls, data: Any) -> Any:
        if isinstance(data, dict):
            key = BUDGET_KEYS.get(data.get("mechanism", cls.model_fields["mechanism"].default))
            total = data.get(key) if key is not None else None
            if isinstance(total, str) and total.strip().lower() in (INFINITE, "infinity"):
                data = {**data, "infinite": True}
        return data

    @model_validator(mode="after")
    def _check_root_support(self) -> "BudgetConfig":
        if self.root_support and self.measure != "in_play":
            raise ValueError("root_support needs measure = \"in_play\"")
        if self.root_support and not math.isfinite(self.root_threshold):
            raise ValueError(f"root_threshold = {self.root_threshold} must be a finite number")
        return self

    @model_validator(mode="after")
    def _check_total(self) -> "BudgetConfig":
        for key in ("rho", "epsilon"):
            value = getattr(self, key)
            if value is not None and value > MAX_FLOAT:
                raise ValueError(f"{key} = {shown(value)} is too large to compute with (above {MAX_FLOAT:.3g}); "
                                 "use \"inf\" for a zero-noise test run")
        key = self.key
        value = getattr(self, key)
        if value is None and not self.infinite:
            raise ValueError(f"{self.mechanism} needs '{key}' (an exact fraction, or \"inf\" for a zero-noise test run)")
        if value is not None and value <= 0:
            raise ValueError(f"{key} must be positive, got {value}")
        if not 0 < self.delta < 1:
            raise ValueError(f"delta must be in (0, 1), got {self.delta}")
        return self


#: Default ``split_cost``: a joint solve of more count variables (children x non-zero parent cells) than
#: this goes through groups (solvers/split.py). Measured (benchmarks/RESULTS.md, "Split by cost"): a joint
#: solve takes about 200 MB + 7 KB per variable; a State -> County parent of 215 counties (357,000) 2.7 GB
#: and 305 CPU s on one worker, split 0.4 GB and 64 CPU s; a 60-county state (71,000) 0.7 GB jointly.
#: Rhode Island 2010's largest parent has 9,870, the demo's and the pinned inputs' fewer: never split. The
#: limit keeps the nation's US -> State parent (88 state parts x about 1,775 cells: 156,200 on the synthetic
#: us88) joint, as in production, at about 1.3 GB, and splits a state of 100+ counties.
SPLIT_COST = 160_000

#: The Pyomo path's solver when ``solver`` is not given: pyomo.contrib.solver's HiGHS interface, which takes the
#: L2 passes' QPs as well as the LPs and MILPs (``appsi_highs`` takes linear objectives only).
PYOMO_SOLVER = "highs"


class MatchPublished(_Strict):
    """A marginal held equal, in every geounit, to the counts an earlier run published (the 2020 DHC persons'
    hhgq x voting age x hispanic x cenrace to the P.L. 94-171 release): equality constraints of every parent's
    problem, in the L2 passes and the rounder (pipeline/execution/published.py)."""

    run: StrictStr = Field(min_length=1, description=(
        "the earlier run directory (a path or a storage URL) on the same spine; only its published histograms, "
        "spine and configuration are read, each checked against its manifest's SHA-256"))
    product: StrictStr = Field(min_length=1, description="the earlier run's product whose histograms are matched")
    query: StrictStr = Field(min_length=1, description=(
        "the marginal of this product held equal to them, a query of its schema (\"hhgq8lev * votingage * "
        "hispanic * cenrace\")"))
    attributes: dict[str, StrictStr] = Field(default_factory=dict, description=(
        "each term of `query` -> the earlier product's attribute it recodes to (its groups in that attribute's "
        "level order: hhgq8lev = \"hhgq\"); a term named like an attribute of the earlier product needs none"))


class EstimationConfig(_Strict):
    """Query orderings of the multi-pass L2 estimation and rounder, per child level."""

    l2_passes: dict[str, list[list[str]]] = Field(description=(
        "per level: the least-squares passes, each a list of measured queries"))
    rounder_passes: dict[str, list[list[str]]] = Field(description=(
        "per level: the rounder's passes, each a list of queries"))
    tau_slack: float = Field(default=0.1, ge=0, allow_inf_nan=False,
                             description="relative slack of the L2 passes' tau constraints (finite, >= 0)")
    split_above: int = Field(default=300, ge=0, description=(
        "parents with more children than this are solved in two stages through groups of split_group "
        "consecutive children (solvers/split.py); 0 = no limit on the number of children"))
    split_cost: int = Field(default=SPLIT_COST, ge=0, description=(
        "parents whose children x non-zero parent cells (the joint solve's count variables) exceed this "
        "are also solved in two stages, with groups small enough to stay within it; 0 = children count only"))
    split_group: int = Field(default=25, ge=2, description="children per group of a two-stage solve")
    backend: Literal["piqp-highs", "clarabel-highs", "gurobi"] = Field(
        default="piqp-highs", description=(
            "solvers of the direct path: PIQP (QP) + HiGHS (LP); Clarabel (QP) + HiGHS (LP), the default before "
            "PIQP (to reproduce an older run); or Gurobi where licensed"))
    refine_banded: bool = Field(default=False, description=(
        "backend piqp-highs: solve an L2 pass with tau bands by PIQP with iterative refinement first (the "
        "2020 DHC preset: several times fewer iterations on its banded passes); "
        "false: refined only where the plain try fails, as before (the P.L. 94-171 presets' pinned outputs)"))
    compiler: Literal["direct", "pyomo"] = Field(default="direct", description=(
        "direct (the default): each parent's rows built with numpy and the passes handed to the back end's "
        "solvers; pyomo: the parent's Pyomo model, each pass a Pyomo model solved through Pyomo by `solver`"))
    solver: str | None = Field(default=None, description=(
        "compiler = \"pyomo\": the solver of every pass, a name pyomo.environ.SolverFactory knows (appsi_highs, "
        "highs, gurobi_persistent, cplex_direct...; default highs)"))
    qp_solver: str | None = Field(default=None, description=(
        "compiler = \"pyomo\": the solver of the L2 passes' QPs, where `solver` takes no QP (default: solver)"))
    solver_options: dict[str, StrictStr | StrictInt | StrictFloat | StrictBool] = Field(
        default_factory=dict, description="compiler = \"pyomo\": options given to every solve (e.g. Threads = 1)")
    match_published: MatchPublished | None = Field(default=None, description=(
        "a marginal of the product held equal to an earlier run's published counts at every level (public data: "
        "no privacy cost); none: no such constraint"))

    @model_validator(mode="after")
    def _check_compiler(self) -> "EstimationConfig":
        pyomo_only = [k for k in ("solver", "qp_solver", "solver_options") if k in self.model_fields_set]
        if self.compiler == "direct" and pyomo_only:
            raise ValueError(f"{pyomo_only[0]} chooses a solver of the Pyomo path: set compiler = \"pyomo\" (the "
                             "direct path's solvers are `backend`)")
        if self.refine_banded and (self.compiler == "pyomo" or self.backend != "piqp-highs"):
            raise ValueError("refine_banded = true is a setting of PIQP on the direct path: it needs backend = "
                             f"\"piqp-highs\" and compiler = \"direct\" (got {self.backend!r}, {self.compiler!r})")
        if self.compiler == "pyomo" and "backend" in self.model_fields_set:
            raise ValueError("backend chooses the direct path's solvers; compiler = \"pyomo\" takes `solver` (and "
                             "`qp_solver`) instead")
        for key in ("solver", "qp_solver"):
            if getattr(self, key) is not None and not getattr(self, key).strip():
                raise ValueError(f"{key} is empty: name a solver that pyomo.environ.SolverFactory knows")
        return self

    @property
    def pyomo_solver(self) -> str:
        """The Pyomo path's solver of every pass."""
        return self.solver or PYOMO_SOLVER

    @model_serializer(mode="wrap")
    def _omit_direct_defaults(self, handler: SerializerFunctionWrapHandler) -> dict:
        """No Pyomo-path keys on the direct path and no ``match_published`` or ``refine_banded`` key when unset
        (config.json and the config hash stay those of a configuration written before the keys existed), no
        ``backend`` on the Pyomo path (it chooses no solver there)."""
        data = handler(self)
        if data.get("match_published") is None:
            data.pop("match_published", None)
        if not data.get("refine_banded", False):
            data.pop("refine_banded", None)
        if data.get("compiler") == "direct":
            for key in ("compiler", "solver", "qp_solver", "solver_options"):
                data.pop(key, None)
        else:
            data.pop("backend", None)
        return data


class ProductConfig(_Strict):
    """Everything about one product (persons or units)."""

    budget: BudgetConfig = Field(description="the product's privacy budget (its own table, below)")
    estimation: EstimationConfig = Field(description="how the product is estimated (its own table, below)")
    invariants: dict[str, list[str]] = Field(default_factory=dict, description=(
        "per level: the names of the census's declared invariants that hold there"))
    constraints: dict[str, list[str]] = Field(default_factory=dict, description=(
        "per level: the names of the census's declared constraints that hold there (and above)"))


#: The production checks a run may waive by name in ``[run] weaken_privacy`` (docs/how-to/production.md): a
#: budget above the ceiling or a query whose noise is below the floor (privacy/accounting.py), input whose
#: housing units ``topdown ingest blocks`` derived from the person counts, and blocks missing from the block
#: assignment files. A waived run's certificate says ``private: false`` and lists the waivers.
WAIVERS = ("budget_ceiling", "derived_housing_units", "blocks_missing_from_baf")


def waiver_hint(check: str) -> str:
    """The end of a refusal that ``check`` (one of :data:`WAIVERS`) can waive."""
    assert check in WAIVERS, check
    return f"or add \"{check}\" to [run] weaken_privacy (the certificate then says private: false)"


class RunSection(_Strict):
    name: str = Field(default="topdown", description="the run's name (in its manifest and certificate)")
    census: str = Field(default=DEFAULT_CENSUS, description=(
        "the census declaration: a preset under conf/census/ or a TOML file (docs/reference/census.md); "
        "read when the configuration loads, which then carries the declaration itself (Config.census, "
        "Config.census_table) and leaves this the default"))
    products: list[str] = Field(min_length=1, description="products to run (default: the census's first)")
    spine: Literal["standard", "aian", "optimized"] = Field(default="standard", description=(
        "the geographic spine: the census's hierarchy, or for a U.S. census the AIAN or optimized spine"))
    mode: Literal["test", "production"] = Field(default="production", description=(
        "production (the default): noise from the OS CSPRNG, no seed; test: seeded, reproducible noise that "
        "gives no privacy"))
    seed: Annotated[int, Strict()] | None = Field(default=None, description=(  # strict: `seed = true` is refused
        "test mode's seed of the noise (0 to 2^63 - 1); refused in production"))
    input: str = Field(default="demo", description="the input directory (--input overrides it)")
    baf: str | None = Field(default=None, description=(
        "the block assignment files' directory (the AIAN and optimized spines)"))
    algorithm: Literal["topdown", "block_by_block"] = Field(default="topdown", description=(
        "topdown, or block_by_block: every block its own problem with the whole budget on the leaf level, the levels "
        "above it sums of blocks (TDA paper, Appendix A)"))
    build_demo_input: bool = Field(default=False, description="write the bundled demo input to `input` when missing")
    weaken_privacy: list[Literal[WAIVERS]] = Field(default=[], description=(  # type: ignore[valid-type]
        "production checks waived by name (WAIVERS); the certificate then says private: false"))

    @model_serializer(mode="wrap")
    def _omit_no_waivers(self, handler: SerializerFunctionWrapHandler) -> dict:
        """No ``weaken_privacy`` key when nothing is waived (config.json and the config hash stay those of a
        configuration written before the key existed)."""
        data = handler(self)
        if not data.get("weaken_privacy"):
            data.pop("weaken_privacy", None)
        if data.get("census") == DEFAULT_CENSUS:  # likewise the default census
            data.pop("census", None)
        return data

    @model_validator(mode="after")
    def _check_mode(self) -> "RunSection":
        if len(set(self.products)) != len(self.products):
            raise ValueError(f"products lists a product twice ({self.products})")
        if len(set(self.weaken_privacy)) != len(self.weaken_privacy):
            raise ValueError(f"weaken_privacy lists a waiver twice ({self.weaken_privacy})")
        if self.mode == "production" and self.seed is not None:
            raise ValueError("mode = \"production\" (the default) draws from the operating system's CSPRNG and "
                             "refuses a seed; remove 'seed', or set mode = \"test\" for reproducible noise that "
                             "gives no privacy")
        if self.mode == "test" and self.seed is None:
            raise ValueError("mode = \"test\" needs an integer 'seed'")
        if self.seed is not None and not 0 <= self.seed <= MAX_SEED:
            raise ValueError(f"seed {self.seed} is outside 0..{MAX_SEED}")
        if (why := unsafe_name(self.name, "name")) is not None:  # it names outputs' folders (runs/<name>-...)
            raise ValueError(why)
        return self


#: ``[run]`` keys that locate input files rather than configure the run (left out of :meth:`Config.digest`).
LOCATIONS = ("input", "baf")


class Config(_Strict):
    """A whole run configuration: ``[run]``, the census it runs on (``[run] census`` or inline ``[census]``
    tables), and one table per product of that census (``[persons]``, ``[units]``), by product name."""

    model_config = ConfigDict(extra="forbid", frozen=True, arbitrary_types_allowed=True)

    run: RunSection
    products: dict[str, ProductConfig] = Field(default_factory=dict)
    census: SkipValidation[Census] = Field(exclude=True)  # resolved once, from run.census or census_table
    # the [census] table as written: inline, or read from the preset or file [run] census names (config.json
    # carries it, so that a run directory stands alone); None for the default census
    census_table: dict | None = Field(default=None, exclude=True)
    census_named: str | None = Field(default=None, exclude=True)  # [run] census as written, when it named one
    source: str = Field(default="<memory>", exclude=True)

    @model_validator(mode="before")
    @classmethod
    def _resolve_census(cls, data: Any) -> Any:
        """The census from ``[run] census`` or an inline ``[census]`` table; the top-level tables named after
        its products become :attr:`products`; ``[run] products`` defaults to its first product."""
        if not isinstance(data, dict) or isinstance(data.get("census"), Census):
            return data
        data = dict(data)
        source = data.get("source", "<memory>")
        run = data.get("run", {})
        run = dict(run) if isinstance(run, dict) else run.model_dump()
        table, named = data.pop("census", None), data.pop("census_named", None)
        if table is not None:
            if "census" in run:
                raise ConfigError(f"{source}: [run] census and a [census] table: declare the census one way")
            census = census_from_dict(table if isinstance(table, dict) else {}, source=source)
        elif run.get("census", DEFAULT_CENSUS) == DEFAULT_CENSUS:
            table, census = None, default_census()
        else:  # a preset or a file: carried as its table, so that config.json names no path
            named = run.pop("census")
            table, census = read_declaration(_census_location(named, source), f"{source}: run.census")
        names = [p.name for p in census.products]
        run.setdefault("products", names[:1])
        products = dict(data.pop("products", {}) or {})
        for name in names:
            value = data.pop(name, None)
            if value is not None:
                products[name] = value
        for key in data:
            if key not in ("run", "source", "census_table", "census_named"):
                raise ConfigError(f"{source}: [{key}]: not a product of census {census.name!r} (products: "
                                  f"{', '.join(names)}){did_you_mean(key, [*names, 'run', 'census'])}")
        return {**data, "run": run, "products": products, "census": census, "census_table": table,
                "census_named": named}

    @model_validator(mode="after")
    def _check_products(self) -> "Config":
        """Product and level names are the census's."""
        names = [p.name for p in self.census.products]
        for product in self.run.products:
            if product not in names:
                raise ConfigError(f"{self.source}: run.products: {product!r} is not a product of census "
                                  f"{self.census.name!r} (products: {', '.join(names)}){did_you_mean(product, names)}")
            if product not in self.products:
                raise ValueError(f"run.products lists {product!r} but there is no [{product}] table")
        levels = self.census.hierarchy.names
        for product, cfg in self.products.items():
            spec = self.census.product(product)
            for key, by_level in (("budget.levels", cfg.budget.levels), ("budget.queries", cfg.budget.queries),
                                  ("estimation.l2_passes", cfg.estimation.l2_passes),
                                  ("estimation.rounder_passes", cfg.estimation.rounder_passes)):
                for level in by_level:
                    if level not in levels:
                        raise ConfigError(f"{self.source}: {product}.{key}.{level}: unknown level (levels of census "
                                          f"{self.census.name!r}: {', '.join(levels)}){did_you_mean(level, levels)}")
            root = cfg.budget.queries.get(levels[0], {})
            for query in cfg.budget.root_support:
                if query not in root:
                    raise ConfigError(f"{self.source}: {product}.budget.root_support: {query!r} is not measured at "
                                      f"the root level {levels[0]!r} (its queries: {', '.join(root) or 'none'})")
            for table, known in (("constraints", spec.constraints), ("invariants", spec.invariants)):
                for level, listed in getattr(cfg, table).items():
                    if level not in levels:
                        raise ConfigError(f"{self.source}: [{product}.{table}] names level {level!r}; levels are "
                                          f"{', '.join(levels)}{did_you_mean(level, levels)}")
                    for name in listed:
                        if name not in known:
                            raise ConfigError(f"{self.source}: [{product}.{table}].{level}: unknown {table[:-1]} "
                                              f"{name!r}; known: {', '.join(known)}{did_you_mean(name, known)}")
            self._check_total_bound(spec, cfg)
        if self.run.spine != "standard" and not self.census.hierarchy.us:
            raise ConfigError(f"{self.source}: run.spine = {self.run.spine!r} is a U.S. spine (AIAN areas, block "
                              f"assignment files); census {self.census.name!r}'s hierarchy is not the U.S. one "
                              "(us = false): use spine = \"standard\"")
        return self

    def _check_total_bound(self, spec: Product, cfg: ProductConfig) -> None:
        """A total invariant declared at a level makes the total invariant there and at every level above it; each
        of those levels needs a constraint of right-hand side ``total`` (else the children's invariant totals need
        not add up to their parent's estimate), except the hierarchy's state level, whose whole states bind their
        parts as a group, below which no total is invariant."""
        hierarchy, names = self.census.hierarchy, list(self.census.hierarchy.names)
        totals = {n for n, inv in spec.invariants.items() if inv.kind == "total"}
        declared = [lv for lv in names if totals & set(cfg.invariants.get(lv, []))]
        binding = [c for c, con in spec.constraints.items() if con.rhs == "total"]
        bound = [lv for lv in names if set(binding) & set(cfg.constraints.get(lv, []))]
        below = [lv for lv in bound if not declared or names.index(lv) > names.index(declared[-1])]
        if below:
            known = f" ({', '.join(sorted(totals))})" if totals else " (none is declared)"
            raise ConfigError(f"{self.source}: [{spec.name}.constraints] {below[0]}: a constraint with rhs = \"total\" "
                              f"needs the total invariant at {below[0]}: declare a total invariant{known} at "
                              f"{below[0]} or below in [{spec.name}.invariants]")
        if self.run.spine != "standard" and hierarchy.state in bound:
            raise ConfigError(f"{self.source}: [{spec.name}.constraints] {hierarchy.state}: a constraint with rhs = "
                              f"\"total\" cannot bind the {self.run.spine} spine's {hierarchy.state} nodes, parts of "
                              f"a {hierarchy.state} without an invariant total (the whole {hierarchy.state}'s total "
                              "binds its parts as a group)")
        if not declared:
            return
        lowest = declared[-1]
        where = f"{self.source}: [{spec.name}.invariants] {lowest}"
        if hierarchy.state is not None and names.index(lowest) > names.index(hierarchy.state):
            raise ConfigError(f"{where}: a total is invariant down to {hierarchy.state} at most on this hierarchy "
                              f"(a {hierarchy.state} split into parts by a spine has no invariant part totals)")
        missing = [lv for lv in names[:names.index(lowest) + 1] if lv != hierarchy.state
                   and not set(binding) & set(cfg.constraints.get(lv, []))]
        if missing:
            hint = f"{binding[0]!r}" if binding else "a constraint with rhs = \"total\" (none is declared)"
            raise ConfigError(f"{where}: the total is invariant at {', '.join(names[:names.index(lowest) + 1])}, "
                              f"but {', '.join(missing)} {'has' if len(missing) == 1 else 'have'} no constraint "
                              f"that binds it: add {hint} to "
                              f"[{spec.name}.constraints] {missing[0]}")

    @model_serializer(mode="wrap")
    def _products_by_name(self, handler: SerializerFunctionWrapHandler) -> dict:
        """``{"run": ..., "<product>": ... or null per product of the census, "census": the inline table}``:
        the form of the configuration file (config.json and the config hash of a P.L. 94-171 run are those of a
        configuration written before censuses were declared)."""
        data = handler(self)
        products = data.pop("products", {})
        out = {"run": data.pop("run"), **{p.name: products.get(p.name) for p in self.census.products}, **data}
        if self.census_table is not None:
            out["census"] = self.census_table
        return out

    def waived(self, check: str) -> bool:
        """Whether ``[run] weaken_privacy`` waives the production check ``check`` (one of :data:`WAIVERS`)."""
        assert check in WAIVERS, check
        return check in self.run.weaken_privacy

    def product(self, name: str) -> ProductConfig:
        return self.products[name]

    @property
    def run_products(self) -> list[Product]:
        """The census's products this run processes, in ``[run] products`` order (resolved at load)."""
        by_name = {p.name: p for p in self.census.products}
        return [by_name[name] for name in self.run.products]

    def with_overrides(self, **run_fields: Any) -> "Config":
        """A copy with some ``[run]`` fields replaced (validated again)."""
        data = self.model_dump(mode="json")
        data["run"].update({k: v for k, v in run_fields.items()})
        return config_from_dict({**data, "census_named": self.census_named}, source=self.source)

    def digest(self) -> str:
        """SHA-256 of the canonical JSON of the configuration (the manifest's config hash), without the
        :data:`LOCATIONS` of its input: where the input lies and how its path is spelled (relative, absolute,
        through a link) do not change the configuration; its files are identified by their SHA-256 sums
        (the manifest's input hashes)."""
        return _digest(self.model_dump(mode="json"))

    def matches(self, config_hash: Any) -> bool:
        """Whether a manifest's config hash is this configuration's: its :meth:`digest`, or, for a census named by
        ``[run] census``, the hash a run of an older version recorded (the name where config.json now carries the
        declaration)."""
        if config_hash == self.digest():
            return True
        if self.census_named is None:
            return False
        data = self.model_dump(mode="json")
        data.pop("census")
        data["run"]["census"] = self.census_named
        return config_hash == _digest(data)


def _digest(data: dict) -> str:
    """:meth:`Config.digest` of a configuration's JSON form."""
    data = {**data, "run": {k: v for k, v in data["run"].items() if k not in LOCATIONS}}
    return hashlib.sha256(json.dumps(data, sort_keys=True).encode()).hexdigest()


def _census_location(value: Any, source: str) -> str | Path:
    """``[run] census``: a preset name, or a file (relative to the working directory, else to the configuration
    file's folder). Read once, when the configuration is loaded: the configuration then carries the declaration
    itself (:attr:`Config.census_table`), not its path."""
    if not isinstance(value, str) or not value:
        raise ConfigError(f"{source}: run.census: expected a census preset name or a file path (got {value!r})")
    for candidate in (Path(value), Path(source).parent / value):
        if os.path.lexists(candidate):
            return candidate
    return value  # a preset, or census_path's error


def _deep_merge(base: dict, top: dict) -> dict:
    out = dict(base)
    for key, value in top.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = value
    return out


def leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted key: value}; lists are values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


_MISSING = object()


def differing_keys(before: dict, after: dict) -> list[str]:
    """The dotted keys whose values differ between two configurations in their JSON form, sorted."""
    old, new = leaves(before), leaves(after)
    return sorted(k for k in set(old) | set(new) if old.get(k, _MISSING) != new.get(k, _MISSING))


def preset_dir() -> Path:
    """The folder of shipped presets (``conf/``)."""
    return Path(__import__("topdown.conf", fromlist=["__file__"]).__file__).parent


def preset_names() -> list[str]:
    """The shipped presets' names (``demo``, ``pl94_production_2021``...)."""
    return sorted(q.stem for q in preset_dir().glob("*.toml"))


def resolve_config_path(path: str | Path) -> Path:
    """A config path as given, or the name of a shipped preset (``demo``, ``pl94_production_2021``...)."""
    p = Path(path)
    if p.is_file():  # a directory of the same name (a run called "demo") is not a configuration
        return p
    candidate = preset_dir() / (p.name if p.suffix == ".toml" else p.name + ".toml")
    if candidate.exists():
        return candidate
    if p.exists():
        raise ConfigError(f"{path}: cannot read the configuration: not a file (a TOML file or a preset name)")
    presets = preset_names()
    raise ConfigError(f"{path}: no such configuration file or shipped preset (presets: {', '.join(presets)})"
                      + did_you_mean(path, [*presets, *toml_files_beside(p)]))


def read_toml(path: Path, _chain: tuple[Path, ...] = ()) -> dict:
    """A TOML file with ``include`` resolved (relative to the file, then the shipped presets).

    ``include`` names one ``.toml`` file or a shipped preset (``"demo"``); an include cycle, or a chain of more
    than :data:`~.limits.MAX_INCLUDES` files, is refused."""
    chain = (*_chain, path.resolve())
    data = read_toml_file(path, "the configuration")
    include = data.pop("include", None)
    if include is not None:
        presets = preset_names()
        if not isinstance(include, str) or not (include.endswith(".toml") or include in presets):
            raise ConfigError(f"{path}: key 'include' must name a .toml file or a shipped preset, such as \"demo\" "
                              f"(got {include!r}){did_you_mean(include, presets)}")
        inc = path.parent / include if include.endswith(".toml") else preset_dir() / f"{include}.toml"
        if not inc.exists():
            inc = resolve_config_path(include)
        if inc.resolve() in chain:
            cycle = " -> ".join(str(p) for p in (*chain, inc.resolve()))
            raise ConfigError(f"{path}: key 'include' makes an include cycle ({cycle})")
        if len(chain) >= MAX_INCLUDES:
            raise ConfigError(f"{path}: key 'include' makes a chain of more than {MAX_INCLUDES} files (from "
                              f"{chain[0]})")
        base = read_toml(inc, chain)
        run, base_run = data.get("run"), base.get("run")
        production = isinstance(run, dict) and run.get("mode") == "production" and "seed" not in run
        if production and isinstance(base_run, dict):
            base_run.pop("seed", None)  # a preset's test seed does not carry into production
        data = _deep_merge(base, data)
    return data


def _keys_at(model: type[BaseModel], loc: tuple) -> list[str]:
    """The keys the table at ``loc`` (a pydantic error's location in ``model``) takes; [] where it takes any."""
    annotation: Any = model
    for part in (*loc, None):
        while get_origin(annotation) in (Annotated, Union, UnionType):  # X | None, Annotated[X, ...]: X
            args = [a for a in get_args(annotation) if a is not type(None)]
            annotation = args[0] if get_origin(annotation) is Annotated or len(args) == 1 else None
        if part is None:
            break
        if isinstance(annotation, type) and issubclass(annotation, BaseModel):
            field = annotation.model_fields.get(str(part))
            annotation = field.annotation if field is not None else None
        elif get_origin(annotation) in (dict, list):  # part is a key or an index
            annotation = get_args(annotation)[-1]
        else:
            return []
    return list(annotation.model_fields) if isinstance(annotation, type) and issubclass(annotation, BaseModel) else []


def _shown(value: object) -> str:
    """A value as a message shows it: its repr, cut short past 80 characters (a 5,000-digit number stays one line)."""
    text = repr(value)
    return text if len(text) <= 80 else f"{text[:60]}... ({len(text):,} characters)"


def _format_validation_error(path: Path | str, exc: ValidationError, model: type[BaseModel] | None = None) -> str:
    """One line for one error, else a header and one indented line per error. Keys are named as written in the
    file (a product's table is ``[persons]``, not ``products.persons``); a misspelt key gets the closest key of its
    table (``model``'s, default :class:`Config`), and the required key it was meant for is not reported missing."""
    model = model or Config
    errors = exc.errors()
    meant = set()
    for err in errors:
        if err["type"] == "extra_forbidden":
            meant.add((*err["loc"][:-1], closest(err["loc"][-1], _keys_at(model, err["loc"][:-1]))))
    lines = []
    for err in errors:
        where = err["loc"][1:] if model is Config and err["loc"][:1] == ("products",) else err["loc"]
        loc = ".".join(str(x) for x in where) or "(top level)"
        got = err.get("input")
        if err["type"] == "extra_forbidden":
            known = _keys_at(model, err["loc"][:-1])
            lines.append(f"{loc}: unknown key (known: {', '.join(known)}){did_you_mean(err['loc'][-1], known)}")
            continue
        if err["type"] == "missing" and tuple(err["loc"]) in meant:
            continue
        shown = f" (got {_shown(got)})" if isinstance(got, (str, int, float)) and err["type"] != "missing" else ""
        lines.append(f"{loc}: {err['msg']}{shown}")
    if len(lines) == 1:
        return f"{path}: invalid configuration: {lines[0]}"
    return "\n  ".join([f"{path}: invalid configuration", *lines])


def load_config(path: str | Path) -> Config:
    """Read and validate a configuration file (or shipped preset name)."""
    if not isinstance(path, (str, os.PathLike)):
        raise ConfigError(f"load_config({path!r}): expected a configuration file or a shipped preset name")
    p = resolve_config_path(path)
    data = read_toml(p)
    return config_from_dict(data, source=str(p))


def config_from_dict(data: dict, source: str = "<memory>") -> Config:
    """Validate a configuration given as a dictionary (as parsed from TOML); production mode is checked
    further by :func:`check_production`."""
    try:
        config = Config.model_validate({**data, "source": source})
    except ValidationError as exc:
        for err in exc.errors():  # a census or name check's own message (it names the file and key)
            if isinstance(err.get("ctx", {}).get("error"), ConfigError):
                raise err["ctx"]["error"] from None
        raise ConfigError(_format_validation_error(source, exc)) from None
    check_production(config)
    return config


def check_production(config: Config) -> None:
    """Production mode refuses what would publish exact or unprotected answers, or waste a release:
    an infinite budget (no noise) and a level or query share of 0 at a level the algorithm measures (the
    seed is refused by :class:`RunSection`; a zero total budget by :class:`BudgetConfig`). Raises
    :class:`ConfigError` naming the file and the key."""
    if config.run.mode != "production":
        return
    where = config.source
    for product in config.run.products:
        budget = config.product(product).budget
        if budget.infinite:
            raise ConfigError(f"{where}: {product}.budget.{budget.key} = \"inf\" is refused in mode = \"production\": "
                              "an infinite budget adds no noise and publishes exact counts (use mode = \"test\")")
        measured = [census_hierarchy(config).leaf] if config.run.algorithm == "block_by_block" else list(budget.levels)
        for level in measured:
            if budget.levels.get(level) == 0:
                raise ConfigError(f"{where}: {product}.budget.levels.{level} = 0 is refused in mode = \"production\": "
                                  "the level's queries are listed but would not be measured; give it a positive share")
            for query, share in budget.queries.get(level, {}).items():
                if share == 0:
                    raise ConfigError(f"{where}: {product}.budget.queries.{level}.\"{query}\" = 0 is refused in mode = "
                                      "\"production\": a listed query with no budget is not measured; remove it or "
                                      "give it a positive share")


def census_hierarchy(config: Config) -> Hierarchy:
    """The hierarchy a run's spine is built on: its census's (``config.census``)."""
    return config.census.hierarchy
