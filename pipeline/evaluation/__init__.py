"""Evaluation: accuracy metrics, GLS and uncertainty, intervals, replicates, reports, and the direct privacy audit."""
