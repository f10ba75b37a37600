"""The census declaration loader: a ``[census]`` TOML table (docs/reference/census.md) into the typed
objects of :mod:`topdown.vocab.census`, checked once, here.

:func:`load_census` reads a declaration file or a preset (``conf/census/NAME.toml``); :func:`census_from_dict`
reads a parsed ``[census]`` table (a run configuration's inline one). Every error is a :class:`ConfigError`
(exit 2) of one line naming the file, the dotted key and the offending value.
"""
from __future__ import annotations

import copy
import math
import os
import re
from functools import lru_cache
from pathlib import Path
from typing import Any

import topdown.conf
from topdown.vocab.census import (CONSTRAINT_RHS, INVARIANT_KINDS, GENERIC_MDF, MAX_CELLS, MAX_UNIT_TYPES, Attribute, Census,
                                  EvaluationRoles,
                                  ConstraintSpec, Hierarchy, InvariantSpec, Level, Product, Records, UnitBounds, UnitDetail,
                                  Units)
from topdown.vocab.queries import QueryError, build_query
from topdown.vocab.schema import Schema

from .errors import ConfigError, did_you_mean, query_hint, toml_files_beside
from .limits import read_toml_file

#: The census a run uses when its configuration names none (P.L. 94-171, ``conf/census/pl94.toml``).
DEFAULT_CENSUS = "pl94"
SENSES = ("==", "<=", ">=")
#: The Census MDF layouts of the P.L. 94-171 products (written, checked and read back by ``outputs/us_mdf.py``).
PL94_PERSONS_MDF, PL94_UNITS_MDF = "pl94_persons", "pl94_units"
#: The MDF layouts a product may declare (``mdf``).
MDF_LAYOUTS: tuple[str, ...] = (GENERIC_MDF, PL94_PERSONS_MDF, PL94_UNITS_MDF)
#: Right-hand sides and invariants computed from the unit records (``[census.units]``).
UNIT_RHS = ("unit_lower", "unit_upper", "occupied", "housing_units", "unit_counts")
UNIT_INVARIANTS = ("unit_counts", "unit_total", "housing_units")
_UNSET = object()


#: The keys each table of a declaration may hold (any other is refused with the closest valid one), by its
#: dotted key; ``P`` is a product's name, ``[]`` an array of tables. A product's ``synth`` holds the shape of
#: ``topdown synth --census`` input (test data, not the census: read and checked by ``inputs.synth``, not carried
#: by :class:`Product`).
DECLARATION_KEYS: dict[str, tuple[str, ...]] = {
    "census": ("name", "hierarchy", "units", "products"),
    "census.hierarchy": ("levels", "geocode", "pattern", "root_code", "us", "state"),
    "census.hierarchy.levels[]": ("name", "width", "column"),
    "census.units": ("name", "type_column", "types", "occupied_column", "detail"),
    "census.units.detail": ("column", "types", "vacant"),
    "census.products.P": ("records", "mdf", "evaluation_queries", "uncertainty_queries", "evaluation", "attributes",
                          "recodes", "invariants", "constraints", "unit_bounds", "synth"),
    "census.products.P.evaluation": ("diversity_query", "share_query", "sample_queries", "tradeoff_query",
                                     "homogeneity"),
    "census.products.P.records": ("name", "where"),
    "census.products.P.attributes[]": ("name", "size", "column", "labels", "values"),
    "census.products.P.recodes.NAME": ("attribute", "groups"),
    "census.products.P.constraints.NAME": ("query", "sense", "rhs"),
    "census.products.P.unit_bounds": ("attribute", "min_per_unit", "cap"),
}
PRODUCT_KEYS = DECLARATION_KEYS["census.products.P"]


def census_dir() -> Path:
    """The folder of shipped census declarations (``conf/census/``)."""
    return Path(topdown.conf.__file__).parent / "census"


def census_presets() -> list[str]:
    return sorted(p.stem for p in census_dir().glob("*.toml"))


