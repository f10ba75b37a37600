"""Synthetic input of household-based censuses (``topdown synth --census dhc2020``): persons who live in
households and group quarters, not records drawn attribute by attribute (not real data; every draw comes from
``default_rng`` of the seed).

A declaration asks for it with ``generator = "by_household"`` in a product's ``[census.products.P.synth]`` table.
Its products then follow the layout of the 2020 Demographic and Housing Characteristics file
(``conf/census/dhc2020.toml``), checked when the generator starts:

* a persons product counting the person records: ``relgq`` (relationship 0..17, then group-quarters types, each
  in a group of the recode ``hhgq8lev`` whose index is the facility's unit type), ``sex``, ``age`` (single years),
  ``hispanic``, ``cenrace`` (63 combinations, the first six single races);
* a households product counting the occupied housing units (``where`` on the units' ``tenvacgq``): the
  householder's ``sex``, ``hhage``, ``hispanic`` and ``race``, the household's ``elderly`` and ``hhtype``, whose
  level is found from the household's composition through the recodes ``hh_size``, ``coupled_hh_type``,
  ``own_child_status``, ``multig``, ``with_relatives``, ``child_under_18`` and ``child_excluding_couple``;
* a units product counting every unit record by ``tenvacgq`` (0-3 tenure, 4-10 vacancy, then the GQ types).

Shape (rounded national shares of 2020): blocks of about ``persons_per_leaf`` persons (lognormal, 30 % without
households), 28 % of households one person, 47 % married couples (1 % of them same-sex), 7 % cohabiting
couples, the rest single parents and other families or roommates; own children by the householder's age,
parents, grandchildren and siblings in some households (multigenerational ones follow); a household's members
mostly share its race and ethnicity; 11 % of housing units vacant; about one group-quarters facility per 100
blocks, its residents' ages by type (college students 18-22, nursing home residents mostly 75+, ...). Every
record's cell satisfies the declared structural zeros (an age outside them is drawn again within them).
"""
from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import numpy as np
import pyarrow as pa
import pyarrow.parquet as pq

from topdown.vocab.census import Census, Product
from topdown.vocab.queries import build_query

from ..configuration.config import ConfigError
from ..configuration.limits import MAX_PERSONS, check_count
from ..runtime.outdir import writes
from .us_synth import _geography

