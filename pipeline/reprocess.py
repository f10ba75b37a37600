"""``topdown reprocess RUN --out NEW [--config CHANGES.toml]``: estimate again from published measurements.

Post-processing is free in differential privacy: estimates computed from the noisy measurements and the
declared invariants alone add no privacy loss. Reprocessing reads only the public part of ``RUN``
(``config.json``, ``spine.parquet``, ``invariants/``, ``noisy_measurements/``), never its input, and
draws no noise: each chunk's answers come from :class:`sources.Published`. The level loop, the MDF and
the manifest are those of a run (:func:`runner.execute`).

``CHANGES.toml`` overrides the run's configuration key by key. Only keys that post-processing uses may
change (:data:`POST_PROCESSING`: the estimation settings and the constraints, which are rebuilt from the
published invariants); a change to anything that was measured is refused naming the key.
"""
from __future__ import annotations

import hashlib
import json
import logging
import os
import shutil
import time
from pathlib import Path
from typing import Any

import pandas as pd

from .config import Config, ConfigError, _deep_merge, config_from_dict, read_toml, resolve_config_path
from .engine import ProgressFn
from .invariants import UNIT_COLUMNS
from .levels import Level, public_levels
from .nmf import run_config, run_spine
from .rundir import RunDir, RunDirError, file_sha256
from .runner import Plan, _level_names, execute, opened
from .sources import Published

log = logging.getLogger("topdown")

#: Configuration keys reprocessing may change, as prefixes ("<product>" stands for persons and units):
#: the run's name and where its input was (nothing is read from it), the estimation settings (passes and
#: orderings, tau slack, rounder passes, split settings, solver back end and options, failsafe) and the
#: constraints. Everything else (budget, queries, spine, mechanism, mode, seed, products, algorithm,
#: invariants) determined what was measured or published and may not change.
POST_PROCESSING = ("run.name", "run.input", "run.build_demo_input", "run.baf", "<product>.estimation",
                   "<product>.constraints")

#: What a reprocessing adds to the privacy loss of the measurements it reads.
ZERO_LOSS = {"rho": "0", "epsilon": "0", "delta": "0",
             "why": "post-processing: computed from published noisy measurements and declared invariants only; "
                    "no noise drawn and no confidential data read"}


def _leaves(data: Any, prefix: str = "") -> dict[str, Any]:
    """A nested dict as {dotted key: value}; lists are values."""
    if not isinstance(data, dict):
        return {prefix: data}
    out: dict[str, Any] = {}
    for key, value in data.items():
        out.update(_leaves(value, f"{prefix}.{key}" if prefix else str(key)))
    return out


def _post_processing(key: str) -> bool:
    for allowed in POST_PROCESSING:
        for product in ("persons", "units"):
            prefix = allowed.replace("<product>", product)
            if key == prefix or key.startswith(prefix + "."):
                return True
    return False


def changed_keys(before: Config, after: Config, where: str) -> list[str]:
    """The dotted keys ``after`` changes; raises :class:`ConfigError` naming the first measured one."""
    old, new = _leaves(before.model_dump(mode="json")), _leaves(after.model_dump(mode="json"))
    changed = sorted(k for k in set(old) | set(new) if old.get(k, _MISSING) != new.get(k, _MISSING))
    measured = [k for k in changed if not _post_processing(k)]
    if measured:
        raise ConfigError(f"{where}: {measured[0]} changes what was measured (reprocessing may change only "
                          f"{', '.join(POST_PROCESSING)}); run a new release for it instead")
    return changed


_MISSING = object()


def apply_changes(config: Config, changes: str | Path) -> Config:
    """``config`` with the keys of the TOML file ``changes`` overriding its own."""
    path = resolve_config_path(changes)
    return config_from_dict(_deep_merge(config.model_dump(mode="json"), read_toml(path)), source=str(path))


def read_invariants(src: RunDir, product: str) -> pd.DataFrame:
    """The published invariants of ``product``. The units MDF needs the block GQ-facility counts, which runs
    before config.json published with the persons invariants only; they are taken from there."""
    inv = pd.read_parquet(src.invariants(product))
    inv["geocode"] = inv["geocode"].astype(str)
    if product == "units" and not set(UNIT_COLUMNS) <= set(inv.columns):
        other = src.invariants("persons")
        if not other.exists():
            raise FileNotFoundError(f"{src.invariants(product)}: no GQ-facility counts (u1..u7), and no persons "
                                    "invariants to take them from")
        gq = pd.read_parquet(other, columns=["level", "geocode", *UNIT_COLUMNS[1:]])
        gq["geocode"] = gq["geocode"].astype(str)
        inv = inv.merge(gq, on=["level", "geocode"], how="left")
    return inv


