"""The inputs of ``topdown evaluate`` routed to groups of whole states, so that no task holds
a level or the truth whole: verify's groups (``verify._Groups``: consecutive states - a state's AIAN parts
together - of about ``verify.GROUP_BLOCKS`` blocks or ``verify.GROUP_RECORDS`` records, at most
``verify.MAX_GROUPS``; a declared hierarchy's nodes of its first level below the root). Every kind of rows
lands in ``folder/<kind>/<group>-<part>.parquet``:

* the truth, tabulated one read task (``dataplane.read_tasks``: whole row groups of one input file, about
  ``ROWS_PER_TASK`` records) at a time into block histograms (geocode, cell, count), on the workers;
* each run's spine rows and each level's estimates below the root (the root is read whole);
* the off-spine entities' blocks.

A group's rows are read back with :func:`group_rows`. The folder lies inside the evaluation's private output
folder (it holds true counts; on an object store, under the output's prefix, with the store's private settings)
and is removed when the evaluation ends.
"""
from __future__ import annotations

import copy
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from topdown.geo.spine import PREFIX, STATE
from topdown.vocab.census import Census, Product

from ..execution.dataplane import InputFiles, counts_units, read_tasks
from ..runtime.storage import StorePath, location, read_table, write_parquet
from ..inputs.tabulate import sparse_counts
from ..inputs.validate import check_records
from ..outputs.verify import _Groups, _route

#: The spill folder's name inside the evaluation's output folder.
SPILL_DIR = ".groups-tmp"


def router(groups: _Groups) -> _Groups:
    """``groups`` without its spine: what routing a code needs (small enough to send to every task), and for a
    hierarchy other than the U.S. each block's key number (:func:`block_keys`)."""
    light = copy.copy(groups)
    light.block_key = None if groups.us else pd.Series(
        groups.row_key, index=pd.Index(np.asarray(groups.spine.column("geoid").to_numpy(zero_copy_only=False), str)))
    light.spine, light.row_group, light.row_key = None, None, None
    return light


def block_keys(groups: _Groups, geocodes: pd.Series) -> np.ndarray:
    """The key number of each block (an index into ``groups.runs["key"]``: its state on a U.S. spine, else its
    node of the first level below the root) of a :func:`router`; a block not on the spine gets some key."""
    keys = groups.runs["key"][0]
    if groups.us:
        key = np.searchsorted(keys, geocodes.str[:PREFIX[STATE]].to_numpy().astype(str))
    else:
        key = groups.block_key.reindex(geocodes.astype(str)).fillna(0).to_numpy()
    return np.minimum(key, max(len(keys) - 1, 0)).astype(np.int64)


def write_rows(frame: pd.DataFrame | pa.Table, group: np.ndarray, folder: Path | StorePath, part: str) -> None:
    """The rows of ``frame`` into ``folder/<g>-<part>.parquet``, ``g`` each row's group (``group``)."""
    table = frame if isinstance(frame, pa.Table) else pa.Table.from_pandas(frame, preserve_index=False)
    folder.mkdir(parents=True, exist_ok=True)
    for g in np.unique(group):
        write_parquet(table.filter(pa.array(group == g)), folder / f"{int(g)}-{part}.parquet")


def group_rows(folder: Path, g: int, columns: dict[str, str]) -> pd.DataFrame:
    """Group ``g``'s rows of one kind (``columns``: name -> dtype of the empty frame when it has none)."""
    files = sorted(folder.glob(f"{g}-*.parquet"))
    if not files:
        return pd.DataFrame({c: pd.Series(dtype=t) for c, t in columns.items()})
    return pa.concat_tables([read_table(f) for f in files], promote_options="default").to_pandas()


def truth_tasks(files: InputFiles, census: Census) -> list[tuple[str, list[int], list[Product]]]:
    """(file, row groups, products counted from them) of each read task of the truth: ``census``'s products
    counting its unit records from the unit files, the others from the record file they count."""
    tasks = []
    for units, paths in ((False, files.persons), (True, files.units)):
        counted = [p for p in census.products if counts_units(census, p) == units]
        if counted and paths:
            tasks += [(path, rgs, counted) for path, rgs in read_tasks(paths)]
    return tasks


def tabulate_task(path: str, row_groups: list[int], product: Product, census: Census) -> pd.DataFrame:
    """Block histograms (geocode, cell, count) of ``product`` from one read task's records, read and checked as
    a run reads them (``validate.check_records``)."""
    leaf, cells, _ = check_records(location(path), product, census.hierarchy, row_groups)
    return sparse_counts(pd.Series(leaf).astype(str), np.asarray(cells), product.schema.ncells)


def route_truth(path: str, row_groups: list[int], products: list[Product], census: Census, groups: _Groups,
                folder: Path, part: int) -> dict[str, np.ndarray]:
    """Tabulate one read task's records into block histograms of each of ``products`` and route them to their
    groups (``folder/<product>/``); returns each product's count per key of ``groups`` (:func:`block_keys`)."""
    keys = groups.runs["key"][0]
    totals = {}
    for product in products:
        hist = tabulate_task(path, row_groups, product, census)
        geocode = pa.array(hist["geocode"].to_numpy(), pa.large_string())
        write_rows(hist, groups.route("geoid", geocode), folder / product.name, str(part))
        totals[product.name] = np.bincount(block_keys(groups, hist["geocode"]), weights=hist["count"].to_numpy(),
                                           minlength=len(keys)).astype(np.int64)
    return totals


def route_spine(groups: _Groups, folder: Path) -> None:
    """Each group's rows of the spine (strings, as ``RunReader.spine_table`` gives them)."""
    for g in range(groups.count):
        frame = groups.spine_frame(g)
        write_rows(frame, np.full(len(frame), g), folder, "0")


def route_level(groups: _Groups, path: Path, folder: Path, level: str) -> None:
    """A level's histogram rows (``path``: its folder of parts) routed by geocode, a batch at a time."""
    _route(groups, path, folder, level, part="0")


def route_entities(groups: _Groups, table: pd.DataFrame, folder: Path) -> None:
    """The entities' rows (geoid, kind number, entity number) routed by block."""
    if len(table):
        write_rows(table, groups.route("geoid", pa.array(table["geoid"].to_numpy(), pa.large_string())), folder, "0")
