"""Synthetic U.S. input of the P.L. 94-171 shape for scale tests (not real data; every draw comes from
``default_rng(seed)``): ``topdown synth`` without ``--census``, written through the loader's CEF writer.

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
"""
from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq

from topdown.geo.states import STATE_FIPS
from topdown.geo.us2020 import US2020, StateCounts

from ..configuration.config import ConfigError
from ..configuration.limits import MAX_BLOCKS, MAX_PERSONS, check_count
from ..runtime.outdir import writes
from .ingest import CENRACE_COMBOS, HISPANIC_RACE_WEIGHTS, SINGLE_RACE, TWO_RACE_WEIGHTS, cef_tables, write_cef
from .validate import PERSON_RECORDS, UNIT_RECORDS, US_PERSONS

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
    cells = np.asarray(US_PERSONS.schema.cell_index(hhgq, va, hisp, race))
    keys, n = np.unique(block * US_PERSONS.schema.ncells + cells, return_counts=True)

    # housing units
    hh_size = rng.uniform(1.9, 3.2, size=blocks)
    occupied = np.where(pop > 0, np.clip(np.rint(pop / hh_size), 1, np.maximum(pop, 1)), 0).astype(np.int64)
    vacant = rng.binomial(occupied, rng.beta(2, 18, size=blocks))
    vacant += np.where((pop == 0) & (rng.random(blocks) < empty_units), rng.integers(1, 4, size=blocks), 0)

    unit_block = np.concatenate([np.arange(blocks), np.arange(blocks), fac_block])
    unit_type = np.concatenate([np.zeros(2 * blocks, np.int64), fac_type])
    unit_occ = np.concatenate([np.ones(blocks, bool), np.zeros(blocks, bool), np.ones(n_fac, bool)])
    unit_count = np.concatenate([occupied, vacant, np.ones(n_fac, np.int64)])
    return (geoids, keys // US_PERSONS.schema.ncells, keys % US_PERSONS.schema.ncells, n, unit_block, unit_type, unit_occ,
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
