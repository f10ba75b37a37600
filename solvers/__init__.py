"""Solving one parent: the multi-pass L2 estimation and the rounder over the parent's rows (built directly
with numpy, or compiled from its Pyomo model), handed to solver back ends (PIQP/Clarabel + HiGHS, Gurobi, or
any Pyomo solver on the Pyomo path, pyomo_path.py).

``solve_parent(problem) -> ParentSolution`` is the entry point (solve.py); the contract is problem.py.
"""
from .backends import Backend, ClarabelHighs, PiqpHighs
from .failsafe import FailsafeExhausted
from .layout import ProblemError
from topdown.vocab.problem import Constraint, GroupTotal, Measurement, ParentProblem, ParentSolution
from .solve import solve_parent

__all__ = ["solve_parent", "ParentProblem", "ParentSolution", "Measurement", "Constraint", "GroupTotal",
           "Backend", "PiqpHighs", "ClarabelHighs", "FailsafeExhausted", "ProblemError"]
