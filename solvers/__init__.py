"""Solving one parent: Pyomo models for the multi-pass L2 estimation and the rounder, solver back ends.

``solve_parent(problem) -> ParentSolution`` is the entry point (solve.py); the contract is problem.py.
"""
from .backends import Backend, ClarabelHighs, PiqpHighs
from .failsafe import FailsafeExhausted
from .layout import ProblemError
from topdown.vocab.problem import Constraint, GroupTotal, Measurement, ParentProblem, ParentSolution
from .solve import solve_parent

__all__ = ["solve_parent", "ParentProblem", "ParentSolution", "Measurement", "Constraint", "GroupTotal",
           "Backend", "PiqpHighs", "ClarabelHighs", "FailsafeExhausted", "ProblemError"]
