"""census-topdown pipeline: configuration, data contracts, measurement, estimation on Dask, outputs.

``from topdown.pipeline import run`` runs a configuration end to end (see :func:`topdown.pipeline.execution.runner.run`);
``submit`` starts one without blocking and returns a Job (:mod:`topdown.pipeline.jobs`).
"""
from typing import Any

__all__ = ["run", "submit", "submit_reprocess", "submit_uncertainty", "submit_replicates", "Job", "Cancelled",
           "load_config", "Config", "ConfigError"]


def __getattr__(name: str) -> Any:
    # Lazy, so that importing a small module (schema, queries) does not import Dask and the solvers.
    if name == "run":
        from .execution.runner import run

        return run
    if name in ("submit", "submit_reprocess", "submit_uncertainty", "submit_replicates", "Job", "Cancelled"):
        from . import jobs

        return getattr(jobs, name)
    if name in ("load_config", "Config", "ConfigError"):
        from .configuration import config

        return getattr(config, name)
    raise AttributeError(name)
