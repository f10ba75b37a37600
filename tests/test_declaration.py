"""Census declarations: the loader reads a ``[census]`` table into the typed
objects of vocab/census.py, and refuses a bad declaration with one line naming the file, the key and the value."""
from __future__ import annotations

import copy
import re
from itertools import product as iproduct
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from topdown.pipeline.configuration.census import census_from_dict, load_census
from topdown.pipeline.configuration.errors import ConfigError
from topdown.vocab.census import MAX_CELLS, EvaluationRoles
from topdown.vocab.queries import build_query

#: A small valid declaration: a prefix hierarchy, unit records, one product with every kind of declaration.
SMALL = {
    "name": "small",
    "hierarchy": {"geocode": "geoid", "pattern": r"\d{6}", "root_code": "ALL",
                  "levels": [{"name": "Nation"}, {"name": "Region", "width": 2}, {"name": "Leaf", "width": 6}]},
    "units": {"types": 3},
    "products": {"people": {
        "evaluation_queries": ["total", "kind * age"],
        "attributes": [{"name": "kind", "size": 3}, {"name": "age", "size": 4, "column": "age_group"},
                       {"name": "sex", "size": 2, "values": [["F", 0], ["M", 1]]}],
        "recodes": {"adult": {"attribute": "age", "groups": [[2, 3]]},
                    "young_old": {"attribute": "age", "groups": [[0, 1], [3]]},
                    "home": {"attribute": "kind", "groups": [[0]]}},
        "invariants": {"tot": "total", "units_vect": "unit_counts"},
        "constraints": {"total": {"query": "total", "sense": "==", "rhs": "total"},
                        "kind_lb": {"query": "kind", "sense": ">=", "rhs": "unit_lower"},
                        "home_occ": {"query": "home", "sense": ">=", "rhs": "occupied"},
                        "no_child_kind2": {"zero_where": {"kind": [2], "age": [0]}}},
        "unit_bounds": {"attribute": "kind", "min_per_unit": [0, 1, 1], "cap": [99, 99, 99]},
    }},
}


def declare(**edits) -> dict:
    """SMALL with ``edits``: dotted key (``products.people.recodes.adult.groups``) -> value (None deletes)."""
    data = copy.deepcopy(SMALL)
    for dotted, value in edits.items():
        *path, last = dotted.split("__")
        node = data
        for k in path:
            node = node[int(k)] if isinstance(node, list) else node[k]
        if value is None:
            del node[last]
        elif isinstance(node, list):
            node[int(last)] = value
        else:
            node[last] = value
    return data


def test_the_small_declaration_loads():
    census = census_from_dict(SMALL, source="small.toml")
    assert census.name == "small" and census.hierarchy.names == ("Nation", "Region", "Leaf")
    assert census.hierarchy.by_prefix and census.hierarchy.root_code == "ALL"
    (people,) = census.products
    assert people.name == "people" and people.schema.shape == (3, 4, 2)
    assert people.attributes[1].column == "age_group" and people.attributes[2].values == (("F", 0), ("M", 1))
    assert people.records.name == "people"
    zero = people.constraints["no_child_kind2"]
    assert (zero.sense, zero.rhs) == ("==", "zero")
    q = build_query(people.schema, zero.query)
    counted = np.flatnonzero(q.groups >= 0)
    kind, age, _ = people.schema.unravel(counted)
    assert q.n_answers == 1 and set(kind) == {2} and set(age) == {0} and counted.size == 2
    assert people.total_invariant and people.unit_bounds.min_per_unit == (0, 1, 1)


def test_a_unit_detail_gives_each_code_its_type():
    """``[census.units.detail]``: each code's unit type (-1 for a code no type lists) and the vacant codes."""
    units = census_from_dict(declare(units__detail={"column": "status", "types": [[0, 1, 4], [2], [3]],
                                                    "vacant": [1]})).units
    assert units.detail.column == "status" and units.detail.vacant == (1,)
    assert units.detail.type_of([0, 1, 2, 3, 4, 5, -1]).tolist() == [0, 0, 1, 2, 0, -1, -1]


def test_a_column_hierarchy_loads():
    census = census_from_dict(declare(hierarchy={"levels": [{"name": "Nation"}, {"name": "Region", "column": "reg"},
                                                            {"name": "District", "column": "dist"}]}))
    assert not census.hierarchy.by_prefix and census.hierarchy.levels[2].column == "dist"