#: Household kinds: alone, married opposite-sex, married same-sex, cohabiting opposite-sex, cohabiting same-sex,
#: single parent or other family, roommates (no relatives).
KIND_SHARES = np.array([0.28, 0.465, 0.005, 0.065, 0.005, 0.13, 0.05])
ALONE, MARRIED_OPP, MARRIED_SAME, COHAB_OPP, COHAB_SAME, FAMILY, ROOMMATES = range(7)
#: coupled_hh_type's groups: married same-sex, married opposite-sex, cohabiting same-sex, opposite-sex, none.
COUPLE_GROUP = np.array([4, 1, 0, 3, 2, 4, 4])
#: Race groups of households: not Hispanic white, black, AIAN, Asian, NHPI, SOR, two or more; then Hispanic.
RACE_SHARES = np.array([0.60, 0.12, 0.007, 0.058, 0.002, 0.005, 0.028, 0.18])
#: Housing units vacant, and the vacancy statuses' shares (tenvacgq 4..10).
VACANT_SHARE = 0.11
VACANCY_SHARES = np.array([0.2, 0.03, 0.06, 0.04, 0.3, 0.01, 0.36])
#: Tenure (mortgage, free and clear, rented, no rent) for householders under 65 and 65+.
TENURE_YOUNG, TENURE_OLD = np.array([0.45, 0.12, 0.41, 0.02]), np.array([0.25, 0.5, 0.23, 0.02])
#: Group-quarters facilities per block (at most GQ_SHARE of the persons live in them), and per GQ type (in relgq order from 18) its share of facilities,
#: median residents and age range of most residents.
FACILITIES_PER_BLOCK = 0.01
GQ_SHARE = 0.025
GQ_TYPES = [  # share, median residents, (low, high) ages
    (0.02, 600, (18, 60)), (0.03, 150, (18, 60)), (0.06, 60, (18, 55)), (0.01, 80, (18, 50)),
    (0.02, 40, (18, 60)), (0.01, 50, (18, 60)), (0.02, 30, (12, 20)), (0.02, 20, (12, 20)), (0.01, 15, (12, 20)),
    (0.20, 80, (70, 100)), (0.01, 100, (20, 80)), (0.01, 30, (20, 90)), (0.01, 20, (30, 90)), (0.005, 15, (18, 60)),
    (0.005, 15, (5, 25)), (0.12, 250, (18, 22)), (0.04, 200, (18, 30)), (0.005, 100, (18, 40)), (0.05, 25, (20, 70)),
    (0.05, 30, (18, 60)), (0.02, 20, (18, 60)), (0.02, 15, (25, 70)), (0.01, 15, (18, 70)), (0.25, 20, (18, 80)),
]
#: Relationship levels (relgq) of household members.
REL_ALONE, REL_HOUSEHOLDER, REL_SPOUSE_OPP, REL_PARTNER_OPP, REL_SPOUSE_SAME, REL_PARTNER_SAME = 0, 1, 2, 3, 4, 5
REL_BIO, REL_ADOPTED, REL_STEP, REL_SIBLING, REL_PARENT, REL_GRANDCHILD, REL_ROOMMATE = 6, 7, 8, 9, 10, 11, 15
FIRST_GQ = 18

PERSONS_ATTRS = ("relgq", "sex", "age", "hispanic", "cenrace")
HOUSEHOLD_ATTRS = ("sex", "hhage", "hispanic", "race", "elderly", "tenure", "hhtype")
HOUSEHOLD_RECODES = ("hh_size", "coupled_hh_type", "own_child_status", "multig", "with_relatives", "child_under_18",
                     "child_excluding_couple")


def asks_for_households(hints: dict[str, dict]) -> bool:
    """Whether a declaration's synth tables (``synth.synth_hints``) ask for this generator."""
    return any(h.get("generator") == "by_household" for h in hints.values())


def _roles(census: Census) -> tuple[Product, Product, Product]:
    """The persons, households and units products of the layout above (ConfigError naming what is missing)."""
    units = census.units.name if census.units is not None else None
    where = f"{census.source}: synth generator \"by_household\""
    if units is None:
        raise ConfigError(f"{where}: the census declares no unit records ([census.units])")
    persons = [p for p in census.products if p.records.name != units]
    households = [p for p in census.products if p.records.name == units and p.records.where]
    unit_hist = [p for p in census.products if p.records.name == units and not p.records.where]
    if len(persons) != 1 or len(households) != 1 or len(unit_hist) != 1:
        raise ConfigError(f"{where}: needs one product of person records, one of occupied units (a `where`) and one "
                          "of all unit records")
    for product, names, recodes in ((persons[0], PERSONS_ATTRS, ("hhgq8lev",)),
                                    (households[0], HOUSEHOLD_ATTRS, HOUSEHOLD_RECODES),
                                    (unit_hist[0], ("tenvacgq",), ())):
        have = {a.name for a in product.attributes}
        if missing := [n for n in names if n not in have] + [r for r in recodes if r not in product.schema.recodes]:
            raise ConfigError(f"{where}: product {product.name!r} has no attribute or recode {missing[0]!r}")
    return persons[0], households[0], unit_hist[0]