def census_path(path_or_preset: str | Path, where: str | None = None) -> Path:
    """A declaration file as given, or the shipped preset of that name; ``where`` (``"FILE: run.census"``,
    ``"--census"``) starts the error's message."""
    p = Path(path_or_preset)
    if p.is_file() or (p.suffix == ".toml" and os.path.lexists(p)):  # not a regular file: refused when read
        return p
    candidate = census_dir() / (p.name if p.suffix == ".toml" else p.name + ".toml")
    if candidate.is_file():
        return candidate
    shown = f"{where} {str(path_or_preset)!r}" if where else str(path_or_preset)
    raise ConfigError(f"{shown}: no such census declaration file or preset (presets: {', '.join(census_presets())})"
                      + did_you_mean(path_or_preset, [*census_presets(), *toml_files_beside(p)]))


def load_census(path_or_preset: str | Path, where: str | None = None) -> Census:
    """Read and check a census declaration: a TOML file with a ``[census]`` table, or a preset name (``where``:
    see :func:`census_path`)."""
    return read_declaration(path_or_preset, where)[1]


def read_declaration(path_or_preset: str | Path, where: str | None = None) -> tuple[dict, Census]:
    """A census declaration file or preset (``where``: see :func:`census_path`): its ``[census]`` table as
    written (a copy) and the census it declares."""
    table, census = _load_file(str(census_path(path_or_preset, where).resolve()))
    return copy.deepcopy(table), census


@lru_cache(maxsize=16)
def _load_file(path: str) -> tuple[dict, Census]:
    data = read_toml_file(path, "the census declaration")
    if not isinstance(data.get("census"), dict):
        raise ConfigError(f"{path}: a census declaration needs a [census] table")
    return data["census"], census_from_dict(data["census"], source=path)


def default_census() -> Census:
    """The census of a run configuration that names none."""
    return load_census(DEFAULT_CENSUS)


def _short(value: Any) -> str:
    text = repr(value)
    return text if len(text) <= 80 else text[:77] + "..."


class _Reader:
    """Typed reads of a declaration's values; every failure names the source and the dotted key."""

    def __init__(self, source: str):
        self.source = source

    def fail(self, key: str, problem: str, value: Any = _UNSET, hint: str = "") -> ConfigError:
        """The error at ``key``, the offending ``value`` shown, then the ``hint`` (:func:`did_you_mean`)."""
        shown = "" if value is _UNSET else f" (got {_short(value)})"
        return ConfigError(f"{self.source}: {key}: {problem}{shown}{hint}")

    def table(self, data: Any, key: str, allowed: tuple[str, ...] | None = None) -> dict:
        if not isinstance(data, dict):
            raise self.fail(key, "expected a table", data)
        if allowed is not None:
            for k in data:
                if k not in allowed:
                    raise self.fail(f"{key}.{k}", f"unknown key (known: {', '.join(allowed)}){did_you_mean(k, allowed)}")
        return data

    def string(self, data: Any, key: str) -> str:
        if not isinstance(data, str) or not data:
            raise self.fail(key, "expected a non-empty string", data)
        return data

    def integer(self, data: Any, key: str, low: int = 0) -> int:
        if isinstance(data, bool) or not isinstance(data, int) or data < low:
            raise self.fail(key, f"expected an integer >= {low}", data)
        return data

    def boolean(self, data: Any, key: str) -> bool:
        if not isinstance(data, bool):
            raise self.fail(key, "expected true or false", data)
        return data

    def items(self, data: Any, key: str) -> list:
        if not isinstance(data, list):
            raise self.fail(key, "expected a list", data)
        return data

    def name(self, data: Any, key: str) -> str:
        """A name usable as a query term: no ``*``, no surrounding spaces."""
        text = self.string(data, key)
        if "*" in text or text != text.strip() or text in ("total", "detailed"):
            raise self.fail(key, "names may not contain '*', start or end with a space, or be 'total' or "
                                 "'detailed'", text)
        return text


