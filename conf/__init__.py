"""TOML run configurations and privacy-budget presets shipped with census-topdown."""
