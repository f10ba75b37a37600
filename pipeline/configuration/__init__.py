"""Configuration: the validated TOML strategy, census declarations, limits, and the errors of bad user files."""
