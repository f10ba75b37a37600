"""The noisy measurement file (NMF): a run's noisy measurements and constraints in the layout of the Census
Bureau's published 2020 files, which the Bureau's GLS code reads, and a reader of both that layout and ours.

The Bureau's layout, as its public GLS code reads it (GitHub uscensusbureau/DAS_2020_GLS_Uncertainty_Evaluation:
``GLS/main_two_pass_alg.py`` ``setup_spine_structures`` and ``convert_constr_to_query``, driven by
``GLS/drivers/us_pl94_2020.py``; ``GLS/two_pass_gls_parquet.py`` reads and writes its own estimates only):

* one Spark-written Parquet folder per geolevel, ``<reader path>/<Geolevel>.parquet/``, with two parts told
  apart by folder, ``DPQuery/`` (noisy measurements) and ``Constraint/`` (constraints); geolevel names are the
  spine's (``US``, ``State``, ``County``, ``Tract``, ``Block_Group``, ``Block``); a level whose every node was
  bypassed may lack ``DPQuery/``;
* DPQuery rows, one per (node, query): ``geocode`` (string, the spine node: on the AIAN spine a State geocode
  starts with the AIAN flag), ``query_name`` (the DAS query name plus the 4-character suffix ``_dpq``; the
  reader drops the last 4 characters, ``QUERY_NAME_SUFFIX_LEN = 4``, and passes the rest to the schema's
  ``getQuery``: ``total``, ``detailed``, attribute and recode names crossed by ``" * "``), ``value`` (the noisy
  answers, one list, the query's answers flattened in C order: the schema's axes in schema order, the last
  fastest, as DAS ``SumOverGroupedQuery.answer`` flattens them), ``variance`` (one float for every answer of
  the row);
* Constraint rows, one per (node, constraint): ``geocode``, ``query_name`` (constraint name plus ``_con``;
  ``total_con`` / ``pl94_con`` is a node's total-population invariant, summed), ``sign`` (``=``, ``<=``,
  ``>=``), ``query_shape``, ``value`` (the right-hand side, one entry per answer, read as int64), ``variance``,
  ``plb``, and one string column per schema attribute holding the name of the term acting on that attribute
  in the constraint's query, or ``*`` where the query sums over it (the reader joins the non-``*`` values in
  column order with ``" * "``); an ``=`` constraint other than ``total_con`` must have zero right-hand sides;
  every node of a level has Constraint rows, so a level's nodes are read from the Constraint part;
* ``query_shape`` is DAS ``SumOverGroupedQuery.queryShape`` (the repository's
  ``GLS/das_decennial/programs/queries/querybase.py``): one entry per schema attribute, 1 where summed over,
  the number of groups where recoded, the attribute's size otherwise; ``plb`` is the query's share of the
  privacy-loss budget (``GLS/das_decennial/programs/nodes/node4sparksql.py``,
  ``DPQueryConvertibleToSparkType``: a double, with ``plb_num``/``plb_denom`` for the exact fraction). The
  GLS reader reads neither ``plb`` nor ``query_shape`` (it takes shapes from the schema); the reader also
  skips columns named ``State`` and ``County`` when it collects attribute columns. We write ``plb`` as the
  exact fraction in a string (``"26/4097"``).

What ``topdown nmf RUN --out DIR`` writes (format ``topdown-nmf/2``): that layout per product,
``DIR/<product>/`` being a Bureau reader path, plus side files the Bureau's reader never opens::

    DIR/nmf.json                                 run name, config SHA-256, mechanism and rho per product, levels,
                                                 spine kind, schema dimensions, the queries measured per level
    DIR/<product>/<Level>.parquet/DPQuery/part-NNNNN.parquet   (one part per part of the run's measurements,
                                                 so a reprocessing reads the block level part by part)
        geocode str | query_name str (<query>_dpq) | query_shape list<int32> | value list<int64> |
        variance float64 | plb str (the exact fraction of the product's total budget spent on this query at
        this node, e.g. "26/4097") | one str column per schema attribute (the term or "*")
    DIR/<product>/<Level>.parquet/Constraint/part-00000.parquet
        geocode | query_name (<constraint>_con: total_con, hhgq_total_lb_con, hhgq_total_ub_con,
        nurse_nva_0_con) | sign | query_shape list<int32> | value list<int64> | variance float64 (null) |
        plb str (null) | one column per attribute
    DIR/<product>/<Level>.parquet/Invariant/part-00000.parquet   (ours: the declared invariants)
        geocode | query_name (gqhh_vect: housing units and GQ facilities of the 8 hhgq types; tot: persons;
        hu_tot; tot_whole_state: at the State level of a spine that splits a state into AIAN parts, the whole
        state's persons total, geocode = state FIPS) | value list<int64>

A node whose budget was moved away by bypassing has no DPQuery rows. Nothing in the file is confidential:
DPQuery values are the published noisy measurements, Constraint and Invariant values the declared invariants
and right-hand sides computed from them.

:func:`read_nmf` reads our layout, and a folder of the Bureau's layout (no ``nmf.json``: ``<Level>.parquet``
folders directly under it, or under ``<product>/``) given the configuration and spine it was measured with;
its invariants are then derived from its Constraint rows (:func:`derived_invariants`). Query and constraint
names are mapped to ours by :data:`BUREAU_NAMES` and, failing that, by their terms.
"""
from __future__ import annotations

