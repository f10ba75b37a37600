"""Approximate Monte Carlo replicates: ``topdown replicates RUN --n 50 --out DIR`` reruns TopDown with the
run's own MDF as the input and fresh seeds (test mode), and ``topdown uncertainty RUN --replicates DIR`` adds,
for every published count, the Bureau's AMC interval (its rule and statistics: pipeline/evaluation/amc.py).

Privacy: a replicate reads published data only (the MDF, and the block group-quarters facility counts,
which are declared invariants), never the confidential input, so by post-processing it consumes no privacy
budget; its own noise protects nothing and is drawn in test mode from documented seeds.
"""
from __future__ import annotations

import json
import logging
import os
import shutil
import threading
import time
from concurrent.futures import ThreadPoolExecutor, as_completed
from pathlib import Path

import numpy as np
import pandas as pd

from topdown.vocab.census import GENERIC_MDF, Census, Product

from ..configuration.config import Config

from ..runtime.progress import Reporter, reporter, reporting, track
from ..execution.dataplane import counts_units
from ..outputs.mdf import MDF_LAYOUT, generic_levels
from ..runtime.outdir import claimed
from ..runtime.rundir import RunDirError, RunReader, remove_tree, write_json_atomic, write_table
from ..runtime.storage import StorePath, location, read_table

log = logging.getLogger("topdown")

#: Replicate seeds are SEED_BASE + i unless given (recorded in DIR/replicates.json).
SEED_BASE = 1_000_003

#: Replicates run side by side by default: their levels' tasks fill the workers where one replicate's
#: small top levels (one task each) leave them idle; each adds its chunk window to the scheduler.
PARALLEL = 2


def mdf_input(run_dir: Path, out: Path) -> Path:
    """Write the input of the run's census (one Parquet file per record kind) from the run's MDFs and public
    invariants: each product's records from its MDF (by its layout's ``records`` when the layout reads them
    back, converted in Arrow; else each generic attribute back to an input value: the first one its ``values``
    map to the level). The unit records (``[census.units]``) come from the MDFs of the products that count
    them and the leaves' invariant unit counts: :func:`detailed_units` where the census declares
    ``[census.units.detail]``, else each product's types from its MDF and the other types' units from the
    invariants (all occupied: their occupancy is not published)."""
    reader = RunReader(run_dir)
    census = reader.census()
    hierarchy, spine = census.hierarchy, reader.spine_table()
    codes = spine.drop_duplicates(hierarchy.leaf).set_index(hierarchy.leaf, drop=False)
    out.mkdir(parents=True, exist_ok=True)

    def geography(leaves: pd.Series) -> dict:
        if hierarchy.by_prefix:
            return {hierarchy.geocode: codes["geoid"].reindex(leaves).to_numpy()}
        return {lv.column: codes[lv.name].reindex(leaves).to_numpy() for lv in hierarchy.levels[1:]}

    products, unit_frames, written = reader.products(), [], set()
    detailed = census.units is not None and census.units.detail is not None
    for product in products:
        layout, units = MDF_LAYOUT[product.mdf], counts_units(census, product)
        if units and not reader.mdf(product.name).exists():
            continue  # its unit records come from the invariants
        if layout.reads_back is not None and product.records.name not in written:
            frame = layout.records(read_table(reader.mdf(product.name), columns=list(layout.record_columns)))
        elif product.mdf == GENERIC_MDF and ((units and detailed) or (not product.records.where
                                                                     and product.records.name not in written)):
            frame = _generic_records(reader.table(reader.mdf(product.name)), product, hierarchy, geography)
        else:
            raise RunDirError(f"{reader.root}: product {product.name!r}: replicates rebuild each record file from "
                              "one product's MDF (mdf = \"generic\" without records.where, or a layout that reads "
                              "its records back), or unit records from several with [census.units.detail]")
        written.add(product.records.name)
        frame = frame if isinstance(frame, pd.DataFrame) else frame.to_pandas()
        if units:
            unit_frames.append((product, frame))
        else:
            write_table(frame, out / f"{product.records.name}.parquet")
    if census.units is not None:
        inv = reader.table(reader.invariants(products[0].name))
        leaves = inv[inv["level"] == hierarchy.leaf].astype({"geocode": str})
        counts = leaves[[f"u{k}" for k in range(census.units.types)]].to_numpy(np.int64)
        make = detailed_units if detailed else _typed_units
        frame = make(census, unit_frames, leaves["geocode"].to_numpy(), counts, geography)
        write_table(frame, out / f"{census.units.name}.parquet")
    return out