def _refused(data: dict, *fragments: str) -> str:
    with pytest.raises(ConfigError) as err:
        census_from_dict(data, source="decl.toml")
    msg = str(err.value)
    assert msg.startswith("decl.toml: ") and "\n" not in msg, msg
    for f in fragments:
        assert f in msg, (f, msg)
    return msg


#: One bad declaration per case: the edit and the fragments its message must hold (key and value).
BAD = {
    "unknown attribute in a query": (
        {"products__people__evaluation_queries": ["total", "kind * colour"]},
        ("census.products.people.evaluation_queries[1]", "'colour'")),
    "unknown attribute in a recode": (
        {"products__people__recodes__adult": {"attribute": "agee", "groups": [[1]]}},
        ("census.products.people.recodes.adult.attribute", "'agee'")),
    "unknown attribute in a constraint": (
        {"products__people__constraints__kind_lb": {"query": "knd", "sense": ">=", "rhs": "unit_lower"}},
        ("census.products.people.constraints.kind_lb.query", "'knd'")),
    "unknown attribute in a structural zero": (
        {"products__people__constraints__no_child_kind2": {"zero_where": {"kind": [2], "agee": [0]}}},
        ("census.products.people.constraints.no_child_kind2.zero_where.agee", "'agee'")),
    "unknown attribute in unit_bounds": (
        {"products__people__unit_bounds__attribute": "sex2"},
        ("census.products.people.unit_bounds.attribute", "'sex2'")),
    "recode level out of range": (
        {"products__people__recodes__adult__groups": [[2, 4]]},
        ("census.products.people.recodes.adult.groups[0]", "got 4", "0..3")),
    "recode level in two groups": (
        {"products__people__recodes__young_old__groups": [[0, 1], [1, 3]]},
        ("census.products.people.recodes.young_old.groups[1]", "another group", "got 1")),
    "structural zero level out of range": (
        {"products__people__constraints__no_child_kind2": {"zero_where": {"kind": [3]}}},
        ("census.products.people.constraints.no_child_kind2.zero_where.kind", "got 3")),
    "query term that does not parse": (
        {"products__people__constraints__home_occ": {"query": "home * ", "sense": ">=", "rhs": "occupied"}},
        ("census.products.people.constraints.home_occ.query", "'home * '")),
    "two terms on one attribute": (
        {"products__people__evaluation_queries": ["age * adult"]},
        ("census.products.people.evaluation_queries[0]", "two terms", "'age * adult'")),
    "root level with a width": (
        {"hierarchy__levels": [{"name": "Nation", "width": 1}, {"name": "Leaf", "width": 6}]},
        ("census.hierarchy.levels[0]", "neither width nor column")),
    "level with both width and column": (
        {"hierarchy__levels__1": {"name": "Region", "width": 2, "column": "reg"}},
        ("census.hierarchy.levels[1]", "exactly one of width", "'reg'")),
    "level with neither width nor column": (
        {"hierarchy__levels__1": {"name": "Region"}},
        ("census.hierarchy.levels[1]", "exactly one of width", "'Region'")),
    "widths not increasing": (
        {"hierarchy__levels__2": {"name": "Leaf", "width": 2}},
        ("census.hierarchy.levels[2].width", "must increase", "got 2")),
    "width above the pattern's length": (
        {"hierarchy__levels__2": {"name": "Leaf", "width": 7}},
        ("census.hierarchy.levels[2].width", "pattern", "(6)", "got 7")),
    "constraint rhs outside the vocabulary": (
        {"products__people__constraints__total": {"query": "total", "sense": "==", "rhs": "totl"}},
        ("census.products.people.constraints.total.rhs", "'totl'", "unit_lower")),
    "constraint sense outside the vocabulary": (
        {"products__people__constraints__total": {"query": "total", "sense": "=", "rhs": "total"}},
        ("census.products.people.constraints.total.sense", "got '='")),
    "invariant kind outside the vocabulary": (
        {"products__people__invariants__tot": "grand_total"},
        ("census.products.people.invariants.tot", "'grand_total'", "unit_counts")),
    "constraint needing units without [census.units]": (
        {"units": None, "products__people__invariants": {"tot": "total"}, "products__people__unit_bounds": None,
         "products__people__constraints": {"home_occ": {"query": "home", "sense": ">=", "rhs": "occupied"}}},
        ("census.products.people.constraints.home_occ.rhs", "[census.units]", "'occupied'")),
    "invariant needing units without [census.units]": (
        {"units": None, "products__people__unit_bounds": None, "products__people__constraints": {}},
        ("census.products.people.invariants.units_vect", "[census.units]", "'unit_counts'")),
    "unit_bounds list of the wrong length": (
        {"products__people__unit_bounds__cap": [99, 99]},
        ("census.products.people.unit_bounds.cap", "2 values", "size 3", "[99, 99]")),
    "histogram above the cell limit": (
        {"products__people__attributes": [{"name": "a", "size": 65536}, {"name": "b", "size": 32769}]},
        ("census.products.people.attributes", "2,147,549,184 cells", f"limit of {MAX_CELLS:,} cells",
         "65536 x 32769")),
    "unknown key": (
        {"products__people__recode": {}},
        ("census.products.people.recode", "unknown key")),
    "more unit types than the invariants hold": (
        {"units__types": 9},
        ("census.units.types", "at most 8 unit types", "got 9")),
    "unit detail with a list per type missing": (
        {"units__detail": {"column": "status", "types": [[0, 1], [2]]}},
        ("census.units.detail.types", "one list of codes per unit type (3)", "[[0, 1], [2]]")),
    "unit detail listing a code for two types": (
        {"units__detail": {"column": "status", "types": [[0, 1], [2], [1]]}},
        ("census.units.detail.types[2]", "code listed for unit types 0 and 2", "got 1")),
    "unit detail whose vacant code is not a housing unit's": (
        {"units__detail": {"column": "status", "types": [[0, 1], [2], [3]], "vacant": [2]}},
        ("census.units.detail.vacant", "unit type 0's", "got 2")),
    "unit detail without its column": (
        {"units__detail": {"types": [[0, 1], [2], [3]]}},
        ("census.units.detail.column",)),
    "unit_counts constraint whose query has not one answer per unit type": (
        {"products__people__constraints__by_type": {"query": "sex", "sense": "==", "rhs": "unit_counts"}},
        ("census.products.people.constraints.by_type.query", "one answer per unit type (3)", "'sex'")),
    "unknown MDF layout": (
        {"products__people__mdf": "dhc"},
        ("census.products.people.mdf", "'dhc'", "generic")),
    "unknown attribute in an evaluation study's query": (
        {"products__people__evaluation": {"diversity_query": "kind * colour"}},
        ("census.products.people.evaluation.diversity_query", "'colour'")),
    "unknown evaluation study": (
        {"products__people__evaluation": {"blau_query": "kind"}},
        ("census.products.people.evaluation.blau_query", "unknown key", "diversity_query")),
    "a trade-off query that is not sampled": (
        {"products__people__evaluation": {"sample_queries": ["total"], "tradeoff_query": "kind * age"}},
        ("census.products.people.evaluation.tradeoff_query", "sample_queries", "'kind * age'")),
}


