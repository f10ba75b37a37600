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
import logging
import os
import shutil
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Callable

import pandas as pd
from distributed import Security

from topdown.geo.spine import Spine

from ..configuration.config import (Config, ConfigError, _deep_merge, config_from_dict, differing_keys, load_config,
                                    read_toml, resolve_config_path)
from .engine import ProgressFn
from topdown.vocab.census import Product

from ..configuration.errors import InputError
from ..inputs.invariants import UNIT_COLUMNS
from ..outputs.mdf import MDF_LAYOUT
from .levels import Level, public_levels
from .nmf import NoisyMeasurementFile, is_bureau_nmf, nmf_meta, read_nmf
from ..runtime.outdir import bookkeeping, check
from ..runtime.rundir import MEASURED, RunDir, RunDirError, RunReader, remove_tree, sha256_file, write_table
from ..runtime.storage import StorePath, copy_files, location, read_frame
from .runner import Plan, execute, opened
from .preflight import check_levels
from .sources import Published
from ..privacy.budget import KINDS, of_config
from ..privacy.measure import MEASUREMENT_PARQUET

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


def _post_processing(key: str, products: list[str]) -> bool:
    for allowed in POST_PROCESSING:
        for product in products:
            prefix = allowed.replace("<product>", product)
            if key == prefix or key.startswith(prefix + "."):
                return True
    return False


def changed_keys(before: Config, after: Config, where: str) -> list[str]:
    """The dotted keys ``after`` changes; raises :class:`ConfigError` naming the first measured one."""
    changed = differing_keys(before.model_dump(mode="json"), after.model_dump(mode="json"))
    products = [p.name for p in after.census.products]
    measured = [k for k in changed if not _post_processing(k, products)]
    if measured:
        raise ConfigError(f"{where}: {measured[0]} changes what was measured (reprocessing may change only "
                          f"{', '.join(POST_PROCESSING)}); run a new release for it instead")
    return changed



def apply_changes(config: Config, changes: str | Path) -> Config:
    """``config`` with the keys of the TOML file ``changes`` overriding its own."""
    path = resolve_config_path(changes)
    return config_from_dict(_deep_merge(config.model_dump(mode="json"), read_toml(path)), source=str(path))


def _unit_donors(product: Product, products: list[Product]) -> list[Product]:
    """The products whose invariants hold every node's unit counts (kind ``unit_counts``), when ``product``'s
    do not: the U.S. units MDF needs the block GQ-facility counts, which runs before config.json published
    with the persons invariants only."""
    return [p for p in products if p is not product and any(s.kind == "unit_counts" for s in p.invariants.values())]


def read_invariants(src: RunReader, product: Product, products: list[Product]) -> pd.DataFrame:
    """The published invariants of ``product``, with the unit counts it lacks taken from another product's
    (:func:`_unit_donors`)."""
    inv = read_frame(src.invariants(product.name))
    inv["geocode"] = inv["geocode"].astype(str)
    if not set(UNIT_COLUMNS) <= set(inv.columns):
        other = next((src.invariants(p.name) for p in _unit_donors(product, products)
                      if src.invariants(p.name).exists()), None)
        if other is None:
            if MDF_LAYOUT[product.mdf].needs_unit_counts:
                raise FileNotFoundError(f"{src.invariants(product.name)}: no GQ-facility counts (u1..u7), and no "
                                        "invariants of another product to take them from")
            return inv
        gq = read_frame(other, columns=["level", "geocode", *UNIT_COLUMNS[1:]])
        gq["geocode"] = gq["geocode"].astype(str)
        inv = inv.merge(gq, on=["level", "geocode"], how="left")
    return inv


def tree_sha256(root: Path) -> str:
    """One SHA-256 over the relative paths and contents of every file under ``root`` (or of one file), but the
    marker and lock of the command that wrote it (``outdir``)."""
    if root.is_file():
        return sha256_file(root)
    h = hashlib.sha256()
    for f in sorted(p for p in root.rglob("*") if p.is_file() and not bookkeeping(p.name)):
        h.update(f"{f.relative_to(root).as_posix()}\0{sha256_file(f)}\n".encode())
    return h.hexdigest()