def _typed_units(census: Census, frames: list[tuple[Product, pd.DataFrame]], leaves: np.ndarray, counts: np.ndarray,
                 geography) -> pd.DataFrame:
    """The unit records of a census without ``[census.units.detail]``: the products' MDF records, and the units
    of each type no product selects from the leaves' invariant ``counts`` (one column per type)."""
    units, covered = census.units, set()
    parts = [frame for _, frame in frames]
    for product, _ in frames:
        covered |= _types_of(census, product)
    for k in range(units.types):
        if k not in covered:
            where = pd.Series(np.repeat(leaves, counts[:, k]))
            parts.append(pd.DataFrame({**geography(where), units.type_column: np.full(len(where), k, np.int64),
                                       units.occupied_column: True}))
    return pd.concat(parts, ignore_index=True).astype({units.type_column: np.int64})


def detailed_units(census: Census, frames: list[tuple[Product, pd.DataFrame]], leaves: np.ndarray, counts: np.ndarray,
                   geography) -> pd.DataFrame:
    """The unit records of a census with ``[census.units.detail]`` (code column ``c``) from the MDFs of the
    products that count them (``frames``), with exactly the published units of each type in each leaf
    (``counts``, the invariants u0..u7 of ``leaves``), so that a replicate's invariants are the run's:

    * records of a product with ``records.where`` on ``c`` (households: the occupied housing units) come first,
      then those of the product without one (the unit histogram) whose code no such ``where`` lists;
    * each record's type is its code's; a leaf keeps the first ``counts[leaf, k]`` records of type k, in that
      order, and is padded to ``counts[leaf, k]`` with records of :func:`padding_code` (type k's most frequent
      code in the MDFs among those no ``where`` lists);
    * occupancy follows the code (``vacant``); a column a record's product does not hold is 0."""
    units, detail = census.units, census.units.detail
    selected: set[int] = set()
    for product, _ in frames:
        where = dict(product.records.where)
        if set(where) - {detail.column}:
            raise RunDirError(f"product {product.name!r}: replicates rebuild unit records from products whose "
                              f"records.where is on [census.units.detail] column {detail.column!r} only")
        selected |= {int(v) for v in where.get(detail.column, ())}
    parts = []
    for product, frame in sorted(frames, key=lambda pf: not pf[0].records.where):  # the selecting ones first
        code = frame[detail.column].to_numpy(np.int64)
        if not product.records.where:
            frame = frame[~np.isin(code, list(selected))]
        parts.append(frame)
    leaf_column = _leaf_column(census)
    frame = pd.concat(parts, ignore_index=True) if parts else pd.DataFrame({leaf_column: [], detail.column: []})
    code = frame[detail.column].to_numpy(np.int64)
    kind = detail.type_of(code)
    if (kind < 0).any():
        raise RunDirError(f"MDF code {code[kind < 0][0]} of {detail.column!r}: not listed in [census.units.detail]")
    at = pd.Index(leaves).get_indexer(frame[leaf_column].astype(str))
    if (at < 0).any():
        raise RunDirError(f"MDF leaf {frame[leaf_column].iloc[int(np.flatnonzero(at < 0)[0])]!r}: not in the invariants")
    keep = pd.Series(np.arange(len(frame))).groupby([at, kind]).cumcount().to_numpy() < counts[at, kind]
    kept = frame[keep]
    free = code[~np.isin(code, list(selected))]
    have = np.zeros_like(counts)
    np.add.at(have, (at[keep], kind[keep]), 1)
    pads = []
    for k in range(units.types):
        short = counts[:, k] - have[:, k]
        if short.any():
            where = pd.Series(np.repeat(leaves, short))
            pad_code = padding_code(free, detail.types[k], selected)
            pads.append(pd.DataFrame({leaf_column: where.to_numpy(), detail.column: np.full(len(where), pad_code)}))
    frame = pd.concat([kept, *pads], ignore_index=True)
    code = frame[detail.column].to_numpy(np.int64)
    places = {census.hierarchy.geocode, *(lv.column for lv in census.hierarchy.levels)}
    columns = {c: frame[c].fillna(0).to_numpy(np.int64) for c in frame.columns
               if c not in (*places, units.type_column, units.occupied_column)}
    return pd.DataFrame({**geography(frame[leaf_column].astype(str)), units.type_column: detail.type_of(code),
                         units.occupied_column: ~np.isin(code, detail.vacant), **columns})


