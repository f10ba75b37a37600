"""The noisy measurement file (NMF): a run's noisy measurements, invariants and constraints in the layout
the Census Bureau published for 2020, and its reader.

Layout of ``topdown nmf RUN --out DIR`` (format ``topdown-nmf/1``)::

    DIR/nmf.json                                   run name, config SHA-256, mechanism and rho per product,
                                                   levels, schema dimensions, the queries measured per level
    DIR/<product>/<Level>.parquet/DPQuery/part-NNNNN.parquet
        geocode       str     spine node (the run's spine.parquet geocodes)
        query_name    str     the measured query, e.g. ``votingage * hispanic * cenrace``
        value         list<int64>  the noisy answers in the query's cell order (below)
        variance      float64 the noise variance of every answer of this query at this node
        budget_share  str     exact fraction of the product's total rho spent on this query at this node
    DIR/<product>/<Level>.parquet/Constraint/part-00000.parquet
        geocode       str
        query_name    str     constraint name (``total``, ``hhgq_total_lb``, ``hhgq_total_ub``, ``nurse_nva_0``,
                              ``hh_lb_occupied``) or invariant name (``gqhh_vect``: housing units and group-quarters
                              facilities of the 8 hhgq types; ``tot``: persons, where declared; ``hu_tot``;
                              ``tot_whole_state``: at the State level of a spine that splits a state into
                              AIAN / non-AIAN parts, the whole state's persons total, geocode = state FIPS)
        kind          str     ``constraint`` or ``invariant``
        query         str     the query the right-hand side applies to (empty for unit-count invariants)
        sign          str     ``=``, ``<=`` or ``>=``
        value         list<float64>  right-hand side, one entry per answer of ``query``

Cell order: the answers of a query are the Kronecker product of its factors over the schema's axes in schema
order (persons: hhgq 8, votingage 2, hispanic 2, cenrace 63, the last fastest; a recode's answers are its
groups in declared order), as ``vocab/queries.py`` defines; ``detailed`` is the histogram itself. Every
node of every level has Constraint rows (its invariants); a node whose budget was moved away by bypassing has
no DPQuery rows. Nothing in the file is confidential: DPQuery values are the published noisy measurements and
Constraint values are the declared invariants and right-hand sides computed from them.
"""
from __future__ import annotations

import json
import os
import shutil
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from topdown.geo.spine import Spine

from ..inputs.validate import InputError
from .invariants import UNIT_COLUMNS
from .levels import level_constraints, published_units
from .progress import track
from .rundir import MEASURED, RunReader, check_out, removed_on_failure, write_json_atomic, write_table
from topdown.vocab.census import Product

FORMAT = "topdown-nmf/1"
SIGNS = {"==": "=", "<=": "<=", ">=": ">="}
MEASUREMENT_COLUMNS = ("geocode", "query", "answer", "value", "variance")
#: The Constraint rows of a whole state's persons total where the spine splits the state into parts.
WHOLE_STATE_TOTAL = "tot_whole_state"


def node_shares(spine: Spine, budget, level: str) -> dict[str, Fraction]:
    """Each node's geolevel budget share (the levels whose budget it carries after bypassing)."""
    return {g: sum((budget.levels[lv] for lv in spine.budget_levels(level, g)), Fraction(0))
            for g in spine.nodes(level)}


# ------------------------------------------------------------------------------------------------ writer
def _dpquery_table(long: pd.DataFrame, shares: dict[str, Fraction], query_shares: dict[str, Fraction]) -> pa.Table:
    """Long measurement rows (geocode, query, answer, value, variance) as one DPQuery row per (node, query)."""
    long = long.sort_values(["geocode", "query", "answer"], kind="stable")
    geo, qry = long["geocode"].to_numpy(dtype=object), long["query"].to_numpy(dtype=object)
    first = np.ones(len(long), dtype=bool)
    first[1:] = (geo[1:] != geo[:-1]) | (qry[1:] != qry[:-1])
    starts = np.flatnonzero(first)
    offsets = np.append(starts, len(long)).astype(np.int32)
    values = pa.ListArray.from_arrays(pa.array(offsets), pa.array(long["value"].to_numpy(np.int64)))
    g, q = geo[starts], qry[starts]
    return pa.table({
        "geocode": pa.array(g, pa.string()), "query_name": pa.array(q, pa.string()), "value": values,
        "variance": pa.array(long["variance"].to_numpy(np.float64)[starts]),
        "budget_share": pa.array([str(shares[a] * query_shares[b]) for a, b in zip(g, q)], pa.string()),
    })