def census_from_dict(data: dict, source: str = "<memory>") -> Census:
    """A :class:`Census` from a parsed ``[census]`` table (or a document holding one)."""
    r = _Reader(source)
    if set(data) == {"census"}:
        data = data["census"]
    data = r.table(data, "census", DECLARATION_KEYS["census"])
    name = r.string(data.get("name"), "census.name")
    if "hierarchy" not in data:
        raise r.fail("census.hierarchy", "missing: declare the levels of the geography")
    hierarchy = _hierarchy(r, data["hierarchy"])
    units = _units(r, data["units"]) if "units" in data else None
    products_data = r.table(data.get("products"), "census.products")
    if not products_data:
        raise r.fail("census.products", "declare at least one product")
    products = tuple(_product(r, pname, pdata, units) for pname, pdata in products_data.items())
    return Census(name=name, hierarchy=hierarchy, products=products, units=units, source=source)


def _pattern_width(r: _Reader, pattern: str, key: str) -> int | None:
    """The longest string ``pattern`` matches (None: unbounded)."""
    try:
        regex = re.compile(pattern)
    except re.error as exc:
        raise r.fail(key, f"not a regular expression ({exc})", pattern) from None
    _, high = re._parser.parse(regex.pattern).getwidth()  # type: ignore[attr-defined]
    return None if high >= 2**31 - 1 else int(high)  # sre's MAXREPEAT - 1 means unbounded


def _hierarchy(r: _Reader, data: Any) -> Hierarchy:
    key = "census.hierarchy"
    data = r.table(data, key, DECLARATION_KEYS["census.hierarchy"])
    raw = r.items(data.get("levels"), f"{key}.levels")
    if len(raw) < 2:
        raise r.fail(f"{key}.levels", "declare the root and at least one level below it", raw)
    levels: list[Level] = []
    for i, item in enumerate(raw):
        lk = f"{key}.levels[{i}]"
        item = r.table(item, lk, DECLARATION_KEYS["census.hierarchy.levels[]"])
        lname = r.string(item.get("name"), f"{lk}.name")
        if lname in (lv.name for lv in levels):
            raise r.fail(f"{lk}.name", "a level of this name is declared twice", lname)
        width, column = item.get("width"), item.get("column")
        if i == 0 and (width is not None or column is not None):
            raise r.fail(lk, "the root level has neither width nor column (its one node is root_code)", item)
        if i > 0 and (width is None) == (column is None):
            raise r.fail(lk, "a level below the root has exactly one of width (a prefix of the geocode) or "
                             "column (an input column)", item)
        levels.append(Level(lname, None if width is None else r.integer(width, f"{lk}.width", 1),
                            None if column is None else r.string(column, f"{lk}.column")))
    by_prefix = levels[1].width is not None
    for i, lv in enumerate(levels[1:], 1):
        if (lv.width is not None) != by_prefix:
            raise r.fail(f"{key}.levels[{i}]", "levels mix width and column: a hierarchy is either prefixes of one "
                                               "geocode column or one input column per level", lv.name)
    geocode = data.get("geocode")
    pattern = data.get("pattern")
    if by_prefix:
        geocode = r.string(geocode, f"{key}.geocode") if geocode is not None else None
        if geocode is None:
            raise r.fail(f"{key}.geocode", "a prefix hierarchy (levels with width) names its geocode column")
        widths = [lv.width for lv in levels[1:]]
        for i in range(1, len(widths)):
            if widths[i] <= widths[i - 1]:
                raise r.fail(f"{key}.levels[{i + 1}].width", f"widths must increase level by level (the level above "
                                                             f"has width {widths[i - 1]})", widths[i])
    elif geocode is not None:
        raise r.fail(f"{key}.geocode", "a column hierarchy (levels with column) has no geocode column", geocode)
    if pattern is not None:
        pattern = r.string(pattern, f"{key}.pattern")
        longest = _pattern_width(r, pattern, f"{key}.pattern")
        if by_prefix and longest is not None and levels[-1].width > longest:
            raise r.fail(f"{key}.levels[{len(levels) - 1}].width", f"wider than the longest geocode the pattern "
                                                                   f"{pattern!r} matches ({longest})", levels[-1].width)
    state = data.get("state")
    if state is not None and state not in (lv.name for lv in levels):
        raise r.fail(f"{key}.state", f"not a level (levels: {', '.join(lv.name for lv in levels)})", state)
    return Hierarchy(levels=tuple(levels), geocode=geocode, pattern=pattern,
                     root_code=r.string(data.get("root_code", "US"), f"{key}.root_code"),
                     us=r.boolean(data.get("us", False), f"{key}.us"), state=state)


