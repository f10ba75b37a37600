"""The shared vocabulary of pipeline and solvers: histogram schemas, marginal queries and the parent-problem contract.

Imports nothing from ``topdown.pipeline`` or ``topdown.solvers``."""