def test_evaluation_studies_are_declared_per_product():
    """A product's evaluation studies, each query parsed on its schema; none declared: every study left out."""
    roles = census_from_dict(declare(products__people__evaluation={
        "diversity_query": "kind * sex", "sample_queries": ["total", "kind * age"], "tradeoff_query": "kind * age",
        "homogeneity": True})).product("people").evaluation
    assert (roles.diversity_query, roles.share_query, roles.sample_queries, roles.tradeoff_query, roles.homogeneity) \
        == ("kind * sex", None, ("total", "kind * age"), "kind * age", True)
    assert census_from_dict(declare()).product("people").evaluation == EvaluationRoles()


@pytest.mark.parametrize("case", sorted(BAD))
def test_bad_declarations_are_refused_with_the_key_and_value(case):
    edits, fragments = BAD[case]
    _refused(declare(**edits), *fragments)


def test_a_bad_file_is_named(tmp_path):
    path = tmp_path / "mine.toml"
    path.write_text('[census]\nname = "x"\n[census.hierarchy]\nlevels = [{ name = "A" }, { name = "B" }]\n'
                    '[census.products.p]\nattributes = [{ name = "a", size = 0 }]\n')
    with pytest.raises(ConfigError, match=re.escape(f"{path}: census.hierarchy.levels[1]: a level below the root")):
        load_census(path)
    path.write_text("[census\n")
    with pytest.raises(ConfigError, match="not valid TOML"):
        load_census(path)
    with pytest.raises(ConfigError, match=r"no such census declaration file or preset \(presets: .*pl94"):
        load_census(tmp_path / "absent")


# Any declared recode, and any cross of declared terms, is the query build_query builds from the schema.
_ATTRS = st.lists(st.integers(1, 6), min_size=1, max_size=4)


