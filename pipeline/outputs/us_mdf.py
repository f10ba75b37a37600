"""The Census MDF layouts of the U.S. P.L. 94-171 products (DAS-2020 ``mdf2020writer.py``,
``mdf2020_recoder.py``): ``pl94_persons`` and ``pl94_units``, as :class:`~.layout.MdfLayout` objects.

The one module of ``outputs`` that knows the P.L. 94-171 person attributes (hhgq, votingage, hispanic, cenrace,
in the declared order of ``conf/census/pl94.toml``) and the Census MDF's columns. Tabulation geography is the
block GEOID cut at the U.S. hierarchy's prefix widths (the block number is the GEOID after the tract); EPNUM /
EUNUM number the rows of a block in cell order, so the files are deterministic.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from topdown.geo.spine import US_HIERARCHY
from topdown.vocab.census import Hierarchy, Product

from ..configuration.census import PL94_PERSONS_MDF, PL94_UNITS_MDF
from .layout import MdfLayout, codes_column, expand, tabulation

#: MDF person columns (DAS-2020 ``mdf2020_recoder.py``), all strings as in the Census MDF.
PERSON_COLUMNS = ["SCHEMA_TYPE_CODE", "SCHEMA_BUILD_ID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLKGRPCE",
                  "TABBLK", "EPNUM", "RTYPE", "GQTYPE_PL", "VOTING_AGE", "CENHISP", "CENRACE"]
#: CENRACE codes "01".."63" by cenrace index.
CENRACE_CODES = [f"{i + 1:02d}" for i in range(63)]
UNIT_COLUMNS = ["SCHEMA_TYPE_CODE", "SCHEMA_BUILD_ID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLKGRPCE",
                "TABBLK", "EUNUM", "RTYPE", "HH_STATUS"]

#: Tabulation geography columns: their characters of the block GEOID (the U.S. hierarchy's prefix widths).
_WIDTH = {level.name: level.width for level in US_HIERARCHY.levels[1:]}
GEOGRAPHY = {"TABBLKST": (0, _WIDTH["State"]), "TABBLKCOU": (_WIDTH["State"], _WIDTH["County"]),
             "TABTRACTCE": (_WIDTH["County"], _WIDTH["Tract"]), "TABBLKGRPCE": (_WIDTH["Tract"], _WIDTH["Block_Group"]),
             "TABBLK": (_WIDTH["Tract"], _WIDTH["Block"])}
#: The MDF columns whose concatenation is a block's GEOID.
MDF_GEOID = ("TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK")
#: Facility counts of a block's unit frame (``u1..u7``: group-quarters facilities of each type).
GQ_FACILITIES = [f"u{k}" for k in range(1, 8)]


def _geography(geoids: np.ndarray, rows: np.ndarray) -> dict[str, pa.DictionaryArray]:
    """The geography columns of records in blocks ``rows`` (of the blocks ``geoids``), sliced once per block."""
    g = pd.Series(geoids, dtype=str)
    out = {}
    for name, (a, b) in GEOGRAPHY.items():
        values, which = np.unique(g.str[a:b].to_numpy(dtype=object).astype(str), return_inverse=True)
        out[name] = codes_column(values, which[rows])
    return out


def _records(type_code: str, geoids: np.ndarray, hist: sp.csr_matrix, number: str) -> tuple[dict, np.ndarray]:
    """The columns every MDF record has (schema, geography, its number within the block, named ``number``)
    for the records of block histograms ``hist`` (rows: the blocks ``geoids``), and each record's cell."""
    rows, cells, seq = expand(hist)
    none = np.zeros(rows.size, dtype=np.int32)
    return {"SCHEMA_TYPE_CODE": codes_column([type_code], none), "SCHEMA_BUILD_ID": codes_column(["1.1.0"], none),
            **_geography(np.asarray(geoids), rows), number: pa.array(seq.astype(np.int64))}, cells


def person_mdf(product: Product, geoids: np.ndarray, hist: sp.csr_matrix) -> pa.Table:
    """MDF persons from block histograms of the persons ``product`` (rows of ``hist`` are the blocks ``geoids``)."""
    frame, cells = _records("MPD", geoids, hist, "EPNUM")
    hhgq, va, hisp, race = product.schema.unravel(cells)
    frame |= {"RTYPE": codes_column(["3", "5"], hhgq != 0), "GQTYPE_PL": codes_column([str(h) for h in range(8)], hhgq),
              "VOTING_AGE": codes_column(["1", "2"], va), "CENHISP": codes_column(["1", "2"], hisp),
              "CENRACE": codes_column(CENRACE_CODES, race)}
    return pa.table([frame[c] for c in PERSON_COLUMNS], names=PERSON_COLUMNS)