import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from topdown.geo.spine import Spine
from topdown.vocab.census import Product
from topdown.vocab.queries import CROSS, _axis_factor, build_query, canonical_name
from topdown.vocab.schema import Schema

from ..configuration.errors import InputError
from ..inputs.invariants import UNIT_COLUMNS, WHOLE_STATE
from .levels import level_constraints, published_units
from ..runtime.progress import track
from ..runtime.outdir import claimed
from ..runtime.rundir import MEASURED, RunReader, write_json_atomic, write_table
from ..runtime.storage import location, read_frame, read_schema, read_table

FORMAT = "topdown-nmf/2"
#: The parts of a level folder: the Bureau's two, and ours (the declared invariants; the Bureau's reader
#: never opens it).
DPQUERY, CONSTRAINT, INVARIANT = "DPQuery", "Constraint", "Invariant"
#: The suffixes of DPQuery and Constraint names; the Bureau's reader drops the last SUFFIX_LEN characters.
DPQ, CON, SUFFIX_LEN = "_dpq", "_con", 4
SIGNS = {"==": "=", "<=": "<=", ">=": ">="}
#: The Invariant rows of a whole state's persons total where the spine splits the state into parts.
WHOLE_STATE_TOTAL = "tot_whole_state"
#: The name of a node's total-population constraint in the Bureau's files (``pl94`` is its other spelling).
TOTAL = "total"
#: The one table of names: the Bureau's names (suffix dropped) of queries and constraints that are not ours.
#: Our query language is DAS-2020's (vocab/queries.py), so its names are ours but for the 2020 P.L. 94-171
#: total-population constraint ``pl94_con``; any other name is matched to the configuration's queries as
#: spelled, then by its terms, in any order.
BUREAU_NAMES: dict[str, str] = {"pl94": TOTAL}
#: The columns the Bureau's reader needs, with the Arrow types accepted (checked before anything is read).
_STRING = (lambda t: pa.types.is_string(t) or pa.types.is_large_string(t), "a string")
_NUMBER = (lambda t: pa.types.is_integer(t) or pa.types.is_floating(t), "a number")
_NUMBERS = (lambda t: (pa.types.is_list(t) or pa.types.is_large_list(t)) and _NUMBER[0](t.value_type),
            "a list of numbers")
REQUIRED = {DPQUERY: {"geocode": _STRING, "query_name": _STRING, "value": _NUMBERS, "variance": _NUMBER},
            CONSTRAINT: {"geocode": _STRING, "query_name": _STRING, "sign": _STRING, "value": _NUMBERS}}


def node_shares(spine: Spine, budget, level: str) -> dict[str, Fraction]:
    """Each node's geolevel budget share (the levels whose budget it carries after bypassing)."""
    return {g: sum((budget.levels[lv] for lv in spine.budget_levels(level, g)), Fraction(0))
            for g in spine.nodes(level)}


def query_terms(schema: Schema, name: str) -> tuple[list[str], list[int]]:
    """Per schema attribute, the term of query ``name`` acting on it (``*``: summed over) and its number of
    answers there (DAS ``queryShape``)."""
    name = canonical_name(name)
    terms, shape = ["*"] * len(schema.dims), [1] * len(schema.dims)
    if name == "detailed":
        return list(schema.dim_names), [size for _, size in schema.dims]
    for term in ([] if name == "total" else name.split(CROSS)):
        axis, groups = _axis_factor(schema, term)
        terms[axis], shape[axis] = term, len(groups)
    return terms, shape


def _described(schema: Schema, names: list[str]) -> dict[str, pa.Array]:
    """The query_shape and attribute columns of rows whose queries are ``names``."""
    known = {n: query_terms(schema, n) for n in set(names)}
    cols = {"query_shape": pa.array([known[n][1] for n in names], pa.list_(pa.int32()))}
    for axis, dim in enumerate(schema.dim_names):
        cols[dim] = pa.array([known[n][0][axis] for n in names], pa.string())
    return cols


