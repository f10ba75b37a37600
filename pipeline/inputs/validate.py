"""Read and check the CEF-like input contract (docs/reference/input.md; DAS-2020 ``cef_validator_classes.py``).

persons.parquet: ``geoid`` (15-digit block GEOID), ``hhgq`` 0..7, ``votingage`` 0..1, ``hispanic`` 0..1,
``cenrace`` 0..62. units.parquet: ``geoid``, ``unit_type`` 0..7 (0 housing unit, 1..7 GQ major types in
hhgq order), ``occupied`` (bool; GQ facilities are always occupied).

Besides column-level checks, the structure the TopDown constraints rely on is checked, as the census declares
it (for P.L. 94-171, conf/census/pl94.toml):

* no record in a structural zero (a constraint ``== 0`` of right-hand side ``zero``; P.L. 94-171's
  ``nurse_nva_0``: no person under 18 in a nursing facility), by both readers;
* a product's ``unit_bounds``: the records of type k in a block are at most its units of type k x ``cap[k]``
  (a person needs a unit of their type: ``hhgq_total_ub``) and at least those units x ``min_per_unit[k]``
  (a GQ facility needs a resident: ``hhgq_total_lb``);
* GQ facilities are occupied.

A declared census (``topdown.vocab.census``) reads its own records with :func:`check_records`: the geography
of its hierarchy (a geocode column matching the declared pattern, or one code column per level, each code
nesting in one parent) and one column per attribute.

Every failure raises :class:`InputError` naming the file, the column, the block GEOID of the first
offending record and the bad value (a code or a GEOID). Messages never contain a count of persons, nor a
record's position in its file: in a file sorted by GEOID a row number is the number of persons (or units)
in the blocks before it, a confidential count; only declared invariants may be disclosed.
"""
from __future__ import annotations

import functools
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc

from topdown.geo.spine import US_HIERARCHY, nesting_problem
from topdown.vocab.census import Hierarchy, Product, Units
from topdown.vocab.queries import build_query

from ..configuration.census import default_census
from ..configuration.errors import InputError
from ..runtime.storage import parquet_file, read_table

#: The input's two record files (kinds): persons.parquet (or persons/) and units.parquet (or units/).
PERSON_RECORDS, UNIT_RECORDS = "persons", "units"
GEOID_LEN = 15

#: The product :func:`check_persons` reads: the default census's (conf/census/pl94.toml), from its person
#: records (:func:`validate_input`'s check of a P.L. 94-171 input; a run reads every census by
#: :func:`check_records`).
US_PERSONS: Product = default_census().product(PERSON_RECORDS)
#: Integer columns and their legal closed ranges, from the declaration.
PERSON_CODES: dict[str, tuple[int, int]] = {a.column: (0, a.size - 1) for a in US_PERSONS.attributes}
_US_UNITS = default_census().units
UNIT_CODES: dict[str, tuple[int, int]] = {_US_UNITS.type_column: (0, _US_UNITS.types - 1)}
PERSON_COLUMNS = ("geoid", *PERSON_CODES)
UNIT_COLUMNS = ("geoid", "unit_type", "occupied")


#: The largest grid of levels (cells of the attributes a structural zero restricts) its zeros are checked on at
#: once, with those of the other zeros restricting the same attributes; a larger zero is checked on its own.
ZERO_GRID = 1 << 20


def zero_checks(product: Product) -> list[tuple[tuple[int, ...], np.ndarray | None, list[tuple[str, list[np.ndarray]]]]]:
    """``product``'s structural zeros (its constraints ``== 0`` of right-hand side ``zero``), grouped by the
    attributes they restrict: per group, those attributes' positions, the grid of their levels inside one of
    the group's zeros (None: a zero larger than :data:`ZERO_GRID`, alone in its group), and each zero's name and
    levels inside it per attribute (a query's counted cells are a product of levels)."""
    groups: dict[tuple[int, ...], list] = {}
    for spec in product.constraints.values():
        if spec.rhs != "zero" or spec.sense != "==":
            continue
        maps = build_query(product.schema, spec.query).level_maps
        axes = tuple(i for i, m in enumerate(maps) if (m < 0).any())
        inside = [maps[i] >= 0 for i in axes]
        if math.prod(len(m) for m in inside) > ZERO_GRID:
            groups[(spec.name,)] = [axes, None, [(spec.name, inside)]]
            continue
        grid = functools.reduce(np.multiply.outer, inside, np.array(True))
        group = groups.setdefault(axes, [axes, np.zeros(grid.shape, dtype=bool), []])
        group[1] |= grid
        group[2].append((spec.name, inside))
    return [tuple(g) for g in groups.values()]