def _hhtype_table(product: Product) -> tuple[dict[tuple, int], ...]:
    """For k = 7..1: {the first k flags (the groups of :data:`HOUSEHOLD_RECODES`) of a household type: its first
    level}: a household's type is the level matching most of its flags, in that order."""
    size = dict(product.schema.dims)["hhtype"]
    flags = np.full((size, len(HOUSEHOLD_RECODES)), -1)
    for j, name in enumerate(HOUSEHOLD_RECODES):
        for g, levels in enumerate(product.schema.recodes[name][1]):
            flags[list(levels), j] = g
    tables = []
    for k in range(len(HOUSEHOLD_RECODES), 0, -1):
        table: dict[tuple, int] = {}
        for level in range(size):
            table.setdefault(tuple(flags[level, :k]), level)
        tables.append(table)
    return tuple(tables)


def _household_type(tables: tuple[dict[tuple, int], ...], flags: np.ndarray) -> np.ndarray:
    out = np.empty(len(flags), np.int64)
    for i, row in enumerate(map(tuple, flags)):
        for table in tables:
            level = table.get(row[:len(next(iter(table)))])
            if level is not None:
                out[i] = level
                break
        else:  # pragma: no cover - the size flag alone always matches
            raise AssertionError(row)
    return out


def _ages(rng: np.random.Generator, n: int, low: int, high: int, mode: float) -> np.ndarray:
    return np.clip(np.rint(rng.triangular(low, mode, high, n)), 0, 115).astype(np.int64)


def _allowed_ages(product: Product) -> np.ndarray:
    """[relgq, age] True where no structural zero of ``product`` forbids the pair (its zeros are relgq x age)."""
    schema = product.schema
    allowed = np.ones((dict(schema.dims)["relgq"], dict(schema.dims)["age"]), bool)
    keep = [schema.axis("relgq"), schema.axis("age")]
    for spec in product.constraints.values():
        if spec.rhs != "zero":
            continue
        cube = (build_query(schema, spec.query).groups >= 0).reshape(schema.shape)
        others = tuple(a for a in range(len(schema.shape)) if a not in keep)
        allowed &= ~cube.any(axis=others)
    return allowed


def _fix_ages(rng: np.random.Generator, rel: np.ndarray, age: np.ndarray, allowed: np.ndarray) -> np.ndarray:
    """Ages outside the structural zeros: a record in one gets the allowed age nearest to its own."""
    bad = np.flatnonzero(~allowed[rel, age])
    for i in bad:
        ok = np.flatnonzero(allowed[rel[i]])
        age[i] = ok[np.argmin(np.abs(ok - age[i]))]
    return age


def _blocks(rng: np.random.Generator, blocks: int) -> np.ndarray:
    """15-digit GEOIDs of one synthetic state (44) of ``blocks`` blocks: counties of up to 4,000 blocks, tracts of
    50-150, 1-4 block groups each."""
    return _geography(rng, blocks, "44")[0]


