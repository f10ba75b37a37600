"""Microdata Detail Files: one row per record, with its geography; the layouts a product may declare
(:data:`MDF_LAYOUT`).

Leaf histograms are expanded cell by cell and the records of a leaf numbered in cell order, so the files are
deterministic. A declared product's ``mdf = "generic"`` layout (:func:`generic_mdf`) has one code column per
level below the root, the record's number within its leaf (:data:`RECORD_NUMBER`) and one column per attribute
(its label when the attribute declares labels, else its level); the Census MDF layouts are in :mod:`.us_mdf`.
"""
from __future__ import annotations

import numpy as np
import pandas as pd
import pyarrow as pa
import scipy.sparse as sp

from topdown.vocab.census import GENERIC_MDF, Hierarchy, Product

from ..configuration.errors import ConfigError
from .layout import MdfLayout, codes_column, expand, tabulation
from .us_mdf import US_LAYOUTS

#: The generic MDF's column numbering a leaf's records, in cell order.
RECORD_NUMBER = "record"

#: ``pq.write_table`` options of an MDF part: its string columns are dictionary arrays in memory (a code per
#: record, not a string) and plain strings to readers (the file stores no Arrow schema).
MDF_PARQUET = {"store_schema": False}


def generic_mdf(product: Product, codes: pd.DataFrame, hist: sp.csr_matrix) -> pa.Table:
    """The generic MDF of a declared ``product``: one row per record of the leaf histograms ``hist`` (row i the
    leaf whose level codes are row i of ``codes``: one column per level below the root, named by the level),
    with those codes, :data:`RECORD_NUMBER` and one column per attribute (label, or level as an integer)."""
    rows, cells, seq = expand(hist)
    frame: dict[str, pa.Array] = {}
    for level in codes.columns:
        values, which = np.unique(codes[level].to_numpy(dtype=object).astype(str), return_inverse=True)
        frame[level] = codes_column(values, which[rows])
    frame[RECORD_NUMBER] = pa.array(seq.astype(np.int64))
    for attribute, levels in zip(product.attributes, product.schema.unravel(cells)):
        levels = np.asarray(levels)
        frame[attribute.name] = (codes_column(list(attribute.labels), levels) if attribute.labels
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
    return tabulation(mdf[hierarchy.leaf].astype(str).to_numpy(), cell)


#: The generic layout.
GENERIC = MdfLayout(GENERIC_MDF, lambda product, geoids, hist, units, codes: generic_mdf(product, codes, hist),
                    lambda table, hierarchy: table.column(hierarchy.leaf), tabulate=tabulate_generic_mdf)
#: Every MDF layout, by its declared name (the declaration loader's ``MDF_LAYOUTS``).
MDF_LAYOUT: dict[str, MdfLayout] = {layout.name: layout for layout in (GENERIC, *US_LAYOUTS)}


def layout_of(product: Product) -> MdfLayout:
    """The MDF layout ``product`` declares."""
    try:
        return MDF_LAYOUT[product.mdf]
    except KeyError:
        raise ConfigError(f"product {product.name!r}: MDF layout {product.mdf!r} is not available in this version "
                          f"(layouts: {', '.join(MDF_LAYOUT)})") from None


def product_mdf(product: Product, geoids: np.ndarray, hist: sp.csr_matrix, units: pd.DataFrame,
                codes: pd.DataFrame | None = None) -> pa.Table:
    """One task's MDF rows in ``product``'s declared layout (``geoids`` its blocks, ``hist`` their estimated
    histograms, ``units`` their invariant unit counts u0..u7, ``codes`` their level codes for the generic one)."""
    return layout_of(product).write(product, geoids, hist, units, codes)
