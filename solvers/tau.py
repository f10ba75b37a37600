"""The tau LP of eq. 7.6: the smallest uniform band around pass k's query answers that stays feasible."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp

from .backends import Backend, Result


def tau_lp(backend: Backend, a: sp.csr_matrix, lo: np.ndarray, hi: np.ndarray, lb: np.ndarray,
           ub: np.ndarray, band_cols: np.ndarray, answers: np.ndarray) -> Result:
    """min t s.t. the structural rows, the current column bounds and |z[band_cols] - answers| <= t.

    ``answers`` are pass k's values of the band columns (``Q x*_k``). Returns the LP result; its
    objective is t* (DAS-2020 ``findOptimalTol``).
    """
    m, n = a.shape
    nb = band_cols.size
    rows = np.repeat(np.arange(nb), 2)
    band = sp.csr_matrix((np.tile([1.0, -1.0], nb), (rows, np.ravel(np.column_stack((band_cols, np.full(nb, n)))))),
                         shape=(nb, n + 1))
    band_hi = sp.csr_matrix((np.tile([1.0, 1.0], nb), (rows, np.ravel(np.column_stack((band_cols, np.full(nb, n)))))),
                            shape=(nb, n + 1))
    full = sp.vstack([sp.hstack([a, sp.csr_matrix((m, 1))]), band, band_hi], format="csr")
    c = np.zeros(n + 1)
    c[n] = 1.0
    row_lo = np.concatenate([lo, np.full(nb, -np.inf), answers])
    row_hi = np.concatenate([hi, answers, np.full(nb, np.inf)])
    return backend.lp(c, full, row_lo, row_hi, np.append(lb, 0.0), np.append(ub, np.inf))
