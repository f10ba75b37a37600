"""Microdata Detail Files: one row per person or unit, with tabulation geography (DAS-2020 ``mdf2020writer.py``,
``mdf2020_recoder.py``).

Block histograms are expanded cell by cell; EPNUM / EUNUM number the rows of a block in cell order,
so the files are deterministic. The P.L. 94-171 layouts (``person_mdf``, ``unit_mdf``) are the Census MDF's;
a declared product's ``mdf = "generic"`` layout (:func:`generic_mdf`) has one code column per level below the
root, the record's number within its leaf (:data:`RECORD_NUMBER`) and one column per attribute (its label
when the attribute declares labels, else its level).
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from topdown.geo.spine import US_HIERARCHY
from topdown.pipeline.configuration.census import PERSONS
from topdown.vocab.census import GENERIC_MDF, Hierarchy, Product

from ..configuration.errors import ConfigError

#: MDF person columns (DAS-2020 ``mdf2020_recoder.py``), all strings as in the Census MDF.
PERSON_COLUMNS = ["SCHEMA_TYPE_CODE", "SCHEMA_BUILD_ID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLKGRPCE",
                  "TABBLK", "EPNUM", "RTYPE", "GQTYPE_PL", "VOTING_AGE", "CENHISP", "CENRACE"]
#: CENRACE codes "01".."63" by cenrace index.
CENRACE_CODES = [f"{i + 1:02d}" for i in range(63)]
UNIT_COLUMNS = ["SCHEMA_TYPE_CODE", "SCHEMA_BUILD_ID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLKGRPCE",
                "TABBLK", "EUNUM", "RTYPE", "HH_STATUS"]


#: Tabulation geography columns of the U.S. layouts: their characters of the block GEOID (the U.S. hierarchy's
#: prefix widths; the block number is the GEOID after the tract).
_WIDTH = {level.name: level.width for level in US_HIERARCHY.levels[1:]}
GEOGRAPHY = {"TABBLKST": (0, _WIDTH["State"]), "TABBLKCOU": (_WIDTH["State"], _WIDTH["County"]),
             "TABTRACTCE": (_WIDTH["County"], _WIDTH["Tract"]), "TABBLKGRPCE": (_WIDTH["Tract"], _WIDTH["Block_Group"]),
             "TABBLK": (_WIDTH["Tract"], _WIDTH["Block"])}

#: The generic MDF's column numbering a leaf's records, in cell order.
RECORD_NUMBER = "record"

#: ``pq.write_table`` options of an MDF part: its string columns are dictionary arrays in memory (a code per
#: record, not a string) and plain strings to readers (the file stores no Arrow schema).
MDF_PARQUET = {"store_schema": False}


def _codes(values: list[str] | np.ndarray, index: np.ndarray) -> pa.DictionaryArray:
    """A string column whose record i is ``values[index[i]]``."""
    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(index, dtype=np.int32)), pa.array(values, type=pa.string()))


def _geography(geoids: np.ndarray, rows: np.ndarray) -> dict[str, pa.DictionaryArray]:
    """The geography columns of records in blocks ``rows`` (of the blocks ``geoids``), sliced once per block."""
    g = pd.Series(geoids, dtype=str)
    out = {}
    for name, (a, b) in GEOGRAPHY.items():
        values, which = np.unique(g.str[a:b].to_numpy(dtype=object).astype(str), return_inverse=True)
        out[name] = _codes(values, which[rows])
    return out


def _expand(hist: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block row, cell and within-block sequence number of every record."""
    coo = hist.tocoo()
    order = np.lexsort((coo.col, coo.row))
    rows, cols, counts = coo.row[order], coo.col[order], coo.data[order].astype(np.int64)
    rec_rows = np.repeat(rows, counts)
    rec_cells = np.repeat(cols, counts)
    starts = np.r_[0, np.flatnonzero(np.diff(rec_rows)) + 1]
    seq = np.arange(rec_rows.size) - np.repeat(starts, np.diff(np.r_[starts, rec_rows.size]))
    return rec_rows, rec_cells, seq


