"""Constraint right-hand sides (DAS-2020 `source/programs/constraints/`), hand-checked."""
import numpy as np
import pandas as pd
import pytest

from topdown.pipeline.configuration.config import config_from_dict
from topdown.pipeline.configuration.census import PERSONS_PRODUCT
from topdown.pipeline.inputs.invariants import InvariantError, LevelConstraints, bind, check_feasible, level_rhs, unit_bounds

GQ_CAP = 99999  # the P.L. 94-171 declaration's cap on persons per unit


def _hhgq_bounds(u, total):
    return unit_bounds(u, total, PERSONS_PRODUCT.unit_bounds)


def person_constraints(*args):
    return level_rhs(PERSONS_PRODUCT, *args)

LEVELS = ["US", "State", "County", "Tract", "Block_Group", "Block"]


def test_the_declared_unit_bounds_are_the_bureaus():
    assert PERSONS_PRODUCT.unit_bounds.cap == (GQ_CAP,) * 8
    assert PERSONS_PRODUCT.unit_bounds.min_per_unit == (0, 1, 1, 1, 1, 1, 1, 1)


def test_bounds_without_total_invariant():
    u = np.array([[3, 2, 0, 0, 0, 0, 0, 1]])
    lb, ub = _hhgq_bounds(u, None)
    assert lb.tolist() == [[0, 2, 0, 0, 0, 0, 0, 1]]
    assert ub.tolist() == [[3 * GQ_CAP, 2 * GQ_CAP, 0, 0, 0, 0, 0, GQ_CAP]]


def test_bounds_with_total_invariant():
    # T = 50 persons; 3 HUs, 2 correctional facilities, 1 other noninstitutional facility.
    u = np.array([[3, 2, 0, 0, 0, 0, 0, 1]])
    lb, ub = _hhgq_bounds(u, np.array([50]))
    # ub_k = T - (forced persons in other types) if u_k > 0, else 0.
    assert ub.tolist() == [[50 - 3, 50 - 1, 0, 0, 0, 0, 0, 50 - 2]]
    assert lb.tolist() == [[0, 2, 0, 0, 0, 0, 0, 1]]


def test_only_unit_type_gets_everybody():
    u = np.array([[0, 0, 0, 0, 0, 4, 0, 0]])
    lb, ub = _hhgq_bounds(u, np.array([300]))
    assert lb[0, 5] == 300 and ub[0, 5] == 300
    assert ub[0, :5].tolist() == [0] * 5


def _cfg():
    return config_from_dict({
        "persons": {
            "budget": {"rho": "1", "levels": {lv: "1/6" for lv in LEVELS}, "queries": {lv: {"total": "1"} for lv in LEVELS}},
            "estimation": {"l2_passes": {lv: [["total"]] for lv in LEVELS}, "rounder_passes": {lv: [["total"]] for lv in LEVELS}},
            "invariants": {"State": ["tot"], "Block": ["gqhh_vect", "gqhh_tot"]},
            "constraints": {"US": ["total"], "State": ["hhgq_total_lb", "hhgq_total_ub"],
                            "Block": ["hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0"]},
        }
    }).product("persons")


def _units(rows, tot=None):
    cols = [f"u{k}" for k in range(8)]
    df = pd.DataFrame(rows, columns=cols).assign(occupied=0)
    if tot is not None:
        df["tot"] = tot
    return df


def test_constraints_propagate_and_state_takes_the_stricter():
    cfg = _cfg()
    blocks = _units([[2, 1, 0, 0, 0, 0, 0, 0], [1, 0, 0, 0, 0, 0, 0, 0]])
    cb = person_constraints(cfg, LEVELS, "Block", blocks, None, None)
    assert set(cb.rhs) == {"hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0"}
    county = _units([[3, 1, 0, 0, 0, 0, 0, 0]])
    cc = person_constraints(cfg, LEVELS, "County", county, cb, np.array([0, 0]))
    assert cc.rhs["hhgq_total_lb"].rhs[0].tolist() == [0, 1, 0, 0, 0, 0, 0, 0]
    assert cc.rhs["hhgq_total_ub"].rhs[0, :2].tolist() == [3 * GQ_CAP, GQ_CAP]
    state = _units([[3, 1, 0, 0, 0, 0, 0, 0]], tot=[10])
    cs = person_constraints(cfg, LEVELS, "State", state, cc, np.array([0]))
    assert cs.rhs["hhgq_total_ub"].rhs[0, :2].tolist() == [9, 10]
    us = person_constraints(cfg, LEVELS, "US", state, cs, np.array([0]))
    assert us.rhs["total"].rhs.tolist() == [[10]]
    assert us.rhs["hhgq_total_ub"].rhs[0, :2].tolist() == [9, 10]