# ------------------------------------------------------------------------------------------------ writer
def _dpquery_table(long: pd.DataFrame, shares: dict[str, Fraction], query_shares: dict[str, Fraction],
                   schema: Schema) -> pa.Table:
    """Long measurement rows (geocode, query, answer, value, variance) as one DPQuery row per (node, query)."""
    long = long.sort_values(["geocode", "query", "answer"], kind="stable")
    geo, qry = long["geocode"].to_numpy(dtype=object), long["query"].to_numpy(dtype=object)
    first = np.ones(len(long), dtype=bool)
    first[1:] = (geo[1:] != geo[:-1]) | (qry[1:] != qry[:-1])
    starts = np.flatnonzero(first)
    offsets = np.append(starts, len(long)).astype(np.int32)
    values = pa.ListArray.from_arrays(pa.array(offsets), pa.array(long["value"].to_numpy(np.int64)))
    g, q = geo[starts], list(qry[starts])
    described = _described(schema, q)
    return pa.table({
        "geocode": pa.array(g, pa.string()), "query_name": pa.array([n + DPQ for n in q], pa.string()),
        "query_shape": described.pop("query_shape"), "value": values,
        "variance": pa.array(long["variance"].to_numpy(np.float64)[starts]),
        "plb": pa.array([str(shares[a] * query_shares[b]) for a, b in zip(g, q)], pa.string()), **described,
    })


def nmf_invariants(product: Product) -> list[tuple[str, tuple[str, ...], str]]:
    """The rows of ``product``'s invariants in the NMF, from their declared kinds, in the order unit counts,
    totals, housing units: (name, the invariants file's columns, query). ``unit_total`` is the sum of the
    ``unit_counts`` row and has no row of its own."""
    columns = {"unit_counts": (tuple(UNIT_COLUMNS), ""), "total": (("tot",), "total"), "housing_units": (("u0",), "total")}
    return [(name, *columns[kind]) for kind in columns for name, spec in product.invariants.items() if spec.kind == kind]


def _integers(values: np.ndarray, what: str) -> np.ndarray:
    out = np.rint(values)
    if not np.array_equal(out, values):
        raise ValueError(f"{what}: a right-hand side that is not an integer")  # a bug: they are sums of counts
    return out.astype(np.int64)


def _constraint_table(product: Product, nodes: pd.Index, units: pd.DataFrame, cons) -> pa.Table:
    """Constraint rows of one level in (geocode, name) order: each declared constraint and, at every node whose
    persons total is invariant, ``total_con`` (the Bureau's total invariant; a configured ``total`` constraint
    there is the same row)."""
    rows: list[tuple] = []
    tot = units["tot"] if "tot" in units.columns else None
    if tot is not None:
        rows += [(g, TOTAL, "=", "total", [v]) for g, v in zip(nodes, tot.to_numpy()) if not np.isnan(v)]
    done = {r[0] for r in rows}
    for c in cons.rhs.values():
        rows += [(g, c.name, SIGNS[c.sense], c.query, v) for g, v in zip(nodes, c.rhs)
                 if not np.isnan(v).any() and not (c.name == TOTAL and g in done)]
    rows.sort(key=lambda r: (r[0], r[1]))
    g, names, signs, queries, values = (list(c) for c in zip(*rows)) if rows else ([],) * 5
    return pa.table({
        "geocode": pa.array(g, pa.string()), "query_name": pa.array([n + CON for n in names], pa.string()),
        "sign": pa.array(signs, pa.string()), "query_shape": _described(product.schema, queries).pop("query_shape"),
        "value": pa.array([_integers(np.asarray(v, dtype=float), n) for n, v in zip(names, values)],
                          pa.list_(pa.int64())),
        "variance": pa.nulls(len(g), pa.float64()), "plb": pa.nulls(len(g), pa.string()),
        **{k: v for k, v in _described(product.schema, queries).items() if k != "query_shape"},
    })


def _invariant_table(product: Product, nodes: pd.Index, units: pd.DataFrame,
                     whole_states: pd.Series | None = None) -> pa.Table:
    """Invariant rows of one level in (geocode, name) order; ``whole_states``: the whole-state totals of states
    split into parts (rows geocode = state FIPS)."""
    rows: list[tuple] = []
    if whole_states is not None:
        rows += [(str(g), WHOLE_STATE_TOTAL, [int(v)]) for g, v in whole_states.items()]
    for name, cols, _ in nmf_invariants(product):
        if all(c in units.columns for c in cols):
            vals = units[list(cols)].to_numpy(dtype=float)
            rows += [(g, name, _integers(v, name)) for g, v in zip(nodes, vals) if not np.isnan(v).any()]
    rows.sort(key=lambda r: (r[0], r[1]))
    cols = list(zip(*rows)) if rows else [[]] * 3
    return pa.table({"geocode": pa.array(cols[0], pa.string()), "query_name": pa.array(cols[1], pa.string()),
                     "value": pa.array(cols[2], pa.list_(pa.int64()))})


