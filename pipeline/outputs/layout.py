"""An MDF layout (:class:`MdfLayout`): how a product's records are written, located, checked and read back, and
the record expansion every layout shares. The layouts themselves are in :mod:`.mdf` (the generic one, and the
table of all of them) and :mod:`.us_mdf` (the Census MDF's)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp

from topdown.vocab.census import Hierarchy, Product


@dataclass(frozen=True)
class MdfLayout:
    """One MDF layout a product may declare (``Product.mdf``).

    ``write(product, geoids, hist, units, codes)``: one task's records (``geoids`` its leaves, ``hist`` their
    histograms, ``units`` their invariant unit counts u0..u7, ``codes`` their level codes); ``leaf_codes(table,
    hierarchy)``: each record's leaf geocode (verify routes records by it); ``tabulate(frame, product,
    hierarchy)``: leaf histograms (geocode, cell, count) tabulated back from records, or None when the layout
    holds one row per counted record only (``counted_rows(frame)``: their number, named ``rows_named`` in
    verify's report); ``reads_back``: the input record kind (``persons`` or ``units``) replicates rebuild from
    it, by ``records(table)`` reading its ``record_columns``; ``needs_unit_counts``: whether ``write`` reads the
    leaves' group-quarters facility counts (u1..u7 of the invariants)."""

    name: str
    write: Callable[[Product, np.ndarray, sp.csr_matrix, pd.DataFrame, pd.DataFrame | None], pa.Table]
    leaf_codes: Callable[[pa.Table, Hierarchy], pa.ChunkedArray]
    tabulate: Callable[[pd.DataFrame, Product, Hierarchy], pd.DataFrame] | None = None
    counted_rows: Callable[[pd.DataFrame], int] | None = None
    rows_named: str = "record"
    reads_back: str | None = None
    records: Callable[[pa.Table], pa.Table | pd.DataFrame] | None = None
    record_columns: tuple[str, ...] = ()
    needs_unit_counts: bool = False


def codes_column(values: list[str] | np.ndarray, index: np.ndarray) -> pa.DictionaryArray:
    """A string column whose record i is ``values[index[i]]``."""
    return pa.DictionaryArray.from_arrays(pa.array(np.asarray(index, dtype=np.int32)),
                                          pa.array(values, type=pa.string()))


def expand(hist: sp.csr_matrix) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Leaf row, cell and within-leaf sequence number of every record of the leaf histograms ``hist``."""
    coo = hist.tocoo()
    order = np.lexsort((coo.col, coo.row))
    rows, cols, counts = coo.row[order], coo.col[order], coo.data[order].astype(np.int64)
    rec_rows = np.repeat(rows, counts)
    rec_cells = np.repeat(cols, counts)
    starts = np.r_[0, np.flatnonzero(np.diff(rec_rows)) + 1]
    seq = np.arange(rec_rows.size) - np.repeat(starts, np.diff(np.r_[starts, rec_rows.size]))
    return rec_rows, rec_cells, seq


def tabulation(geocode, cell) -> pd.DataFrame:
    """Leaf histograms (geocode, cell, count) of records with these leaf geocodes and cells."""
    return (pd.DataFrame({"geocode": geocode, "cell": cell}).groupby(["geocode", "cell"]).size()
            .rename("count").reset_index())