def source_hashes(src: RunReader) -> dict[str, str]:
    """The SHA-256 of everything a reprocessing reads from ``src`` (its "input")."""
    names = [n for n in MEASURED if n != "certificate.json"]
    return {name: tree_sha256(src.root / name) for name in names if (src.root / name).exists()}


def link_tree(src: Path, dst: Path) -> None:
    """Hard-link (or copy, across file systems) every file of ``src`` to the same place under ``dst``:
    the published bytes, unchanged (an object store has no links: its objects are copied)."""
    if isinstance(src, StorePath) or isinstance(dst, StorePath):
        copy_files(src, dst)
        return

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


def reprocessing_certificate(source_cert: dict, after: Config, of: dict) -> dict:
    """The source's certificate (the privacy loss of the measurements, unchanged) marked as a reprocessing
    (``of``: what was read, with its configuration hash) that adds zero privacy loss."""
    return {**source_cert, "run": after.run.name, "config_sha256": after.digest(), "reprocessing_of": of,
            "added_privacy_loss": ZERO_LOSS}


@dataclass
class _Source:
    """What a reprocessing reads, checked and loaded before anything is written."""

    config: Config
    spine: Spine
    invariants: dict[str, pd.DataFrame]  # per product: level, geocode, u0..u7, tot
    certificate: dict
    hashes: dict[str, str]
    publish: Callable[[RunDir], None]  # links or writes the measurements, spine and invariants


def _from_run(run_dir: Path, changes: str | Path | None) -> _Source:
    src = RunReader(run_dir)
    before = src.config()
    src.check_sums(MEASURED, "reprocessing")
    config = apply_changes(before, changes) if changes else before
    changed = changed_keys(before, config, str(changes or src.config_path))
    of = {"run": str(src.root.resolve()), "config_sha256": before.digest(), "changed_keys": changed}
    cert = reprocessing_certificate(src.certificate().data, config, of)
    names = ["spine.parquet", "noisy_measurements",
             *(src.invariants(p).relative_to(src.root).as_posix() for p in config.run.products)]

    def publish(rd: RunDir) -> None:
        for name in names:
            final = rd.root / name
            staged = rd.staging(final)  # emptied first (on a store: final itself)
            remove_tree(staged) if staged.is_dir() else staged.unlink(missing_ok=True)
            link_tree(src.root / name, staged)
            rd.commit(final)

    return _Source(config, src.spine(), {p.name: read_invariants(src, p, config.run_products)
                                         for p in config.run_products}, cert,
                   source_hashes(src), publish)


def nmf_hashes(nmf_dir: Path, spine: Path) -> dict[str, str]:
    """The SHA-256 of what a reprocessing of a noisy measurement file reads."""
    return {"nmf": tree_sha256(nmf_dir), "spine": tree_sha256(spine)}


def invariants_of_nmf(nmf, product: Product, products: list[Product], spine: Spine | None = None) -> pd.DataFrame:
    """The invariants of a noisy measurement file as a run's invariants table (:meth:`NoisyMeasurementFile.invariants`),
    with the unit counts ``product`` lacks from another product's (:func:`_unit_donors`)."""
    out = nmf.invariants(product, spine)
    donors = [p for p in _unit_donors(product, products) if p.name in nmf.constraints]
    if donors and "u1" not in out.columns:
        gq = invariants_of_nmf(nmf, donors[0], products, spine)[["level", "geocode", *UNIT_COLUMNS[1:]]]
        out = out.merge(gq, on=["level", "geocode"], how="left")
    return out