def _leaf_column(census: Census) -> str:
    """The records' column that holds their leaf's geocode."""
    hierarchy = census.hierarchy
    return hierarchy.geocode if hierarchy.by_prefix else hierarchy.levels[-1].column


def padding_code(codes: np.ndarray, of_type: tuple[int, ...], selected: set[int]) -> int:
    """The code a leaf's missing unit of one type gets: the most frequent of ``codes`` among the type's codes
    that no product's ``where`` selects (``selected``), the lowest on a tie, or the lowest such code."""
    eligible = sorted(set(of_type) - selected) or sorted(of_type)
    tally = pd.Series(codes[np.isin(codes, eligible)]).value_counts()
    if not len(tally):
        return eligible[0]
    return int(min(tally.index[tally == tally.max()]))


def _types_of(census: Census, product: Product) -> set[int]:
    """The unit types whose records ``product`` (counting the census's unit records) selects: those its
    ``records.where`` lists of the type column, else all."""
    where = dict(product.records.where).get(census.units.type_column)
    return set(range(census.units.types)) if where is None else {int(k) for k in where}


def _generic_records(mdf: pd.DataFrame, product: Product, hierarchy, geography) -> pd.DataFrame:
    """The input records of ``product``'s generic MDF ``mdf``: each record's leaf geography (``geography`` of
    its leaf geocode) and each attribute's input value."""
    frame = geography(mdf[hierarchy.leaf].astype(str))
    for a in product.attributes:
        levels = generic_levels(mdf, a)
        if a.values:
            first = {}
            for value, level in a.values:
                first.setdefault(level, value)
            frame[a.column] = pd.Series(levels).map(first).to_numpy()
        else:
            frame[a.column] = levels
    return pd.DataFrame(frame)


def replicates(run: str | Path, n: int, out: str | Path, *, seeds: list[int] | None = None, client=None,
               scheduler: str | None = None, workers: int | None = None, parallel: int | None = None) -> dict:
    """Run ``n`` replicates of ``run`` into ``out/rep-XXX``; returns the record written to out/replicates.json.

    The replicate input (the run's MDF and public invariants) is written, read and tabulated once; the
    replicates then run ``parallel`` (default :data:`PARALLEL`) at a time side by side on one cluster, each
    into ``.rep-XXX.partial`` renamed to ``rep-XXX`` when complete (the same files as a run of its seed
    alone). Resumable: a replicate recorded complete is kept, a partial one is redone. ``out`` is held by this
    call alone (``outdir.claimed``). On an object store (``run`` and ``out`` may be URLs), which has no rename,
    each replicate is run in place and counts once ``replicates.json``, written after it, lists it."""
    from ..configuration.config import ConfigError
    from ..configuration.limits import MAX_REPLICATES, check_count

    run, out = location(run), location(out)
    check_count(n, "--n", 1, MAX_REPLICATES)
    seeds = list(seeds or [SEED_BASE + i for i in range(n)])
    if len(seeds) != n:
        raise ConfigError(f"--n {n}: but {len(seeds)} seeds")
    parallel = PARALLEL if parallel is None else parallel
    check_count(parallel, "--parallel", 1, MAX_REPLICATES)
    config = RunReader(run).config()
    with claimed(out, "replicates"):
        return _replicates(run, config, seeds, out, client, scheduler, workers, parallel)


def _replicates(run: Path, config, seeds: list[int], out: Path, client, scheduler: str | None, workers: int | None,
                parallel: int) -> dict:
    """:func:`replicates` into the folder ``out`` it holds."""
    from ..execution.runner import dask_client, prepare, with_input

    record_path = out / "replicates.json"
    record = _read_record(record_path, run)
    todo = _pending(out, record, seeds)
    write_json_atomic(record_path, record)
    if not todo:
        return record
    cancel = _Either(threading.Event(), reporter().cancel)  # set on an error here, or the job's cancel
    with dask_client(client, scheduler, workers) as dclient:
        # On a worker: the conversion holds the MDF's columns, a driver's whole peak otherwise.
        inp = dclient.submit(_replicate_input, run, out / "input", pure=False).result()
        rep_configs = {i: with_input(config, inp).with_overrides(mode="test", seed=seeds[i],
                                                                   name=f"{config.run.name}-rep{i:03d}")
                       for i in todo}
        prep = prepare(rep_configs[todo[0]], inp, dclient)
        pool = ThreadPoolExecutor(min(parallel, len(todo)), thread_name_prefix="replicate")
        try:
            futures = [pool.submit(_replicate, rep_configs[i], out / f"rep-{i:03d}", prep, dclient, cancel)
                       for i in todo]
            for fut in track(as_completed(futures), "replicates", len(futures), unit="replicates"):
                entry = fut.result()
                record["replicates"] = sorted([*record["replicates"], entry], key=lambda r: r["dir"])
                write_json_atomic(record_path, record)
                log.info("replicate %s (seed %d) done", entry["dir"], entry["seed"])
        finally:  # an error or a cancellation: the others stop at their next task
            cancel.events[0].set()
            pool.shutdown(wait=True, cancel_futures=True)
    return record


