"""Synthetic input of any declared census's shape (``topdown synth --census NAME``; not real data, every draw
comes from ``default_rng(seed)``); the U.S. P.L. 94-171-shaped input is :mod:`.us_synth`'s.

:func:`write_census` is driven by the declaration only: the hierarchy's levels (prefix geocode or one column per level), attributes
(and their input ``values``), unit records and unit bounds, structural zeros, and the optional
``[census.products.P.synth]`` table (:class:`SynthShape`: full-size node counts, codes, unit sizes, weights).
"""
from __future__ import annotations

import os
import re
import shutil
import tempfile
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from ..configuration.census import read_declaration
from ..configuration.config import ConfigError
from ..configuration.limits import MAX_PERSONS, check_count
from ..runtime.outdir import writes
from topdown.vocab.census import Attribute, Census, Product
from topdown.vocab.queries import build_query


#: Persons generated at a time (one row group of each partition's file; memory is about 100 bytes a person).
CHUNK_PERSONS = 1_000_000
#: Spread of the leaves' populations (lognormal sigma; 0.6 gives a 95th percentile of 2.7 times the median, as
#: the 1940 enumeration districts: median 865, p95 2,342 persons) and of the parents' numbers of children.
LEAF_SIGMA, FANOUT_SIGMA = 0.6, 1.0
#: Spread of the residents of a group-quarters facility around the type's declared mean.
FACILITY_SIGMA = 0.5
#: Rounds of redrawing an attribute for records that fall in a structural-zero cell.
ZERO_ROUNDS = 200


@dataclass(frozen=True)
class SynthShape:
    """The ``[census.products.P.synth]`` table of a declaration, checked (every key optional):
    ``persons_per_leaf`` (default 1,000); ``nodes`` {level: nodes at full size} (default 10 children per parent;
    a level with a code list: its length); ``codes`` {level: a list of codes, or a format of ``parent`` (the
    parent's code, "" below the root), ``n`` (1-based number within the parent), ``odd`` (2n - 1), ``N``
    (1-based number within the level)} - for a prefix hierarchy the level's own characters, for a column
    hierarchy the whole code; ``unit_size`` mean persons per unit of each type (default 3 per housing unit, 50
    per facility); ``weights`` {attribute: one weight per level} (default uniform)."""

    persons_per_leaf: float
    nodes: dict[str, int]
    codes: dict[str, str | tuple[str, ...]]
    unit_size: tuple[float, ...] | None
    weights: dict[str, np.ndarray]


def synth_hints(census: Census) -> dict[str, dict]:
    """The ``synth`` table of each product of ``census``, read from its declaration file (``census.source``;
    none when the census was built in memory). The typed :class:`Census` carries no synthesis hints: they
    describe test data, not the census."""
    try:
        table = read_declaration(census.source)[0]
    except ConfigError:
        return {}
    products = table.get("products", {})
    return {name: table.get("synth", {}) for name, table in products.items() if isinstance(table, dict)}


