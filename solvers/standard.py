"""The compiled form every pass works on: ``lo <= A z <= hi``, ``lb <= z <= ub``, in layout column order."""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

from .layout import Layout

#: Row families in the order the builders emit them.
FAMILIES = ("definitions", "parent", "marginal", "constraints", "group_totals")


@dataclass
class StandardForm:
    """A parent's structural rows and base column bounds (x, sp, sn >= 0; aux columns free)."""

    a: sp.csr_matrix
    lo: np.ndarray
    hi: np.ndarray
    lb: np.ndarray
    ub: np.ndarray
    rows: dict[str, slice]  # family -> its rows

    @property
    def shape(self) -> tuple[int, int]:
        return self.a.shape


def base_bounds(layout: Layout) -> tuple[np.ndarray, np.ndarray]:
    """Column bounds before any pass: counts and parent slacks are non-negative, aux columns free."""
    lb = np.full(layout.n_cols, -np.inf)
    lb[layout.xcol[layout.xcol >= 0]] = 0.0
    for s in (layout.spcol, layout.sncol):
        lb[s[s >= 0]] = 0.0
    return lb, np.full(layout.n_cols, np.inf)


def family_slices(layout: Layout) -> dict[str, slice]:
    out, start = {}, 0
    for name in FAMILIES:
        n = len(layout.families[name])
        out[name] = slice(start, start + n)
        start += n
    return out