@st.composite
def _declared(draw):
    sizes = draw(_ATTRS)
    names = [f"a{i}" for i in range(len(sizes))]
    recodes = {}
    for j in range(draw(st.integers(0, 4))):
        axis = draw(st.integers(0, len(sizes) - 1))
        levels = draw(st.permutations(range(sizes[axis])))
        kept = levels[:draw(st.integers(1, sizes[axis]))]
        cuts = sorted(draw(st.sets(st.integers(1, max(1, len(kept) - 1)), max_size=len(kept) - 1)))
        groups = [list(kept[a:b]) for a, b in zip([0, *cuts], [*cuts, len(kept)]) if kept[a:b]]
        recodes[f"r{j}"] = {"attribute": names[axis], "groups": groups}
    terms = draw(st.lists(st.sampled_from(names + list(recodes)), max_size=3))
    return sizes, names, recodes, terms


@settings(max_examples=60, deadline=None)
@given(_declared())
def test_declared_recodes_and_queries_round_trip(drawn):
    sizes, names, recodes, terms = drawn
    data = declare(products={"p": {"attributes": [{"name": n, "size": s} for n, s in zip(names, sizes)],
                                   "recodes": recodes}}, units=None)
    schema = census_from_dict(data).products[0].schema
    assert schema.dims == tuple(zip(names, sizes))
    for rname, spec in recodes.items():
        assert schema.recodes[rname] == (spec["attribute"], tuple(tuple(g) for g in spec["groups"]))
    axes = {}
    for t in terms:
        axis = names.index(recodes[t]["attribute"] if t in recodes else t)
        if axis in axes:
            return  # two terms on one axis: build_query refuses it (tested above)
        axes[axis] = [[k] for k in range(sizes[axis])] if t in names else recodes[t]["groups"]
    name = " * ".join(terms) if terms else "total"
    q = build_query(schema, name)
    # From first principles: the answer of a cell is the row-major index of its groups over the crossed axes.
    for cell, levels in enumerate(iproduct(*(range(s) for s in sizes))):
        index, excluded = 0, False
        for axis in sorted(axes):
            group = [i for i, g in enumerate(axes[axis]) if levels[axis] in g]
            excluded |= not group
            index = index * len(axes[axis]) + (group[0] if group else 0)
        assert q.groups[cell] == (-1 if excluded else index)
    assert q.n_answers == int(np.prod([len(g) for g in axes.values()]))


# P.L. 94-171 declared: conf/census/pl94.toml gives the persons schema the Python code gave,
# cell for cell. The expected values are computed here from first principles.
def _census_race_order() -> list[tuple[int, ...]]:
    """The 63 race combinations in Census order: 6-bit membership strings (White most significant), '1' before
    '0', the empty one dropped, stable-sorted by the number of races."""
    strings = [s for s in ("".join(b) for b in iproduct("10", repeat=6)) if "1" in s]
    strings.sort(key=lambda s: s.count("1"))
    return [tuple(int(c) for c in s) for s in strings]


def _expected_pl94_recodes() -> dict[str, tuple[str, tuple[tuple[int, ...], ...]]]:
    combos = _census_race_order()
    of = lambda pred: tuple(i for i, c in enumerate(combos) if pred(c))  # noqa: E731
    races = ("white", "black", "aian", "asian", "nhpi", "sor")
    return {
        "hhinstlevels": ("hhgq", ((0,), (1, 2, 3, 4), (5, 6, 7))),
        "gqlevels": ("hhgq", tuple((k,) for k in range(1, 8))),
        "householdTotal": ("hhgq", ((0,),)),
        "gqTotal": ("hhgq", (tuple(range(1, 8)),)),
        "gqNursingTotal": ("hhgq", ((3,),)),
        "nonvoting": ("votingage", ((0,),)),
        "voting": ("votingage", ((1,),)),
        "majorRaces": ("cenrace", tuple((k,) for k in range(6)) + (of(lambda c: sum(c) > 1),)),
        # White alone; Black alone or Black + White; ... SOR alone or SOR + White; everything else.
        "cenrace_7lev_two_comb": ("cenrace", ((0,),) + tuple(
            of(lambda c, r=r: c == tuple(int(i == r) for i in range(6)))
            + of(lambda c, r=r: c == tuple(int(i in (0, r)) for i in range(6))) for r in range(1, 6))
            + (tuple(i for i in range(63) if i not in (0, *range(1, 11))),)),
        "numraces": ("cenrace", tuple(of(lambda c, k=k: sum(c) == k) for k in range(1, 7))),
        **{f"{race}Combo": ("cenrace", (of(lambda c, r=r: c[r] == 1),)) for r, race in enumerate(races)},
    }