def synth_shape(census: Census, product: Product, hints: dict) -> SynthShape:
    """The checked synthesis hints of ``product`` (ConfigError naming the key and value)."""
    where = f"{census.source}: census.products.{product.name}.synth"
    known = {"persons_per_leaf", "nodes", "codes", "unit_size", "weights", "generator"}
    if unknown := sorted(set(hints) - known):
        raise ConfigError(f"{where}: unknown key {unknown[0]!r} (keys: {', '.join(sorted(known))})")
    for table in ("nodes", "codes", "weights"):
        if not isinstance(hints.get(table, {}), dict):
            raise ConfigError(f"{where}.{table}: need a table (got {hints[table]!r})")
    levels = census.hierarchy.names[1:]
    ppl = hints.get("persons_per_leaf", 1000)
    if isinstance(ppl, bool) or not isinstance(ppl, (int, float)) or not ppl >= 1:
        raise ConfigError(f"{where}.persons_per_leaf: need a number >= 1 (got {ppl!r})")
    nodes, codes = dict(hints.get("nodes", {})), dict(hints.get("codes", {}))
    for table, value in (("nodes", nodes), ("codes", codes)):
        if bad := sorted(set(value) - set(levels)):
            raise ConfigError(f"{where}.{table}: unknown level {bad[0]!r} (levels below the root: {', '.join(levels)})")
    for level, n in nodes.items():
        if isinstance(n, bool) or not isinstance(n, int) or n < 1:
            raise ConfigError(f"{where}.nodes.{level}: need a whole number >= 1 (got {n!r})")
    for level, c in codes.items():
        ok = isinstance(c, str) or (isinstance(c, list) and c and all(isinstance(x, str) and x for x in c)
                                     and len(set(c)) == len(c))
        if not ok:
            raise ConfigError(f"{where}.codes.{level}: need a format string or a list of distinct codes (got {c!r})")
        codes[level] = c if isinstance(c, str) else tuple(c)
    unit_size = hints.get("unit_size")
    if unit_size is not None:
        types = census.units.types if census.units else 0
        if (not isinstance(unit_size, list) or len(unit_size) != types
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x > 0 for x in unit_size)):
            raise ConfigError(f"{where}.unit_size: need {types} positive numbers, one per unit type (got {unit_size!r})")
        unit_size = tuple(float(x) for x in unit_size)
    weights = {}
    sizes = {a.name: a.size for a in product.attributes}
    for name, w in hints.get("weights", {}).items():
        if name not in sizes:
            raise ConfigError(f"{where}.weights: unknown attribute {name!r} (attributes: {', '.join(sizes)})")
        if (not isinstance(w, list) or len(w) != sizes[name]
                or not all(isinstance(x, (int, float)) and not isinstance(x, bool) and x >= 0 for x in w) or sum(w) <= 0):
            raise ConfigError(f"{where}.weights.{name}: need {sizes[name]} non-negative numbers, not all 0 (got {w!r})")
        weights[name] = np.asarray(w, float) / float(sum(w))
    for a in product.attributes:
        weights.setdefault(a.name, np.full(a.size, 1.0 / a.size))
    return SynthShape(float(ppl), nodes, codes, unit_size, weights)


@dataclass(frozen=True)
class _Tree:
    """The synthetic hierarchy below the root: per level, each node's parent (index into the level above) and
    its code (a column hierarchy's code, or a prefix hierarchy's whole geocode prefix)."""

    parent: tuple[np.ndarray, ...]
    code: tuple[np.ndarray, ...]

    def ancestor(self, depth: int) -> np.ndarray:
        """For each leaf, the index of its ancestor at ``depth`` (0: the first level below the root)."""
        index = np.arange(self.code[-1].size)
        for d in range(len(self.code) - 1, depth, -1):
            index = self.parent[d][index]
        return index


def level_counts(census: Census, shape: SynthShape, leaves: int) -> list[int]:
    """Nodes per level below the root for ``leaves`` leaves: the full-size counts scaled in log space
    (count = leaves ^ (log full / log full leaves)), so that a full-size input has the declared counts and a
    small one keeps every level (at least one node, never more than the level below, nor than its listed
    codes)."""
    levels = census.hierarchy.names[1:]
    full = []
    for i, level in enumerate(levels):
        listed = shape.codes.get(level)
        default = len(listed) if isinstance(listed, tuple) else 10 ** (i + 1)
        full.append(shape.nodes.get(level, default))
    top = max(full[-1], 2)
    counts = [max(1, round(leaves ** (np.log(max(f, 1)) / np.log(top)))) for f in full[:-1]] + [leaves]
    for i, level in enumerate(levels[:-1]):  # never more nodes than listed codes
        if isinstance(listed := shape.codes.get(level), tuple):
            counts[i] = min(counts[i], len(listed))
    for i in range(1, len(counts)):
        counts[i] = max(counts[i], counts[i - 1])
    for i in range(len(counts) - 2, -1, -1):
        counts[i] = min(counts[i], counts[i + 1])
    return counts