def _inside(axes: tuple[int, ...], inside: list[np.ndarray], levels: list[np.ndarray], n: int) -> np.ndarray:
    """Which of ``n`` records lie inside one zero (per attribute of ``axes``, its levels inside)."""
    bad = np.ones(n, dtype=bool)
    for i, m in zip(axes, inside):
        bad &= m[levels[i]]
    return bad


def check_zeros(path: Path, table: pa.Table, product: Product, levels: list[np.ndarray]) -> None:
    """No record of ``product`` lies in one of its structural zeros (``levels``: each attribute's level per
    record, rows of ``table``). The error names the zero's last attribute's column, the record's block and
    value, and the levels (with their labels; an input value where the attribute maps values) that put it
    there."""
    n = len(levels[0])
    for axes, grid, zeros in zero_checks(product):
        if grid is None:
            bad = _inside(axes, zeros[0][1], levels, n)
        elif axes:
            bad = grid.ravel()[np.ravel_multi_index(tuple(levels[i] for i in axes), grid.shape)]
        else:
            bad = np.full(n, bool(grid))
        if not bad.any():
            continue
        row = _first(bad)
        name = next(z for z, inside in zeros if _inside(axes, inside, [lv[row:row + 1] for lv in levels], 1)[0])
        shown = []
        for i in axes:  # an attribute of declared input values by its value, else by its level
            a, level = product.attributes[i], int(levels[i][row])
            value = repr(table.column(a.column)[row].as_py()) if a.values else level
            shown.append(f"{a.name} {value}" + (f" ({a.labels[level]})" if a.labels else ""))
        column = product.attributes[axes[-1] if axes else -1].column
        raise _fail(path, column, _block_of(table, row), f"a record of {product.records.name} in structural zero "
                    f"{name}: {', '.join(shown) or 'every record'}", table.column(column)[row].as_py())


def _fail(path: Path, column: str, block: str | None, problem: str, value: object = None) -> InputError:
    """The error for the first bad record: its file, column, block GEOID (None: not known) and value."""
    where = f", block {block}" if block is not None else ""
    shown = "" if value is None else f" (value {value!r})"
    return InputError(f"{path}: column '{column}'{where}: {problem}{shown}")


def _block_of(table: pa.Table, row: int) -> str | None:
    """The GEOID of record ``row`` when it is a string, else None (also before a column hierarchy's leaf
    geocodes are read)."""
    if "geoid" not in table.column_names:
        return None
    value = table.column("geoid")[row].as_py()
    return value if isinstance(value, str) else None


def _read(path: Path, columns: tuple[str, ...], row_groups: list[int] | None = None) -> pa.Table:
    """The ``columns`` of a Parquet file (only ``row_groups`` when given: one task's share of a big file)."""
    try:
        if row_groups is None:
            table = read_table(path)
        else:
            table = parquet_file(path).read_row_groups(row_groups)
    except (OSError, pa.ArrowException) as exc:
        raise InputError(f"{path}: not a readable Parquet file ({type(exc).__name__}: {exc})") from exc
    missing = [c for c in columns if c not in table.column_names]
    if missing:
        raise InputError(f"{path}: column '{missing[0]}': required column missing (have {table.column_names})")
    twice = [c for c in columns if table.column_names.count(c) > 1]
    if twice:
        raise InputError(f"{path}: column '{twice[0]}': appears {table.column_names.count(twice[0])} times (column "
                         "names must be unique)")
    return table.select(list(columns)).combine_chunks()


def _first(mask: np.ndarray) -> int:
    return int(np.flatnonzero(mask)[0])