def _records(type_code: str, geoids: np.ndarray, hist: sp.csr_matrix, number: str) -> tuple[dict, np.ndarray]:
    """The columns every MDF record has (schema, geography, its number within the block, named ``number``)
    for the records of block histograms ``hist`` (rows: the blocks ``geoids``), and each record's cell."""
    rows, cells, seq = _expand(hist)
    none = np.zeros(rows.size, dtype=np.int32)
    return {"SCHEMA_TYPE_CODE": _codes([type_code], none), "SCHEMA_BUILD_ID": _codes(["1.1.0"], none),
            **_geography(np.asarray(geoids), rows), number: pa.array(seq.astype(np.int64))}, cells


def person_mdf(geoids: np.ndarray, hist: sp.csr_matrix) -> pa.Table:
    """MDF persons from block histograms (rows of ``hist`` are the blocks ``geoids``)."""
    frame, cells = _records("MPD", geoids, hist, "EPNUM")
    hhgq, va, hisp, race = PERSONS.unravel(cells)
    frame |= {"RTYPE": _codes(["3", "5"], hhgq != 0), "GQTYPE_PL": _codes([str(h) for h in range(8)], hhgq),
              "VOTING_AGE": _codes(["1", "2"], va), "CENHISP": _codes(["1", "2"], hisp),
              "CENRACE": _codes(CENRACE_CODES, race)}
    return pa.table([frame[c] for c in PERSON_COLUMNS], names=PERSON_COLUMNS)


def unit_mdf(geoids: np.ndarray, hist: sp.csr_matrix, gq_facilities: np.ndarray) -> pa.Table:
    """MDF units: housing units (RTYPE 2, HH_STATUS 1 occupied / 2 vacant) and GQ facilities (RTYPE 4)."""
    gq = sp.csr_matrix(np.asarray(gq_facilities, dtype=np.int64).reshape(-1, 1))
    frame, cells = _records("MUD", geoids, sp.hstack([hist, gq]).tocsr(), "EUNUM")  # cells: occupied, vacant, GQ facility
    frame |= {"RTYPE": _codes(["2", "4"], cells == 2), "HH_STATUS": _codes(["1", "2", "0"], cells)}
    return pa.table([frame[c] for c in UNIT_COLUMNS], names=UNIT_COLUMNS)


def tabulate_person_mdf(mdf: pd.DataFrame) -> pd.DataFrame:
    """Block histograms (geocode, cell, count) tabulated back from MDF persons (for verification)."""
    geoid = mdf["TABBLKST"] + mdf["TABBLKCOU"] + mdf["TABTRACTCE"] + mdf["TABBLK"]
    cell = PERSONS.cell_index(mdf["GQTYPE_PL"].astype(int).to_numpy(), (mdf["VOTING_AGE"] == "2").to_numpy().astype(int),
                              (mdf["CENHISP"] == "2").to_numpy().astype(int), mdf["CENRACE"].astype(int).to_numpy() - 1)
    return (pd.DataFrame({"geocode": geoid, "cell": cell}).groupby(["geocode", "cell"]).size()
            .rename("count").reset_index())


#: The MDF columns whose concatenation is a block's GEOID.
MDF_GEOID = ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK")


def mdf_geoid(mdf: pa.Table) -> pa.ChunkedArray:
    """Each U.S. MDF record's block GEOID."""
    return pc.binary_join_element_wise(*(mdf[c] for c in MDF_GEOID), "")


def _is(column: pa.ChunkedArray, value: str) -> pa.ChunkedArray:
    return pc.cast(pc.equal(column, value), pa.int64())


#: What :func:`person_records` reads of a ``pl94_persons`` MDF.
PERSON_RECORD_COLUMNS = (*MDF_GEOID, "GQTYPE_PL", "VOTING_AGE", "CENHISP", "CENRACE")


def person_records(mdf: pa.Table) -> pa.Table:
    """The input person records (geoid and one column per P.L. 94-171 persons attribute) of a ``pl94_persons``
    MDF (its :data:`PERSON_RECORD_COLUMNS`), converted in Arrow, column by column."""
    return pa.table({"geoid": mdf_geoid(mdf), "hhgq": pc.cast(mdf["GQTYPE_PL"], pa.int64()),
                     "votingage": _is(mdf["VOTING_AGE"], "2"), "hispanic": _is(mdf["CENHISP"], "2"),
                     "cenrace": pc.subtract(pc.cast(mdf["CENRACE"], pa.int64()), 1)})