def test_infeasible_truth_is_reported_without_counts():
    cons = LevelConstraints(pd.Index(["440010001001000"]), {"hhgq_total_lb": bind(PERSONS_PRODUCT.constraints["hhgq_total_lb"], np.array([[0, 5, 0, 0, 0, 0, 0, 0.]]))})
    with pytest.raises(InvariantError, match="440010001001000") as err:
        check_feasible("Block", cons, {"hhgq": np.array([[7, 3, 0, 0, 0, 0, 0, 0]])})
    assert "3" not in str(err.value).replace("440010001001000", "")


def test_a_part_of_a_state_is_not_pinned_by_its_total():
    """The Bureau's rule (DESIGN.md item 13): with its total T, a node without GQ facilities gets
    lb_0 = ub_0 = T (the Bureau's rule pins an AIAN part's total). A part's total is not invariant (NaN): it
    gets the bounds without a total, while a node that is a whole state keeps the bounds with its (invariant) total."""
    u = np.array([[5, 0, 0, 0, 0, 0, 0, 0], [5, 0, 0, 0, 0, 0, 0, 0]])
    lb, ub = _hhgq_bounds(u, np.array([40.0, 40.0]))
    assert lb[0, 0] == ub[0, 0] == 40  # the pinning the Bureau's rule implies
    lb, ub = _hhgq_bounds(u, np.array([np.nan, 40.0]))
    assert lb[0].tolist() == [0] * 8 and ub[0].tolist() == [5 * GQ_CAP] + [0] * 7
    assert lb[1, 0] == ub[1, 0] == 40
    parts = _units([[5, 0, 0, 0, 0, 0, 0, 0], [7, 1, 0, 0, 0, 0, 0, 0]], tot=[np.nan, np.nan])
    cs = person_constraints(_cfg(), LEVELS, "State", parts, None, None)
    assert cs.rhs["hhgq_total_lb"].rhs[0].tolist() == [0] * 8
    assert cs.rhs["hhgq_total_ub"].rhs[0, 0] == 5 * GQ_CAP and np.isfinite(cs.rhs["hhgq_total_ub"].rhs).all()


def test_units_right_hand_sides_are_the_housing_unit_counts_where_configured():
    from topdown.pipeline.configuration.census import PL94
    from topdown.pipeline.configuration.config import load_config

    units_product = PL94.products[1]
    cfg = load_config("demo").product("units")  # [units.constraints] Block = ["total"]
    nodes = _units([[3, 1, 0, 0, 0, 0, 0, 0], [0, 0, 0, 0, 0, 0, 0, 2]])
    for level in ("Block", "Tract", "US"):  # configured at the blocks: its sums bind every level above
        cons = level_rhs(units_product, cfg, LEVELS, level, nodes, None, None)
        assert list(cons.rhs) == ["total"] and cons.rhs["total"].rhs.tolist() == [[3], [0]]
        assert (cons.rhs["total"].query, cons.rhs["total"].sense) == ("total", "==")


def test_a_declared_products_right_hand_sides_come_from_its_kinds():
    """A product declared from scratch: structural zeros as predicates, unit bounds with its own minimum and
    cap, bound in the order of their kinds (unit bounds, zeros, totals)."""
    from test_declaration import SMALL

    from topdown.pipeline.configuration.census import census_from_dict

    census = census_from_dict(SMALL)
    people = census.products[0]
    levels = list(census.hierarchy.names)
    cfg = _cfg().model_copy(update={"invariants": {"Region": ["tot"]},
                                    "constraints": {"Region": ["total"], "Leaf": ["kind_lb", "no_child_kind2"]}})
    leaf = pd.DataFrame([[2, 1, 0, 0, 0, 0, 0, 0]], columns=[f"u{k}" for k in range(8)]).assign(occupied=1)
    cl = level_rhs(people, cfg, levels, "Leaf", leaf, None, None)
    assert list(cl.rhs) == ["kind_lb", "no_child_kind2"]
    assert cl.rhs["kind_lb"].rhs.tolist() == [[0, 1, 0]] and cl.rhs["no_child_kind2"].rhs.tolist() == [[0]]
    region = leaf.assign(tot=[7])
    cr = level_rhs(people, cfg, levels, "Region", region, cl, np.array([0]))
    assert list(cr.rhs) == ["kind_lb", "no_child_kind2", "total"] and cr.rhs["total"].rhs.tolist() == [[7]]