def _check_nulls(path: Path, table: pa.Table) -> None:
    for name in table.column_names:
        col = table.column(name)
        if col.null_count:
            row = _first(pc.is_null(col).to_numpy(zero_copy_only=False))
            raise _fail(path, name, _block_of(table, row), "null value", None)


def _strings(path: Path, table: pa.Table, name: str, expected: str) -> pa.Array:
    """Column ``name`` as one Arrow string array (a dictionary of strings is decoded); another type fails."""
    col = table.column(name)
    if pa.types.is_dictionary(col.type) and pa.types.is_string(col.type.value_type):
        col = col.cast(pa.string())
    if not (pa.types.is_string(col.type) or pa.types.is_large_string(col.type) or pa.types.is_string_view(col.type)):
        value = col[0].as_py() if len(col) else None
        raise _fail(path, name, None, f"wrong type {col.type}, expected {expected}", value)
    col = col.cast(pa.string())
    return col.combine_chunks() if isinstance(col, pa.ChunkedArray) else col


def _geoids(path: Path, table: pa.Table, hierarchy: Hierarchy = US_HIERARCHY) -> pa.Array:
    """The geocode column of a prefix hierarchy, each value matching the declared pattern."""
    us = hierarchy.pattern == US_HIERARCHY.pattern
    col = _strings(path, table, hierarchy.geocode, "a 15-character string" if us else "a string")
    regex = f"^[0-9]{{{GEOID_LEN}}}$" if us else f"^(?:{hierarchy.pattern or '.+'})$"
    ok = pc.match_substring_regex(col, regex).to_numpy(zero_copy_only=False)
    if not ok.all():
        row = _first(~ok)
        expected = f"{GEOID_LEN} digits" if us else f"the declared pattern {hierarchy.pattern!r}"
        raise _fail(path, hierarchy.geocode, None, f"malformed GEOID, expected {expected}", col[row].as_py())
    return col


def geography_columns(hierarchy: Hierarchy) -> tuple[str, ...]:
    """The input columns a record's geography is read from: the geocode, or one column per level below the root."""
    return (hierarchy.geocode,) if hierarchy.by_prefix else tuple(level.column for level in hierarchy.levels[1:])


def _leaf_codes(path: Path, table: pa.Table, hierarchy: Hierarchy) -> tuple[pa.Array, pd.DataFrame | None]:
    """Each record's leaf geocode and, for a column hierarchy, the codes of every level per distinct leaf
    (columns named by the levels: public geography, what the driver builds the spine from). Every code is a
    non-empty string, the leaf's matches the declared pattern, and each level's codes nest in one parent."""
    if hierarchy.by_prefix:
        return _geoids(path, table, hierarchy), None
    codes = {}
    for level in hierarchy.levels[1:]:
        col = table.column(level.column)
        col = col.cast(pa.string()) if pa.types.is_integer(col.type) else col  # integer codes read as their digits
        codes[level.name] = col = _strings(path, pa.table({level.column: col}), level.column, "a string code")
        empty = pc.equal(pc.utf8_length(col), 0).to_numpy(zero_copy_only=False)
        if empty.any():
            raise _fail(path, level.column, None, f"empty {level.name} code", "")
    leaf = codes[hierarchy.leaf]
    if hierarchy.pattern:
        ok = pc.match_substring_regex(leaf, f"^(?:{hierarchy.pattern})$").to_numpy(zero_copy_only=False)
        if not ok.all():
            raise _fail(path, hierarchy.levels[-1].column, None,
                        f"malformed {hierarchy.leaf} code, expected the declared pattern {hierarchy.pattern!r}",
                        leaf[_first(~ok)].as_py())
    frame = pa.table(codes).group_by(list(codes)).aggregate([]).to_pandas(types_mapper=pd.ArrowDtype)
    frame = frame.astype("str")
    problem = nesting_problem(frame, hierarchy)
    if problem is not None:
        raise nesting_error(problem, hierarchy, path)
    return leaf, frame


