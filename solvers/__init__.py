"""Solving one parent: Pyomo models for the multi-pass L2 estimation and the rounder, solver back ends."""
