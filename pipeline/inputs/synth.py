"""Synthetic census-like input for scale tests (not real data; every draw comes from ``default_rng(seed)``).

Shape, chosen to look like Rhode Island 2010 (data README, section 2) and national shares:

* Geography: counties of 1,000-4,000 blocks (odd FIPS codes 001, 003, ...), tracts of 50-150 blocks
  (codes 000100, 000200, ... within a county), 1-4 block groups per tract splitting its blocks in order;
  block code = block-group digit + 3-digit sequence, so every GEOID has 15 digits.
* Persons: 30 % of blocks empty; the others lognormal (median 36, sigma 0.98: p90 about 125), so about 40
  persons per block on average. Each tract draws its own mix of 8 groups (Hispanic and 7 not-Hispanic race
  groups) from a Dirichlet around national shares (``GROUP_SHARES``: Hispanic 18 %, two or more races
  about 3 %); blocks draw multinomially from their tract's mix. Hispanic persons' and multi-race persons'
  detailed races come from fixed weights (mostly White or Some Other Race; two races mostly White-X).
  Each block's voting-age share is Beta(30, 9) (mean 77 %).
* Housing: occupied units = household persons / a block household size in [1.9, 3.2] (rounded, at least
  one, at most the persons); vacant units Binomial(occupied, Beta(2, 18)); 5 % of empty blocks hold 1-3
  vacant units.
* Group quarters: about 1.2 facilities per 100 blocks (at least 5), the first five of types college (5),
  nursing (3), adult correctional (1), military (6), other noninstitutional (7), the rest drawn from
  ``GQ_TYPE_SHARES``; lognormal residents around a per-type median; nursing residents are all 18+.

The output passes :func:`topdown.pipeline.inputs.validate.validate_input`. :func:`write_partitioned` writes
national-shaped input (many states, hive-partitioned by state) batch by batch, never holding it whole.
:func:`write_us2020` (``topdown synth --shape us2020``) writes the nation of 2020 so: the 52 state-equivalents
of :data:`topdown.geo.us2020.US2020` with their counties, tracts, block groups and blocks (scaled by
``--scale``), a quarter of the blocks without persons, and block assignment files for the AIAN spines.

:func:`write_census` (``topdown synth --census NAME``) writes input of any declared census's shape instead,
driven by its declaration only: the hierarchy's levels (prefix geocode or one column per level), attributes
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

from topdown.geo.states import STATE_FIPS
from topdown.geo.us2020 import US2020, StateCounts

from ..configuration.census import read_declaration
from ..configuration.config import ConfigError
from ..configuration.limits import MAX_BLOCKS, MAX_PERSONS, check_count
from .ingest import HISPANIC_RACE_WEIGHTS, SINGLE_RACE, TWO_RACE_WEIGHTS, cef_tables, write_cef
from ..runtime.outdir import writes
from .validate import PERSON_RECORDS, UNIT_RECORDS
from topdown.pipeline.configuration.census import PERSONS
from topdown.pipeline.inputs.ingest import CENRACE_COMBOS
from topdown.vocab.census import Attribute, Census, Product
from topdown.vocab.queries import build_query

#: Groups: Hispanic, then not-Hispanic White, Black, AIAN, Asian, NHPI, SOR, two or more races.
GROUP_SHARES = np.array([0.18, 0.60, 0.12, 0.007, 0.058, 0.002, 0.005, 0.028])
TRACT_CONCENTRATION = 8.0
EMPTY_SHARE = 0.30
POP_MEDIAN, POP_SIGMA = 36.0, 0.98
#: Facility type shares beyond the first five, and per-type (median residents, share aged 18+).
GQ_TYPE_SHARES = np.array([0.12, 0.04, 0.35, 0.06, 0.18, 0.03, 0.22])
GQ_FIRST_TYPES = (5, 3, 1, 6, 7)
GQ_SIZE = {1: (300, 1.0), 2: (30, 0.1), 3: (80, 1.0), 4: (40, 0.7), 5: (250, 0.97), 6: (200, 0.99), 7: (25, 0.8)}


def _multi_race_weights() -> tuple[np.ndarray, np.ndarray]:
    """Races of not-Hispanic multi-race persons: 90 % two races (``TWO_RACE_WEIGHTS``), 7 % three races
    (those with White twice as likely), 3 % four or more races evenly."""
    sizes = np.array([sum(c) for c in CENRACE_COMBOS])
    weights = np.zeros(len(CENRACE_COMBOS))
    for race, w in TWO_RACE_WEIGHTS.items():
        weights[race] = 0.90 * w / sum(TWO_RACE_WEIGHTS.values())
    three = np.flatnonzero(sizes == 3)
    white = np.array([CENRACE_COMBOS[i][0] + 1.0 for i in three])
    weights[three] = 0.07 * white / white.sum()
    more = np.flatnonzero(sizes >= 4)
    weights[more] = 0.03 / more.size
    races = np.flatnonzero(weights)
    return races, weights[races] / weights[races].sum()


def _geography(rng: np.random.Generator, blocks: int, state: str, first_county: int = 0
               ) -> tuple[np.ndarray, np.ndarray, int]:
    """15-digit GEOIDs (sorted), each block's tract number, and the next free county number (counties are
    numbered from ``first_county``; county k has FIPS code 2k + 1)."""
    geoids: list[str] = []
    tract_of: list[np.ndarray] = []
    county, tract_id, left = first_county, 0, blocks
    while left > 0:
        in_county = min(left, int(rng.integers(1000, 4001)))
        left -= in_county
        tract, county_left = 0, in_county
        while county_left > 0:
            size = min(county_left, int(rng.integers(50, 151)))
            county_left -= size
            groups = min(size, int(rng.integers(1, 5)))
            pos = np.arange(size)
            bg = pos * groups // size
            start = np.searchsorted(bg, bg)
            prefix = f"{state}{2 * county + 1:03d}{(tract + 1) * 100:06d}"
            geoids += [f"{prefix}{g + 1}{j:03d}" for g, j in zip(bg, pos - start)]
            tract_of.append(np.full(size, tract_id))
            tract += 1
            tract_id += 1
        county += 1
    if 2 * county - 1 > 999:
        raise ConfigError(f"synthetic state {state}: more than 500 counties; give it fewer blocks")
    return np.array(geoids, dtype=object), np.concatenate(tract_of), county


def _races(rng: np.random.Generator, group: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """(hispanic, cenrace) for persons of the given groups (index into GROUP_SHARES)."""
    race = np.zeros(group.size, np.int64)
    for g, name in enumerate(("white", "black", "aian", "asian", "nhpi", "other"), start=1):
        race[group == g] = SINGLE_RACE[name]
    hisp = group == 0
    h_races, h_weights = np.array(list(HISPANIC_RACE_WEIGHTS)), np.array(list(HISPANIC_RACE_WEIGHTS.values()), float)
    race[hisp] = rng.choice(h_races, size=int(hisp.sum()), p=h_weights / h_weights.sum())
    multi = group == 7
    m_races, m_weights = _multi_race_weights()
    race[multi] = rng.choice(m_races, size=int(multi.sum()), p=m_weights)
    return hisp.astype(np.int64), race


def write_synthetic(out: Path, blocks: int, seed: int, state: str = "44") -> None:
    """Write out/persons.parquet and out/units.parquet: ``blocks`` synthetic blocks, deterministic in ``seed``."""
    check_count(blocks, "--blocks", 1, MAX_BLOCKS)
    if not (len(state) == 2 and state.isdigit()):
        raise ConfigError(f"write_synthetic: need a 2-digit state code (state={state!r})")
    write_cef(Path(out), *_synthetic_state(np.random.default_rng(seed), blocks, state)[0], command="synth")


def _synthetic_state(rng: np.random.Generator, blocks: int, state: str, first_county: int = 0,
                     pop_median: float = POP_MEDIAN) -> tuple[tuple, int]:
    """The arrays :func:`ingest.write_cef` takes for ``blocks`` synthetic blocks of ``state``, counties
    numbered from ``first_county``, and the next free county number."""
    geoids, tract, next_county = _geography(rng, blocks, state, first_county)
    return _synthetic_blocks(rng, geoids, tract, pop_median), next_county


def _synthetic_blocks(rng: np.random.Generator, geoids: np.ndarray, tract: np.ndarray, pop_median: float,
                      empty_share: float = EMPTY_SHARE, empty_units: float = 0.05, min_facilities: int = 5) -> tuple:
    """The arrays :func:`ingest.write_cef` takes for the blocks ``geoids`` (sorted; ``tract`` numbers each
    block's tract from 0): ``empty_share`` of them without household persons, ``empty_units`` of those with 1-3
    vacant units, about 1.2 group-quarters facilities per 100 blocks (at least ``min_facilities``)."""
    blocks = geoids.size
    tract_mix = rng.dirichlet(TRACT_CONCENTRATION * GROUP_SHARES, size=int(tract.max()) + 1)

    # household persons per block, by group and voting age
    pop = np.where(rng.random(blocks) < empty_share, 0,
                   np.maximum(1, np.rint(rng.lognormal(np.log(pop_median), POP_SIGMA, blocks)))).astype(np.int64)
    by_group = rng.multinomial(pop, tract_mix[tract])
    adult_share = rng.beta(30, 9, size=blocks)
    adults = rng.binomial(by_group, adult_share[:, None])
    counts = np.stack([by_group - adults, adults], axis=2)  # (block, group, votingage)
    owner = np.repeat(np.arange(counts.size), counts.reshape(-1))
    block = owner // (counts.shape[1] * 2)
    group = owner // 2 % counts.shape[1]
    va = owner % 2
    hhgq = np.zeros(owner.size, np.int64)

    # group quarters
    n_fac = min(blocks, max(min_facilities, round(blocks * 0.012)))
    fac_type = np.concatenate([GQ_FIRST_TYPES, rng.choice(np.arange(1, 8), size=max(0, n_fac - 5), p=GQ_TYPE_SHARES)])
    fac_type = fac_type[:n_fac].astype(np.int64)
    fac_block = rng.choice(blocks, size=n_fac, replace=False)
    median = np.array([GQ_SIZE[k][0] for k in fac_type], float)
    residents = np.maximum(1, np.rint(rng.lognormal(np.log(median), 0.7))).astype(np.int64)
    gq_fac = np.repeat(np.arange(n_fac), residents)
    gq_block = fac_block[gq_fac]
    gq_group = (rng.random(gq_fac.size)[:, None] > np.cumsum(tract_mix[tract[gq_block]], axis=1)).sum(1)
    gq_group = np.minimum(gq_group, len(GROUP_SHARES) - 1)
    gq_va = (rng.random(gq_fac.size) < np.array([GQ_SIZE[k][1] for k in fac_type])[gq_fac]).astype(np.int64)

    block = np.concatenate([block, gq_block])
    group = np.concatenate([group, gq_group])
    va = np.concatenate([va, gq_va])
    hhgq = np.concatenate([hhgq, fac_type[gq_fac]])
    hisp, race = _races(rng, group)
    cells = np.asarray(PERSONS.cell_index(hhgq, va, hisp, race))
    keys, n = np.unique(block * PERSONS.ncells + cells, return_counts=True)

    # housing units
    hh_size = rng.uniform(1.9, 3.2, size=blocks)
    occupied = np.where(pop > 0, np.clip(np.rint(pop / hh_size), 1, np.maximum(pop, 1)), 0).astype(np.int64)
    vacant = rng.binomial(occupied, rng.beta(2, 18, size=blocks))
    vacant += np.where((pop == 0) & (rng.random(blocks) < empty_units), rng.integers(1, 4, size=blocks), 0)

    unit_block = np.concatenate([np.arange(blocks), np.arange(blocks), fac_block])
    unit_type = np.concatenate([np.zeros(2 * blocks, np.int64), fac_type])
    unit_occ = np.concatenate([np.ones(blocks, bool), np.zeros(blocks, bool), np.ones(n_fac, bool)])
    unit_count = np.concatenate([occupied, vacant, np.ones(n_fac, np.int64)])
    return (geoids, keys // PERSONS.ncells, keys % PERSONS.ncells, n, unit_block, unit_type, unit_occ,
            unit_count)


#: Blocks generated at a time by :func:`write_partitioned` (written as one row group of each file).
BATCH_BLOCKS = 20_000


def household_median(persons_per_block: float, empty_share: float = EMPTY_SHARE) -> float:
    """The block population median that gives ``persons_per_block`` on average: household persons
    (1 - empty_share) * median * exp(sigma^2 / 2) per block, plus the group-quarters residents (about 0.012
    facilities per block of the ``GQ_SIZE`` medians, lognormal with sigma 0.7)."""
    gq = 0.012 * sum(share * GQ_SIZE[k][0] for k, share in enumerate(GQ_TYPE_SHARES, start=1)) * np.exp(0.7 ** 2 / 2)
    household = (1 - empty_share) * np.exp(POP_SIGMA ** 2 / 2)
    return max(persons_per_block - gq, 1.0) / household


@writes("synth")
def write_partitioned(out: Path, blocks: int, seed: int, persons: int | None = None, states: int = 1) -> tuple[int, int]:
    """Write ``blocks`` synthetic blocks over ``states`` states (the first FIPS codes, block shares drawn
    from the seed) as out/persons/state=SS/part-00000.parquet and out/units/state=SS/part-00000.parquet,
    streaming: one batch of at most :data:`BATCH_BLOCKS` blocks (whole or cut counties, each with its own
    tracts and group quarters) in memory at a time, one row group per batch, rows sorted by GEOID. With
    ``persons``, the block population median is set so that about that many persons are drawn. Each file
    appears whole (written under a temporary name, then renamed). Returns (persons, units) written."""
    codes = sorted(set(STATE_FIPS.values()))
    check_count(blocks, "--blocks", 1, MAX_BLOCKS)
    if persons is not None:
        check_count(persons, "--persons", 1, MAX_PERSONS)
    check_count(states, "--states", 1, len(codes))
    if blocks < states:
        raise ConfigError(f"--blocks {blocks}: at least one block per state (--states {states})")
    rng = np.random.default_rng(seed)
    shares = rng.dirichlet(np.full(states, 4.0)) if states > 1 else np.ones(1)
    per_state = 1 + np.floor(shares * (blocks - states)).astype(np.int64)
    per_state[0] += blocks - per_state.sum()
    median = POP_MEDIAN if persons is None else household_median(persons / blocks)
    written = np.zeros(2, np.int64)
    for i, (state, n) in enumerate(zip(codes, per_state)):
        def batches(i: int = i, state: str = state, n: int = int(n)):
            county, left, batch = 0, n, 0
            while left > 0:
                size = min(left, BATCH_BLOCKS)
                arrays, county = _synthetic_state(np.random.default_rng([seed, i, batch]), size, state, county, median)
                yield arrays
                left -= size
                batch += 1
        written += _write_state(out, state, batches())
    return int(written[0]), int(written[1])


def _write_state(out: Path, state: str, batches) -> tuple[int, int]:
    """Write one state's out/persons/state=SS/part-00000.parquet and out/units/state=SS/part-00000.parquet from
    ``batches`` (the arrays :func:`ingest.write_cef` takes, GEOIDs rising from batch to batch), one row group per
    batch; each file appears whole (written under a temporary name, then renamed). Returns (persons, units)."""
    paths = [out / kind / f"state={state}" / "part-00000.parquet" for kind in (PERSON_RECORDS, UNIT_RECORDS)]
    for path in paths:
        path.parent.mkdir(parents=True, exist_ok=True)
    tmps = [p.with_name(f".{p.name}.tmp") for p in paths]
    writers: list[pq.ParquetWriter] = []
    written = [0, 0]
    for arrays in batches:
        for k, table in enumerate(cef_tables(*arrays)):
            if len(writers) <= k:
                writers.append(pq.ParquetWriter(tmps[k], table.schema))
            writers[k].write_table(table, row_group_size=max(1, table.num_rows))
            written[k] += table.num_rows
    for writer, tmp, path in zip(writers, tmps, paths):
        writer.close()
        os.replace(tmp, path)
    return written[0], written[1]


# ----------------------------------------------------------------------------------------- the nation (us2020)
# `topdown synth --shape us2020 [--scale S]`: the 52 state-equivalents of 2020 (geo.us2020), state by state.

#: Shares of the national shape's blocks: without persons (each holds 1-3 vacant housing units, so every block
#: exists in the input, as blocks with units do in the 2020 spine).
US_EMPTY_SHARE = 0.25
#: Lognormal sigma of the spread of tracts over counties and of blocks over block groups.
COUNTY_SIGMA, BLOCK_SIGMA = 1.0, 0.5
#: At most this many block groups per tract (their code is one digit, 1-9) and blocks per block group (a
#: 3-digit number after the block-group digit).
MAX_BG_PER_TRACT, MAX_BLOCKS_PER_BG = 9, 999
#: The national shape's share of tracts in an AIAN area (every state but DC and Puerto Rico has one), in an
#: incorporated place, and tracts per county subdivision.
AIAN_TRACT_SHARE, PLACE_TRACT_SHARE, TRACTS_PER_MCD = 0.02, 0.6, 2.4


def scaled_counts(state: StateCounts, scale: float) -> StateCounts:
    """``state``'s figures times ``scale`` (persons and blocks, tracts and block groups alike), keeping every
    county with at least one tract, every tract with a block group and every block group with a block."""
    blocks = max(state.counties, round(state.blocks * scale))
    tracts = min(blocks, max(state.counties, round(state.tracts * scale)))
    bgs = min(blocks, MAX_BG_PER_TRACT * tracts, max(tracts, round(state.block_groups * scale)))
    return state._replace(persons=round(state.persons * scale), tracts=tracts, block_groups=bgs, blocks=blocks)


def _spread(rng: np.random.Generator, n: int, parents: int, sigma: float, cap: int) -> np.ndarray:
    """``n`` children over ``parents`` parents: each at least one and at most ``cap``, the rest by lognormal
    weights (unequal sizes)."""
    if not parents <= n <= parents * cap:
        raise ConfigError(f"synth: cannot spread {n} children over {parents} parents of at most {cap} each")
    w = rng.lognormal(0.0, sigma, parents)
    count = 1 + rng.multinomial(n - parents, w / w.sum())
    while (over := count - cap).max() > 0:  # move the excess to the parents with room, in proportion to weight
        count = np.minimum(count, cap)
        room = count < cap
        count[room] += rng.multinomial(int(over[over > 0].sum()), w[room] / w[room].sum())
    return count


@dataclass(frozen=True)
class _Layout:
    """One state's nesting, tract by tract: its county index, its number in the county, its block groups and
    their block counts (``bg_blocks``, tract by tract)."""

    tract_county: np.ndarray
    tract_number: np.ndarray
    tract_bgs: np.ndarray
    bg_blocks: np.ndarray

    @property
    def tract_blocks(self) -> np.ndarray:
        return np.add.reduceat(self.bg_blocks, np.r_[0, np.cumsum(self.tract_bgs)[:-1]])

    def geoids(self, state: str, tracts: slice) -> tuple[np.ndarray, np.ndarray]:
        """The sorted 15-digit GEOIDs of the blocks of ``tracts`` (a range of tract indices) and each block's
        tract index."""
        first_bg = np.r_[0, np.cumsum(self.tract_bgs)]
        bgs = slice(first_bg[tracts.start], first_bg[tracts.stop])
        bg_tract = np.repeat(np.arange(tracts.start, tracts.stop), self.tract_bgs[tracts])
        bg_digit = np.arange(bgs.start, bgs.stop) - first_bg[bg_tract] + 1
        n = self.bg_blocks[bgs]
        block_tract = np.repeat(bg_tract, n)
        block_digit = np.repeat(bg_digit, n)
        seq = np.arange(n.sum()) - np.repeat(np.cumsum(n) - n, n)
        county = 2 * self.tract_county[block_tract] + 1
        tract_code = (self.tract_number[block_tract] + 1) * 100
        geoids = [f"{state}{c:03d}{t:06d}{d}{q:03d}" for c, t, d, q in zip(county, tract_code, block_digit, seq)]
        return np.array(geoids, dtype=object), block_tract


def _layout(rng: np.random.Generator, state: StateCounts) -> _Layout:
    """Counties, tracts, block groups and blocks of ``state`` (the counts of :func:`scaled_counts`)."""
    per_county = _spread(rng, state.tracts, state.counties, COUNTY_SIGMA, 10 ** 4 - 1)
    tract_county = np.repeat(np.arange(state.counties), per_county)
    tract_number = np.arange(state.tracts) - np.repeat(np.cumsum(per_county) - per_county, per_county)
    tract_bgs = _spread(rng, state.block_groups, state.tracts, 0.0, MAX_BG_PER_TRACT)
    bg_blocks = _spread(rng, state.blocks, state.block_groups, BLOCK_SIGMA, MAX_BLOCKS_PER_BG)
    return _Layout(tract_county, tract_number, tract_bgs, bg_blocks)


def _baf_rows(rng: np.random.Generator, state: StateCounts, layout: _Layout) -> dict[str, tuple[str, np.ndarray]]:
    """Per tract, the block assignment files' fields (AIANNH, INCPLACE_CDP, MCD): a few tracts in an AIAN
    area (none in DC and Puerto Rico), most in an incorporated place, runs of tracts in one county subdivision."""
    n = state.tracts
    aian = np.full(n, "|", dtype=object)
    if state.usps not in ("DC", "PR"):
        chosen = rng.choice(n, size=max(1, round(AIAN_TRACT_SHARE * n)), replace=False)
        aian[chosen] = [f"{1000 + k % 3799:04d}|R" for k in range(chosen.size)]
    place = np.where(rng.random(n) < PLACE_TRACT_SHARE, np.char.mod("%05d", 10_000 + np.arange(n) // 3), "")
    mcd = np.char.mod("%05d", 10_000 + (layout.tract_number / TRACTS_PER_MCD).astype(np.int64))
    county = np.char.mod("%03d", 2 * layout.tract_county + 1)
    return {"AIANNH": ("AIANNHCE|COMPTYP", aian), "INCPLACE_CDP": ("PLACEFP", place.astype(object)),
            "MCD": ("COUNTYFP|COUSUBFP", np.char.add(np.char.add(county, "|"), mcd).astype(object))}


@writes("synth")
def write_us2020(out: Path, seed: int, scale: float = 1.0) -> dict[str, int]:
    """Write the national shape (:data:`topdown.geo.us2020.US2020`) at ``scale``: out/persons/state=SS/ and
    out/units/state=SS/ (:func:`write_partitioned`'s layout) and out/baf/ (AIANNH, INCPLACE_CDP and MCD block
    assignment files per state, for the AIAN and optimized spines), state by state and :data:`BATCH_BLOCKS`
    blocks (whole tracts) at a time, so memory stays flat whatever the scale. A quarter of the blocks
    (:data:`US_EMPTY_SHARE`) hold no persons, only vacant units; each state's persons come out near its
    scaled population. Deterministic in ``seed``. Returns the rows written per kind and the block count."""
    if not 0 < scale <= 1:
        raise ConfigError(f"--scale must be in (0, 1] (got {scale})")
    (out / "baf").mkdir(parents=True, exist_ok=True)
    totals = dict.fromkeys((PERSON_RECORDS, UNIT_RECORDS, "blocks"), 0)
    for i, full in enumerate(US2020):
        state = scaled_counts(full, scale)
        layout = _layout(np.random.default_rng([seed, 1, i]), state)
        median = household_median(state.persons / state.blocks, US_EMPTY_SHARE)
        cuts = np.searchsorted(np.cumsum(layout.tract_blocks), np.arange(1, state.blocks // BATCH_BLOCKS + 1)
                               * BATCH_BLOCKS, side="right")
        bounds = np.unique(np.r_[0, np.minimum(cuts, state.tracts), state.tracts])
        baf = _baf_rows(np.random.default_rng([seed, 2, i]), state, layout)
        files = {name: (out / "baf" / f"BlockAssign_ST{state.fips}_{state.usps}_{name}.txt") for name in baf}
        tmps = {name: f.with_name(f".{f.name}.tmp") for name, f in files.items()}
        handles = {name: open(tmps[name], "w") for name in baf}
        try:
            for name, (header, _) in baf.items():
                handles[name].write(f"BLOCKID|{header}\n")

            def batches():
                for b, (lo, hi) in enumerate(zip(bounds[:-1], bounds[1:])):
                    geoids, tract = layout.geoids(state.fips, slice(int(lo), int(hi)))
                    for name, (_, fields) in baf.items():
                        handles[name].writelines(f"{g}|{f}\n" for g, f in zip(geoids, fields[tract]))
                    totals["blocks"] += geoids.size
                    yield _synthetic_blocks(np.random.default_rng([seed, 3, i, b]), geoids, tract - lo, median,
                                            US_EMPTY_SHARE, empty_units=1.0, min_facilities=0)
            persons, units = _write_state(out, state.fips, batches())
        finally:
            for h in handles.values():
                h.close()
        for name, f in files.items():
            os.replace(tmps[name], f)
        totals[PERSON_RECORDS] += persons
        totals[UNIT_RECORDS] += units
    return totals


# ------------------------------------------------------------------------------------------ declared censuses
# `topdown synth --census NAME`: an input of a declared census's shape, driven by its declaration only.

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