def nesting_error(problem: tuple[str, str, str, str, str], hierarchy: Hierarchy, where: object) -> InputError:
    """The :class:`InputError` of a code under two parents (``spine.nesting_problem``'s finding) in ``where``."""
    level, code, parent, first, second = problem
    column = hierarchy.levels[hierarchy.names.index(level)].column
    return InputError(f"{where}: column '{column}': {level} code {code!r} lies in two {parent} codes, "
                      f"{first!r} and {second!r} (each code must nest in one parent)")


def _codes(path: Path, table: pa.Table, name: str, lo: int, hi: int) -> np.ndarray:
    col = table.column(name)
    if not pa.types.is_integer(col.type):
        value = col[0].as_py() if len(col) else None
        raise _fail(path, name, None, f"wrong type {col.type}, expected an integer", value)
    values = col.to_numpy()
    bad = (values < lo) | (values > hi)
    if bad.any():
        row = _first(bad)
        raise _fail(path, name, _block_of(table, row), f"code out of range {lo}..{hi}", int(values[row]))
    return values.astype(np.int8 if hi <= np.iinfo(np.int8).max else np.int64)


def _flags(path: Path, table: pa.Table, name: str) -> np.ndarray:
    col = table.column(name)
    if pa.types.is_boolean(col.type):
        return col.to_numpy(zero_copy_only=False).astype(bool)
    if pa.types.is_integer(col.type):
        return _codes(path, table, name, 0, 1).astype(bool)
    value = col[0].as_py() if len(col) else None
    raise _fail(path, name, None, f"wrong type {col.type}, expected bool", value)


def check_persons(path: Path, row_groups: list[int] | None = None) -> tuple[pa.Array, pd.DataFrame]:
    """Read and check the records of :data:`US_PERSONS` (of ``row_groups`` only, when given): nulls, GEOIDs,
    codes, and no record in a structural zero. Returns the GEOIDs and a frame of codes in file order."""
    table = _read(path, PERSON_COLUMNS, row_groups)
    _check_nulls(path, table)
    geo = _geoids(path, table)
    persons = pd.DataFrame({"geoid": pd.Series(geo.to_pandas(), dtype="str")})
    for name, (lo, hi) in PERSON_CODES.items():
        persons[name] = _codes(path, table, name, lo, hi)
    check_zeros(path, table, US_PERSONS, [persons[a.column].to_numpy() for a in US_PERSONS.attributes])
    return geo, persons


def check_units(path: Path, row_groups: list[int] | None = None, hierarchy: Hierarchy = US_HIERARCHY,
                declared: Units | None = None) -> tuple[pa.Array, pd.DataFrame]:
    """Read and check unit records (of ``row_groups`` only, when given): nulls, geography, codes, and GQ
    facilities occupied. Returns the leaf geocodes and a frame (geoid, unit_type, occupied) in file order; a
    column hierarchy's level codes per leaf are in the frame's ``attrs["geography"]``. ``declared`` names the
    unit columns (default: the P.L. 94-171 ones)."""
    declared = declared or Units()
    if hierarchy == US_HIERARCHY and declared == Units():
        table = _read(path, UNIT_COLUMNS, row_groups)
        _check_nulls(path, table)
        geo, geography = _geoids(path, table), None
    else:
        detail = () if declared.detail is None else (declared.detail.column,)
        columns = _unique((*geography_columns(hierarchy), declared.type_column, declared.occupied_column, *detail))
        table = _read(path, columns, row_groups)
        _check_nulls(path, table)
        geo, geography = _leaf_codes(path, table, hierarchy)
        table = pa.table({"geoid": geo, "unit_type": table.column(declared.type_column),
                          "occupied": table.column(declared.occupied_column),
                          **{c: table.column(c) for c in detail}})
    units = pd.DataFrame({"geoid": pd.Series(geo.to_pandas(), dtype="str")})
    units["unit_type"] = _codes(path, table, "unit_type", 0, declared.types - 1)
    units["occupied"] = _flags(path, table, "occupied")
    units.attrs["geography"] = geography
    utype = units["unit_type"].to_numpy(np.int64)
    unoccupied_gq = (utype > 0) & ~units["occupied"].to_numpy()
    if unoccupied_gq.any():
        row = _first(unoccupied_gq)
        raise _fail(path, "occupied", units['geoid'].iat[row], f"GQ facility of type {utype[row]} "
                    "is marked unoccupied (GQ facilities are always occupied)", False)
    if declared.detail is not None:
        _check_unit_detail(path, table, units, declared)
    return geo, units