def _units(r: _Reader, data: Any) -> Units:
    key = "census.units"
    data = r.table(data, key, DECLARATION_KEYS["census.units"])
    default = Units()
    types = r.integer(data.get("types", default.types), f"{key}.types", 1)
    if types > MAX_UNIT_TYPES:
        raise r.fail(f"{key}.types", f"at most {MAX_UNIT_TYPES} unit types", types)
    return Units(name=r.string(data.get("name", default.name), f"{key}.name"),
                 type_column=r.string(data.get("type_column", default.type_column), f"{key}.type_column"),
                 types=types,
                 occupied_column=r.string(data.get("occupied_column", default.occupied_column), f"{key}.occupied_column"),
                 detail=None if data.get("detail") is None else _unit_detail(r, data["detail"], types))


def _unit_detail(r: _Reader, data: Any, types: int) -> UnitDetail:
    """``[census.units.detail]``: each of the ``types`` unit types' codes (disjoint, non-negative integers)
    and the vacant housing units' codes (codes of type 0)."""
    key = "census.units.detail"
    data = r.table(data, key, DECLARATION_KEYS[key])
    listed = r.items(data.get("types"), f"{key}.types")
    if len(listed) != types:
        raise r.fail(f"{key}.types", f"one list of codes per unit type ({types})", listed)
    seen: dict[int, int] = {}
    by_type = []
    for k, codes in enumerate(listed):
        at = f"{key}.types[{k}]"
        codes = tuple(r.integer(c, f"{at}[{i}]") for i, c in enumerate(r.items(codes, at)))
        for c in codes:
            if c in seen:
                raise r.fail(at, f"code listed for unit types {seen[c]} and {k}", c)
            seen[c] = k
        if not codes:
            raise r.fail(at, "an empty list of codes", listed[k])
        by_type.append(codes)
    vacant = tuple(r.integer(c, f"{key}.vacant[{i}]")
                   for i, c in enumerate(r.items(data.get("vacant", []), f"{key}.vacant")))
    for c in vacant:
        if seen.get(c) != 0:
            raise r.fail(f"{key}.vacant", "a vacant code must be one of unit type 0's (housing units)", c)
    return UnitDetail(column=r.string(data.get("column"), f"{key}.column"), types=tuple(by_type), vacant=vacant)




def _records(r: _Reader, data: Any, key: str, default: str) -> Records:
    if data is None:
        return Records(default)
    if isinstance(data, str):
        return Records(r.string(data, key))
    data = r.table(data, key, DECLARATION_KEYS["census.products.P.records"])
    where = r.table(data.get("where", {}), f"{key}.where")
    pairs = tuple((col, tuple(v if isinstance(v, list) else [v])) for col, v in where.items())
    return Records(r.string(data.get("name"), f"{key}.name"), pairs)


