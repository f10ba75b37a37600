"""Outputs: the MDF writers and verify."""
