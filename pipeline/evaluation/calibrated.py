"""Intervals for published counts calibrated on two generations of replicates by size (``method`` =
``calibrated``): the replicates' error, pooled over counts of similar size, as a function of
the true count, extrapolated one generation back and inverted into a confidence interval (Neyman's
construction).

Notation as in pipeline/evaluation/amc.py: a published count q0 (one cell of one query at one node), its
replicates q_1..q_n (TopDown rerun on the published microdata), ``BIAS = mean(q_i - q0)``, ``MSE =
mean((q_i - q0)^2)``. In the replicates' world q0 is the truth, so they show how TopDown's output is spread
about a true count of that size. Per (product, level, query), over all its published cells:

(C1) bins k of the published count, :data:`EDGES`, merged upwards until each holds :data:`MIN_ROWS` cells (one
     bin where the key has fewer); per bin ``x_k = mean q0``, ``b_k = mean BIAS``, ``s_k^2 = mean MSE - b_k^2``
     (the spread of the replicates about the bin's bias, the cells' own biases included);
(C2) ``b(t)``, ``s(t)``: the points (x_k, b_k) and (x_k, s_k) joined linearly, constant beyond the ends;
(C3) the interval at level L of a published count q0 is the set of true counts t in {0, 1, 2, ...} under which
     q0 is within the central L range of its distribution, ``t + b(t) - z s(t) <= q0 <= t + b(t) + z s(t)``,
     z the normal 1 - (1 - L)/2 quantile: ``[min{t: U(t) >= q0}, max{t: L(t) <= q0}]`` with ``L`` and ``U``
     those bounds made non-decreasing in t (running maxima); integer bounds, never below 0;
(C4) the replicates start from the published data, which TopDown has already pulled toward the mean, so
     they under-state its bias and spread; replicates of one replicate (a second generation) under-state
     them again by about the same factor, so (C3) uses ``b = b_1^2 / b_2`` and ``s = s_1^2 / s_2`` at each
     knot (1: the replicates of the run, 2: those of one replicate; :func:`extrapolate`).

Why (C3) rather than AMC's ``q0 - BIAS +- t RMSE``: TopDown's error depends on the TRUE size (small counts are
pulled up, large ones down), and coverage is wanted for every true size; inverting the error's distribution
given the truth gives each true size its nominal rate where the functions are right, while a correction
evaluated at the published count mixes sizes. A key whose replicates all equal the published counts (an
invariant) gets ``[q0, q0]``. ``estimate`` of a ``calibrated`` row is the t with ``t + b(t) = q0`` (the
interval's construction at z = 0), ``variance`` = ``s(t)^2`` there; ``rep_*`` are the ``amc`` row's.
Measured (benchmarks/RESULTS_uncertainty.md, "A calibrated interval for published counts"): nominal on a
synthetic state, NOT on Rhode Island 2010 (0.80-0.88 at 90 % in most block sizes): real data lose more in the
first step than (C4) extrapolates. Experimental.
"""
from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from ..execution.memory import release_memory
from ..runtime.storage import location, parquet_file, parquet_writer, read_table
from .amc import KEY, SCHEMA, Tabulator, conform, replicate_dirs
from .bounded import z_value
from .evaluate import EvaluationError

#: Name of the rows in the uncertainty table's ``method`` column.
METHOD = "calibrated"
#: Lower edges of the size bins of (C1) (published count); the last bin is open.
EDGES = np.array([0, 1, 2, 3, 5, 7, 10, 15, 20, 30, 40, 50, 75, 100, 150, 250, 400, 700, 1_000, 2_000, 5_000,
                  10_000, 20_000, 50_000, 100_000, 200_000, 500_000, 1_000_000, 10_000_000], dtype=np.float64)
#: Fewest cells a bin of (C1) holds (bins with fewer are merged into the next larger).
MIN_ROWS = 30