def _attribute(r: _Reader, data: Any, key: str) -> Attribute:
    data = r.table(data, key, DECLARATION_KEYS["census.products.P.attributes[]"])
    name = r.name(data.get("name"), f"{key}.name")
    size = r.integer(data.get("size"), f"{key}.size", 1)
    labels = data.get("labels")
    if labels is not None:
        labels = tuple(r.string(x, f"{key}.labels[{i}]") for i, x in enumerate(r.items(labels, f"{key}.labels")))
        if len(labels) != size:
            raise r.fail(f"{key}.labels", f"{len(labels)} labels for an attribute of size {size}")
    values = data.get("values")
    if values is not None:
        pairs, seen = [], {}
        for i, pair in enumerate(r.items(values, f"{key}.values")):
            if not isinstance(pair, list) or len(pair) != 2:
                raise r.fail(f"{key}.values[{i}]", "expected [input value, level]", pair)
            if not isinstance(pair[0], (str, int, float)):  # bool is an int
                raise r.fail(f"{key}.values[{i}]", "an input value is a string, a number or true/false", pair[0])
            level = r.integer(pair[1], f"{key}.values[{i}]", 0)
            if level >= size:
                raise r.fail(f"{key}.values[{i}]", f"level out of range 0..{size - 1}", level)
            if pair[0] in seen:
                raise r.fail(f"{key}.values[{i}]", f"input value {pair[0]!r} is already mapped, by "
                                                   f"{key}.values[{seen[pair[0]]}] (one level per input value)", pair)
            seen[pair[0]] = i
            pairs.append((pair[0], level))
        values = tuple(pairs)
    return Attribute(name, size, r.string(data.get("column", name), f"{key}.column"), labels, values)


def _levels(r: _Reader, data: Any, key: str, attribute: str, size: int) -> tuple[int, ...]:
    """A list of levels of ``attribute`` (one integer is a list of one)."""
    levels = data if isinstance(data, list) else [data]
    out = []
    for level in levels:
        if isinstance(level, bool) or not isinstance(level, int) or not 0 <= level < size:
            raise r.fail(key, f"level out of range for attribute {attribute!r} (levels 0..{size - 1})", level)
        if level in out:
            raise r.fail(key, f"level listed twice for attribute {attribute!r}", level)
        out.append(level)
    if not out:
        raise r.fail(key, "an empty list of levels", data)
    return tuple(out)


def _recode(r: _Reader, data: Any, key: str, sizes: dict[str, int]) -> tuple[str, tuple[tuple[int, ...], ...]]:
    data = r.table(data, key, DECLARATION_KEYS["census.products.P.recodes.NAME"])
    attr = data.get("attribute")
    if attr not in sizes:
        raise r.fail(f"{key}.attribute", f"unknown attribute (attributes: {', '.join(sizes)})", attr,
                     did_you_mean(attr, sizes))
    groups, seen = [], set()
    for i, group in enumerate(r.items(data.get("groups"), f"{key}.groups")):
        levels = _levels(r, group, f"{key}.groups[{i}]", attr, sizes[attr])
        twice = seen & set(levels)
        if twice:
            raise r.fail(f"{key}.groups[{i}]", "level already in another group of this recode", min(twice))
        seen |= set(levels)
        groups.append(levels)
    if not groups:
        raise r.fail(f"{key}.groups", "declare at least one group")
    return attr, tuple(groups)


def _query(r: _Reader, schema: Schema, query: Any, key: str):
    """A query name on ``schema``, parsed (an unknown attribute or a malformed name is an error)."""
    text = r.string(query, key)
    try:
        return build_query(schema, text)
    except QueryError as exc:
        raise r.fail(key, str(exc), text, query_hint(exc)) from None


