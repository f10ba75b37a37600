"""Evaluation: accuracy metrics, GLS and uncertainty, intervals, replicates, reports."""