def check_nmf_measured(config: Config, meta: dict, where: str) -> None:
    """``config`` must describe what the noisy measurement file measured; the first difference is refused."""
    if config.run.spine != meta.get("spine"):
        raise ConfigError(f"{where}: run.spine is {config.run.spine!r}; the measurements were taken on the "
                          f"{meta.get('spine')!r} spine")
    for product in config.run.products:
        m = meta["products"].get(product)
        if m is None:
            raise ConfigError(f"{where}: run.products lists {product!r}; the measurement file has no such product")
        budget = config.product(product).budget
        total = of_config(budget)
        recorded = KINDS.get(m["mechanism"])
        if recorded is None or not isinstance(total, recorded):
            raise ConfigError(f"{where}: {product}.budget.mechanism differs from the measurement file's {m['mechanism']!r}")
        if m.get("rho") is not None and str(total) != str(m["rho"]):
            raise ConfigError(f"{where}: {product}.budget.rho differs from the measurement file's {m['rho']}")
        for level in meta["levels"]:
            if list(budget.queries.get(level, {})) != list(m["queries"].get(level, [])):
                raise ConfigError(f"{where}: {product}.budget.queries.{level} differs from the queries the "
                                  f"measurement file measured at {level}")


def open_nmf(nmf_dir: Path, spine_path: str | Path | None, config_path: str | Path | None
             ) -> tuple[Config, Spine, NoisyMeasurementFile]:
    """A noisy measurement file (ours or the Bureau's layout) opened with the spine and the configuration it was
    measured with, all three checked against each other (reprocessing and ``topdown uncertainty`` read it so)."""
    if spine_path is None or config_path is None:
        raise ConfigError(f"{nmf_dir}: reading a noisy measurement file needs --spine (the spine it was measured "
                          "on) and --config (the configuration it was measured with, with any post-processing changes)")
    meta = nmf_meta(nmf_dir)  # a bad nmf.json is reported before the configuration is read
    config = load_config(config_path)
    spine_path = Path(spine_path)
    spine = Spine.read_parquet(spine_path, standard_levels=meta["levels"] if meta else None)
    if meta is not None and spine.levels != meta["levels"]:
        raise InputError(f"{spine_path}: levels {spine.levels} are not the measurement file's {meta['levels']}")
    nmf = read_nmf(nmf_dir, config, spine)
    check_nmf_measured(config, nmf.meta, str(config.source))
    for product in config.run.products:
        for level in spine.levels:
            if not pd.Index(spine.nodes(level).astype(str)).equals(nmf.nodes[product][level]):
                raise InputError(f"{spine_path}: the {level} nodes differ from those of the measurement file {nmf_dir}")
    if nmf.bureau:
        nmf.check_parts()
    return config, spine, nmf


def write_measurement_parts(nmf: NoisyMeasurementFile, product: Product, level: str, directory: Path,
                            spine: Spine) -> None:
    """``product``'s measurements of a level as a run's parts in ``directory``, each holding whole families of
    nodes (a block task then reads only its own parts), read and written one DPQuery part at a time: one run part
    per part of our files; a file from elsewhere is regrouped through per-part pieces
    (:meth:`NoisyMeasurementFile.run_parts`)."""
    parts = nmf.parts[product.name][level]
    if not parts:
        write_table(nmf.measurements(product.name, level), directory / "part-00000.parquet", **MEASUREMENT_PARQUET)
        return
    parent = spine.parent_level(level)
    parents = spine.parents(level).rename(index=str).astype(str) if parent is not None else None
    chunk = nmf.run_parts(product.name, level, parents)
    if chunk is None:
        for i, part in enumerate(parts):
            write_table(nmf.measurement_table(product.name, level, part), directory / f"part-{i:05d}.parquet",
                        **MEASUREMENT_PARQUET)
        return
    pieces = directory.with_name(f".{directory.name}.pieces")
    shutil.rmtree(pieces, ignore_errors=True)
    try:
        for i, part in enumerate(parts):
            long = nmf.measurement_part(product.name, level, part)
            for c, rows in long.groupby(chunk.reindex(long["geocode"]).to_numpy(), sort=True):
                write_table(rows, pieces / f"{int(c):05d}" / f"{i:05d}.parquet")
        for c in sorted(pieces.iterdir()):
            rows = pd.concat([read_frame(f) for f in sorted(c.glob("*.parquet"))], ignore_index=True)
            rows = rows.sort_values(["geocode", "query", "answer"], kind="stable").reset_index(drop=True)
            write_table(rows, directory / f"part-{c.name}.parquet", **MEASUREMENT_PARQUET)
    finally:
        shutil.rmtree(pieces, ignore_errors=True)