def _product(r: _Reader, name: str, data: Any, units: Units | None) -> Product:
    key = f"census.products.{name}"
    r.name(name, key)
    data = r.table(data, key, PRODUCT_KEYS)
    attrs = tuple(_attribute(r, a, f"{key}.attributes[{i}]")
                  for i, a in enumerate(r.items(data.get("attributes"), f"{key}.attributes")))
    if not attrs:
        raise r.fail(f"{key}.attributes", "declare at least one attribute")
    sizes: dict[str, int] = {}
    for i, a in enumerate(attrs):
        if a.name in sizes:
            raise r.fail(f"{key}.attributes[{i}].name", "an attribute of this name is declared twice", a.name)
        sizes[a.name] = a.size
    ncells = math.prod(sizes.values())
    if ncells > MAX_CELLS:
        raise r.fail(f"{key}.attributes", f"the histogram has {ncells:,} cells, above the limit of {MAX_CELLS:,} "
                                          "cells per product", " x ".join(str(s) for s in sizes.values()))
    recodes: dict[str, tuple[str, tuple[tuple[int, ...], ...]]] = {}
    for rname, rdata in r.table(data.get("recodes", {}), f"{key}.recodes").items():
        rkey = f"{key}.recodes.{rname}"
        r.name(rname, rkey)
        if rname in sizes:
            raise r.fail(rkey, "a recode may not have an attribute's name", rname)
        recodes[rname] = _recode(r, rdata, rkey, sizes)
    constraints_data = r.table(data.get("constraints", {}), f"{key}.constraints")
    # A structural zero declared as a predicate becomes a query over anonymous recodes "<constraint>.<attr>".
    zero_queries: dict[str, str] = {}
    for cname, cdata in constraints_data.items():
        if isinstance(cdata, dict) and "zero_where" in cdata:
            ckey = f"{key}.constraints.{cname}"
            r.name(cname, ckey)
            r.table(cdata, ckey, ("zero_where",))
            where = r.table(cdata["zero_where"], f"{ckey}.zero_where")
            if not where:
                raise r.fail(f"{ckey}.zero_where", "name at least one attribute and its levels")
            terms = []
            for attr, levels in where.items():
                if attr not in sizes:
                    raise r.fail(f"{ckey}.zero_where.{attr}", f"unknown attribute (attributes: {', '.join(sizes)})",
                                 attr, did_you_mean(attr, sizes))
                term = f"{cname}.{attr}"
                recodes[term] = (attr, (_levels(r, levels, f"{ckey}.zero_where.{attr}", attr, sizes[attr]),))
                terms.append(term)
            zero_queries[cname] = " * ".join(terms)
    schema = Schema(name=name, dims=tuple(sizes.items()), recodes=recodes)

    invariants = {}
    for iname, kind in r.table(data.get("invariants", {}), f"{key}.invariants").items():
        ikey = f"{key}.invariants.{iname}"
        if kind not in INVARIANT_KINDS:
            raise r.fail(ikey, f"unknown invariant kind (kinds: {', '.join(INVARIANT_KINDS)})", kind)
        if kind in UNIT_INVARIANTS and units is None:
            raise r.fail(ikey, f"invariant kind {kind!r} needs unit records: declare [census.units]", kind)
        invariants[iname] = InvariantSpec(iname, kind)

    bounds = None
    if "unit_bounds" in data:
        bkey = f"{key}.unit_bounds"
        bdata = r.table(data["unit_bounds"], bkey, DECLARATION_KEYS["census.products.P.unit_bounds"])
        if units is None:
            raise r.fail(bkey, "unit bounds need unit records: declare [census.units]")
        attr = bdata.get("attribute")
        if attr not in sizes:
            raise r.fail(f"{bkey}.attribute", f"unknown attribute (attributes: {', '.join(sizes)})", attr,
                         did_you_mean(attr, sizes))
        lists = {}
        for field in ("min_per_unit", "cap"):
            values = r.items(bdata.get(field), f"{bkey}.{field}")
            if len(values) != sizes[attr]:
                raise r.fail(f"{bkey}.{field}", f"{len(values)} values for attribute {attr!r} of size {sizes[attr]}",
                             values)
            lists[field] = tuple(r.integer(v, f"{bkey}.{field}[{i}]") for i, v in enumerate(values))
        for i, (low, cap) in enumerate(zip(lists["min_per_unit"], lists["cap"])):
            if low > cap:
                raise r.fail(f"{bkey}.min_per_unit[{i}]", f"above cap[{i}] = {cap} (no unit could hold its records)",
                             low)
        bounds = UnitBounds(attr, lists["min_per_unit"], lists["cap"])

    constraints = {}
    for cname, cdata in constraints_data.items():
        ckey = f"{key}.constraints.{cname}"
        if cname in zero_queries:
            constraints[cname] = ConstraintSpec(cname, zero_queries[cname], "==", "zero")
            continue
        cdata = r.table(cdata, ckey, DECLARATION_KEYS["census.products.P.constraints.NAME"])
        query = _query(r, schema, cdata.get("query"), f"{ckey}.query")
        sense, rhs = cdata.get("sense"), cdata.get("rhs")
        if sense not in SENSES:
            raise r.fail(f"{ckey}.sense", f"unknown sense (senses: {', '.join(SENSES)})", sense)
        if rhs not in CONSTRAINT_RHS:
            raise r.fail(f"{ckey}.rhs", f"unknown right-hand side (known: {', '.join(CONSTRAINT_RHS)})", rhs)
        if rhs in UNIT_RHS and units is None:
            raise r.fail(f"{ckey}.rhs", f"right-hand side {rhs!r} needs unit records: declare [census.units]", rhs)
        if rhs in ("unit_lower", "unit_upper"):
            if bounds is None:
                raise r.fail(f"{ckey}.rhs", f"right-hand side {rhs!r} needs [{key}.unit_bounds]", rhs)
            if query.n_answers != sizes[bounds.attribute]:
                raise r.fail(f"{ckey}.query", f"a {rhs} constraint bounds one answer per level of "
                                              f"{bounds.attribute!r} ({sizes[bounds.attribute]})", query.name)
        elif rhs == "unit_counts":
            if query.n_answers != units.types:
                raise r.fail(f"{ckey}.query", f"a unit_counts constraint needs one answer per unit type "
                                              f"({units.types})", query.name)
        elif rhs != "zero" and query.n_answers != 1:
            raise r.fail(f"{ckey}.query", f"a {rhs} constraint needs a query with one answer", query.name)
        constraints[cname] = ConstraintSpec(cname, query.name, sense, rhs)

    default = Product(schema=schema, records=Records(name), attributes=attrs)
    queries = {}
    for field in ("evaluation_queries", "uncertainty_queries"):
        if field not in data:
            queries[field] = getattr(default, field)
            continue
        values = r.items(data[field], f"{key}.{field}")
        queries[field] = tuple(_query(r, schema, q, f"{key}.{field}[{i}]").name for i, q in enumerate(values))
    mdf = data.get("mdf", "generic")
    if mdf not in MDF_LAYOUTS:
        raise r.fail(f"{key}.mdf", f"unknown MDF layout (layouts: {', '.join(MDF_LAYOUTS)})", mdf)
    return Product(schema=schema, records=_records(r, data.get("records"), f"{key}.records", name), attributes=attrs,
                   invariants=invariants, constraints=constraints, unit_bounds=bounds, mdf=mdf,
                   evaluation=_evaluation(r, schema, data.get("evaluation", {}), f"{key}.evaluation"), **queries)