def _expected_groups(dims: list[tuple[str, int]], recodes: dict, name: str) -> np.ndarray:
    """A query's answer per cell (-1: not counted), row-major over the dimensions, by enumeration."""
    if name == "total":
        return np.zeros(int(np.prod([s for _, s in dims])), dtype=np.int64)
    if name == "detailed":
        name = " * ".join(d for d, _ in dims)
    factors = {}
    for term in name.split(" * "):
        dim, groups = recodes[term] if term in recodes else (term, tuple((k,) for k in range(dict(dims)[term])))
        factors[dim] = groups
    out = []
    for levels in iproduct(*(range(s) for _, s in dims)):
        index, excluded = 0, False
        for (dim, _), level in zip(dims, levels):
            if dim in factors:
                g = [i for i, grp in enumerate(factors[dim]) if level in grp]
                excluded |= not g
                index = index * len(factors[dim]) + (g[0] if g else 0)
        out.append(-1 if excluded else index)
    return np.array(out)


def test_pl94_declaration_is_the_old_persons_schema_cell_for_cell():
    from topdown.pipeline.configuration.config import load_config

    pl94 = load_census("pl94")
    persons, units = pl94.products
    dims = [("hhgq", 8), ("votingage", 2), ("hispanic", 2), ("cenrace", 63)]
    assert list(persons.schema.dims) == dims and persons.schema.ncells == 2016
    expected = _expected_pl94_recodes()
    assert persons.schema.recodes == expected  # every recode's groups, in order
    assert units.schema.dims == (("occupancy", 2),)
    assert units.schema.recodes == {"occupied": ("occupancy", ((0,),)), "vacant": ("occupancy", ((1,),))}
    # Every query of the production strategy (budgets and estimation passes), and the constraints' queries.
    config = load_config("pl94_production_2021")
    cfg = config.product("persons")
    names = {q for level in cfg.budget.queries.values() for q in level}
    names |= {q for passes in (*cfg.estimation.l2_passes.values(), *cfg.estimation.rounder_passes.values())
              for group in passes for q in group}
    names |= {c.query for c in persons.constraints.values()} | set(persons.evaluation_queries)
    assert {"detailed", "votingage * hispanic * cenrace", "hhinstlevels"} <= names
    for name in sorted(names):
        got = build_query(persons.schema, name).groups
        assert np.array_equal(got, _expected_groups(dims, expected, name)), name
    # The declared vocabulary of the persons product (constraints and invariants).
    assert {n: (c.query, c.sense, c.rhs) for n, c in persons.constraints.items()} == {
        "total": ("total", "==", "total"), "hhgq_total_lb": ("hhgq", ">=", "unit_lower"),
        "hhgq_total_ub": ("hhgq", "<=", "unit_upper"), "nurse_nva_0": ("gqNursingTotal * nonvoting", "==", "zero"),
        "hh_lb_occupied": ("householdTotal", ">=", "occupied")}
    assert {n: i.kind for n, i in persons.invariants.items()} == {
        "tot": "total", "gqhh_vect": "unit_counts", "gqhh_tot": "unit_total"}
    assert persons.unit_bounds.min_per_unit == (0,) + (1,) * 7 and persons.unit_bounds.cap == (99999,) * 8
    assert pl94.hierarchy.names == ("US", "State", "County", "Tract", "Block_Group", "Block")
    assert [lv.width for lv in pl94.hierarchy.levels] == [None, 2, 5, 11, 12, 15]


# A run configuration selects its census: [run] census = preset or file, or inline tables.
PL94_TEXT = (Path(__file__).resolve().parents[1] / "conf" / "census" / "pl94.toml").read_text()