def _codes(census: Census, shape: SynthShape, depth: int, parent: np.ndarray, parent_code: np.ndarray) -> np.ndarray:
    """The codes of one level's nodes (see :class:`SynthShape`), checked: a prefix hierarchy's level adds its
    declared number of characters, a column hierarchy's codes are distinct."""
    h = census.hierarchy
    level = h.levels[depth + 1]
    where = f"{census.source}: census.products.*.synth.codes.{level.name}"
    count = parent.size
    first = np.searchsorted(parent, parent)
    n = np.arange(count) - first + 1
    spec = shape.codes.get(level.name)
    if isinstance(spec, tuple):
        if count > len(spec):
            raise ConfigError(f"{where}: {count} nodes needed, {len(spec)} codes listed (give fewer persons or more "
                              "codes)")
        own = np.array(spec[:count], dtype=object)
    else:
        if spec is None:
            width = (level.width - h.levels[depth].width if depth else level.width) if h.by_prefix else None
            spec = f"{{n:0{width}d}}" if width else ("{N:02d}" if depth == 0 else "{parent}{n:02d}")
        try:
            own = np.array([spec.format(parent=p if not h.by_prefix else "", n=int(k), odd=2 * int(k) - 1, N=i + 1)
                            for i, (p, k) in enumerate(zip(parent_code[parent], n))], dtype=object)
        except (KeyError, IndexError, ValueError) as exc:
            raise ConfigError(f"{where}: format {spec!r} does not apply ({type(exc).__name__}: {exc}; fields: parent, "
                              "n, odd, N)") from None
    if h.by_prefix:
        width = level.width - (h.levels[depth].width if depth else 0)
        bad = [c for c in own if len(c) != width]
        if bad:
            raise ConfigError(f"{where}: code {bad[0]!r} is not {width} characters long (the level's width is "
                              f"{level.width})")
        return np.array([p + c for p, c in zip(parent_code[parent], own)], dtype=object)
    if len(set(own)) != own.size:
        dup = next(c for c in own if (own == c).sum() > 1)
        raise ConfigError(f"{where}: code {dup!r} is given to two nodes (a column hierarchy's codes must be distinct "
                          "within a level; use the {parent} field)")
    return own


def synthetic_tree(census: Census, shape: SynthShape, leaves: int, rng: np.random.Generator) -> _Tree:
    """A hierarchy of ``leaves`` leaves: :func:`level_counts` nodes per level, every parent with at least one
    child and the others spread by lognormal weights (unequal fan-outs), children numbered in order."""
    counts = level_counts(census, shape, leaves)
    parents: list[np.ndarray] = []
    codes: list[np.ndarray] = []
    above, above_code = 1, np.array([""], dtype=object)
    for depth, count in enumerate(counts):
        w = rng.lognormal(0.0, FANOUT_SIGMA, above)
        extra = rng.choice(above, size=count - above, p=w / w.sum()) if count > above else np.zeros(0, np.int64)
        parent = np.sort(np.concatenate([np.arange(above), extra])).astype(np.int64)
        code = _codes(census, shape, depth, parent, above_code)
        parents.append(parent)
        codes.append(code)
        above, above_code = count, code
    pattern = census.hierarchy.pattern
    if pattern is not None and (bad := [c for c in codes[-1] if not re.fullmatch(pattern, c)]):
        raise ConfigError(f"{census.source}: census.hierarchy.pattern {pattern!r} does not match the synthetic leaf "
                          f"code {bad[0]!r} (see the synth table's codes)")
    return _Tree(tuple(parents), tuple(codes))


@dataclass(frozen=True)
class _Population:
    """Per leaf: persons of the bulk type (all persons without unit bounds) and units of the bulk type; the
    group-quarters facilities (leaf, type, residents), sorted by leaf."""

    bulk: np.ndarray
    bulk_units: np.ndarray
    bulk_type: int
    fac_leaf: np.ndarray
    fac_type: np.ndarray
    fac_residents: np.ndarray


def _unit_sizes(census: Census, shape: SynthShape, bulk: int) -> np.ndarray:
    assert census.units is not None
    if shape.unit_size is not None:
        return np.asarray(shape.unit_size)
    return np.where(np.arange(census.units.types) == bulk, 3.0, 50.0)


