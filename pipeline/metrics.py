"""Accuracy and empirical-privacy metrics of protected histograms against the truth (pure functions).

Conventions. The *error* (residual) of an estimate is ``protected - true`` (paper section 9, Table 12: empty
blocks have positive median error; Petti & Flaxman 2020 "DP count minus precise count"). The Bureau's
``accuracy_metrics.py`` reports quantiles of ``true - protected`` (facts 8), i.e. the mirror image.
Quantiles use the inverted-CDF definition (the smallest observed value whose CDF reaches q), so they are
observed errors, as in the paper's Tables 11-12.

Sources: facts file section 8 (bins, quantiles, Blau index, largest-share error); TopDown paper (seed 003)
section 9, Tables 9-13; Petti & Flaxman 2020 (seed 001) and Flaxman 2019 (seed 004): homogeneity index,
empirical privacy loss, simple-random-sampling baselines.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Sequence

import numpy as np
import pandas as pd
from scipy.special import logsumexp

from .queries import Query

#: Signed-error quantiles reported per bin (facts 8; paper Tables 11-12).
QUANTILES: tuple[float, ...] = (0.005, 0.025, 0.05, 0.25, 0.5, 0.75, 0.95, 0.975, 0.995)

#: Left edges of true-population bins [edge_i, edge_{i+1}); the last bin is open (facts 8).
BLOCK_BINS: tuple[int, ...] = (0, 1, 10, 100, 1000)  # 0, 1-9, 10-99, 100-999, 1000+
COUNTY_BINS: tuple[int, ...] = (0, 1001, 10000, 100000, 1000000)  # <=1000, 1001-9999, ..., >999999
#: Off-spine entity bins: the AIAN-area bins of facts 8 (0-99, 100-999, 1000-9999, 10000+).
ENTITY_BINS: tuple[int, ...] = (0, 100, 1000, 10000)

#: Largest-share tolerance: 5 percentage points (facts 8, "L1 relative", share <= 0.05).
SHARE_TOLERANCE = 0.05


# -- basic errors ---------------------------------------------------------------------------------------

def mean_abs_error(est: np.ndarray, true: np.ndarray) -> float:
    """Mean of ``|est - true|`` over all entries (NaN for no entries)."""
    err = np.asarray(est, dtype=float) - np.asarray(true, dtype=float)
    return float(np.abs(err).mean()) if err.size else float("nan")


def weighted_quantiles(values: np.ndarray, weights: np.ndarray | None, qs: Sequence[float] = QUANTILES) -> np.ndarray:
    """Inverted-CDF quantiles of ``values`` repeated ``weights`` times: for each q the smallest value v with
    (weight of values <= v) >= q * total weight. Equals ``np.quantile(np.repeat(values, weights), q,
    method="inverted_cdf")``. NaN when the total weight is 0."""
    values = np.asarray(values, dtype=float)
    weights = np.ones_like(values) if weights is None else np.asarray(weights, dtype=float)
    keep = weights > 0
    values, weights = values[keep], weights[keep]
    if not values.size:
        return np.full(len(qs), np.nan)
    order = np.argsort(values, kind="stable")
    values, cum = values[order], np.cumsum(weights[order])
    idx = np.searchsorted(cum, np.asarray(qs, dtype=float) * cum[-1], side="left")
    return values[np.minimum(idx, values.size - 1)]


def bin_labels(edges: Sequence[int]) -> list[str]:
    """Labels of the bins [e_i, e_{i+1} - 1] and the open last bin, e.g. ``0, 1-9, 10-99, 1000+``."""
    labels = []
    for lo, hi in zip(edges, list(edges[1:]) + [None]):
        if hi is None:
            labels.append(f"{lo}+")
        elif hi - 1 == lo:
            labels.append(f"{lo}")
        else:
            labels.append(f"{lo}-{hi - 1}")
    return labels


def assign_bins(true: np.ndarray, edges: Sequence[int]) -> np.ndarray:
    """Bin index of each true count (``edges`` left edges; values below edges[0] go to bin 0)."""
    return np.maximum(np.searchsorted(np.asarray(edges), np.asarray(true), side="right") - 1, 0)


def error_summary(err: np.ndarray, true: np.ndarray | None = None, qs: Sequence[float] = QUANTILES) -> dict:
    """n, mean |error|, mean signed error, mean relative |error| (|error| / max(1, true)) and signed quantiles."""
    err = np.asarray(err, dtype=float)
    row = {"n": int(err.size), "mean_abs_error": float(np.abs(err).mean()) if err.size else np.nan,
           "mean_signed_error": float(err.mean()) if err.size else np.nan}
    if true is not None:
        rel = np.abs(err) / np.maximum(1.0, np.asarray(true, dtype=float))
        row["mean_rel_abs_error"] = float(rel.mean()) if err.size else np.nan
    row.update({quantile_column(q): v for q, v in zip(qs, weighted_quantiles(err, None, qs))})
    return row


def quantile_column(q: float) -> str:
    return f"q{q:g}"


def errors_by_bin(true: np.ndarray, err: np.ndarray, edges: Sequence[int], qs: Sequence[float] = QUANTILES
                  ) -> pd.DataFrame:
    """Error distribution of one query answer per geounit, by true-count bin (facts 8; paper Tables 11-12).

    One row per bin (all bins, empty ones with n = 0) and a final row ``bin = "all"``.
    """
    true, err = np.asarray(true), np.asarray(err, dtype=float)
    idx = assign_bins(true, edges)
    rows = []
    for b, label in enumerate(bin_labels(edges)):
        sel = idx == b
        rows.append({"bin": label, **error_summary(err[sel], true[sel], qs)})
    rows.append({"bin": "all", **error_summary(err, true, qs)})
    return pd.DataFrame(rows)


# -- sparse query errors -----------------------------------------------------------------------------

@dataclass
class SparseHist:
    """Histograms of ``n_units`` geounits in long form: unit index, cell, count (zero cells may be omitted)."""

    unit: np.ndarray  # int64
    cell: np.ndarray  # int64
    count: np.ndarray  # float64 or int64
    n_units: int


@dataclass
class QueryErrors:
    """Errors of one query at ``n_units`` geounits.

    ``l1[u]`` is sum_i |est_i - true_i| over the answers of unit u (paper section 9, Tables 9-10);
    ``values``/``counts`` the distribution of all n_units x n_answers residuals (zeros included);
    ``true``/``est`` the dense answers [n_units, n_answers] when they were small enough to build.
    """

    n_units: int
    n_answers: int
    l1: np.ndarray
    values: np.ndarray
    counts: np.ndarray
    true: np.ndarray | None = None
    est: np.ndarray | None = None

    @property
    def mean_abs_error(self) -> float:
        """Average over geounits of the query's L1 error (paper Tables 9-10)."""
        return float(self.l1.mean()) if self.n_units else float("nan")

    def abs_quantiles(self, qs: Sequence[float]) -> np.ndarray:
        """Quantiles of |residual| over all answers of all geounits."""
        return weighted_quantiles(np.abs(self.values), self.counts, qs)

    def signed_quantiles(self, qs: Sequence[float]) -> np.ndarray:
        return weighted_quantiles(self.values, self.counts, qs)


