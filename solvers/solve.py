"""``solve_parent``: one parent's children, from noisy measurements to integer histograms.

Sequence per failsafe level (failsafe.py): layout (layout.py) -> rows compiled once (direct.py; or the
Pyomo model, model.py, on the Pyomo path) -> multi-pass L2 with tau bands (l2.py, eqs. 7.5-7.6) -> multi-pass rounder (rounder.py, eq. 7.7) ->
check of every row on the integer result. Shortcuts (as DAS-2020 `topdown_engine.py`): an all-zero parent gives zeros, a
single child (not at the root) gets the parent's histogram. A parent with more than
``problem.split_above`` children, or children x non-zero parent cells above ``problem.split_cost``, is
solved in two stages through groups of children (split.py).
"""
from __future__ import annotations

import time
from dataclasses import replace
from typing import Callable

import numpy as np

from .backends import DEFAULT_BACKEND, Backend
from .failsafe import LEVELS, RELAX_EDITS, FailsafeExhausted, relax_rows
from .l2 import SolveFailure, run_l2
from .layout import Layout, build_layout
from .direct import compile_direct
from topdown.vocab.problem import FailsafeStep, ParentProblem, ParentSolution, SolveStats
from .rounder import column_values, run_rounder
from .split import MapSolve, solve_split, wants_split
from .standard import StandardForm

CHECK_TOL = 1e-6

Compiler = Callable[[Layout], StandardForm]

#: The compiler of the pipeline's solves unless ``compiler = "pyomo"``: the direct numpy/scipy build of the Pyomo
#: model's rows, equal to ``model.compile_pyomo`` entry for entry (tests/test_solvers.py, random instances) at a
#: fraction of the cost (a Pyomo ConcreteModel per parent was about a fifth of a block-level task's CPU; DESIGN.md).
DEFAULT_COMPILER: Compiler = compile_direct


def check_rows(layout: Layout, form: StandardForm, hist: np.ndarray) -> None:
    """Raise SolveFailure if the integer histograms (over the layout's cells) break a row (parent, constraints,
    groups, bands)."""
    if (hist < 0).any():
        raise SolveFailure("rounded histogram has negative cells")
    if (hist[layout.xcol < 0] != 0).any():
        raise SolveFailure("rounded histogram is positive on a cell without a variable")
    val = form.a @ column_values(layout, hist.astype(float))
    bad = (val < form.lo - CHECK_TOL) | (val > form.hi + CHECK_TOL)
    if bad.any():
        fams = [name for name, sl in form.rows.items() if bad[sl].any()]
        raise SolveFailure(f"rounded histogram breaks {int(bad.sum())} rows (families: {', '.join(fams)})")


def solve_parent(problem: ParentProblem, backend: Backend = DEFAULT_BACKEND,
                 compiler: Compiler | None = None, map_solve: MapSolve | None = None) -> ParentSolution:
    """Estimate the children of one parent (see the ParentProblem contract in problem.py).

    ``compiler`` turns a Layout into a StandardForm: ``DEFAULT_COMPILER`` (the direct build) or
    ``model.compile_pyomo`` (the Pyomo model, the problem's definition; the Pyomo path pairs it with
    ``pyomo_path.PyomoBackend``). ``map_solve`` solves the
    independent second-stage groups of a split parent (split.py), e.g. on other workers: same result.
    """
    compiler = compiler or DEFAULT_COMPILER
    k, ncells = problem.n_children, problem.schema.ncells
    t_start = time.perf_counter()
    parent = problem.parent_sparse()
    if parent is not None:
        if not parent.cells.size:
            build_layout(problem)  # validates the problem
            return ParentSolution.zeros(k, ncells, stats=SolveStats(shortcut="zero parent"))
        if k == 1:
            build_layout(problem)
            return ParentSolution(parent.cells.copy(), parent.counts[None, :].copy(), ncells,
                                  stats=SolveStats(shortcut="single child"))
    if wants_split(problem):
        # map_solve reaches stage 1 too: a stage 1 still too large is split again, its groups spread alike.
        solution = solve_split(problem, lambda part: solve_parent(part, backend, compiler, map_solve), LEVELS,
                               map_solve)
        solution.stats.total_s = round(time.perf_counter() - t_start, 6)
        return solution
    failsafe: list[FailsafeStep] = []
    levels = LEVELS if problem.parent_hist is not None else LEVELS[:1]  # the root: no parent to relax
    for level, name in enumerate(levels):
        stats = SolveStats(level=name)
        try:
            t0 = time.perf_counter()
            edits = name == RELAX_EDITS
            layout = build_layout(problem, relax_parent=name != "exact", relax_inequalities=edits)
            form = compiler(layout)
            stats.build_s, stats.n_x, stats.n_cols = round(time.perf_counter() - t0, 6), layout.n_x, layout.n_cols
            stats.n_rows, stats.nnz = form.shape[0], int(form.a.nnz)
            fatal = [msg for kind, msg in layout.infeasible if kind == "equality" or not edits]
            if layout.n_x == 0 and not fatal:  # every cell is a structural zero: nothing to estimate
                return ParentSolution.zeros(k, ncells, failsafe=failsafe,
                                            stats=replace(stats, shortcut="no free cells"))
            if fatal:
                raise SolveFailure("infeasible input: " + "; ".join(fatal[:5])
                                   + (f" (+{len(fatal) - 5} more)" if len(fatal) > 5 else ""))
            if name != "exact":
                form, notes = relax_rows(layout, form, backend, edits)
                failsafe += notes
            l2 = run_l2(layout, form, backend)
            failsafe += l2.steps
            stats.l2, stats.tau = l2.stats, [st.get("tau") for st in l2.stats if "tau" in st]
            hist, stats.rounder = run_rounder(layout, form, l2.z, backend)
            stats.rounder_milp = sum(st["milp"] for st in stats.rounder)
            check_rows(layout, form, hist)
        except SolveFailure as err:
            failsafe.append(FailsafeStep(0, "level_failed", f"level {name} failed: {err}"))
            continue
        if parent is not None:  # the layout's cells hold every parent cell
            stats.parent_l1_change = int(np.abs(hist.sum(axis=0) - layout.parent_at_cells()).sum())
        stats.total_s = round(time.perf_counter() - t_start, 6)
        return ParentSolution(layout.cells, hist, ncells, failsafe=failsafe, stats=stats)
    raise FailsafeExhausted(f"parent {problem.parent!r}: every failsafe level failed: " + " | ".join(map(str, failsafe)))
