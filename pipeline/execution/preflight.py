"""Checks of a run that need no input data, done before the run directory is touched (exit code 2), and the
block assignment files' checks against the input (exit code 3 when the input disagrees with them).

Everything here raises :class:`~topdown.pipeline.configuration.config.ConfigError` naming the configuration key (or the
command-line option) and the offending value, so a bad configuration never starts a cluster, takes the
lock or writes a file.
"""
from __future__ import annotations

import os
from pathlib import Path

import pandas as pd

from ..configuration.config import Config, ConfigError, census_hierarchy, waiver_hint
from ..configuration.errors import query_hint
from ..privacy.accounting import check_budget, check_noise
from topdown.vocab.queries import QueryError, build_query
from ..inputs.ingest import derived_units
from ..configuration.errors import InputError


#: Most worker processes of an embedded cluster per CPU: more only compete for the CPUs (and each holds a Python
#: process's memory), and a typo such as ``--workers 1000`` would start processes without bound.
WORKERS_PER_CPU = 4


def max_workers() -> int:
    """The largest ``--workers`` an embedded cluster accepts on this machine."""
    return WORKERS_PER_CPU * (os.cpu_count() or 1)


def check_workers(workers: int | None) -> None:
    """``--workers`` is a positive number of worker processes (0 or -1 would start no worker and wait), at most
    :func:`max_workers`."""
    if workers is not None and (isinstance(workers, bool) or not isinstance(workers, int) or workers < 1):
        raise ConfigError(f"--workers must be a positive number of worker processes, got {workers!r}")
    if workers is not None and workers > max_workers():
        raise ConfigError(f"--workers {workers}: at most {max_workers()} worker processes ({WORKERS_PER_CPU} per CPU, "
                          f"{os.cpu_count() or 1} CPUs here)")


def check_pass_queries(config: Config) -> None:
    """Every query named in ``l2_passes`` and ``rounder_passes`` parses against the product's schema."""
    for spec in config.run_products:
        product, cfg = spec.name, config.product(spec.name)
        for table in ("l2_passes", "rounder_passes"):
            for level, passes in getattr(cfg.estimation, table).items():
                for i, names in enumerate(passes):
                    if not names:
                        raise ConfigError(f"{config.source}: [{product}.estimation.{table}].{level}: pass {i} is empty")
                    for name in names:
                        try:
                            build_query(spec.schema, name)
                        except QueryError as exc:
                            raise ConfigError(f"{config.source}: [{product}.estimation.{table}].{level}, pass {i}: "
                                              f"{exc}{query_hint(exc)}") from None


def check_levels(config: Config, levels: list[str] | None = None) -> None:
    """Every product's budget and passes name exactly the spine's ``levels`` (default: the census hierarchy's,
    which every spine kind keeps), and each level's passes list every query it measures."""
    levels = list(census_hierarchy(config).names) if levels is None else levels
    for spec in config.run_products:
        product, cfg = spec.name, config.product(spec.name)
        check_budget(cfg.budget, levels, spec.schema, where=f"{config.source}: {product}.budget")
        for table in ("l2_passes", "rounder_passes"):
            passes = getattr(cfg.estimation, table)
            for level in levels:
                if level not in passes:
                    raise ConfigError(f"{config.source}: [{product}.estimation.{table}] has no entry for level {level!r}")
            for level in passes:
                if level not in levels:
                    raise ConfigError(f"{config.source}: [{product}.estimation.{table}] names level {level!r}; levels are "
                                      f"{', '.join(levels)}")
        for level in levels:
            measured = set(cfg.budget.queries.get(level, {}))
            listed = {q for p in cfg.estimation.l2_passes[level] for q in p}
            if missing := measured - listed:
                raise ConfigError(f"{config.source}: [{product}.estimation.l2_passes].{level} does not list measured "
                                  f"quer{'y' if len(missing) == 1 else 'ies'} {', '.join(sorted(missing))}")


