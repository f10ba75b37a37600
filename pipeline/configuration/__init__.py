"""Configuration: the validated TOML strategy, preflight checks, measurement sources."""
