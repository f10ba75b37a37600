"""Direct numpy/scipy build of the same StandardForm as the Pyomo model: the floor that the Pyomo path
is benchmarked against (benchmarks/parents.py) and a cross-check in the tests."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .layout import Layout
from .standard import FAMILIES, StandardForm, base_bounds, family_slices


def compile_direct(layout: Layout) -> StandardForm:
    """Stack the layout's row families into one CSR matrix."""
    indptr, cols, coefs, lo, hi = [np.zeros(1, dtype=np.int64)], [], [], [], []
    offset = 0
    for name in FAMILIES:
        rows = layout.families[name]
        if not len(rows):
            continue
        indptr.append(np.asarray(rows.indptr[1:], dtype=np.int64) + offset)
        offset += rows.indptr[-1]
        cols += rows.cols
        coefs += rows.coefs
        lo += rows.lo
        hi += rows.hi
    cat = (lambda parts, dt: np.concatenate(parts).astype(dt) if parts else np.zeros(0, dt))
    a = sp.csr_matrix((cat(coefs, float), cat(cols, np.int64), np.concatenate(indptr)),
                      shape=(len(lo), layout.n_cols))
    lb, ub = base_bounds(layout)
    return StandardForm(a, np.asarray(lo, float), np.asarray(hi, float), lb, ub, family_slices(layout))