def write_nmf(run_dir: str | Path, out_dir: str | Path) -> Path:
    """Write the noisy measurement file of a complete run into ``out_dir`` (absent or empty: ``outdir.claimed``).

    The directory is built under a temporary sibling and put in place at once, so it is complete or absent (on
    an object store: built in place, ``nmf.json`` written last; ``outdir.Claim.building``).
    """
    run_dir, out_dir = location(run_dir), location(out_dir)
    reader = RunReader(run_dir)
    config = reader.config()
    with claimed(out_dir, "nmf") as claim:
        reader.check_sums(MEASURED, "writing the noisy measurement file")
        spine = reader.spine()
        cert = reader.certificate().data
        with claim.building() as tmp:
            meta = {"format": FORMAT, "run": config.run.name, "config_sha256": config.digest(),
                    "levels": spine.levels, "spine": spine.kind, "products": {}}
            for spec in config.run_products:
                product, schema = spec.name, spec.schema
                cfg = config.product(product)
                inv_path = reader.invariants(product)
                units, parents, _, state_total = published_units(spine, read_frame(inv_path),
                                                                 where=str(inv_path))
                # occupied units are not a declared invariant: a constraint that needs them has no right-hand side
                units = [u.assign(occupied=np.nan) for u in units]
                nodes = [u.index for u in units]
                cons = level_constraints(spec, cfg, spine.levels, units, parents)
                for lv, n, u, c in track(list(zip(spine.levels, nodes, units, cons)), f"nmf {product}",
                                         unit="levels"):
                    base = tmp / product / f"{lv}.parquet"
                    shares = node_shares(spine, cfg.budget, lv)
                    qshares = cfg.budget.queries.get(lv, {})
                    parts = sorted(reader.measurements(product, lv).glob("part-*.parquet"))
                    (base / DPQUERY).mkdir(parents=True, exist_ok=True)
                    for i, part in enumerate(parts):  # part by part, as the run wrote them
                        long = read_table(part).to_pandas()
                        if len(long):
                            write_table(_dpquery_table(long, shares, qshares, schema),
                                        base / DPQUERY / f"part-{i:05d}.parquet")
                    # a state in parts
                    split = state_total is not None and "tot" in u.columns and u["tot"].isna().any()
                    write_table(_constraint_table(spec, n, u, c), base / CONSTRAINT / "part-00000.parquet")
                    write_table(_invariant_table(spec, n, u, state_total if split else None),
                                base / INVARIANT / "part-00000.parquet")
                meta["products"][product] = {
                    "mechanism": cert[product]["mechanism"], "rho": cert[product].get("rho"),
                    "schema": [list(d) for d in schema.dims],
                    "queries": {lv: list(cfg.budget.queries.get(lv, {})) for lv in spine.levels},
                }
            write_json_atomic(tmp / "nmf.json", meta)
    return out_dir


# ------------------------------------------------------------------------------------------------ reader
def _checked(path: Path, part: str, columns: list[str] | None = None) -> pa.Table:
    """A part file's table, its required columns (:data:`REQUIRED`) checked first: one clear error each."""
    try:
        schema = read_schema(path)
    except (pa.ArrowException, OSError) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({type(exc).__name__})") from None
    for name, (ok, what) in REQUIRED[part].items():
        if name not in schema.names:
            raise InputError(f"{path}: no column {name!r} (a {part} part has {', '.join(REQUIRED[part])})")
        if not ok(schema.field(name).type):
            raise InputError(f"{path}: column {name!r} is {schema.field(name).type}, not {what}")
    return read_table(path, columns=columns)


def _name_map(raw: Iterable[str], known: Iterable[str], suffix: str, where: str) -> dict[str, str]:
    """The Bureau's names (with ``suffix``) -> ours among ``known`` (:data:`BUREAU_NAMES`, then by terms)."""
    known = list(known)
    by_terms = {frozenset(canonical_name(k).split(CROSS)): k for k in known}
    out = {}
    for name in raw:
        base = canonical_name(name[:-SUFFIX_LEN]) if name.endswith(suffix) else None
        ours = BUREAU_NAMES.get(base, base)
        ours = ours if ours in known else by_terms.get(frozenset((ours or "").split(CROSS)))
        if ours is None:
            raise InputError(f"{where}: unknown query name {name!r} (expected one of "
                             f"{', '.join(k + suffix for k in known)})")
        out[name] = ours
    return out


