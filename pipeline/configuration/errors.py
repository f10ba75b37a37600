"""The configuration error (exit 2): a run configuration or a census declaration is invalid."""
from __future__ import annotations


class ConfigError(ValueError):
    """A configuration file is invalid; the message names the file and the key."""