def tree_sha256(root: Path) -> str:
    """One SHA-256 over the relative paths and contents of every file under ``root`` (or of one file)."""
    if root.is_file():
        return file_sha256(root)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file()):
        h.update(f"{f.relative_to(root).as_posix()}\0{file_sha256(f)}\n".encode())
    return h.hexdigest()


def source_hashes(src: RunDir) -> dict[str, str]:
    """The SHA-256 of everything a reprocessing reads from ``src`` (its "input")."""
    names = ["config.json", "spine.parquet", "invariants", "noisy_measurements"]
    return {name: tree_sha256(src.root / name) for name in names if (src.root / name).exists()}


def link_tree(src: Path, dst: Path) -> None:
    """Hard-link (or copy, across file systems) every file of ``src`` to the same place under ``dst``:
    the published bytes, unchanged."""
    def link(a: str, b: str) -> None:
        try:
            os.link(a, b)
        except OSError:
            shutil.copy2(a, b)

    if src.is_file():
        dst.parent.mkdir(parents=True, exist_ok=True)
        link(str(src), str(dst))
    else:
        shutil.copytree(src, dst, copy_function=link)


def reprocessing_certificate(source_cert: dict, before: Config, after: Config, src: Path,
                             changed: list[str]) -> dict:
    """The source's certificate (the privacy loss of the measurements, unchanged) marked as a reprocessing
    that adds zero privacy loss."""
    return {**source_cert, "run": after.run.name, "config_sha256": after.digest(),
            "reprocessing_of": {"run": str(src.resolve()), "config_sha256": before.digest(), "changed_keys": changed},
            "added_privacy_loss": ZERO_LOSS}


def reprocess(
    run_dir: str | Path, out: str | Path, changes: str | Path | None = None, *, client=None, scheduler: str | None = None,
    workers: int | None = None, resume: bool = False, force: bool = False, progress: ProgressFn | None = None,
) -> Path:
    """Estimate every level of the complete run ``run_dir`` again into ``out`` from its published noisy
    measurements and invariants (no noise drawn), with the post-processing changes of ``changes`` (a TOML
    file). Cluster arguments as :func:`runner.run`. Returns the new run directory's path."""
    t0 = time.perf_counter()
    src = RunDir(run_dir)
    if Path(out).resolve() == src.root.resolve():
        raise RunDirError(f"{out}: reprocessing writes a new run directory, not into the run it reads")
    before = run_config(src.root)
    config = apply_changes(before, changes) if changes else before
    changed = changed_keys(before, config, str(changes or src.config_path))
    spine = run_spine(src.root)
    levels: dict[str, list[Level]] = {}
    for product in config.run.products:
        _level_names(config, product, spine.levels)
        levels[product] = public_levels(product, config.product(product), spine, read_invariants(src, product),
                                        where=str(src.invariants(product)))
    cert = reprocessing_certificate(json.loads((src.root / "certificate.json").read_text()), before, config,
                                    src.root, changed)
    hashes = source_hashes(src)

    def publish(rd: RunDir) -> None:
        for name in ["spine.parquet", "noisy_measurements",
                     *(src.invariants(p).relative_to(src.root).as_posix() for p in config.run.products)]:
            final = rd.root / name
            staged = rd.staging(final)
            shutil.rmtree(staged, ignore_errors=True) if staged.is_dir() else staged.unlink(missing_ok=True)
            link_tree(src.root / name, staged)
            rd.commit(final)

    log.info("reprocessing %s (config %s) into %s: no noise is drawn%s", src.root, before.digest()[:12], out,
             f"; changed: {', '.join(changed)}" if changed else "")
    plan = Plan(spine, levels, cert, publish, lambda rd, product, level: Published.of_level(
        rd.measurements(product, level.name)), {"input_sha256": hashes, "reprocessing_of": cert["reprocessing_of"]})
    rundir = RunDir(out)
    with opened(rundir, config, hashes, resume, force) as state:
        return execute(config, rundir, state, plan, client, scheduler, workers, progress, t0)