def _from_nmf(nmf_dir: Path, spine_path: str | Path | None, config_path: str | Path | None) -> _Source:
    from ..privacy.certificate import certificate
    from .runner import path_shares

    config, spine, nmf = open_nmf(nmf_dir, spine_path, config_path)
    spine_path = Path(spine_path)
    invariants = {p.name: invariants_of_nmf(nmf, p, config.run_products, spine) for p in config.run_products}
    of = {"noisy_measurement_file": str(location(nmf_dir).resolve()), "config_sha256": nmf.meta.get("config_sha256"),
          "spine": str(spine_path.resolve())}
    cert = reprocessing_certificate(
        certificate(config, path_shares(spine, config)), config, of)

    def publish(rd: RunDir) -> None:
        write_table(spine.to_arrow(), rd.root / "spine.parquet")
        for product in config.run_products:
            write_table(invariants[product.name], rd.staging(rd.invariants(product.name)))
            rd.commit(rd.invariants(product.name))
            for level in spine.levels:
                final = rd.measurements(product.name, level)
                rd.clear_place(final)
                write_measurement_parts(nmf, product, level, rd.staging(final), spine)
                rd.commit(final)

    return _Source(config, spine, invariants, cert, nmf_hashes(location(nmf_dir), spine_path), publish)


def is_nmf(path: str | Path) -> bool:
    """A noisy measurement file: ours (``nmf.json``) or a folder of the Bureau's layout."""
    return (location(path) / "nmf.json").exists() or is_bureau_nmf(path)


def identity(source: str | Path, changes: str | Path | None = None, spine: str | Path | None = None
             ) -> tuple[str, dict[str, str]]:
    """The configuration hash and input hashes a reprocessing of ``source`` records (for ``topdown batch``)."""
    if is_nmf(source):
        return load_config(changes).digest(), nmf_hashes(location(source), Path(spine))
    before = RunReader(source).config()
    return (apply_changes(before, changes) if changes else before).digest(), source_hashes(RunReader(source))


def reprocess(
    source: str | Path, out: str | Path, changes: str | Path | None = None, *, spine: str | Path | None = None,
    client=None, scheduler: str | None = None, workers: int | None = None, resume: bool = False, force: bool = False,
    progress: ProgressFn | None = None, security: Security | None = None,
) -> Path:
    """Estimate every level again into ``out`` from published noisy measurements and invariants (no noise
    drawn): those of the complete run directory ``source``, with the post-processing changes of ``changes``
    (a TOML file), or those of the noisy measurement file ``source`` (``topdown nmf``) with ``spine`` (its
    spine file) and ``changes`` (the full configuration it was measured with, post-processing free to
    change). Cluster arguments as :func:`runner.run`. Returns the new run directory's path."""
    t0 = time.perf_counter()
    if location(out).resolve() == location(source).resolve():
        raise RunDirError(f"{out}: reprocessing writes a new run directory, not into the one it reads")
    check(out, "reprocess")
    if spine is not None and not is_nmf(source):
        raise ConfigError(f"--spine {spine}: only for a noisy measurement file; the run directory {source} carries "
                          "its own spine")
    src = _from_nmf(location(source), spine, changes) if is_nmf(source) else _from_run(location(source), changes)
    config = src.config
    levels: dict[str, list[Level]] = {}
    check_levels(config, src.spine.levels)
    for product in config.run_products:
        levels[product.name] = public_levels(product, config.product(product.name), src.spine, src.invariants[product.name],
                                        where=f"invariants of {source}")
    of = src.certificate["reprocessing_of"]
    log.info("reprocessing %s into %s: no noise is drawn%s", source, out,
             f"; changed: {', '.join(of['changed_keys'])}" if of.get("changed_keys") else "")
    plan = Plan(src.spine, levels, src.certificate, src.publish, lambda rd, product, level: Published.of_level(
        rd.measurements(product, level.name)), {"input_sha256": src.hashes, "reprocessing_of": of})
    rundir = RunDir(out)
    with opened(rundir, config, src.hashes, resume, force, command="reprocess") as (state, _):
        return execute(config, rundir, state, plan, client, scheduler, workers, progress, t0, security,
                       fresh=not state)
