"""The solver inputs built from CSR arrays are the matrices scipy's stacking gives, entry for entry
and in the same order, so the solvers see the same problem and return the same solution:
``backends._cone_rows`` (Clarabel's cone rows) and ``rounder.flow_rows`` / ``with_flow_rows`` (the
rounder's flow LP)."""
from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from hypothesis import given, settings
from hypothesis import strategies as st

from topdown.solvers.backends import _cone_rows
from topdown.solvers.rounder import flow_rows, with_flow_rows


def _same(x: sp.spmatrix, y: sp.spmatrix) -> None:
    assert x.format == y.format and x.shape == y.shape
    np.testing.assert_array_equal(x.indptr, y.indptr)
    np.testing.assert_array_equal(x.indices, y.indices)
    assert x.data.tobytes() == y.data.tobytes()


def _matrix(rng: np.random.Generator, m: int, n: int) -> sp.csr_matrix:
    a = sp.random(m, n, density=0.3, format="csr", random_state=rng)
    a.data = rng.choice([-1.0, 1.0, 2.5], size=a.data.size)
    return a


def _cone_rows_reference(a, lo, hi, lb, ub):
    """The stacked form by scipy's row indexing and vstack (the construction the direct build replaced)."""
    n = a.shape[1]
    eq = np.isfinite(lo) & np.isfinite(hi) & (lo == hi)
    up, down = np.isfinite(hi) & ~eq, np.isfinite(lo) & ~eq
    col_up, col_down = np.flatnonzero(np.isfinite(ub)), np.flatnonzero(np.isfinite(lb))

    def unit(cols, value):
        return sp.csr_matrix((np.full(cols.size, value), cols, np.arange(cols.size + 1)), shape=(cols.size, n))

    mat = sp.vstack([a[eq], a[up], -a[down], unit(col_up, 1.0), unit(col_down, -1.0)], format="csc")
    rhs = np.concatenate([hi[eq], hi[up], -lo[down], ub[col_up], -lb[col_down]])
    return mat, rhs, int(eq.sum()), mat.shape[0] - int(eq.sum())


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(0, 12), st.integers(1, 10))
def test_cone_rows_equal_scipy_stacking(seed: int, m: int, n: int) -> None:
    rng = np.random.default_rng(seed)
    a = _matrix(rng, m, n)
    lo = rng.choice([-np.inf, -1.0, 0.0, 2.0], size=m)
    hi = np.where(rng.random(m) < 0.4, lo, rng.choice([np.inf, 0.0, 3.0], size=m))
    hi = np.where(np.isfinite(lo) & np.isfinite(hi), np.maximum(lo, hi), hi)
    lb = rng.choice([-np.inf, 0.0, 1.0], size=n)
    ub = rng.choice([np.inf, 5.0], size=n)
    got, want = _cone_rows(a, lo, hi, lb, ub), _cone_rows_reference(a, lo, hi, lb, ub)
    _same(got[0], want[0])
    np.testing.assert_array_equal(got[1], want[1])
    assert got[2:] == want[2:]


def _as_lp_reads(a: sp.spmatrix) -> sp.csc_matrix:
    """The matrix as ``ClarabelHighs.lp`` passes it to HiGHS (CSC, sorted indices)."""
    csc = sp.csc_matrix(a)
    csc.sort_indices()
    return csc


def _flow_reference(a: sp.csr_matrix, blocks: list[tuple[sp.csr_matrix, np.ndarray]]):
    """The rounder's LP matrix and extra columns by per-query blocks and scipy's hstack/vstack."""
    m, n = a.shape
    mats, rhs, cost, ub, width = [], [], [], [], 0
    for rows, target in blocks:
        g = rows.shape[0]
        r = np.floor(target + 1e-9)
        f = np.clip(target - r, 0.0, 1.0)
        eye = sp.identity(g, format="csr")
        mats.append((sp.hstack([rows, -eye, -eye, eye], format="csr"), width))
        rhs.append(r)
        cost.append(np.concatenate([1.0 - 2.0 * f, np.ones(2 * g)]))
        ub.append(np.concatenate([np.ones(g), np.full(2 * g, np.inf)]))
        width += 3 * g
    extra = [sp.hstack([b[:, :n], sp.csr_matrix((b.shape[0], off)), b[:, n:],
                        sp.csr_matrix((b.shape[0], width - off - (b.shape[1] - n)))], format="csr") for b, off in mats]
    full = sp.vstack([sp.hstack([a, sp.csr_matrix((m, width))], format="csr")] + extra, format="csr")
    cat = (lambda parts: np.concatenate(parts) if parts else np.zeros(0))
    return full, cat(rhs), cat(cost), np.zeros(width), cat(ub)


@settings(max_examples=60, deadline=None)
@given(st.integers(0, 2**32 - 1), st.integers(1, 10), st.integers(1, 12),
       st.lists(st.integers(0, 6), min_size=0, max_size=4))
def test_flow_rows_equal_the_stacked_blocks(seed: int, m: int, n: int, sizes: list[int]) -> None:
    rng = np.random.default_rng(seed)
    a = _matrix(rng, m, n)
    blocks = [(sp.csr_matrix((rng.random((g, n)) < 0.4).astype(float)), rng.random(g) * rng.choice([0.5, 3.0, 40.0]))
              for g in sizes]  # each query's rows over the n variables, and their L2 targets
    rows = sp.vstack([b for b, _ in blocks], format="csr") if blocks else sp.csr_matrix((0, n))
    target = np.concatenate([t for _, t in blocks]) if blocks else np.zeros(0)
    flow, rhs, cost, lb, ub = flow_rows(rows, target, [b.shape[0] for b, _ in blocks])
    want = _flow_reference(a, blocks)
    _same(_as_lp_reads(with_flow_rows(a, flow)), _as_lp_reads(want[0]))
    for got, ref in zip((rhs, cost, lb, ub), want[1:]):
        np.testing.assert_array_equal(got, ref)


def test_highs_prints_nothing_to_stdout():
    """HiGHS 1.16 prints a banner when a process makes its first Highs; the back end keeps stdout clean
    (the CLI's output, a worker's console, the benchmarks' JSON lines)."""
    import subprocess
    import sys

    code = ("import numpy as np, scipy.sparse as sp\n"
            "from topdown.solvers.backends import DEFAULT_BACKEND as b\n"
            "r = b.lp(np.ones(2), sp.csr_matrix(np.ones((1, 2))), np.ones(1), np.ones(1), np.zeros(2), np.ones(2))\n"
            "print('x', r.ok, float(r.x.sum()))\n")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout == "x True 1.0\n"


def test_an_lp_without_columns_is_decided_by_its_rows():
    """A rounder pass with nothing left to round gives an LP without columns; HiGHS would answer "Empty".
    The back end decides it: optimal when every row holds at 0, infeasible otherwise."""
    import scipy.sparse as sp

    from topdown.solvers.backends import DEFAULT_BACKEND

    empty = sp.csr_matrix((2, 0))
    ok = DEFAULT_BACKEND.lp(np.zeros(0), empty, np.array([0.0, -1.0]), np.array([0.0, np.inf]), np.zeros(0), np.zeros(0),
                            presolve=False)
    assert ok.ok and ok.status == "Optimal" and ok.x.size == 0
    bad = DEFAULT_BACKEND.lp(np.zeros(0), empty, np.array([1.0, 0.0]), np.array([1.0, 0.0]), np.zeros(0), np.zeros(0))
    assert not bad.ok and bad.status == "Infeasible"
