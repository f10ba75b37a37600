"""Microdata Detail Files: one row per person or unit, with tabulation geography (facts 7.2, 7.3).

Block histograms are expanded cell by cell; EPNUM / EUNUM number the rows of a block in cell order,
so the files are deterministic.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import scipy.sparse as sp

from topdown.vocab.schema import PERSONS

#: MDF person columns (facts 7.2), all strings as in the Census MDF.
PERSON_COLUMNS = ["SCHEMA_TYPE_CODE", "SCHEMA_BUILD_ID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLKGRPCE",
                  "TABBLK", "EPNUM", "RTYPE", "GQTYPE_PL", "VOTING_AGE", "CENHISP", "CENRACE"]
#: CENRACE codes "01".."63" by cenrace index (a lookup, so that a block set without persons gives empty columns).
CENRACE_CODES = np.array([f"{i + 1:02d}" for i in range(63)])
UNIT_COLUMNS = ["SCHEMA_TYPE_CODE", "SCHEMA_BUILD_ID", "TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLKGRPCE",
                "TABBLK", "EUNUM", "RTYPE", "HH_STATUS"]


def _geography(geoids: np.ndarray) -> dict[str, np.ndarray]:
    g = pd.Series(geoids, dtype=str)
    return {"TABBLKST": g.str[0:2].to_numpy(), "TABBLKCOU": g.str[2:5].to_numpy(),
            "TABTRACTCE": g.str[5:11].to_numpy(), "TABBLKGRPCE": g.str[11:12].to_numpy(),
            "TABBLK": g.str[11:15].to_numpy()}


def _expand(geoids: np.ndarray, hist: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Block geoid, cell and within-block sequence number of every record."""
    coo = hist.tocoo()
    order = np.lexsort((coo.col, coo.row))
    rows, cols, counts = coo.row[order], coo.col[order], coo.data[order].astype(np.int64)
    rec_rows = np.repeat(rows, counts)
    rec_cells = np.repeat(cols, counts)
    starts = np.r_[0, np.flatnonzero(np.diff(rec_rows)) + 1]
    seq = np.arange(rec_rows.size) - np.repeat(starts, np.diff(np.r_[starts, rec_rows.size]))
    return geoids[rec_rows], rec_cells, seq


def person_mdf(geoids: np.ndarray, hist: sp.csr_matrix) -> pd.DataFrame:
    """MDF persons from block histograms (rows of ``hist`` are the blocks ``geoids``)."""
    geo, cells, seq = _expand(np.asarray(geoids), hist)
    hhgq, va, hisp, race = PERSONS.unravel(cells)
    frame = {"SCHEMA_TYPE_CODE": "MPD", "SCHEMA_BUILD_ID": "1.1.0", **_geography(geo),
             "EPNUM": seq.astype(np.int64), "RTYPE": np.where(hhgq == 0, "3", "5"),
             "GQTYPE_PL": hhgq.astype(str), "VOTING_AGE": np.where(va == 1, "2", "1"),
             "CENHISP": np.where(hisp == 1, "2", "1"), "CENRACE": CENRACE_CODES[race]}
    return pd.DataFrame(frame, columns=PERSON_COLUMNS)


def unit_mdf(geoids: np.ndarray, hist: sp.csr_matrix, gq_facilities: np.ndarray) -> pd.DataFrame:
    """MDF units: housing units (RTYPE 2, HH_STATUS 1 occupied / 2 vacant) and GQ facilities (RTYPE 4)."""
    gq = sp.csr_matrix(np.asarray(gq_facilities, dtype=np.int64).reshape(-1, 1))
    full = sp.hstack([hist, gq]).tocsr()  # cell 0 occupied, 1 vacant, 2 GQ facility
    geo, cells, seq = _expand(np.asarray(geoids), full)
    frame = {"SCHEMA_TYPE_CODE": "MUD", "SCHEMA_BUILD_ID": "1.1.0", **_geography(geo), "EUNUM": seq.astype(np.int64),
             "RTYPE": np.where(cells == 2, "4", "2"), "HH_STATUS": np.choose(cells, ["1", "2", "0"])}
    return pd.DataFrame(frame, columns=UNIT_COLUMNS)


def tabulate_person_mdf(mdf: pd.DataFrame) -> pd.DataFrame:
    """Block histograms (geocode, cell, count) tabulated back from MDF persons (for verification)."""
    geoid = mdf["TABBLKST"] + mdf["TABBLKCOU"] + mdf["TABTRACTCE"] + mdf["TABBLK"]
    cell = PERSONS.cell_index(mdf["GQTYPE_PL"].astype(int).to_numpy(), (mdf["VOTING_AGE"] == "2").to_numpy().astype(int),
                              (mdf["CENHISP"] == "2").to_numpy().astype(int), mdf["CENRACE"].astype(int).to_numpy() - 1)
    return (pd.DataFrame({"geocode": geoid, "cell": cell}).groupby(["geocode", "cell"]).size()
            .rename("count").reset_index())