#: What :func:`housing_unit_records` reads of a ``pl94_units`` MDF.
UNIT_RECORD_COLUMNS = (*MDF_GEOID, "RTYPE", "HH_STATUS")


def housing_unit_records(mdf: pa.Table) -> pd.DataFrame:
    """The housing units (unit_type 0) of a ``pl94_units`` MDF (its :data:`UNIT_RECORD_COLUMNS`) as input unit
    records (geoid, unit_type, occupied); its group-quarters facilities carry no type."""
    hu = mdf.filter(pc.equal(mdf["RTYPE"], "2"))
    return pd.DataFrame({"geoid": mdf_geoid(hu).to_numpy(zero_copy_only=False), "unit_type": 0,
                         "occupied": pc.equal(hu["HH_STATUS"], "1").to_numpy(zero_copy_only=False)})


def generic_mdf(product: Product, codes: pd.DataFrame, hist: sp.csr_matrix) -> pa.Table:
    """The generic MDF of a declared ``product``: one row per record of the leaf histograms ``hist`` (row i the
    leaf whose level codes are row i of ``codes``: one column per level below the root, named by the level),
    with those codes, :data:`RECORD_NUMBER` and one column per attribute (label, or level as an integer)."""
    rows, cells, seq = _expand(hist)
    frame: dict[str, pa.Array] = {}
    for level in codes.columns:
        values, which = np.unique(codes[level].to_numpy(dtype=object).astype(str), return_inverse=True)
        frame[level] = _codes(values, which[rows])
    frame[RECORD_NUMBER] = pa.array(seq.astype(np.int64))
    for attribute, levels in zip(product.attributes, product.schema.unravel(cells)):
        levels = np.asarray(levels)
        frame[attribute.name] = (_codes(list(attribute.labels), levels) if attribute.labels
                                 else pa.array(levels.astype(np.int64)))
    return pa.table(list(frame.values()), names=list(frame))


def generic_levels(mdf: pd.DataFrame, attribute) -> np.ndarray:
    """Each generic MDF row's level of ``attribute`` (its column holds the level's label, or the level)."""
    column = mdf[attribute.name]
    if attribute.labels:
        return pd.Index(attribute.labels).get_indexer(column.astype(str))
    return column.to_numpy(np.int64)


def tabulate_generic_mdf(mdf: pd.DataFrame, product: Product, hierarchy: Hierarchy) -> pd.DataFrame:
    """Leaf histograms (geocode, cell, count) tabulated back from a generic MDF (for verification)."""
    cell = product.schema.cell_index(*(generic_levels(mdf, a) for a in product.attributes))
    return (pd.DataFrame({"geocode": mdf[hierarchy.leaf].astype(str).to_numpy(), "cell": cell})
            .groupby(["geocode", "cell"]).size().rename("count").reset_index())


#: Facility counts of a block's unit frame (``u1..u7``: group-quarters facilities of each type).
GQ_FACILITIES = [f"u{k}" for k in range(1, 8)]


def product_mdf(product: Product, geoids: np.ndarray, hist: sp.csr_matrix, units: pd.DataFrame,
                codes: pd.DataFrame | None = None) -> pa.Table:
    """One task's MDF rows in ``product``'s declared layout (``geoids`` its blocks, ``hist`` their estimated
    histograms, ``units`` their invariant unit counts u0..u7, ``codes`` their level codes for the generic one)."""
    if product.mdf == GENERIC_MDF:
        return generic_mdf(product, codes, hist)
    if product.mdf == "pl94_persons":
        return person_mdf(geoids, hist)
    if product.mdf == "pl94_units":
        return unit_mdf(geoids, hist, units[GQ_FACILITIES].to_numpy().sum(axis=1))
    raise ConfigError(f"product {product.name!r}: MDF layout {product.mdf!r} is not available in this version "
                      "(layouts: generic, pl94_persons, pl94_units)")