def _check_unit_detail(path: Path, table: pa.Table, units: pd.DataFrame, declared: Units) -> None:
    """Each unit record's type and occupancy are the ones its ``[census.units.detail]`` code implies."""
    detail, names = declared.detail, (declared.type_column, declared.occupied_column)
    col = table.column(detail.column)
    if not pa.types.is_integer(col.type):
        raise _fail(path, detail.column, None, f"wrong type {col.type}, expected an integer",
                    col[0].as_py() if len(col) else None)
    codes = col.to_numpy()
    implied = detail.type_of(codes)
    problems = (
        (implied < 0, detail.column, "a code [census.units.detail] does not list", codes),
        (implied != units["unit_type"].to_numpy(np.int64), names[0],
         f"not the unit type its {detail.column} implies", units["unit_type"].to_numpy()),
        (units["occupied"].to_numpy() == np.isin(codes, detail.vacant), names[1],
         f"not the occupancy its {detail.column} implies", units["occupied"].to_numpy()))
    for bad, column, problem, values in problems:
        if bad.any():
            row = _first(bad)
            if column != detail.column:
                problem += f" ({detail.column} {int(codes[row])})"
            raise _fail(path, column, units["geoid"].iat[row], problem, values[row].item())


def _unique(names: tuple[str, ...]) -> tuple[str, ...]:
    return tuple(dict.fromkeys(names))


def check_records(path: Path, product: Product, hierarchy: Hierarchy, row_groups: list[int] | None = None
                  ) -> tuple[pd.Series, np.ndarray, pd.DataFrame | None]:
    """Read and check the records a declared ``product`` counts (of ``row_groups`` only, when given): the
    hierarchy's geography, nulls, each attribute's column (a level 0..size-1, or a value its ``values``
    map declares), and no record in a structural zero. Records outside the product's ``where`` are dropped.
    Returns each kept record's leaf geocode and histogram cell, and (column hierarchy) the level codes per leaf of the whole read."""
    attributes = product.attributes
    columns = _unique((*geography_columns(hierarchy), *(a.column for a in attributes),
                       *(column for column, _ in product.records.where)))
    table = _read(path, columns, row_groups)
    _check_nulls(path, table)
    geo, geography = _leaf_codes(path, table, hierarchy)
    if "geoid" not in table.column_names:  # errors name a record's block by its leaf geocode
        table = table.append_column("geoid", geo)
    if product.records.where:  # the geography of every record is checked (the spine is built from all)
        keep = np.ones(table.num_rows, dtype=bool)
        for column, values in product.records.where:
            keep &= pc.is_in(table.column(column), pa.array(list(values))).to_numpy(zero_copy_only=False)
        table = table.filter(pa.array(keep))
    levels = []
    for a in attributes:
        if a.values is None:
            levels.append(_codes(path, table, a.column, 0, a.size - 1).astype(np.int64))
            continue
        raw, mapped = pa.array([v for v, _ in a.values]), np.array([lv for _, lv in a.values], dtype=np.int64)
        at = pc.index_in(table.column(a.column), raw)
        if at.null_count:
            row = _first(pc.is_null(at).to_numpy(zero_copy_only=False))
            raise _fail(path, a.column, _block_of(table, row), f"value not declared for attribute {a.name!r}",
                        table.column(a.column)[row].as_py())
        levels.append(mapped[at.to_numpy()])
    check_zeros(path, table, product, levels)
    leaf = pd.Series(table.column("geoid").to_pandas(), dtype="str")
    cells = np.asarray(product.schema.cell_index(*levels), dtype=np.int64)
    return leaf, cells, geography


def _constraint_of(product: Product, rhs: str) -> str:
    """The name of ``product``'s first constraint of right-hand side ``rhs`` (else its unit bounds' key)."""
    return next((c.name for c in product.constraints.values() if c.rhs == rhs), f"{product.name}.unit_bounds")