def answer_totals(hist: SparseHist, query: Query) -> tuple[np.ndarray, np.ndarray]:
    """Sparse query answers: sorted keys ``unit * n_answers + answer`` and their sums (zeros dropped)."""
    g = query.groups[np.asarray(hist.cell, dtype=np.int64)]
    keep = g >= 0
    keys = np.asarray(hist.unit, dtype=np.int64)[keep] * query.n_answers + g[keep]
    uniq, inv = np.unique(keys, return_inverse=True)
    sums = np.bincount(inv, weights=np.asarray(hist.count, dtype=float)[keep], minlength=uniq.size)
    nz = sums != 0
    return uniq[nz], sums[nz]


def query_errors(true: SparseHist, est: SparseHist, query: Query, dense_limit: int = 20_000_000) -> QueryErrors:
    """Errors ``est - true`` of ``query`` at every geounit, computed sparsely (zero answers never built)."""
    if true.n_units != est.n_units:
        raise ValueError(f"query {query.name!r}: truth has {true.n_units} geounits, estimate {est.n_units}")
    n, a = true.n_units, query.n_answers
    kt, vt = answer_totals(true, query)
    ke, ve = answer_totals(est, query)
    keys, inv = np.unique(np.concatenate([kt, ke]), return_inverse=True)
    err = np.bincount(inv, weights=np.concatenate([-vt, ve]), minlength=keys.size)
    l1 = np.bincount(keys // a, weights=np.abs(err), minlength=n) if keys.size else np.zeros(n)
    nonzero = err[err != 0]
    vals, cnts = np.unique(nonzero, return_counts=True)
    zeros = n * a - nonzero.size
    if zeros:
        pos = np.searchsorted(vals, 0.0)
        vals, cnts = np.insert(vals, pos, 0.0), np.insert(cnts, pos, zeros)
    out = QueryErrors(n, a, l1.astype(float), vals.astype(float), cnts.astype(np.int64))
    if n * a <= dense_limit:
        dense_t, dense_e = np.zeros(n * a), np.zeros(n * a)
        dense_t[kt], dense_e[ke] = vt, ve
        out.true, out.est = dense_t.reshape(n, a), dense_e.reshape(n, a)
    return out


def nonzero_cells(hist: SparseHist) -> np.ndarray:
    """Number of distinct non-zero cells per geounit."""
    keys = np.unique(np.asarray(hist.unit, dtype=np.int64)[np.asarray(hist.count) != 0] * (2**31)
                     + np.asarray(hist.cell, dtype=np.int64)[np.asarray(hist.count) != 0])
    return np.bincount(keys // (2**31), minlength=hist.n_units)


# -- Blau index (facts 8 `print_blau_quintile_errors`; paper Table 13) ------------------------------

def blau_index(counts: np.ndarray) -> np.ndarray:
    """Blau diversity 1 - sum_i n_i^2 / N^2 per row of ``counts[units, groups]``; NaN where N = 0."""
    counts = np.asarray(counts, dtype=float)
    total = counts.sum(axis=1)
    with np.errstate(invalid="ignore", divide="ignore"):
        out = 1.0 - (counts**2).sum(axis=1) / total**2
    return np.where(total > 0, out, np.nan)


def quintiles(values: np.ndarray) -> np.ndarray:
    """Quintile 1..5 of each value by rank (ties broken by position, so quintiles are equal-sized:
    the i-th smallest of n values, i = 1..n, is in quintile ceil(5 i / n))."""
    values = np.asarray(values, dtype=float)
    n = values.size
    rank = np.empty(n, dtype=np.int64)
    rank[np.argsort(values, kind="stable")] = np.arange(1, n + 1)
    return -(-5 * rank // n) if n else rank


def blau_quintile_errors(blau: np.ndarray, err: np.ndarray) -> pd.DataFrame:
    """Mean signed and mean absolute total error per Blau quintile (geounits with no Blau index, i.e.
    zero true population, are left out)."""
    blau, err = np.asarray(blau, dtype=float), np.asarray(err, dtype=float)
    keep = ~np.isnan(blau)
    blau, err = blau[keep], err[keep]
    q = quintiles(blau)
    rows = []
    for k in range(1, 6):
        sel = q == k
        rows.append({"quintile": k, "n": int(sel.sum()),
                     "blau_min": float(blau[sel].min()) if sel.any() else np.nan,
                     "blau_max": float(blau[sel].max()) if sel.any() else np.nan,
                     "mean_signed_error": float(err[sel].mean()) if sel.any() else np.nan,
                     "mean_abs_error": float(np.abs(err[sel]).mean()) if sel.any() else np.nan})
    return pd.DataFrame(rows)


# -- homogeneity index (Petti & Flaxman 2020, "Our evaluation approach" 3) -----------------------------

def homogeneity_index(nonzero: np.ndarray, ncells: int) -> np.ndarray:
    """Number of cells of the detailed histogram with a true count of zero."""
    return ncells - np.asarray(nonzero, dtype=np.int64)


def bias_by_homogeneity(index: np.ndarray, err: np.ndarray) -> pd.DataFrame:
    """Bias (mean signed error) and mean |error| of the total per homogeneity-index value."""
    frame = pd.DataFrame({"homogeneity": np.asarray(index, dtype=np.int64), "err": np.asarray(err, dtype=float)})
    frame["abs"] = frame["err"].abs()
    out = frame.groupby("homogeneity").agg(n=("err", "size"), bias=("err", "mean"), mean_abs_error=("abs", "mean"))
    return out.reset_index()


# -- largest-group share (facts 8 "L1 relative") ------------------------------------------------------

def largest_share_error(est: np.ndarray, true: np.ndarray) -> np.ndarray:
    """Per geounit |est_k / est_total - true_k / true_total| where k is the answer LARGEST in the protected
    data (first one on ties). 0 if both totals are 0; NaN (excluded) if exactly one total is 0."""
    est, true = np.asarray(est, dtype=float), np.asarray(true, dtype=float)
    te, tt = est.sum(axis=1), true.sum(axis=1)
    k = est.argmax(axis=1)
    rows = np.arange(est.shape[0])
    with np.errstate(invalid="ignore", divide="ignore"):
        out = np.abs(est[rows, k] / te - true[rows, k] / tt)
    out = np.where((te == 0) & (tt == 0), 0.0, out)
    return np.where((te == 0) ^ (tt == 0), np.nan, out)


def entity_metrics(true_total: np.ndarray, err_total: np.ndarray, share_err: np.ndarray,
                   edges: Sequence[int] = ENTITY_BINS, tol: float = SHARE_TOLERANCE) -> pd.DataFrame:
    """Per true-population bin (and "all"): n entities, mean |total error|, mean signed total error, and the
    share of entities whose largest group's share is within ``tol`` of the truth (over entities where it
    is defined, ``n_share``)."""
    true_total, err_total = np.asarray(true_total), np.asarray(err_total, dtype=float)
    share_err = np.asarray(share_err, dtype=float)
    idx = assign_bins(true_total, edges)

    def row(sel: np.ndarray) -> dict:
        defined = sel & ~np.isnan(share_err)
        return {"n": int(sel.sum()),
                "mean_abs_error": float(np.abs(err_total[sel]).mean()) if sel.any() else np.nan,
                "mean_signed_error": float(err_total[sel].mean()) if sel.any() else np.nan,
                "n_share": int(defined.sum()),
                "share_within_5pp": float((share_err[defined] <= tol + 1e-12).mean()) if defined.any() else np.nan}

    rows = [{"bin": label, **row(idx == b)} for b, label in enumerate(bin_labels(edges))]
    rows.append({"bin": "all", **row(np.ones(idx.size, dtype=bool))})
    return pd.DataFrame(rows)


# -- empirical privacy loss (Petti & Flaxman 2020; Flaxman 2019 section 2.3) ---------------------------

@dataclass
class EPLResult:
    """``epl = max |EPL(x)|`` over integer x with -bound <= x and x + 1 <= bound; the curve ``epl_x``."""

    epl: float
    bound: float
    bandwidth: float
    x: np.ndarray
    epl_x: np.ndarray


def kde_log_density(values: np.ndarray, counts: np.ndarray | None, x: np.ndarray, factor: float = 0.1
                    ) -> tuple[np.ndarray, float]:
    """log p(x) of the 1-D Gaussian KDE of the pooled residuals (``values`` repeated ``counts`` times) and its
    bandwidth. Identical to ``scipy.stats.gaussian_kde(pooled, bw_method=factor)``: bandwidth = factor x the
    sample standard deviation (ddof 1) of the pooled residuals; evaluated in log space on unique values so
    millions of residuals cost as much as their distinct values and far tails do not underflow."""
    values = np.asarray(values, dtype=float)
    counts = np.ones_like(values) if counts is None else np.asarray(counts, dtype=float)
    n = counts.sum()
    mean = (values * counts).sum() / n
    var = (counts * (values - mean) ** 2).sum() / (n - 1)
    h = factor * np.sqrt(var)
    x = np.asarray(x, dtype=float)
    z = (x[:, None] - values[None, :]) / h
    logp = logsumexp(-0.5 * z**2, b=counts[None, :], axis=1) - np.log(n * h * np.sqrt(2 * np.pi))
    return logp, float(h)


def central_bound(values: np.ndarray, counts: np.ndarray | None, quantile: float = 0.99, scale: float = 1.5) -> float:
    """Half-width of the central range: ``scale`` x max(|q_(1-quantile)|, |q_quantile|) of the residuals
    (Petti & Flaxman's replication code: 1.5 x the larger of the 1st and 99th percentiles; Flaxman 2019 sec.
    2.3 parameterises K as a scaling factor times a residual percentile)."""
    lo, hi = weighted_quantiles(values, counts, (1 - quantile, quantile))
    return float(scale * max(abs(lo), abs(hi)))


def empirical_privacy_loss(values: np.ndarray, counts: np.ndarray | None = None, factor: float = 0.1,
                           quantile: float = 0.99, scale: float = 1.5) -> EPLResult:
    """EPL = max over the central range of |log p(x) / p(x+1)|, p the Gaussian KDE (bandwidth factor 0.1)
    of the pooled residuals (Petti & Flaxman 2020, eq. for EPL(x)).

    x runs over the integers with -B <= x and x + 1 <= B, B = :func:`central_bound` (at least x = -1, 0 so
    that tiny residual spreads are still evaluated). Residuals that are all equal (invariants) have no
    density: EPL is +inf (an exactly published count has unbounded privacy loss).
    """
    values = np.asarray(values, dtype=float)
    counts = np.ones_like(values) if counts is None else np.asarray(counts, dtype=float)
    keep = counts > 0
    values, counts = values[keep], counts[keep]
    if values.size == 0:
        raise ValueError("empirical_privacy_loss: no residuals")
    bound = central_bound(values, counts, quantile, scale)
    if np.unique(values).size < 2:
        return EPLResult(float("inf"), bound, 0.0, np.zeros(0), np.zeros(0))
    top = max(int(np.floor(bound)), 1)
    x = np.arange(-top, top, dtype=float)
    logp, h = kde_log_density(values, counts, np.append(x, float(top)), factor)
    epl_x = logp[:-1] - logp[1:]
    return EPLResult(float(np.abs(epl_x).max()), bound, h, x, epl_x)


# -- simple random sampling baseline (Petti & Flaxman 2020) -------------------------------------------

def simple_random_sample(n_records: int, rate: float, seed: Sequence[int] | int) -> np.ndarray:
    """Sorted indices of a simple random sample without replacement of round(rate x n) records.

    Not a privacy mechanism (a non-DP baseline), so a seeded NumPy generator is adequate here."""
    if not 0 < rate <= 1:
        raise ValueError(f"sampling rate {rate} is not in (0, 1]")
    rng = np.random.default_rng(seed)
    size = int(round(rate * n_records))
    return np.sort(rng.choice(n_records, size=size, replace=False))
