"""Direct numpy/scipy build of the same StandardForm as the Pyomo model: the floor that the Pyomo path
is benchmarked against (benchmarks/parents.py) and a cross-check in the tests."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .layout import Layout
from .standard import FAMILIES, StandardForm, base_bounds, family_slices


def compile_direct(layout: Layout) -> StandardForm:
    """Stack the layout's row families into one CSR matrix."""
    parts = [layout.families[name].csr() for name in FAMILIES]
    offsets = np.cumsum([0] + [p[0][-1] for p in parts[:-1]])
    indptr = np.concatenate([[0]] + [p[0][1:] + off for p, off in zip(parts, offsets)])
    lo, hi = (np.concatenate([p[i] for p in parts]) for i in (3, 4))
    a = sp.csr_matrix((np.concatenate([p[2] for p in parts]), np.concatenate([p[1] for p in parts]), indptr),
                      shape=(lo.size, layout.n_cols))
    lb, ub = base_bounds(layout)
    return StandardForm(a, lo, hi, lb, ub, family_slices(layout))