def nmf_invariants(product: Product) -> list[tuple[str, tuple[str, ...], str]]:
    """The rows of ``product``'s invariants in the NMF, from their declared kinds, in the order unit counts,
    totals, housing units: (name, the invariants file's columns, query). ``unit_total`` is the sum of the
    ``unit_counts`` row and has no row of its own."""
    columns = {"unit_counts": (tuple(UNIT_COLUMNS), ""), "total": (("tot",), "total"), "housing_units": (("u0",), "total")}
    return [(name, *columns[kind]) for kind in columns for name, spec in product.invariants.items() if spec.kind == kind]


def _constraint_table(product: Product, nodes: pd.Index, units: pd.DataFrame, cons,
                      whole_states: pd.Series | None = None) -> pa.Table:
    """Invariant and constraint rows of one level, in (geocode, kind, name) order; ``whole_states``: the
    whole-state totals of states split into parts (rows geocode = state FIPS)."""
    rows: list[tuple] = []
    if whole_states is not None:
        rows += [(str(g), WHOLE_STATE_TOTAL, "invariant", "total", "=", [float(v)]) for g, v in whole_states.items()]
    for name, cols, query in nmf_invariants(product):
        if all(c in units.columns for c in cols):
            vals = units[list(cols)].to_numpy(dtype=float)
            rows += [(g, name, "invariant", query, "=", list(v)) for g, v in zip(nodes, vals) if not np.isnan(v).any()]
    for c in cons.rhs.values():
        rows += [(g, c.name, "constraint", c.query, SIGNS[c.sense], list(v)) for g, v in zip(nodes, c.rhs)
                 if not np.isnan(v).any()]
    rows.sort(key=lambda r: (r[0], r[2], r[1]))
    cols = list(zip(*rows)) if rows else [[]] * 6
    return pa.table({"geocode": pa.array(cols[0], pa.string()), "query_name": pa.array(cols[1], pa.string()),
                     "kind": pa.array(cols[2], pa.string()), "query": pa.array(cols[3], pa.string()),
                     "sign": pa.array(cols[4], pa.string()), "value": pa.array(cols[5], pa.list_(pa.float64()))})