def test_the_default_census_leaves_config_json_unchanged(tmp_path):
    from topdown.pipeline.configuration.config import config_from_dict, load_config, read_toml

    default = load_config("demo")
    assert default.census.name == "pl94" and [p.name for p in default.census.products] == ["persons", "units"]
    dumped = default.model_dump(mode="json")
    assert list(dumped) == ["run", "persons", "units"] and "census" not in dumped["run"]
    named = tmp_path / "named.toml"
    named.write_text('include = "demo.toml"\n[run]\ncensus = "pl94"\n')
    assert load_config(named).digest() == default.digest()
    # A census file elsewhere is part of the configuration (and of its hash), and survives a round trip.
    (tmp_path / "mine.toml").write_text(PL94_TEXT.replace('name = "pl94"', 'name = "mine"'))
    mine = tmp_path / "run.toml"
    mine.write_text('include = "demo.toml"\n[run]\ncensus = "mine.toml"\n')
    config = load_config(mine)
    dumped = config.model_dump(mode="json")  # the declaration itself, not its path
    assert config.census.name == "mine" and "census" not in dumped["run"] and dumped["census"]["name"] == "mine"
    assert config.digest() != default.digest()
    # Inline [census] tables: the configuration's JSON holds them, and validates again from it.
    inline = tmp_path / "inline.toml"
    inline.write_text('include = "demo.toml"\n' + PL94_TEXT.replace('name = "pl94"', 'name = "inline"'))
    config = load_config(inline)
    assert config.census.name == "inline" and config.model_dump(mode="json")["census"]["name"] == "inline"
    again = config_from_dict(config.model_dump(mode="json"), source="again")
    assert again.census.name == "inline" and again.digest() == config.digest()
    assert config.product("persons") == default.product("persons")
    data = read_toml(inline)
    data["run"]["census"] = "pl94"
    with pytest.raises(ConfigError, match="declare the census one way"):
        config_from_dict(data, source="both.toml")


@pytest.mark.parametrize("toml, fragments", [
    ('[run]\nproducts = ["persons", "households"]\n', ("run.products", "'households'", "census 'pl94'")),
    ('[households.budget]\nrho = "1"\n', ("[households]", "not a product of census 'pl94'")),
    ('[persons.invariants]\nCounty = ["tot", "population"]\n', ("[persons.invariants].County", "'population'")),
    ('[persons.constraints]\nDistrict = ["total"]\n', ("[persons.constraints]", "'District'", "Block_Group")),
    ('[persons.estimation.l2_passes]\nDistrict = [["total"]]\n', ("persons.estimation.l2_passes.District",
                                                                   "unknown level")),
    ('[run]\ncensus = "no_such_census"\n', ("no_such_census", "no such census declaration", "pl94")),
])
def test_configurations_are_checked_against_their_census(tmp_path, toml, fragments):
    from topdown.pipeline.configuration.config import load_config

    path = tmp_path / "bad.toml"
    path.write_text('include = "demo.toml"\n' + toml)
    with pytest.raises(ConfigError) as err:
        load_config(path)
    assert "\n" not in str(err.value)
    for f in fragments:
        assert f in str(err.value), (f, str(err.value))


@pytest.mark.parametrize("setup, fragments", [
    # a census file named by [run] census
    (lambda: ('[run]\ncensus = "decl.toml"\n',
              PL94_TEXT.replace('gqNursingTotal = { attribute = "hhgq", groups = [[3]] }',
                                'gqNursingTotal = { attribute = "hhgq", groups = [[8]] }')),
     ("decl.toml", "census.products.persons.recodes.gqNursingTotal.groups[0]", "got 8", "0..7")),
    (lambda: ('[run]\ncensus = "decl.toml"\n',
              PL94_TEXT.replace('query = "gqNursingTotal * nonvoting"', 'query = "gqNursingTotal * nonvotign"')),
     ("decl.toml", "census.products.persons.constraints.nurse_nva_0.query", "'nonvotign'")),
    # inline [census] tables
    (lambda: (PL94_TEXT + '[[census.products.persons.attributes]]\nname = "age"\nsize = 1065221\n', None),
     ("bad.toml", "census.products.persons.attributes", "2,147,485,536 cells", "limit of 2,147,483,648 cells")),
    (lambda: (PL94_TEXT.replace('{ name = "Tract", width = 11 }', '{ name = "Tract", width = 11, column = "t" }'),
              None),
     ("bad.toml", "census.hierarchy.levels[3]", "exactly one of width", "'t'")),
])
def test_bad_declarations_through_topdown_run(tmp_path, setup, fragments):
    from cli_subprocess import assert_clean_failure, snapshot, topdown

    toml, decl = setup()
    if decl is not None:
        (tmp_path / "decl.toml").write_text(decl)
    (tmp_path / "bad.toml").write_text('include = "demo.toml"\n' + toml)
    before = snapshot(tmp_path)
    outcome = topdown("run", "bad.toml", "--out", "run", "--input", "no-input", "--workers", "1", "--quiet",
                      cwd=tmp_path, timeout=120)
    assert_clean_failure(outcome, 2, *fragments)
    assert snapshot(tmp_path) == before  # nothing written