def _bounded_column(product: Product) -> str:
    """The input column of ``product``'s unit-bounded attribute (its levels are the unit types)."""
    return next(a.column for a in product.attributes if a.name == product.unit_bounds.attribute)


def _unit(k: int) -> str:
    """Unit type ``k`` in words (:class:`Units`: 0 housing unit, then the group-quarters types)."""
    return "housing unit" if k == 0 else f"GQ facility of type {k}"


def block_problem(geoids: np.ndarray, persons_by_type: np.ndarray, units_by_type: np.ndarray, product: Product
                  ) -> tuple[str, str, int, str] | None:
    """The first problem of blocks (``geoids`` sorted; per block ``product``'s records and the units of each
    type) with ``product``'s unit bounds, as (file kind "persons" or "units", block GEOID, type, message), or
    None: the records of type k are at most the units of type k x ``cap[k]`` (a person of type k needs a unit
    of type k in the block) and at least those units x ``min_per_unit[k]`` (a GQ facility needs a resident)."""
    bounds = product.unit_bounds
    cap, low = np.asarray(bounds.cap, dtype=np.int64), np.asarray(bounds.min_per_unit, dtype=np.int64)
    over = persons_by_type > units_by_type * cap
    if over.any():
        b, k = np.argwhere(over)[0]
        text = (f"the block has no {_unit(k)} for this person" if units_by_type[b, k] == 0 else
                f"the block has more records of this type than its {_unit(k)}s hold ({cap[k]} each: "
                f"{_constraint_of(product, 'unit_upper')})")
        return PERSON_RECORDS, str(geoids[b]), int(k), text
    short = persons_by_type < units_by_type * low
    if short.any():
        b, k = np.argwhere(short)[0]
        units = "housing units" if k == 0 else "GQ facilities of this type"
        each = "a resident" if low[k] == 1 else f"{low[k]} residents"
        return UNIT_RECORDS, str(geoids[b]), int(k), (f"the block has more {units} than residents of that type "
                                                      f"(each facility needs {each}: "
                                                      f"{_constraint_of(product, 'unit_lower')})")
    return None


def raise_block_problem(problem: tuple[str, str, int, str] | None, persons_path: object, units_path: object,
                        product: Product, units: Units) -> None:
    """Raise the :class:`InputError` of :func:`block_problem`'s finding, naming the file it is in and the column:
    ``product``'s unit-bounded attribute's, or the ``units``' type column."""
    if problem is None:
        return
    kind, block, k, text = problem
    if kind == PERSON_RECORDS:
        raise _fail(persons_path, _bounded_column(product), block, text, k)
    raise _fail(units_path, units.type_column, block, text, k)


def by_type(geoids: pd.Series, codes: np.ndarray, blocks: np.ndarray, types: int) -> np.ndarray:
    """Records per (block, type 0..types-1), rows in the order of ``blocks`` (sorted unique GEOIDs)."""
    rows = np.searchsorted(blocks, geoids.to_numpy())
    return np.bincount(rows * types + codes.astype(np.int64), minlength=len(blocks) * types).reshape(len(blocks), types)


def validate_input(persons_path: Path | str, units_path: Path | str) -> tuple[pd.DataFrame, pd.DataFrame]:
    """Read persons.parquet and units.parquet of :data:`US_PERSONS`, check the contract, return compact frames
    in file order.

    Returned dtypes: ``geoid`` str, codes int8, ``occupied`` bool. Raises :class:`InputError`.
    """
    persons_path, units_path = Path(persons_path), Path(units_path)
    pgeo, persons = check_persons(persons_path)
    ugeo, units = check_units(units_path)
    blocks = np.union1d(pgeo.unique().to_numpy(zero_copy_only=False), ugeo.unique().to_numpy(zero_copy_only=False))
    types = _US_UNITS.types
    persons_by_type = by_type(persons["geoid"], persons[_bounded_column(US_PERSONS)].to_numpy(), blocks, types)
    units_by_type = by_type(units["geoid"], units["unit_type"].to_numpy(), blocks, types)
    raise_block_problem(block_problem(blocks, persons_by_type, units_by_type, US_PERSONS), persons_path, units_path,
                        US_PERSONS, _US_UNITS)
    return persons, units