def _list_values(column: pa.ChunkedArray, where: str) -> np.ndarray:
    """A list column's values, flattened, as int64 (the noisy answers and right-hand sides are integers)."""
    flat = pc.list_flatten(column.combine_chunks() if column.num_chunks != 1 else column.chunk(0))
    values = flat.to_numpy(zero_copy_only=False)
    if values.dtype.kind == "f":
        if not np.isfinite(values).all() or not np.array_equal(values, np.rint(values)):
            raise InputError(f"{where}: column 'value' holds a value that is not an integer")
    return values.astype(np.int64)


def _expand(dpq: pa.Table, names: dict[str, str], schema: Schema | None, where: str) -> pa.Table:
    """DPQuery rows as long measurement rows (geocode, query, answer, value, variance), sorted by (geocode,
    query, answer), built in Arrow (a state's block level has tens of millions); rows without a value or with
    an infinite variance (unmeasured) are left out. Each row's number of values is checked against its
    query's answers on ``schema`` (without one: against its ``query_shape``, where present)."""
    keep = pc.and_(pc.is_valid(dpq.column("value")), pc.is_finite(pc.cast(dpq.column("variance"), pa.float64())))
    dpq = dpq.filter(keep)
    query = np.array([names[q] for q in dpq.column("query_name").to_pylist()], dtype=str)
    order = np.lexsort((query, dpq.column("geocode").to_numpy(zero_copy_only=False).astype(str)))
    dpq, query = dpq.take(order), query[order]
    lengths = pc.list_value_length(dpq.column("value")).to_numpy(zero_copy_only=False).astype(np.int64)
    if schema is not None:
        expected = {q: build_query(schema, q).n_answers for q in set(query)}
        expected = np.array([expected[q] for q in query], dtype=np.int64)
    elif "query_shape" in dpq.column_names:
        expected = np.array([np.prod(s) for s in dpq.column("query_shape").to_pylist()], dtype=np.int64)
    else:
        expected = lengths
    if (lengths != expected).any():
        i = int(np.flatnonzero(lengths != expected)[0])
        raise InputError(f"{where}: query {query[i]!r} at {dpq.column('geocode')[i].as_py()!r} has {lengths[i]} "
                         f"values; its answers are {expected[i]}")
    rows = np.repeat(np.arange(len(lengths), dtype=np.int32), lengths)
    starts = np.repeat((np.cumsum(lengths) - lengths).astype(np.int32), lengths)
    per_row = pa.array(rows)  # geocode and query: dictionary-encoded by row, written as plain strings
    return pa.table({
        "geocode": pa.DictionaryArray.from_arrays(per_row, pc.cast(dpq.column("geocode"), pa.string()).combine_chunks()),
        "query": pa.DictionaryArray.from_arrays(per_row, pa.array(query, pa.string())),
        "answer": pa.array(np.arange(int(lengths.sum()), dtype=np.int32) - starts),
        "value": pa.array(_list_values(dpq.column("value"), where)),
        "variance": pa.array(pc.cast(dpq.column("variance"), pa.float64()).to_numpy()[rows]),
    })


EMPTY_MEASUREMENTS = {"geocode": "str", "query": "str", "answer": np.int32, "value": np.int64, "variance": np.float64}