def _read_record(path: Path, run: Path) -> dict:
    """replicates.json of ``run``'s replicates (a new one when absent)."""
    if not path.exists():
        return {"run": str(run), "replicates": []}
    try:
        record = json.loads(path.read_text())
        if not isinstance(record, dict) or not isinstance(record.get("replicates"), list):
            raise ValueError("no list of replicates")
    except (OSError, UnicodeDecodeError, ValueError) as exc:
        raise RunDirError(f"{path}: not a readable replicates record ({type(exc).__name__}: {exc}); "
                          "choose another --out") from None
    if record.get("run") != str(run):
        raise RunDirError(f"{path.parent} holds replicates of {record.get('run')}, not {run}")
    return record


def _pending(out: Path, record: dict, seeds: list[int]) -> list[int]:
    """The indices of the replicates still to run; drops from ``record`` every entry whose folder is not
    complete (removed or damaged since). A replicate recorded with another seed is refused."""
    kept = []
    for entry in record["replicates"]:
        try:
            complete = RunReader(out / entry["dir"]).manifest().status == "complete"
        except (RunDirError, OSError, KeyError, TypeError):
            complete = False
        if complete:
            kept.append(entry)
        else:
            log.warning("%s: incomplete or missing; it is run again", out / str(entry.get("dir")))
    record["replicates"] = kept
    done = {r["dir"]: r["seed"] for r in kept}
    todo = []
    for i, seed in enumerate(seeds):
        name = f"rep-{i:03d}"
        if name in done and done[name] != seed:
            raise RunDirError(f"{out / name}: a replicate of seed {done[name]}, not {seed}; choose another --out")
        if name not in done:
            todo.append(i)
    return todo


def _replicate_input(run: Path, path: Path | StorePath) -> Path | StorePath:
    """The replicate input of ``run`` at ``path``, written once (through a partial folder renamed when complete;
    on a store, which has no rename, written again by every call, before any replicate reads it)."""
    if isinstance(path, StorePath):
        remove_tree(path)
        return mdf_input(run, path)
    if not path.is_dir():
        partial = path.with_name(f".{path.name}.partial")
        shutil.rmtree(partial, ignore_errors=True)
        mdf_input(run, partial)
        os.rename(partial, path)
    return path


class _Either:
    """Set when any of its events is (None: never): a replicate's thread stops on its command's error or
    on the job's cancellation."""

    def __init__(self, *events: threading.Event | None) -> None:
        self.events = events

    def is_set(self) -> bool:
        return any(e is not None and e.is_set() for e in self.events)


def _replicate(config: Config, target: Path, prep, client, cancel: _Either) -> dict:
    """One replicate into ``target`` (through ``.<name>.partial``, renamed when complete); its record entry.
    ``client_cpu_seconds`` is this replicate's driver thread's CPU."""
    from ..execution.runner import run_prepared

    t0, c0 = time.perf_counter(), time.thread_time()
    store = isinstance(target, StorePath)  # no rename: run in place (replicates.json lists it once complete)
    partial = target if store else target.with_name(f".{target.name}.partial")
    remove_tree(partial)
    with reporting(Reporter(enabled=False, cancel=cancel)):  # type: ignore[arg-type]  # one bar for all replicates: the caller's
        run_prepared(config, partial, prep, client)
    if not store:
        shutil.rmtree(target, ignore_errors=True)  # a replicate left incomplete by an earlier version
        os.rename(partial, target)
    return {"dir": target.name, "seed": config.run.seed, "wall_seconds": round(time.perf_counter() - t0, 2),
            "client_cpu_seconds": round(time.thread_time() - c0, 2)}