@writes("synth")
def write_households(out: Path, census: Census, persons: int, seed: int, persons_per_block: float = 30.0
                     ) -> dict[str, int]:
    """Write ``persons/`` and ``units/`` (one Parquet file each) of about ``persons`` persons (``out`` absent or empty; the
    files appear together at the end). Deterministic in ``seed``. Returns rows per file kind."""
    check_count(persons, "--persons", 1, MAX_PERSONS)
    pprod, hprod, uprod = _roles(census)
    rng = np.random.default_rng([seed, 7])
    n_blocks = max(1, round(persons / persons_per_block))
    geoids = _blocks(rng, n_blocks)
    tables = _hhtype_table(hprod)
    allowed = _allowed_ages(pprod)
    hhgq8 = np.full(dict(pprod.schema.dims)["relgq"], -1)
    for g, levels in enumerate(pprod.schema.recodes["hhgq8lev"][1]):
        hhgq8[list(levels)] = g

    # households: about persons / 2.5 of them, spread over the blocks that have any
    n_hh = max(1, round(persons * (1 - GQ_SHARE) / 2.25))
    weight = rng.lognormal(0.0, 0.9, n_blocks) * (rng.random(n_blocks) > 0.3)
    if weight.sum() == 0:
        weight[0] = 1.0
    hh_block = np.sort(rng.choice(n_blocks, size=n_hh, p=weight / weight.sum()))
    kind = rng.choice(len(KIND_SHARES), size=n_hh, p=KIND_SHARES)
    race_group = rng.choice(len(RACE_SHARES), size=n_hh, p=RACE_SHARES)
    head_age = np.where(kind == ALONE, _ages(rng, n_hh, 18, 100, 70), _ages(rng, n_hh, 17, 95, 40))
    head_sex = rng.integers(0, 2, n_hh)
    couple = np.isin(kind, [MARRIED_OPP, MARRIED_SAME, COHAB_OPP, COHAB_SAME])
    same_sex = np.isin(kind, [MARRIED_SAME, COHAB_SAME])
    # own children: couples and families with a householder of parenting age
    parenting = np.clip((head_age - 18) / 12, 0, 1) * np.clip((62 - head_age) / 12, 0, 1)
    mean_children = np.where(couple, 1.1, np.where(kind == FAMILY, 1.4, 0.0)) * parenting
    n_child = rng.poisson(mean_children)
    n_child = np.where(kind == FAMILY, np.maximum(n_child, (rng.random(n_hh) < 0.55).astype(np.int64)), n_child)
    has_parent = (kind != ALONE) & (kind != ROOMMATES) & (head_age >= 30) & (head_age <= 65) & (rng.random(n_hh) < 0.05)
    has_grandchild = (kind != ALONE) & (kind != ROOMMATES) & (head_age >= 45) & (rng.random(n_hh) < 0.06)
    has_sibling = (kind == FAMILY) & (n_child == 0)
    n_roommates = np.where(kind == ROOMMATES, 1 + rng.poisson(0.4, n_hh), 0)

    # persons of the households, member by member
    rows = []  # (household, relgq, sex, age)
    hh = np.arange(n_hh)
    rows.append((hh, np.where(kind == ALONE, REL_ALONE, REL_HOUSEHOLDER), head_sex, head_age))
    c = hh[couple]
    rel = np.where(np.isin(kind[c], [MARRIED_OPP, COHAB_OPP]),
                   np.where(kind[c] == MARRIED_OPP, REL_SPOUSE_OPP, REL_PARTNER_OPP),
                   np.where(kind[c] == MARRIED_SAME, REL_SPOUSE_SAME, REL_PARTNER_SAME))
    rows.append((c, rel, np.where(same_sex[c], head_sex[c], 1 - head_sex[c]),
                 np.clip(head_age[c] + np.rint(rng.normal(-1, 5, c.size)).astype(np.int64), 15, 105)))
    ch = np.repeat(hh, n_child)
    rows.append((ch, rng.choice([REL_BIO, REL_ADOPTED, REL_STEP], size=ch.size, p=[0.9, 0.03, 0.07]),
                 rng.integers(0, 2, ch.size), np.clip(head_age[ch] - rng.integers(18, 41, ch.size), 0, 60)))
    p = hh[has_parent]
    rows.append((p, np.full(p.size, REL_PARENT), rng.integers(0, 2, p.size),
                  np.clip(head_age[p] + rng.integers(20, 36, p.size), 30, 110)))
    g = hh[has_grandchild]
    rows.append((g, np.full(g.size, REL_GRANDCHILD), rng.integers(0, 2, g.size), rng.integers(0, 18, g.size)))
    s = hh[has_sibling]
    rows.append((s, np.full(s.size, REL_SIBLING), rng.integers(0, 2, s.size),
                 np.clip(head_age[s] + rng.integers(-8, 9, s.size), 15, 110)))
    r = np.repeat(hh, n_roommates)
    rows.append((r, np.full(r.size, REL_ROOMMATE), rng.integers(0, 2, r.size),
                 np.clip(head_age[r] + rng.integers(-5, 6, r.size), 15, 100)))
    m_hh, m_rel, m_sex, m_age = (np.concatenate(x) for x in zip(*rows))
    m_age = _fix_ages(rng, m_rel, m_age, allowed)
    order = np.lexsort((m_rel, m_hh))
    m_hh, m_rel, m_sex, m_age = m_hh[order], m_rel[order], m_sex[order], m_age[order]
    head_age = m_age[m_rel <= REL_HOUSEHOLDER]  # as fixed (one householder per household, first in its rows)

    # the household's type from its composition, and its elderly presence
    size = np.bincount(m_hh, minlength=n_hh)
    own = np.isin(m_rel, [REL_BIO, REL_ADOPTED, REL_STEP]) & (m_age < 18)
    under6 = np.bincount(m_hh, own & (m_age < 6), n_hh) > 0
    six17 = np.bincount(m_hh, own & (m_age >= 6), n_hh) > 0
    own_status = np.where(under6 & six17, 3, np.where(under6, 1, np.where(six17, 2, 0)))
    child = np.bincount(m_hh, m_age < 18, n_hh) > 0
    not_couple = ~np.isin(m_rel, [REL_ALONE, REL_HOUSEHOLDER, REL_SPOUSE_OPP, REL_PARTNER_OPP, REL_SPOUSE_SAME,
                                  REL_PARTNER_SAME])
    child_excl = np.bincount(m_hh, not_couple & (m_age < 18), n_hh) > 0
    any_child = np.bincount(m_hh, np.isin(m_rel, [REL_BIO, REL_ADOPTED, REL_STEP]), n_hh) > 0
    multig = any_child & (has_parent | has_grandchild)
    relatives = np.isin(kind, [MARRIED_OPP, MARRIED_SAME]) | (np.bincount(
        m_hh, np.isin(m_rel, [REL_BIO, REL_ADOPTED, REL_STEP, REL_SIBLING, REL_PARENT, REL_GRANDCHILD]), n_hh) > 0)
    flags = np.stack([np.minimum(size, 7) - 1, COUPLE_GROUP[kind], own_status, multig, relatives, child, child_excl],
                     axis=1).astype(np.int64)
    hhtype = _household_type(tables, flags)
    oldest = np.zeros(n_hh, np.int64)
    np.maximum.at(oldest, m_hh, m_age)
    elderly = np.select([oldest >= 75, oldest >= 65, oldest >= 60], [3, 2, 1], 0)
    tenure = np.where(head_age >= 65, rng.choice(4, n_hh, p=TENURE_OLD), rng.choice(4, n_hh, p=TENURE_YOUNG))

    # race and ethnicity: the household's, a member's own one time in twenty
    hisp = (race_group == 7).astype(np.int64)
    single = np.where(race_group < 6, race_group, np.where(race_group == 6, 6 + rng.integers(0, 15, n_hh),
                                                          rng.choice([0, 5, 10], n_hh, p=[0.5, 0.4, 0.1])))
    m_race = single[m_hh].copy()
    m_hisp = hisp[m_hh].copy()
    own_race = rng.random(m_hh.size) < 0.05
    m_race[own_race] = rng.integers(0, 63, int(own_race.sum()))
    head_rows = np.flatnonzero(m_rel <= REL_HOUSEHOLDER)
    head_race = np.minimum(m_race[head_rows], 6)
    head_hisp = m_hisp[head_rows]
    head_sex = m_sex[head_rows]

    # group-quarters facilities and their residents
    shares = np.array([t[0] for t in GQ_TYPES])
    n_fac = max(1, rng.poisson(n_blocks * FACILITIES_PER_BLOCK))
    fac_type = rng.choice(len(GQ_TYPES), size=n_fac, p=shares / shares.sum())
    fac_block = rng.choice(n_blocks, size=n_fac)
    medians = np.array([t[1] for t in GQ_TYPES], float)
    fac_res = np.maximum(1, np.rint(rng.lognormal(np.log(medians[fac_type]), 0.5))).astype(np.int64)
    room = max(1, round(GQ_SHARE * persons))  # facilities beyond the group-quarters share are left out
    fac_res[0] = min(fac_res[0], room)
    keep = np.cumsum(fac_res) <= room
    fac_type, fac_block, fac_res = fac_type[keep], fac_block[keep], fac_res[keep]
    n_fac = fac_type.size
    g_fac = np.repeat(np.arange(n_fac), fac_res)
    g_rel = FIRST_GQ + fac_type[g_fac]
    lo = np.array([t[2][0] for t in GQ_TYPES])[fac_type[g_fac]]
    hi = np.array([t[2][1] for t in GQ_TYPES])[fac_type[g_fac]]
    g_age = _fix_ages(rng, g_rel, np.rint(lo + (hi - lo) * rng.beta(2, 2, g_fac.size)).astype(np.int64), allowed)
    g_group = rng.choice(len(RACE_SHARES), size=g_fac.size, p=RACE_SHARES)

    # vacant housing units
    n_vac = rng.binomial(n_hh, VACANT_SHARE)
    vac_block = rng.choice(n_blocks, size=n_vac)
    vac_status = 4 + rng.choice(7, size=n_vac, p=VACANCY_SHARES)

    geo = pa.array(geoids, pa.string())
    person_geo = np.concatenate([hh_block[m_hh], fac_block[g_fac]])
    porder = np.argsort(person_geo, kind="stable")
    persons_t = pa.table({
        "geoid": geo.take(pa.array(person_geo[porder])),
        "relgq": pa.array(np.concatenate([m_rel, g_rel])[porder].astype(np.int8)),
        "sex": pa.array(np.concatenate([m_sex, rng.integers(0, 2, g_fac.size)])[porder].astype(np.int8)),
        "age": pa.array(np.concatenate([m_age, g_age])[porder].astype(np.int16)),
        "hispanic": pa.array(np.concatenate([m_hisp, (g_group == 7).astype(np.int64)])[porder].astype(np.int8)),
        "cenrace": pa.array(np.concatenate([m_race, np.where(g_group < 6, g_group, 0)])[porder].astype(np.int8)),
    })
    zero = np.zeros(n_vac + n_fac, np.int64)
    unit_geo = np.concatenate([hh_block, vac_block, fac_block])
    uorder = np.argsort(unit_geo, kind="stable")

    def col(values, fill=zero, dtype=np.int16):
        return pa.array(np.concatenate([values, fill])[uorder].astype(dtype))

    units_t = pa.table({
        "geoid": geo.take(pa.array(unit_geo[uorder])),
        census.units.type_column: col(np.zeros(n_hh + n_vac, np.int64), hhgq8[FIRST_GQ + fac_type], np.int8),
        census.units.occupied_column: pa.array(np.r_[np.ones(n_hh, bool), np.zeros(n_vac, bool), np.ones(n_fac, bool)][uorder]),
        "tenvacgq": col(tenure, np.r_[vac_status, 11 + fac_type], np.int8),
        "hh_sex": col(head_sex, dtype=np.int8), "hh_age": col(head_age), "hh_hispanic": col(head_hisp, dtype=np.int8),
        "hh_race": col(head_race, dtype=np.int8), "hh_elderly": col(elderly, dtype=np.int8), "hh_type": col(hhtype),
    })
    staging = Path(tempfile.mkdtemp(prefix=".synth-", dir=out))
    try:
        files = {pprod.records.name: persons_t, census.units.name: units_t}
        for kind, table in files.items():
            (staging / kind).mkdir()
            pq.write_table(table, staging / kind / "part-00000.parquet", row_group_size=1_000_000)
        for kind in files:
            os.replace(staging / kind, out / kind)
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return {kind: table.num_rows for kind, table in files.items()}