@dataclass
class NoisyMeasurementFile:
    """A noisy measurement file opened (the contract ``read_nmf`` keeps stable). Measurements are read part by
    part, on demand.

    * ``meta``: the ``nmf.json`` dictionary (format, run, config_sha256, levels, spine, products); for a file
      of the Bureau's layout, the same keys from the configuration and spine it is read with (format
      ``bureau``).
    * ``parts[product][level]``: the DPQuery part files; :meth:`measurement_part` reads one as a DataFrame with
      exactly the columns and dtypes of a run's ``noisy_measurements/<product>/level=<L>/`` tables: geocode
      (str), query (str), answer (int32, the answer's position in the query's cell order), value (int64),
      variance (float64); rows sorted by (geocode, query, answer). Unmeasured nodes have no rows.
    * ``constraints[product][level]``: DataFrame geocode, name (ours, suffix dropped), sign (``=``, ``<=``,
      ``>=``), value (numpy int64 array per row).
    * ``nodes[product][level]``: every node of the level (pd.Index of geocodes, sorted), measured or not.
    * :meth:`invariants`: a product's invariants as a run's invariants table.
    """

    meta: dict
    root: Path
    schemas: dict[str, Schema | None]  # the configuration's, when it is given
    parts: dict[str, dict[str, list[Path]]] = field(default_factory=dict)
    constraints: dict[str, dict[str, pd.DataFrame]] = field(default_factory=dict)
    nodes: dict[str, dict[str, pd.Index]] = field(default_factory=dict)
    #: per product, the folder holding its ``<Level>.parquet`` folders
    folders: dict[str, Path] = field(default_factory=dict)
    #: per product and level, the measured nodes of each DPQuery part
    part_nodes: dict[str, dict[str, list[np.ndarray]]] = field(default_factory=dict)

    @property
    def bureau(self) -> bool:
        return self.meta["format"] == "bureau"

    def measurement_table(self, product_name: str, level: str, part: Path) -> pa.Table:
        """One DPQuery part as a run's measurement table (Arrow; :meth:`measurement_part` as pandas)."""
        names = read_schema(part).names
        dpq = _checked(part, DPQUERY, ["geocode", "query_name", "value", "variance",
                                       *(["query_shape"] if "query_shape" in names else [])])
        names = _name_map(dpq.column("query_name").unique().to_pylist(),
                          self.meta["products"][product_name]["queries"][level], DPQ, str(part))
        return _expand(dpq, names, self.schemas[product_name], str(part))

    def measurement_part(self, product_name: str, level: str, part: Path) -> pd.DataFrame:
        table = self.measurement_table(product_name, level, part)
        return table.cast(pa.schema([(f.name, f.type.value_type if pa.types.is_dictionary(f.type) else f.type)
                                     for f in table.schema])).to_pandas()

    def measurement_parts(self, product_name: str, level: str) -> Iterator[pd.DataFrame]:
        for part in self.parts[product_name][level]:
            yield self.measurement_part(product_name, level, part)

    def check_parts(self) -> None:
        """Read every DPQuery part once (each is read again, one at a time, where it is used): a file from
        elsewhere is refused before anything is written (our own files are checked as they are read)."""
        for product, levels in self.parts.items():
            for level in levels:
                for part in self.parts[product][level]:
                    self.measurement_table(product, level, part)

    def run_parts(self, product_name: str, level: str, parents: pd.Series | None) -> pd.Series | None:
        """Which run part each measured node goes to, so that a part holds whole families (the children of a
        parent: a run's block task reads one family's measurements), or None where the DPQuery parts already
        do (ours: one per run part). A file from elsewhere (Spark spreads rows over its parts by hash) is cut
        into as many parts, at family boundaries; ``parents``: each node's parent (None at the root)."""
        per_part = self.part_nodes[product_name][level]
        nodes = np.concatenate(per_part) if per_part else np.array([], dtype=str)
        owner = np.repeat(np.arange(len(per_part)), [len(n) for n in per_part])
        family = (parents.reindex(nodes).astype(str).to_numpy() if parents is not None
                  else np.zeros(len(nodes), dtype=str))
        split = pd.DataFrame({"family": family, "owner": owner}).groupby("family")["owner"].nunique()
        if len(np.unique(nodes)) == len(nodes) and (split <= 1).all():
            return None
        order = np.unique(nodes)
        fam = (parents.reindex(order).astype(str).to_numpy() if parents is not None else np.zeros(len(order), str))
        index = pd.factorize(fam)[0]  # families in geocode order
        chunk = index * len(per_part) // max(int(index.max()) + 1, 1) if len(order) else index
        return pd.Series(chunk, index=order)

    def measurements(self, product_name: str, level: str) -> pd.DataFrame:
        """All measurements of one level in one frame (small files and tests; reprocessing reads by part)."""
        frames = list(self.measurement_parts(product_name, level))
        if not frames:
            return pd.DataFrame({c: pd.Series(dtype=t) for c, t in EMPTY_MEASUREMENTS.items()})
        return pd.concat(frames).sort_values(["geocode", "query", "answer"], kind="stable").reset_index(drop=True)

    def invariants(self, product: Product, spine: Spine | None = None) -> pd.DataFrame:
        """``product``'s invariants as a run's invariants table (level, geocode, u0.., tot, and level
        ``whole_state`` rows): our Invariant rows, or, for the Bureau's layout, :func:`derived_invariants`
        (which needs the ``spine``)."""
        if self.bureau:
            return derived_invariants(self, product, spine)
        frames = []
        for level in self.meta["levels"]:
            inv = pq.read_table(self.folders[product.name] / f"{level}.parquet" / INVARIANT).to_pandas()
            whole = inv[inv["query_name"] == WHOLE_STATE_TOTAL]  # a split state's total: whole_state rows
            if len(whole):
                frames.append(pd.DataFrame({"geocode": whole["geocode"].astype(str).to_numpy(), "level": WHOLE_STATE,
                                            "tot": [v[0] for v in whole["value"]]}))
                inv = inv[inv["query_name"] != WHOLE_STATE_TOTAL]
            frame = pd.DataFrame(index=pd.Index(sorted(set(inv["geocode"].astype(str))), name="geocode"))
            for name, columns, _ in nmf_invariants(product):
                rows = inv[inv["query_name"] == name]
                if len(rows):
                    frame = frame.join(pd.DataFrame(np.vstack(rows["value"].to_numpy()), columns=list(columns),
                                                    index=rows["geocode"].astype(str).to_numpy()))
            frames.append(frame.reset_index().assign(level=level))
        return pd.concat(frames, ignore_index=True)