def synthetic_population(census: Census, product: Product, shape: SynthShape, leaves: int, persons: int,
                         rng: np.random.Generator) -> _Population:
    """``persons`` persons over ``leaves`` leaves (every leaf at least one, lognormal sizes) and the units that
    make the declared unit bounds feasible: facilities of each group-quarters type (about ``weights`` x persons
    residents in all, a Poisson number of facilities of the type's mean size, each within [min_per_unit, cap]),
    the rest in units of the bulk type (the attribute's most frequent level: households) within the bounds."""
    weight = rng.lognormal(0.0, LEAF_SIGMA, leaves)
    p = weight / weight.sum()
    empty = np.zeros(0, np.int64)
    bounds = product.unit_bounds if census.units is not None else None
    if bounds is None:
        bulk = 1 + rng.multinomial(persons - leaves, p)
        units = np.zeros(leaves, np.int64)
        if census.units is not None:  # unit records without unit bounds: housing units of the mean size
            units = np.maximum(1, np.rint(bulk / _unit_sizes(census, shape, 0)[0])).astype(np.int64)
        return _Population(bulk, units, 0, empty, empty, empty)
    w = shape.weights[bounds.attribute]
    b = int(np.argmax(w))
    size = _unit_sizes(census, shape, b)
    lo, cap = np.asarray(bounds.min_per_unit), np.asarray(bounds.cap)
    types, residents = [], []
    for k in np.flatnonzero(w > 0):
        if k == b:
            continue
        f = rng.poisson(persons * w[k] / size[k])
        r = np.rint(rng.lognormal(np.log(size[k]) - FACILITY_SIGMA ** 2 / 2, FACILITY_SIGMA, f))
        residents.append(np.clip(r, max(1, lo[k]), cap[k]).astype(np.int64))
        types.append(np.full(f, k, np.int64))
    fac_type = np.concatenate(types) if types else empty
    fac_res = np.concatenate(residents) if residents else empty
    room = persons - leaves  # every leaf keeps at least one person of the bulk type
    keep = np.cumsum(fac_res) <= room
    fac_type, fac_res = fac_type[keep], fac_res[keep]
    fac_leaf = rng.choice(leaves, size=fac_type.size, p=p)
    order = np.lexsort((fac_type, fac_leaf))
    bulk_persons = 1 + rng.multinomial(room - int(fac_res.sum()), p)
    mean = size[b] * rng.uniform(0.85, 1.15, leaves)
    fewest = -(-bulk_persons // cap[b])
    most = bulk_persons // lo[b] if lo[b] > 0 else np.maximum(bulk_persons, fewest)
    units = np.clip(np.rint(bulk_persons / mean), fewest, most).astype(np.int64)
    return _Population(bulk_persons, units, b, fac_leaf[order], fac_type[order], fac_res[order])


def _zero_rules(product: Product, unit_attribute: str | None) -> list[tuple[np.ndarray, int]]:
    """(cells that must stay empty, the axis redrawn for a record in one) of each structural zero of
    ``product`` (a constraint with rhs "zero"): the last attribute the zero depends on, not the unit one."""
    rules = []
    shape = product.schema.shape
    for spec in product.constraints.values():
        if spec.rhs != "zero":
            continue
        zero = build_query(product.schema, spec.query).groups >= 0
        cube = zero.reshape(shape)
        axes = [a for a in range(len(shape)) if not cube.any(axis=tuple(x for x in range(len(shape)) if x != a)).all()
                and product.schema.dim_names[a] != unit_attribute]
        if not axes:
            raise ConfigError(f"{product.name}: structural zero {spec.name!r} leaves no attribute to draw again")
        rules.append((zero, axes[-1]))
    return rules


def _draw(product: Product, shape: SynthShape, fixed: dict[str, np.ndarray], n: int, rng: np.random.Generator,
          unit_attribute: str | None) -> dict[str, np.ndarray]:
    """Levels of ``n`` records: ``fixed`` attributes as given, the others drawn from their weights, then the
    records in a structural-zero cell drawn again (that zero's last attribute) until none is left."""
    levels = {a.name: fixed[a.name] if a.name in fixed else rng.choice(a.size, size=n, p=shape.weights[a.name])
              for a in product.attributes}
    rules = _zero_rules(product, unit_attribute)
    names = product.schema.dim_names
    for _ in range(ZERO_ROUNDS):
        cells = np.asarray(product.schema.cell_index(*(levels[d] for d in names)))
        bad_any = False
        for zero, axis in rules:
            bad = np.flatnonzero(zero[cells])
            if bad.size:
                bad_any = True
                a = names[axis]
                levels[a][bad] = rng.choice(product.schema.dims[axis][1], size=bad.size, p=shape.weights[a])
                cells[bad] = np.asarray(product.schema.cell_index(*(levels[d][bad] for d in names)))
        if not bad_any:
            return levels
    raise ConfigError(f"{product.name}: the synth weights leave records in a structural zero after {ZERO_ROUNDS} "
                      "draws; give the zero's attributes weights outside it")


def _input_column(attribute: Attribute, levels: np.ndarray) -> pa.Array:
    """An attribute's input column for ``levels``: the level itself, or (with ``values``) the first input value
    declared for it."""
    if attribute.values is None:
        return pa.array(levels.astype(np.int8 if attribute.size <= 127 else np.int16))
    first: dict[int, object] = {}
    for value, level in attribute.values:
        first.setdefault(int(level), value)
    if missing := [k for k in range(attribute.size) if k not in first]:
        raise ConfigError(f"attribute {attribute.name!r}: no input value maps to level {missing[0]} (synth cannot "
                          "write it)")
    table = [first[k] for k in range(attribute.size)]
    if all(isinstance(v, int) and not isinstance(v, bool) for v in table):
        arr = np.asarray(table, np.int64)
        small = np.int16 if arr.min() >= -2 ** 15 and arr.max() < 2 ** 15 else np.int64
        return pa.array(arr.astype(small)[levels])
    return pa.array(np.asarray(table, dtype=object)[levels])


def _geography_columns(census: Census, tree: _Tree, leaf: np.ndarray) -> dict[str, pa.Array]:
    """The geography columns of records of the given leaves: the geocode (prefix hierarchy) or one code column
    per level below the root."""
    h = census.hierarchy
    if h.by_prefix:
        assert h.geocode is not None
        return {h.geocode: pa.array(tree.code[-1], pa.string()).take(pa.array(leaf))}
    return {level.column: pa.array(tree.code[d], pa.string()).take(pa.array(tree.ancestor(d)[leaf]))
            for d, level in enumerate(h.levels[1:]) if level.column is not None}


def _products(census: Census) -> tuple[list[Product], list[Product]]:
    """(products counting the person records, products counting the unit records): synth writes one person
    records file and the census's unit records."""
    units = census.units.name if census.units else None
    people = [p for p in census.products if p.records.name != units]
    if not people or len({p.records.name for p in people}) > 1:
        raise ConfigError(f"{census.source}: synth writes one record file besides the units; census "
                          f"{census.name!r} counts {sorted({p.records.name for p in people}) or 'none'}")
    return people, [p for p in census.products if p.records.name == units]


@writes("synth")
def write_census(out: Path, census: Census, persons: int, seed: int) -> dict[str, int]:
    """Write a synthetic input of ``census``'s shape, about ``persons_per_leaf`` persons per leaf and exactly
    ``persons`` persons: <records>/<partition>/part-00000.parquet, a partition per node of the first level below
    the root (:func:`partition_folder`), and the unit records alike when the census declares them; one row group
    per batch of leaves of at most :data:`CHUNK_PERSONS` persons, so memory stays bounded whatever ``persons``.
    Deterministic in ``seed``. ``out`` must be absent or empty; the files appear together at the end. Returns rows per file kind."""
    check_count(persons, "--persons", 1, MAX_PERSONS)
    people, unit_products = _products(census)
    hints = synth_hints(census)
    shapes = {p.name: synth_shape(census, p, hints.get(p.name, {})) for p in census.products}
    main = next((p for p in people if p.unit_bounds is not None), people[0])
    people = [main] + [p for p in people if p is not main]  # the unit attribute's column comes from main
    shape = shapes[main.name]
    leaves = min(persons, max(1, round(persons / shape.persons_per_leaf)))
    tree = synthetic_tree(census, shape, leaves, np.random.default_rng([seed, 0]))
    pop = synthetic_population(census, main, shape, leaves, persons, np.random.default_rng([seed, 1]))
    unit_attr = main.unit_bounds.attribute if census.units is not None and main.unit_bounds is not None else None
    first = tree.ancestor(0)
    leaf_persons = pop.bulk + np.bincount(pop.fac_leaf, pop.fac_residents, minlength=leaves).astype(np.int64)
    top = census.hierarchy.levels[1].column or census.hierarchy.levels[1].name.lower()  # the hive key
    staging = Path(tempfile.mkdtemp(prefix=".synth-", dir=out))
    kinds = [people[0].records.name] + ([census.units.name] if census.units else [])
    written = dict.fromkeys(kinds, 0)
    try:
        for i, code in enumerate(tree.code[0]):
            in_part = np.flatnonzero(first == i)
            writers: dict[str, pq.ParquetWriter] = {}
            batch_of = (np.cumsum(leaf_persons[in_part]) - 1) // CHUNK_PERSONS
            for batch in np.unique(batch_of):
                leaf = in_part[batch_of == batch]
                rng = np.random.default_rng([seed, 2, i, int(batch)])
                for kind, table in _batch_tables(census, people, unit_products, shapes, pop, tree, leaf, unit_attr,
                                                 rng).items():
                    if kind not in writers:
                        folder = staging / kind / partition_folder(top, code, table.schema.names)
                        folder.mkdir(parents=True, exist_ok=True)
                        writers[kind] = pq.ParquetWriter(folder / "part-00000.parquet", table.schema)
                    writers[kind].write_table(table, row_group_size=max(1, table.num_rows))
                    written[kind] += table.num_rows
            for writer in writers.values():
                writer.close()
        for kind in kinds:
            os.replace(staging / kind, out / kind)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return written


def partition_folder(key: str, code: str, columns: list[str]) -> str:
    """The folder of one partition's records: hive-style ``key=code`` (pandas and pyarrow read the folders as one
    table with a column ``key``), or ``code`` alone when the records hold a column ``key`` already (a column
    hierarchy's): a hive key that is also a column of the files makes pandas and pyarrow refuse the dataset
    (the folder's value is typed as a dictionary, the files' column as a string)."""
    return code if key in columns else f"{key}={code}"


def _batch_tables(census: Census, people: list[Product], unit_products: list[Product], shapes: dict[str, SynthShape],
                  pop: _Population, tree: _Tree, leaf: np.ndarray, unit_attr: str | None,
                  rng: np.random.Generator) -> dict[str, pa.Table]:
    """The person and unit records of one batch of leaves (sorted by leaf)."""
    fac = np.flatnonzero(np.isin(pop.fac_leaf, leaf))
    seg_leaf = np.concatenate([leaf, pop.fac_leaf[fac]])
    seg_type = np.concatenate([np.full(leaf.size, pop.bulk_type), pop.fac_type[fac]])
    seg_n = np.concatenate([pop.bulk[leaf], pop.fac_residents[fac]])
    order = np.lexsort((seg_type, seg_leaf))
    rows_leaf, rows_type = np.repeat(seg_leaf[order], seg_n[order]), np.repeat(seg_type[order], seg_n[order])
    n = rows_leaf.size
    columns = _geography_columns(census, tree, rows_leaf)
    for product in people:
        fixed = {unit_attr: rows_type} if unit_attr is not None and product.unit_bounds is not None else {}
        levels = _draw(product, shapes[product.name], fixed, n, rng, unit_attr)
        for a in product.attributes:
            columns.setdefault(a.column, _input_column(a, levels[a.name]))
    tables = {people[0].records.name: pa.table(columns)}
    if census.units is None:
        return tables
    u_n = np.concatenate([pop.bulk_units[leaf], np.ones(fac.size, np.int64)])
    u_leaf = np.repeat(seg_leaf[order], u_n[order])
    u_type = np.repeat(seg_type[order], u_n[order])
    units = _geography_columns(census, tree, u_leaf)
    units[census.units.type_column] = pa.array(u_type.astype(np.int8))
    units[census.units.occupied_column] = pa.array(np.ones(u_leaf.size, bool))
    for product in unit_products:
        levels = _draw(product, shapes[product.name], {}, u_leaf.size, rng, None)
        for a in product.attributes:
            if a.column not in units:
                units[a.column] = _input_column(a, levels[a.name])
    tables[census.units.name] = pa.table(units)
    return tables