def bin_of(q0: np.ndarray) -> np.ndarray:
    """Each published count's bin index in :data:`EDGES`."""
    return np.searchsorted(EDGES, np.asarray(q0, dtype=np.float64), side="right") - 1


def bin_sums(q0: np.ndarray, bias: np.ndarray, mse: np.ndarray) -> np.ndarray:
    """(bins, 4) sums per bin of 1, q0, BIAS and MSE: add those of several chunks, then :func:`fit`."""
    out = np.zeros((len(EDGES), 4))
    k = bin_of(q0)
    for j, v in enumerate((np.ones(len(k)), q0, bias, mse)):
        np.add.at(out[:, j], k, np.asarray(v, dtype=np.float64))
    return out


@dataclass(frozen=True)
class SizeModel:
    """(C2): bias ``b`` and spread ``s`` of TopDown's output at the true counts ``x`` (knots, increasing)."""

    x: np.ndarray
    b: np.ndarray
    s: np.ndarray

    def at(self, t: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        return np.interp(t, self.x, self.b), np.interp(t, self.x, self.s)


def fit(sums: np.ndarray, min_rows: int = MIN_ROWS) -> SizeModel:
    """(C1) from :func:`bin_sums`: bins merged upwards to ``min_rows`` cells (the last one downwards)."""
    groups, acc = [], np.zeros(4)
    for row in sums:
        acc = acc + row
        if acc[0] >= min_rows:
            groups.append(acc)
            acc = np.zeros(4)
    if acc[0] > 0:
        if groups:
            groups[-1] = groups[-1] + acc
        else:
            groups.append(acc)
    if not groups:
        raise ValueError("no published counts to calibrate on")
    g = np.array(groups)
    x, b = g[:, 1] / g[:, 0], g[:, 2] / g[:, 0]
    return SizeModel(x, b, np.sqrt(np.maximum(g[:, 3] / g[:, 0] - b * b, 0.0)))


#: Largest factor by which (C4) moves a knot's bias or spread from the first generation's.
MAX_RATIO = 3.0


def extrapolate(first: SizeModel, second: SizeModel) -> SizeModel:
    """(C4): one generation back. ``first`` is fitted on the replicates of the run (published -> replicate),
    ``second`` on replicates of one of them (replicate -> its replicate); TopDown's bias and spread change by
    about the same factor from one generation to the next, so at each knot of ``first``
    ``b = b1 * r_b`` and ``s = s1 * r_s`` with ``r_b = b1 / b2`` and ``r_s = s1 / s2`` (``b2``, ``s2``:
    ``second`` at that knot), each factor clipped to [1/MAX_RATIO, MAX_RATIO] and 1 where the biases' signs
    differ or one is 0."""
    b2, s2 = second.at(first.x)
    with np.errstate(divide="ignore", invalid="ignore"):
        rb = np.where(first.b * b2 > 0, first.b / b2, 1.0)
        rs = np.where((first.s > 0) & (s2 > 0), first.s / s2, 1.0)
    clip = (1 / MAX_RATIO, MAX_RATIO)
    return SizeModel(first.x, first.b * np.clip(rb, *clip), first.s * np.clip(rs, *clip))


#: Integer true counts are tried one by one up to here; above it, on a geometric grid (ratio 1.001).
DENSE = 100_000


def _grid(model: SizeModel) -> np.ndarray:
    """True counts where (C3)'s bands are evaluated: 0..DENSE, then geometric up to the last knot, and the knots."""
    top = float(model.x[-1])
    dense = np.arange(min(np.ceil(top), DENSE) + 1.0)
    sparse = np.geomspace(DENSE, top, int(np.log(top / DENSE) / np.log(1.001)) + 2) if top > DENSE else dense[:0]
    return np.unique(np.concatenate([dense, sparse, np.maximum(model.x, 0.0)]))


def _band(grid: np.ndarray, values: np.ndarray) -> np.ndarray:
    """``values`` over ``grid`` made strictly increasing (running maximum, plus a negligible slope)."""
    eps = 1e-9
    return np.maximum.accumulate(values - eps * grid) + eps * grid


def _invert(q0: np.ndarray, grid: np.ndarray, band: np.ndarray, beyond: float) -> np.ndarray:
    """The t with ``band(t) = q0`` (interpolated; 0 below the band), ``q0 - beyond`` above the grid's end."""
    return np.where(q0 > band[-1], q0 - beyond, np.interp(q0, band, grid))


def interval(q0: np.ndarray, model: SizeModel, level: float) -> tuple[np.ndarray, np.ndarray]:
    """(C3): the integer interval of true counts that ``q0`` is consistent with at ``level``."""
    q0 = np.asarray(q0, dtype=np.float64)
    z = z_value(level)
    grid = _grid(model)
    b, s = model.at(grid)
    bt, st = model.b[-1], model.s[-1]  # beyond the last knot the bounds are q0 - b -+ z s
    first = _invert(q0, grid, _band(grid, grid + b + z * s), bt + z * st)  # U(t) = q0
    last = _invert(q0, grid, _band(grid, grid + b - z * s), bt - z * st)  # L(t) = q0
    lo = np.maximum(np.ceil(first - 1e-6), 0.0)
    hi = np.maximum(np.floor(last + 1e-6), 0.0)
    return np.minimum(lo, hi), np.maximum(lo, hi)


def centre(q0: np.ndarray, model: SizeModel) -> tuple[np.ndarray, np.ndarray]:
    """The point ``t >= 0`` with ``t + b(t) = q0`` (as :func:`interval` inverts) and ``s(t)^2`` there."""
    q0 = np.asarray(q0, dtype=np.float64)
    grid = _grid(model)
    t = np.maximum(_invert(q0, grid, _band(grid, grid + model.at(grid)[0]), model.b[-1]), 0.0)
    return t, model.at(t)[1] ** 2


# ------------------------------------------------------------------------------ the uncertainty table's rows
def add_sums(sums: dict, amc: pd.DataFrame) -> None:
    """Add the (C1) bin sums of the ``amc`` rows ``amc`` to ``sums`` (per (product, level, query))."""
    for k, g in amc.groupby(KEY, sort=False):
        add = bin_sums(g["published"].to_numpy(), g["rep_bias"].to_numpy(), g["rep_rmse"].to_numpy() ** 2)
        sums[k] = sums[k] + add if k in sums else add


def rows(amc: pd.DataFrame, models: dict) -> pd.DataFrame:
    """The ``calibrated`` rows of the cells of the ``amc`` rows ``amc`` (same order), given :func:`fit` per key."""
    out = []
    for k, g in amc.groupby(KEY, sort=False):
        model, q0 = models[k], g["published"].to_numpy()
        est, var = centre(q0, model)
        lo90, hi90 = interval(q0, model, 0.90)
        lo95, hi95 = interval(q0, model, 0.95)
        out.append(g.assign(method=METHOD, estimate=est, variance=var, ci90_low=lo90, ci90_high=hi90,
                            ci95_low=lo95, ci95_high=hi95))
    return pd.concat(out).loc[amc.index] if out else amc.assign(method=METHOD).iloc[:0]


# ---------------------------------------------------------------------------------------------- driver
#: Rows of an ``amc`` part read at a time.
BATCH_ROWS = 1 << 16


def _amc_batches(part: Path, columns: list[str] | None = None):
    """The ``amc`` rows of an output part, :data:`BATCH_ROWS` at a time, as pandas frames."""
    for batch in parquet_file(part).iter_batches(batch_size=BATCH_ROWS, columns=columns):
        frame = batch.to_pandas()
        frame = frame[frame["method"] == "amc"]
        if len(frame):
            yield frame.reset_index(drop=True)


def second_generation(rep_dir: Path, second_dir: Path) -> tuple[Path, list[Path]]:
    """The replicate of ``rep_dir`` that ``second_dir`` (``topdown replicates`` of it) replicates, and those of
    its replicates whose seed differs from its own (one with the same seed has the same noise: not independent)."""
    dirs = replicate_dirs(second_dir)
    record = json.loads((second_dir / "replicates.json").read_text())
    base = location(str(record.get("run", "")))
    if base.resolve() not in {d.resolve() for d in replicate_dirs(rep_dir)}:
        raise EvaluationError(f"{second_dir}: its replicates are of {base}, not of a replicate in {rep_dir} "
                              f"(make them with `topdown replicates {rep_dir / 'rep-000'} --n 10 --out DIR`)")
    seed = json.loads((base / "config.json").read_text())["run"]["seed"]
    kept = [d for d, r in zip(dirs, record["replicates"]) if r.get("seed") != seed]
    if len(kept) < 2:
        raise EvaluationError(f"{second_dir}: {len(kept)} replicate(s) with a seed other than {base.name}'s own "
                              f"({seed}); at least 2 are needed")
    return base, kept


def second_sums(tab: Tabulator, masks: dict, base: Path, reps: list[Path]) -> dict:
    """(C1) bin sums per key of the replicates ``reps`` of the replicate ``base`` (its counts as the truth),
    over the cells ``masks`` (nodes x cells, per key) that the table holds."""
    out = {}
    for product in sorted({k[0] for k in masks}):
        if not tab.parts(base, product):
            continue
        q0 = tab.tabulate(base, product)
        s1 = {k: np.zeros_like(v) for k, v in q0.items()}
        s2 = {k: np.zeros_like(v) for k, v in q0.items()}
        for rep in reps:  # one replicate's tables at a time
            for k, v in tab.tabulate(rep, product).items():
                d = np.subtract(v, q0[k], out=v)
                s1[k] += d
                s2[k] += d * d
        n = len(reps)
        out.update({k: bin_sums(q0[k][m], s1[k][m] / n, s2[k][m] / n) for k, m in masks.items() if k in q0})
    return out


def calibrated_parts(parts: list[Path], src, staging: Path, entities: pd.DataFrame | None, rep_dir: Path,
                     second_dir: Path) -> list[Path]:
    """The ``calibrated`` rows of every ``amc`` row of the output ``parts``, as new parts in ``staging``:
    (C1) on the ``amc`` rows, (C1) on ``second_dir``'s replicates, (C4), then (C3) part by part."""
    base, reps = second_generation(rep_dir, second_dir)
    keys = sorted({tuple(r[c] for c in KEY) for p in parts
                   for r in read_table(p, columns=KEY).group_by(KEY).aggregate([]).to_pylist()})
    tab = Tabulator(src, entities, keys)
    first: dict = {}
    masks = {k: np.zeros_like(v, dtype=bool) for p in {k[0] for k in keys} for k, v in tab.zeros(p).items()}
    for part in parts:
        for frame in _amc_batches(part, [*KEY, "geocode", "cell", "method", "published", "rep_bias", "rep_rmse"]):
            add_sums(first, frame)
            for k, g in frame.groupby(KEY, sort=False):
                masks[k][tab.aggs[k[1]][0].get_indexer(g["geocode"].astype(str)), g["cell"].to_numpy()] = True
    if not first:
        return []
    second = second_sums(tab, {k: masks[k] for k in first}, base, reps)
    models = {k: extrapolate(fit(v), fit(second[k])) if k in second else fit(v) for k, v in first.items()}
    out = []
    for i, part in enumerate(parts):
        path = staging / f"calibrated-{i:05d}.parquet"
        written = False
        with parquet_writer(path, SCHEMA, compression="zstd") as writer:
            for frame in _amc_batches(part):
                writer.write_table(conform(pa.Table.from_pandas(rows(frame, models), preserve_index=False)))
                written = True
        if written:
            out.append(path)
        else:
            path.unlink()
        release_memory()
    return out