def unit_mdf(geoids: np.ndarray, hist: sp.csr_matrix, gq_facilities: np.ndarray) -> pa.Table:
    """MDF units: housing units (RTYPE 2, HH_STATUS 1 occupied / 2 vacant) and GQ facilities (RTYPE 4)."""
    gq = sp.csr_matrix(np.asarray(gq_facilities, dtype=np.int64).reshape(-1, 1))
    # cells: occupied, vacant, GQ facility
    frame, cells = _records("MUD", geoids, sp.hstack([hist, gq]).tocsr(), "EUNUM")
    frame |= {"RTYPE": codes_column(["2", "4"], cells == 2), "HH_STATUS": codes_column(["1", "2", "0"], cells)}
    return pa.table([frame[c] for c in UNIT_COLUMNS], names=UNIT_COLUMNS)


def tabulate_person_mdf(mdf: pd.DataFrame, product: Product, hierarchy: Hierarchy | None = None) -> pd.DataFrame:
    """Block histograms (geocode, cell, count) of the persons ``product`` tabulated back from MDF persons."""
    g = mdf[list(MDF_GEOID)].astype(str)
    geoid = g["TABBLKST"] + g["TABBLKCOU"] + g["TABTRACTCE"] + g["TABBLK"]
    cell = product.schema.cell_index(mdf["GQTYPE_PL"].astype(int).to_numpy(),
                                     (mdf["VOTING_AGE"] == "2").to_numpy().astype(int),
                                     (mdf["CENHISP"] == "2").to_numpy().astype(int),
                                     mdf["CENRACE"].astype(int).to_numpy() - 1)
    return tabulation(geoid, cell)


def mdf_geoid(mdf: pa.Table, hierarchy: Hierarchy | None = None) -> pa.ChunkedArray:
    """Each MDF record's block GEOID."""
    return pc.binary_join_element_wise(*(mdf.column(c).cast(pa.large_string()) for c in MDF_GEOID),
                                       pa.scalar("", pa.large_string()))


def _is(column: pa.ChunkedArray, value: str) -> pa.ChunkedArray:
    return pc.cast(pc.equal(column, value), pa.int64())


#: What :func:`person_records` reads of a persons MDF.
PERSON_RECORD_COLUMNS = (*MDF_GEOID, "GQTYPE_PL", "VOTING_AGE", "CENHISP", "CENRACE")


def person_records(mdf: pa.Table) -> pa.Table:
    """The input person records (geoid and one column per P.L. 94-171 persons attribute) of a persons MDF (its
    :data:`PERSON_RECORD_COLUMNS`), converted in Arrow, column by column."""
    return pa.table({"geoid": mdf_geoid(mdf).cast(pa.string()), "hhgq": pc.cast(mdf["GQTYPE_PL"], pa.int64()),
                     "votingage": _is(mdf["VOTING_AGE"], "2"), "hispanic": _is(mdf["CENHISP"], "2"),
                     "cenrace": pc.subtract(pc.cast(mdf["CENRACE"], pa.int64()), 1)})


#: What :func:`housing_unit_records` reads of a units MDF.
UNIT_RECORD_COLUMNS = (*MDF_GEOID, "RTYPE", "HH_STATUS")


def housing_unit_records(mdf: pa.Table) -> pd.DataFrame:
    """The housing units (unit_type 0) of a units MDF (its :data:`UNIT_RECORD_COLUMNS`) as input unit records
    (geoid, unit_type, occupied); its group-quarters facilities carry no type."""
    hu = mdf.filter(pc.equal(mdf["RTYPE"], "2"))
    return pd.DataFrame({"geoid": mdf_geoid(hu).to_numpy(zero_copy_only=False), "unit_type": 0,
                         "occupied": pc.equal(hu["HH_STATUS"], "1").to_numpy(zero_copy_only=False)})


#: The Census MDF layouts, by their declared names.
US_LAYOUTS: tuple[MdfLayout, ...] = (
    MdfLayout(PL94_PERSONS_MDF, lambda product, geoids, hist, units, codes: person_mdf(product, geoids, hist),
              mdf_geoid, tabulate=tabulate_person_mdf, reads_back="persons", records=person_records,
              record_columns=PERSON_RECORD_COLUMNS),
    MdfLayout(PL94_UNITS_MDF,
              lambda product, geoids, hist, units, codes: unit_mdf(geoids, hist,
                                                                   units[GQ_FACILITIES].to_numpy().sum(axis=1)),
              mdf_geoid, counted_rows=lambda frame: int((frame["RTYPE"] == "2").sum()), rows_named="housing-unit",
              reads_back="units", records=housing_unit_records, record_columns=UNIT_RECORD_COLUMNS,
              needs_unit_counts=True))
