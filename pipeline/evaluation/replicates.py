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
import shutil
import time
from pathlib import Path

import numpy as np
import pandas as pd

from topdown.pipeline.configuration.census import PERSONS, UNITS, read_as_declared
from topdown.vocab.census import GENERIC_MDF, Census

from ..execution.progress import track
from ..outputs.mdf import generic_levels
from ..execution.rundir import RunDirError, RunReader, check_out, write_json_atomic, write_table

log = logging.getLogger("topdown")

#: Replicate seeds are SEED_BASE + i unless given (recorded in DIR/replicates.json).
SEED_BASE = 1_000_003


def mdf_input(run_dir: Path, out: Path) -> Path:
    """Write persons.parquet and units.parquet (the input format) from a run's MDF and public invariants."""
    reader = RunReader(run_dir)
    census = reader.census()
    if read_as_declared(census):
        return _declared_input(reader, census, out)
    persons = reader.table(reader.mdf(PERSONS.name))
    geoid = persons["TABBLKST"] + persons["TABBLKCOU"] + persons["TABTRACTCE"] + persons["TABBLK"]
    pframe = pd.DataFrame({"geoid": geoid.astype(str), "hhgq": persons["GQTYPE_PL"].astype(np.int64),
                           "votingage": (persons["VOTING_AGE"] == "2").astype(np.int64),
                           "hispanic": (persons["CENHISP"] == "2").astype(np.int64),
                           "cenrace": persons["CENRACE"].astype(np.int64) - 1})
    inv = reader.table(reader.invariants(PERSONS.name))
    spine = reader.spine_table()
    blocks = inv[inv["level"] == spine.columns[-1]].set_index("geocode")
    geoid_of = spine.set_index(spine.columns[-1])["geoid"].reindex(blocks.index).to_numpy()
    if reader.mdf(UNITS.name).exists():  # housing units with their published occupancy
        units = reader.table(reader.mdf(UNITS.name))
        hu = units[units["RTYPE"] == "2"]
        hu_geoid = (hu["TABBLKST"] + hu["TABBLKCOU"] + hu["TABTRACTCE"] + hu["TABBLK"]).astype(str)
        frames = [pd.DataFrame({"geoid": hu_geoid.to_numpy(), "unit_type": 0,
                                "occupied": (hu["HH_STATUS"] == "1").to_numpy()})]
    else:  # a persons-only run: the invariant housing-unit counts (occupancy is not used)
        frames = [pd.DataFrame({"geoid": np.repeat(geoid_of, blocks["u0"].to_numpy(np.int64)), "unit_type": 0,
                                "occupied": True})]
    # Group-quarters facilities by type: the block-level invariant gqhh_vect (the MDF's units carry no type).
    for k in range(1, 8):
        n = blocks[f"u{k}"].to_numpy(np.int64)
        frames.append(pd.DataFrame({"geoid": np.repeat(geoid_of, n),
                                    "unit_type": k, "occupied": True}))
    out.mkdir(parents=True, exist_ok=True)
    write_table(pframe, out / "persons.parquet")
    write_table(pd.concat(frames, ignore_index=True).astype({"unit_type": np.int64}), out / "units.parquet")
    return out


def replicates(run: str | Path, n: int, out: str | Path, *, seeds: list[int] | None = None, client=None,
               scheduler: str | None = None, workers: int | None = None) -> dict:
    """Run ``n`` replicates of ``run`` into ``out/rep-XXX``; returns the record written to out/replicates.json."""
    from ..configuration.config import ConfigError
    from ..execution.runner import dask_client, run as run_topdown

    run, out = Path(run), Path(out)
    config = RunReader(run).config()
    seeds = list(seeds or [SEED_BASE + i for i in range(n)])
    if len(seeds) != n:
        raise ConfigError(f"--n {n} but {len(seeds)} seeds")
    check_out(out, "the replicates", lambda p: (p / "replicates.json").is_file())
    out.mkdir(parents=True, exist_ok=True)
    record_path = out / "replicates.json"
    record = json.loads(record_path.read_text()) if record_path.exists() else {"run": str(run), "replicates": []}
    if record["run"] != str(run):
        raise RunDirError(f"{out} holds replicates of {record['run']}, not {run}")
    write_json_atomic(record_path, record)  # marks the folder as replicates' (check_out) before anything else
    inp = mdf_input(run, out / "input")
    done = {r["seed"] for r in record["replicates"]}
    with dask_client(client, scheduler, workers) as dclient:
        for i, seed in track(list(enumerate(seeds)), "replicates", unit="replicates"):
            if seed in done:
                continue
            t0, c0 = time.perf_counter(), time.process_time()
            rep = config.with_overrides(mode="test", seed=seed, name=f"{config.run.name}-rep{i:03d}")
            target = out / f"rep-{i:03d}"
            shutil.rmtree(target, ignore_errors=True)
            run_topdown(rep, target, input_dir=inp, client=dclient)
            record["replicates"].append({"dir": target.name, "seed": seed,
                                         "wall_seconds": round(time.perf_counter() - t0, 2),
                                         "client_cpu_seconds": round(time.process_time() - c0, 2)})
            write_json_atomic(record_path, record)
            log.info("replicate %d/%d (seed %d) done", i + 1, n, seed)
    return record


def _declared_input(reader: RunReader, census: Census, out: Path) -> Path:
    """A declared census's input from the run's generic MDFs (each attribute back to an input value: the first
    one its ``values`` map to the level) and, with ``[census.units]``, units of each type from the leaves'
    published unit counts (all occupied: occupancy is not published)."""
    hierarchy, spine = census.hierarchy, reader.spine_table()
    codes = spine.drop_duplicates(hierarchy.leaf).set_index(hierarchy.leaf, drop=False)
    out.mkdir(parents=True, exist_ok=True)

    def geography(leaves: pd.Series) -> dict:
        if hierarchy.by_prefix:
            return {hierarchy.geocode: leaves.to_numpy()}
        return {lv.column: codes[lv.name].reindex(leaves).to_numpy() for lv in hierarchy.levels[1:]}

    written = set()
    for product in reader.products():
        if product.mdf != GENERIC_MDF or product.records.where or product.records.name in written:
            raise RunDirError(f"{reader.root}: product {product.name!r}: replicates rebuild each record file from "
                              "one product's generic MDF (mdf = \"generic\", no records.where)")
        written.add(product.records.name)
        mdf = reader.table(reader.mdf(product.name))
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
        write_table(pd.DataFrame(frame), out / f"{product.records.name}.parquet")
    if census.units is not None and census.units.name not in written:
        units = census.units
        inv = reader.table(reader.invariants(reader.products()[0].name))
        leaves = inv[inv["level"] == hierarchy.leaf].astype({"geocode": str})
        frames = []
        for k in range(units.types):
            n = leaves[f"u{k}"].to_numpy(np.int64)
            where = pd.Series(np.repeat(leaves["geocode"].to_numpy(), n))
            frames.append(pd.DataFrame({**geography(where), units.type_column: np.full(len(where), k, np.int64),
                                        units.occupied_column: True}))
        write_table(pd.concat(frames, ignore_index=True), out / f"{units.name}.parquet")
    return out