def derived_invariants(nmf: NoisyMeasurementFile, product: Product, spine: Spine) -> pd.DataFrame:
    """The invariants of a file of the Bureau's layout, derived from its Constraint rows as DAS-2020 builds
    them: a node's persons total from ``total_con`` (summed, as the Bureau's reader does; on the housing-units
    product, its housing units); unit counts at the lowest level from a ``unit_counts`` constraint or the unit
    bounds (persons of type k <= units of type k x cap[k], so u_k = rhs / cap[k]; untightened there, as no total
    is invariant at blocks);
    every level above a level that has them holds its children's sums."""
    name = product.name
    kinds = {spec.name: spec.rhs for spec in product.constraints.values()}
    frames: list[pd.DataFrame] = []
    below: pd.DataFrame | None = None
    for i in range(len(spine.levels) - 1, -1, -1):
        level = spine.levels[i]
        nodes = pd.Index(spine.nodes(level).astype(str))
        con = nmf.constraints[name][level]
        frame = pd.DataFrame(index=nodes)
        if below is not None:  # sums of the children
            parent = spine.parents(spine.levels[i + 1])
            parent.index = parent.index.astype(str)
            frame = below.groupby(parent.reindex(below.index).astype(str).to_numpy()).sum(min_count=1).reindex(nodes)
        for cname, rhs in kinds.items():
            rows = con[con["name"] == cname]
            if not len(rows):
                continue
            vals = pd.DataFrame(np.vstack(rows["value"].to_numpy()), index=rows["geocode"].astype(str).to_numpy())
            if rhs in ("total", "housing_units"):
                frame[{"total": "tot", "housing_units": "u0"}[rhs]] = vals.sum(axis=1).reindex(nodes).to_numpy(float)
            elif rhs == "unit_counts" and below is None:  # a unit histogram's records by type
                for k in vals.columns:
                    frame[UNIT_COLUMNS[k]] = vals[k].reindex(nodes).to_numpy(dtype=float)
            elif rhs == "unit_upper" and below is None:
                cap = np.asarray(product.unit_bounds.cap)
                for k in np.flatnonzero(cap > 0):
                    frame[UNIT_COLUMNS[k]] = (vals[k] // cap[k]).reindex(nodes).to_numpy(dtype=float)
        frame = frame.loc[:, frame.notna().all().to_numpy()] if len(frame.columns) else frame
        frames.append(frame.rename_axis("geocode").reset_index().assign(level=level))
        below = frame
    out = pd.concat(frames[::-1], ignore_index=True)
    present = [c for c in UNIT_COLUMNS if c in out.columns]
    if present:
        out[present] = out[present].fillna(0).astype(np.int64)
    return out


def _bureau_meta(config, spine: Spine) -> dict:
    products = {}
    for spec in config.run_products:
        budget = config.product(spec.name).budget
        products[spec.name] = {"mechanism": budget.mechanism, "rho": None, "schema": [list(d) for d in spec.schema.dims],
                               "queries": {lv: list(budget.queries.get(lv, {})) for lv in spine.levels}}
    return {"format": "bureau", "levels": list(spine.levels), "spine": spine.kind, "products": products}


def nmf_meta(nmf_dir: str | Path) -> dict | None:
    """The ``nmf.json`` of a file of our layout (checked), or None for a folder of the Bureau's layout."""
    meta_path = location(nmf_dir) / "nmf.json"
    if not meta_path.exists():
        return None
    try:
        meta = json.loads(meta_path.read_text())
    except (UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise InputError(f"{meta_path}: not a readable noisy measurement file ({exc})") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT:
        raise InputError(f"{meta_path}: format {meta.get('format') if isinstance(meta, dict) else None!r}; this "
                         f"reader reads {FORMAT} (write the file again with `topdown nmf`)")
    return meta


def is_bureau_nmf(path: str | Path) -> bool:
    """A folder of the Bureau's layout: ``<Level>.parquet`` folders with a Constraint part, directly or one
    folder down."""
    path = location(path)
    return path.is_dir() and any(path.glob(f"*.parquet/{CONSTRAINT}")) or any(path.glob(f"*/*.parquet/{CONSTRAINT}"))


def read_nmf(nmf_dir: str | Path, config=None, spine: Spine | None = None) -> NoisyMeasurementFile:
    """Open a noisy measurement file: ours (``nmf.json`` present), or a folder of the Bureau's layout, which
    needs the ``config`` and ``spine`` it was measured with (see :class:`NoisyMeasurementFile`). Constraint
    parts are read; DPQuery parts are listed and read on demand."""
    nmf_dir = location(nmf_dir)
    meta = nmf_meta(nmf_dir)
    if meta is None:
        if not is_bureau_nmf(nmf_dir):
            raise FileNotFoundError(f"{nmf_dir}: not a noisy measurement file (no nmf.json, and no "
                                    f"<Level>.parquet/{CONSTRAINT} folders of the Bureau's layout)")
        if config is None or spine is None:
            raise InputError(f"{nmf_dir}: a file of the Bureau's layout is read with the configuration and spine it "
                             "was measured with")
        meta = _bureau_meta(config, spine)
    specs = {p.name: p for p in config.run_products} if config is not None else {}
    schemas = {p: specs[p].schema if p in specs else None for p in meta["products"]}
    out = NoisyMeasurementFile(meta, nmf_dir, schemas)
    single = len(meta["products"]) == 1 and not (nmf_dir / next(iter(meta["products"]))).is_dir()
    for product in meta["products"]:
        folder = nmf_dir if single else nmf_dir / product
        out.folders[product] = folder
        out.parts[product], out.constraints[product], out.nodes[product] = {}, {}, {}
        known = list(specs[product].constraints) if product in specs and meta["format"] == "bureau" else None
        for level in meta["levels"]:
            base = folder / f"{level}.parquet"
            if not (base / CONSTRAINT).is_dir():
                raise InputError(f"{base / CONSTRAINT}: missing (every level of a noisy measurement file has a "
                                 f"{CONSTRAINT} part)")
            parts = sorted((base / DPQUERY).glob("*.parquet"))
            out.parts[product][level] = parts
            geocodes = [pc.unique(_checked(p, DPQUERY, ["geocode"]).column("geocode")).to_numpy(zero_copy_only=False)
                        for p in parts]
            con_parts = sorted((base / CONSTRAINT).glob("*.parquet"))
            con = pa.concat_tables([_checked(p, CONSTRAINT, ["geocode", "query_name", "sign", "value"])
                                    for p in con_parts]) if con_parts else None
            if con is None or not con.num_rows:
                frame = pd.DataFrame({"geocode": [], "name": [], "sign": [], "value": []})
            else:
                raw = con.column("query_name").to_pylist()
                names = _name_map(set(raw), known if known is not None else
                                  {n[:-SUFFIX_LEN] for n in raw if n.endswith(CON)}, CON, str(base / CONSTRAINT))
                frame = pd.DataFrame({"geocode": con.column("geocode").to_numpy(zero_copy_only=False).astype(str),
                                      "name": [names[n] for n in raw],
                                      "sign": con.column("sign").to_pylist()})
                bad = set(frame["sign"]) - set(SIGNS.values())
                if bad:
                    raise InputError(f"{base / CONSTRAINT}: sign {sorted(bad)[0]!r}; signs are =, <= and >=")
                lengths = pc.list_value_length(con.column("value")).to_numpy(zero_copy_only=False).astype(np.int64)
                frame["value"] = np.split(_list_values(con.column("value"), str(base / CONSTRAINT)),
                                          np.cumsum(lengths)[:-1])
            out.constraints[product][level] = frame
            out.part_nodes.setdefault(product, {})[level] = [np.asarray(g, dtype=str) for g in geocodes]
            everything = [frame["geocode"].to_numpy(dtype=str), *out.part_nodes[product][level]]
            if (base / INVARIANT).is_dir():
                everything.append(read_table(base / INVARIANT, columns=["geocode"]).column("geocode")
                                  .to_numpy(zero_copy_only=False).astype(str))
            out.nodes[product][level] = pd.Index(np.unique(np.concatenate(everything)) if everything else [])
        if meta["format"] == "bureau":
            meta["products"][product]["queries"] = _measured_queries(out, product)
    return out


def _measured_queries(nmf: NoisyMeasurementFile, product_name: str) -> dict[str, list[str]]:
    """Per level, the queries a Bureau-layout file measured (our names), in the configuration's order where it
    lists them at that level; a name of no configured query is an error."""
    configured = nmf.meta["products"][product_name]["queries"]
    known = list(dict.fromkeys(q for level in configured.values() for q in level))
    out = {}
    for level in nmf.meta["levels"]:
        raw: set[str] = set()
        for part in nmf.parts[product_name][level]:
            raw |= set(_checked(part, DPQUERY, ["query_name"]).column("query_name").unique().to_pylist())
        names = set(_name_map(raw, known, DPQ, str(nmf.folders[product_name] / f"{level}.parquet" / DPQUERY)).values())
        out[level] = [q for q in configured[level] if q in names] + sorted(names - set(configured[level]))
    return out
