"""Block tabulation: person records -> sparse long-format block histograms (as DAS-2020 ``sql_spar_table.py``
builds them).

Records are grouped by (block, histogram variables) and counted; the variable tuple becomes the flat row-major
cell index of the schema. Only non-zero cells are kept. Output is sorted by (geocode, cell).
"""
from __future__ import annotations

import numpy as np
import pandas as pd

from topdown.vocab.census import MAX_UNIT_TYPES, Attribute, Product
from topdown.vocab.schema import Schema


def sparse_counts(geoids: pd.Series, cells: np.ndarray, ncells: int) -> pd.DataFrame:
    """Long ``geocode, cell, count`` rows of records (their block geocodes and cells), non-zero cells, sorted."""
    codes, blocks = pd.factorize(geoids, sort=True)
    keys, counts = np.unique(codes.astype(np.int64) * ncells + cells.astype(np.int64), return_counts=True)
    return pd.DataFrame({
        "geocode": pd.Series(np.asarray(blocks, dtype=object)[keys // ncells], dtype="str"),
        "cell": (keys % ncells).astype(np.int64),
        "count": counts.astype(np.int64),
    })


def block_histograms(persons: pd.DataFrame, schema: Schema) -> pd.DataFrame:
    """Long-format block histograms ``geocode, cell, count`` of records, one row per non-zero cell of ``schema``.

    ``persons`` needs ``geoid`` and one column per schema dimension, holding its levels.
    """
    cells = schema.cell_index(*(persons[name].to_numpy() for name in schema.dim_names))
    return sparse_counts(persons["geoid"], np.asarray(cells), schema.ncells)


def block_units(units: pd.DataFrame) -> pd.DataFrame:
    """Per block: units of each type ``u0..u7`` (the invariant ``gqhh_vect``, DAS-2020 ``invariantsmaker.py``) and
    the housing units split into ``occupied`` and ``vacant``. One row per block with a unit, sorted by geoid."""
    codes, blocks = pd.factorize(units["geoid"], sort=True)
    nblocks = len(blocks)
    utype = units["unit_type"].to_numpy(np.int64)
    types = MAX_UNIT_TYPES
    table = np.bincount(codes * types + utype, minlength=nblocks * types).reshape(nblocks, types)
    hu = utype == 0
    occupied = np.bincount(codes[hu & units["occupied"].to_numpy(bool)], minlength=nblocks)
    out = pd.DataFrame({"geoid": pd.Series(np.asarray(blocks, dtype=object), dtype="str")})
    for k in range(types):
        out[f"u{k}"] = table[:, k].astype(np.int64)
    out["occupied"] = occupied.astype(np.int64)
    out["vacant"] = (table[:, 0] - occupied).astype(np.int64)
    return out


def attribute_levels(attribute: Attribute, column: pd.Series) -> np.ndarray:
    """Each record's level of ``attribute``: the column itself, or its declared ``values`` mapped to levels."""
    if attribute.values is None:
        return column.to_numpy()
    values = column.to_numpy()
    levels = np.full(len(values), -1, dtype=np.int64)
    for value, level in attribute.values:
        levels[values == value] = level
    return levels


def tabulate(product: Product, records: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """Long-format block histograms ``geocode, cell, count`` of ``product`` from the input's record frames
    (``records[name]``, with ``geoid`` and the attributes' columns): its records (those its ``where`` keeps),
    each counted in the cell of its attributes' levels."""
    frame = records[product.records.name]
    for column, values in product.records.where:
        frame = frame[frame[column].isin(values)]
    cells = product.schema.cell_index(*(attribute_levels(a, frame[a.column]) for a in product.attributes))
    return sparse_counts(frame["geoid"], np.asarray(cells), product.schema.ncells)