def check_backend(config: Config) -> None:
    """A product that asks for ``backend = "gurobi"`` needs gurobipy and a licence on this machine; one on the
    Pyomo path (``compiler = "pyomo"``) needs solvers that Pyomo knows, that are available here and that solve
    a small problem of each pass's class (``solvers/pyomo_path.py``)."""
    from topdown.solvers.gurobi import Gurobi, GurobiUnavailable

    for product in config.run.products:
        est = config.product(product).estimation
        if est.compiler == "pyomo":
            from topdown.solvers.pyomo_path import SolverUnusable, check_solvers

            try:
                check_solvers(est.pyomo_solver, est.qp_solver, est.solver_options)
            except SolverUnusable as exc:
                raise ConfigError(f"{config.source}: [{product}.estimation] {exc}") from None
        elif est.backend == "gurobi":
            try:
                Gurobi()
            except GurobiUnavailable as exc:
                raise ConfigError(f"{config.source}: [{product}.estimation] backend = \"gurobi\": {exc}") from None


def read_baf(config: Config) -> pd.DataFrame | None:
    """The block assignment files of ``[run] baf`` (None for the standard spine)."""
    from topdown.geo.baf import read_baf_dir

    if config.run.spine == "standard":
        return None
    if not config.run.baf:
        raise ConfigError(f"{config.source}: [run] spine = {config.run.spine!r} needs the block assignment files: set "
                          "baf = \"DIR\" in the [run] table (a directory of BlockAssign_*.txt[.gz] files; `topdown "
                          "run` has no --baf)")
    baf = Path(config.run.baf)
    if not baf.is_dir():
        raise ConfigError(f"{config.source}: [run] baf = {config.run.baf!r}: no such directory (the block "
                          f"assignment files spine = {config.run.spine!r} needs)")
    try:
        return read_baf_dir(baf)
    except FileNotFoundError as exc:
        raise ConfigError(f"{config.source}: [run] baf: {exc}") from None


def check_baf_states(config: Config, baf: pd.DataFrame, geoids: pd.Series, input_file: Path) -> None:
    """Every input block lies in a state the block assignment files cover (a state missing from them
    would silently get no AIAN area, place or MCD) and, in production unless waived
    (``blocks_missing_from_baf``), is listed in them: a missing block would be put in no AIAN area, place or
    MCD. The message names the number of such blocks and one GEOID (geography, not a count of persons)."""
    baf_dir = config.run.baf
    covered = set(baf.index.str[:2])
    states = geoids.str[:2]
    outside = ~states.isin(covered)
    if outside.any():
        block = geoids[outside].iloc[0]
        raise InputError(f"{input_file}: column 'geoid', block {block}: state {block[:2]} is not covered by the "
                         f"block assignment files of [run] baf = {baf_dir!r} (states {', '.join(sorted(covered))}); "
                         "give the files of every state of the input")
    if config.run.mode != "production" or config.waived("blocks_missing_from_baf"):
        return
    missing = ~geoids.isin(baf.index)
    if missing.any():
        raise InputError(f"{input_file}: column 'geoid': {int(missing.sum())} of {len(geoids)} blocks (e.g. "
                         f"{geoids[missing].iloc[0]}) are not in the block assignment files of [run] baf = "
                         f"{baf_dir!r}; mode = \"production\" refuses to put them in no AIAN area, place or MCD: give "
                         f"complete files, {waiver_hint('blocks_missing_from_baf')}")


def check_derived_units(config: Config, units: tuple[Path, ...]) -> None:
    """In production unless waived (``derived_housing_units``), refuse unit files whose housing-unit counts
    ``topdown ingest blocks`` derived from the person counts: the block housing-unit invariants would publish
    each block's household population within a few persons."""
    if config.run.mode != "production" or config.waived("derived_housing_units"):
        return
    derived = derived_units(units)
    if derived is not None:
        raise InputError(f"{derived}: its housing units were derived from the person counts (topdown ingest blocks "
                         "without hu columns); their block invariants would publish every block's household "
                         "population within a few persons, so mode = \"production\" refuses it: ingest a table with "
                         f"hu or hu_occupied and hu_vacant, {waiver_hint('derived_housing_units')}")


def preflight(config: Config, workers: int | None) -> None:
    """The checks that need neither the input nor the run directory."""
    check_workers(workers)
    check_noise(config)
    check_pass_queries(config)
    check_levels(config)
    check_backend(config)