def write_nmf(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the noisy measurement file of a complete run into ``out_dir`` (created; must not exist).

    The directory is built under a temporary sibling and renamed into place, so it is complete or absent.
    """
    run_dir, out_dir = Path(run_dir), Path(out_dir)
    reader = RunReader(run_dir)
    config = reader.config()
    check_out(out_dir, "the noisy measurement file (an earlier one is not replaced)", lambda _: False)
    reader.check_sums(MEASURED, "writing the noisy measurement file")
    spine = reader.spine()
    cert = reader.certificate().data
    tmp = out_dir.with_name(f".{out_dir.name}.partial")
    shutil.rmtree(tmp, ignore_errors=True)
    with removed_on_failure(tmp):  # complete or absent
        meta = {"format": FORMAT, "run": config.run.name, "config_sha256": config.digest(), "levels": spine.levels,
                "spine": spine.kind, "products": {}}
        for spec in config.run_products:
            product, schema = spec.name, spec.schema
            cfg = config.product(product)
            inv_path = reader.invariants(product)
            units, parents, _, state_total = published_units(spine, pd.read_parquet(inv_path), where=str(inv_path))
            # occupied units are not a declared invariant: a constraint that needs them has no right-hand side here
            units = [u.assign(occupied=np.nan) for u in units]
            nodes = [u.index for u in units]
            cons = level_constraints(spec, cfg, spine.levels, units, parents)
            for lv, n, u, c in track(list(zip(spine.levels, nodes, units, cons)), f"nmf {product}", unit="levels"):
                base = tmp / product / f"{lv}.parquet"
                shares = node_shares(spine, cfg.budget, lv)
                qshares = cfg.budget.queries.get(lv, {})
                parts = sorted(reader.measurements(product, lv).glob("part-*.parquet"))
                (base / "DPQuery").mkdir(parents=True, exist_ok=True)
                for i, part in enumerate(parts):
                    long = pq.read_table(part).to_pandas()
                    if len(long):
                        write_table(_dpquery_table(long, shares, qshares), base / "DPQuery" / f"part-{i:05d}.parquet")
                split = state_total is not None and "tot" in u.columns and u["tot"].isna().any()  # a state in parts
                write_table(_constraint_table(spec, n, u, c, state_total if split else None),
                            base / "Constraint" / "part-00000.parquet")
            meta["products"][product] = {
                "mechanism": cert[product]["mechanism"], "rho": cert[product].get("rho"),
                "schema": [list(d) for d in schema.dims],
                "queries": {lv: list(cfg.budget.queries.get(lv, {})) for lv in spine.levels},
            }
        write_json_atomic(tmp / "nmf.json", meta)
        if out_dir.exists():
            out_dir.rmdir()
        os.replace(tmp, out_dir)
    return out_dir


# ------------------------------------------------------------------------------------------------ reader
@dataclass
class NoisyMeasurementFile:
    """A noisy measurement file read back (the contract ``read_nmf`` keeps stable).

    * ``meta``: the ``nmf.json`` dictionary (format, run, config_sha256, levels, spine, products).
    * ``measurements[product][level]``: a DataFrame with exactly the columns and dtypes of a run's
      ``noisy_measurements/<product>/level=<L>/`` tables: geocode (str), query (str), answer (int32, the
      answer's position in the query's cell order), value (int64), variance (float64); rows sorted by
      (geocode, query, answer). Unmeasured nodes have no rows.
    * ``budget_shares[product][level]``: DataFrame geocode, query, budget_share (fractions.Fraction).
    * ``constraints[product][level]``: DataFrame geocode, name, kind (``invariant``/``constraint``), query,
      sign (``=``, ``<=``, ``>=``), value (numpy float64 array per row).
    * ``nodes[product][level]``: every node of the level (pd.Index of geocodes, sorted), measured or not.
    """

    meta: dict
    measurements: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)
    budget_shares: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)
    constraints: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)
    nodes: dict[str, dict[str, pd.Index]] = field(default_factory=dict)


def _expand(dpq: pa.Table) -> tuple[pd.DataFrame, pd.DataFrame]:
    lengths = pc.list_value_length(dpq.column("value")).to_numpy(zero_copy_only=False).astype(np.int64)
    n = int(lengths.sum())
    starts = np.repeat(np.cumsum(lengths) - lengths, lengths)
    long = pd.DataFrame({
        "geocode": np.repeat(dpq.column("geocode").to_numpy(zero_copy_only=False).astype(object), lengths),
        "query": np.repeat(dpq.column("query_name").to_numpy(zero_copy_only=False).astype(object), lengths),
        "answer": (np.arange(n) - starts).astype(np.int32),
        "value": dpq.column("value").combine_chunks().flatten().to_numpy().astype(np.int64),
        "variance": np.repeat(dpq.column("variance").to_numpy(), lengths).astype(np.float64),
    }).astype({"geocode": "str", "query": "str"})
    shares = pd.DataFrame({"geocode": dpq.column("geocode").to_pylist(), "query": dpq.column("query_name").to_pylist(),
                           "budget_share": [Fraction(s) for s in dpq.column("budget_share").to_pylist()]})
    return long, shares


def read_nmf(nmf_dir: str | Path) -> NoisyMeasurementFile:
    """Read a noisy measurement file written by :func:`write_nmf` (see :class:`NoisyMeasurementFile`)."""
    nmf_dir = Path(nmf_dir)
    meta_path = nmf_dir / "nmf.json"
    if not meta_path.exists():
        raise FileNotFoundError(f"{meta_path}: not a noisy measurement file (no nmf.json)")
    try:
        meta = json.loads(meta_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{meta_path}: not a readable noisy measurement file ({exc})") from None
    if meta.get("format") != FORMAT:
        raise InputError(f"{meta_path}: format {meta.get('format')!r}; this reader reads {FORMAT}")
    out = NoisyMeasurementFile(meta)
    for product in meta["products"]:
        for name in ("measurements", "budget_shares", "constraints", "nodes"):
            getattr(out, name)[product] = {}
        for level in meta["levels"]:
            base = nmf_dir / product / f"{level}.parquet"
            parts = sorted((base / "DPQuery").glob("part-*.parquet"))
            dpq = pa.concat_tables([pq.read_table(p) for p in parts]) if parts else None
            if dpq is not None and dpq.num_rows:
                long, shares = _expand(dpq)
            else:
                long = pd.DataFrame({"geocode": pd.Series(dtype="str"), "query": pd.Series(dtype="str"),
                                     "answer": pd.Series(dtype=np.int32), "value": pd.Series(dtype=np.int64),
                                     "variance": pd.Series(dtype=np.float64)})
                shares = pd.DataFrame({"geocode": [], "query": [], "budget_share": []})
            out.measurements[product][level] = long.sort_values(["geocode", "query", "answer"],
                                                                 kind="stable").reset_index(drop=True)
            out.budget_shares[product][level] = shares
            con = pq.read_table(base / "Constraint").to_pandas().rename(columns={"query_name": "name"})
            con["value"] = [np.asarray(v, dtype=np.float64) for v in con["value"]]
            out.constraints[product][level] = con
            out.nodes[product][level] = pd.Index(np.sort(np.union1d(con["geocode"].unique(),
                                                                    long["geocode"].unique()).astype(str)))
    return out