def _evaluation(r: _Reader, schema: Schema, data: Any, key: str) -> EvaluationRoles:
    """A product's ``evaluation`` table: the queries of evaluate's studies, each parsed on its schema."""
    data = r.table(data, key, DECLARATION_KEYS["census.products.P.evaluation"])
    one = {k: _query(r, schema, data[k], f"{key}.{k}").name
           for k in ("diversity_query", "share_query", "tradeoff_query") if k in data}
    sample = tuple(_query(r, schema, q, f"{key}.sample_queries[{i}]").name
                   for i, q in enumerate(r.items(data.get("sample_queries", []), f"{key}.sample_queries")))
    if "tradeoff_query" in one and one["tradeoff_query"] not in sample:
        raise r.fail(f"{key}.tradeoff_query", "the trade-off figure compares runs with simple random samples: "
                                              "list its query in sample_queries too", one["tradeoff_query"])
    homogeneity = r.boolean(data["homogeneity"], f"{key}.homogeneity") if "homogeneity" in data else False
    return EvaluationRoles(sample_queries=sample, homogeneity=homogeneity, **one)



# The default census (P.L. 94-171, conf/census/pl94.toml), loaded once: the objects of the code that runs on it
# whatever the configuration says (the shipped U.S. inputs, ingest and synth, the pinned evaluations).
PL94: Census = default_census()
PERSONS_PRODUCT: Product = PL94.product("persons")
PERSONS: Schema = PERSONS_PRODUCT.schema
UNITS: Schema = PL94.product("units").schema
#: Unit types: 0 housing unit, 1..7 the major group-quarters types (in the order of hhgq's levels).
N_UNIT_TYPES: int = PL94.units.types
