"""Build CEF-like input (persons.parquet, units.parquet, docs/reference/input.md) from published block tables.

Both readers write one row per person and one row per unit, sorted by geoid and then by the codes in column
order (persons: hhgq, votingage, hispanic, cenrace; units: unit_type, occupied with False first). The output
is a deterministic function of the input. Blocks with neither persons nor units produce no rows (the DAS has
no such blocks; DAS-2020 ``cef_validator_classes.py``).

P.L. 94-171 legacy files (:func:`ingest_pl94`), summary level 750 only
--------------------------------------------------------------------------
The tables pin the (votingage x hispanic x cenrace) cross of every block exactly (DAS-2020 ``schemamaker.py`` and
``cenrace.py`` cell order; P1 race cells 003-008, 011-025, 027-046, 048-062, 064-069, 071 are cenrace 0..62 in
order):

* 18+, not Hispanic: P4 race cell; 18+, Hispanic: P3 - P4;
* under 18, not Hispanic: P2 - P4; under 18, Hispanic: (P1 - P2) - (P3 - P4).

What the tables leave open is allocated as follows.

1. GQ persons (P5 types 003, 004, 005, 006, 008, 009, 010 = hhgq 1..7). Types are served in the order
   nursing (3) first, then 1, 2, 4, 5, 6, 7. A type takes persons from the block's still unallocated
   (votingage, hispanic, cenrace) cells: first the 18+ cells, then the under-18 cells (juvenile facilities,
   type 2, take under-18 cells first); within each age group cells are taken whole, largest remaining count
   first, ties to the lower cell index, until the type's count is met. Nursing-facility persons come only
   from 18+ cells (structural zero ``nurse_nva_0``, DAS-2020 ``Constraints_PL94.py``); if the block has too
   few, it is an error.
   Everybody left is in a household (hhgq 0).
2. GQ facilities. The prototype's geographic-header HU100 counts housing units plus GQ facilities
   (data README caveat 4), so the block has F = HU100 - H1_001 facilities. Every GQ type with persons gets
   one; the rest go one at a time to the type with the most persons per facility (n_k / f_k, exact integer
   comparison, ties to the lower type), never to a type with as many facilities as persons (D'Hondt
   apportionment). If F = 0 while the block has GQ persons (published files whose HU100 is the housing-unit
   count only) the block gets exactly one facility per present type; :class:`Summary` counts those blocks.
   0 < F < present types, or F > GQ persons, is an error.
3. Housing units: H1_002 occupied and H1_003 vacant rows of unit_type 0. GQ facilities are occupied.

Every published cell of P1, P2, P3, P4, P5 and H1 of every block is reproduced exactly; the input's own
subtotal identities are checked first (data README, "Verified").

Block demographics CSV (:func:`ingest_blocks`)
-----------------------------------------------
Columns ``GEOID`` (or the 2020 name ``GEOID20``, or ``GEOID10``), ``pop, pop_<g>, vap, vap_<g>`` for the 8
groups g = hisp, white, black, aian, asian, nhpi, other, two (Hispanic of any race, and not-Hispanic single
races / two or more); other columns (``state``, ``county``, ...) are ignored. ``pop_g`` and ``vap_g`` are
reproduced exactly; everybody lives in a household (hhgq 0).

* Not-Hispanic single-race groups map to cenrace 0..5 (White, Black, AIAN, Asian, NHPI, SOR).
* ``two`` (not Hispanic) and ``hisp`` are collapsed groups: the table does not say which race combination
  their persons have. They get their cenrace from a fixed weight table (``TWO_RACE_WEIGHTS``,
  ``HISPANIC_RACE_WEIGHTS``: rounded 2010 national shares, percent) by a stride sequence, in one of two
  ways (:data:`RACE_CHOICES`):

  - ``spread`` (the default): the group's persons are numbered j = 0, 1, ... over the whole file in output
    order (geoid, then under-18 before 18+), and person j gets the weight bucket that holds slot
    (j * 37) mod 100. Any 100 consecutive persons follow the weights exactly; consecutive persons get
    different races, so a block's group lies in many race combinations.
  - ``compact``: the blocks that have persons of the group are numbered k = 0, 1, ... in GEOID order, and
    all of block k's persons of the group get the bucket of slot (k * 37) mod 100: one race combination per
    block and group, as few as the counts allow, with the weights followed over blocks instead of persons.
* Housing units, when the table has none: occupied = ceil(household persons / 2.5) (so at least one in every
  populated block, and never more than the persons); vacant units follow the file-wide ratio of one vacant
  per 9 occupied units (a 10 % vacancy rate): with C_b the running total of occupied units over blocks in
  GEOID order, block b gets floor(C_b / 9) - floor(C_{b-1} / 9) vacant units. The block housing-unit counts,
  invariants of a production run, are then a function of the person counts and would publish them: units.parquet
  records it in its schema metadata (:data:`DERIVED_UNITS_KEY`) and a production run refuses such input
  unless waived (docs/how-to/production.md).
* Housing units given by the table replace these: ``hu_occupied`` and ``hu_vacant`` are used as they are
  (a populated block needs an occupied unit, and an occupied unit a person); ``hu`` alone is split into
  occupied = min(hu, ceil(persons / 2.5)) and the rest vacant. A block with housing units but no persons
  is kept (its units are vacant): it stays on the spine, where TopDown may give it persons.

Limits and row numbers
----------------------
No count of a block table may exceed :data:`MAX_BLOCK_COUNT` (far above any census block; it also keeps a
value from overflowing int64), and an ingest whose expansion to one row per person and unit would need more
than half of this machine's memory (:data:`BYTES_PER_RECORD` per row) is refused before anything is
allocated. Errors name the file, column and row of the published table: a row of a block table or of a
P.L. 94-171 file is a geographic record, so its number counts blocks (public), never persons. A P.L. 94-171
file's block GEOCODEs must lie in the state its STUSAB names.
"""
from __future__ import annotations

import os
import re
import shutil
from dataclasses import dataclass, field
from importlib.resources.abc import Traversable
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq

from topdown.geo import DAMAGED_FILE_ERRORS
from topdown.geo.states import STATE_FIPS

from ..runtime.private_files import private_dir, seal
from ..runtime.progress import Steps
from ..runtime.outdir import claimed
from ..runtime.rundir import writable_dir
from ..runtime.storage import StorePath
from . import RACE_CHOICES
from topdown.pipeline.configuration.census import PERSONS

#: The six races (White, Black, AIAN, Asian, NHPI, SOR) by their alone-or-in-combination recodes in the
#: P.L. 94-171 declaration (conf/census/pl94.toml).
RACE_COMBO_RECODES = ("whiteCombo", "blackCombo", "aianCombo", "asianCombo", "nhpiCombo", "sorCombo")
#: CENRACE_COMBOS[i] is the 6-tuple of race-membership bits of cenrace level i (the declared Census order).
CENRACE_COMBOS: tuple[tuple[int, ...], ...] = tuple(
    tuple(int(i in PERSONS.recodes[r][1][0]) for r in RACE_COMBO_RECODES)
    for i in range(PERSONS.shape[PERSONS.axis("cenrace")]))
_COMBO_INDEX = {combo: i for i, combo in enumerate(CENRACE_COMBOS)}


def cenrace_index(bits: tuple[int, ...]) -> int:
    """The cenrace level of a race-membership 6-tuple."""
    return _COMBO_INDEX[tuple(int(b) for b in bits)]


NRACE = 63
NURSING, JUVENILE = 3, 2
GQ_ORDER = (3, 1, 2, 4, 5, 6, 7)
GEO_FIELDS = 97
ID_FIELDS = ("FILEID", "STUSAB", "CHARITER", "CIFSN", "LOGRECNO")
#: 0-based positions in the geographic header (data README, "Legacy file layout").
GEO_POS = {"SUMLEV": 2, "LOGRECNO": 7, "GEOCODE": 9, "POP100": 90, "HU100": 91}
BLOCK_SUMLEV = "750"
#: P5 cells 003, 004, 005, 006, 008, 009, 010 are hhgq 1..7 (0-based positions in P5's 10 cells).
P5_DETAIL = (2, 3, 4, 5, 7, 8, 9)
#: The largest count a block table may hold (module docstring, "Limits and row numbers").
MAX_BLOCK_COUNT = 1_000_000
#: What an ingest writes into its output folder, in this order.
CEF_FILES = ("persons.parquet", "units.parquet")
#: Memory an ingest needs per person or unit row it writes (the expanded index arrays and the Arrow columns).
BYTES_PER_RECORD = 64
#: units.parquet schema metadata of an input whose housing-unit counts were derived from its person counts.
DERIVED_UNITS_KEY = b"topdown.derived_housing_units"
DERIVED_UNITS = "occupied = ceil(household persons / 2.5), vacant = 1 per 9 occupied (topdown ingest blocks)"


class IngestError(ValueError):
    """Published tables that cannot be read or are inconsistent; the message names file, column and row."""


@dataclass(frozen=True)
class Summary:
    """What an ingest wrote. All figures are of published (already protected) tables."""

    source: str
    blocks_read: int
    blocks_written: int
    persons: int
    housing_units: int
    gq_facilities: int
    notes: tuple[str, ...] = field(default_factory=tuple)
    #: What the tables do not give and the ingest made up, in words.
    derived: tuple[str, ...] = field(default_factory=tuple)

    def lines(self) -> list[str]:
        """What the ingest did, in words."""
        dropped = self.blocks_read - self.blocks_written
        return [f"read {self.source}: {self.blocks_read:,} blocks",
                f"  kept {self.blocks_written:,} blocks; dropped {dropped:,} with neither persons nor housing units "
                "(the DAS has no such blocks)",
                f"  wrote {self.persons:,} persons, {self.housing_units:,} housing units and {self.gq_facilities:,} "
                "group-quarters facilities",
                *(f"  derived: {d}" for d in self.derived), *(f"  note: {n}" for n in self.notes)]


# --------------------------------------------------------------------------------------------- writing

def write_cef(out: Path, geoids: np.ndarray, person_block: np.ndarray, person_cell: np.ndarray,
              person_count: np.ndarray, unit_block: np.ndarray, unit_type: np.ndarray, unit_occupied: np.ndarray,
              unit_count: np.ndarray, units_derived: bool = False, command: str = "ingest") -> tuple[int, int]:
    """Expand (block, cell, count) and (block, unit_type, occupied, count) rows into out/persons.parquet and
    out/units.parquet, sorted by geoid then codes. ``geoids`` indexes blocks. ``units_derived``: the unit counts
    were derived from the person counts (recorded under :data:`DERIVED_UNITS_KEY`). Returns (persons, units)
    written.

    ``out`` is the output of ``command`` (``ingest``, ``demo-data``, ``synth``): absent, empty or an earlier
    output of it (``outdir.claimed``). Both files are written into a private temporary sibling folder that then
    takes the place of ``out`` at once: ``out`` holds the old pair or the new one at every moment, readable by
    its owner alone (private_files.py)."""
    with claimed(out, command) as claim:
        writable_dir(claim.path.parent, "the folder of the output directory")
        persons, units = cef_tables(geoids, person_block, person_cell, person_count, unit_block, unit_type,
                                    unit_occupied, unit_count)
        if units_derived:
            units = units.replace_schema_metadata({**(units.schema.metadata or {}), DERIVED_UNITS_KEY: DERIVED_UNITS})
        if isinstance(claim.path, StorePath):  # each object appears whole; no folder to put in place
            for name, table in zip(CEF_FILES, (persons, units)):
                sink = pa.BufferOutputStream()
                pq.write_table(table, sink)
                (claim.path / name).write_bytes(sink.getvalue().to_pybytes())
            return persons.num_rows, units.num_rows
        tmp = claim.path.with_name(f".{claim.path.name}.ingest-{os.getpid()}")
        shutil.rmtree(tmp, ignore_errors=True)
        try:
            private_dir(tmp)
            for name, table in zip(CEF_FILES, (persons, units)):
                pq.write_table(table, tmp / name)
            claim.replace_with(seal(tmp))
        finally:
            shutil.rmtree(tmp, ignore_errors=True)
    return persons.num_rows, units.num_rows


def cef_tables(geoids: np.ndarray, person_block: np.ndarray, person_cell: np.ndarray, person_count: np.ndarray,
               unit_block: np.ndarray, unit_type: np.ndarray, unit_occupied: np.ndarray,
               unit_count: np.ndarray) -> tuple[pa.Table, pa.Table]:
    """The person and unit tables of :func:`write_cef`, in memory."""
    geo = pa.array(np.asarray(geoids, dtype=object), type=pa.string())
    geo_rank = np.argsort(np.argsort(np.asarray(geoids, dtype=object), kind="stable"), kind="stable")

    keep = np.asarray(person_count) > 0
    pb, pcell, pn = (np.asarray(a)[keep].astype(np.int64) for a in (person_block, person_cell, person_count))
    order = np.lexsort((pcell, geo_rank[pb]))
    rows = np.repeat(order, pn[order])
    levels = PERSONS.unravel(pcell[rows])
    persons = pa.table({"geoid": geo.take(pa.array(pb[rows])),
                        **{name: pa.array(lv.astype(np.int8)) for name, lv in zip(PERSONS.dim_names, levels)}})

    keep = np.asarray(unit_count) > 0
    ub, ut, un = (np.asarray(a)[keep].astype(np.int64) for a in (unit_block, unit_type, unit_count))
    uo = np.asarray(unit_occupied)[keep].astype(bool)
    order = np.lexsort((uo, ut, geo_rank[ub]))
    rows = np.repeat(order, un[order])
    units = pa.table({"geoid": geo.take(pa.array(ub[rows])), "unit_type": pa.array(ut[rows].astype(np.int8)),
                      "occupied": pa.array(uo[rows])})
    return persons, units


def derived_units(files: tuple[Path, ...]) -> Path | None:
    """The first of the unit files ``files`` whose housing-unit counts an ingest derived from the person counts
    (:data:`DERIVED_UNITS_KEY`), or None. Reads Parquet footers only; an unreadable file is left to the reader."""
    for f in files:
        try:
            metadata = pq.read_schema(f).metadata or {}
        except (OSError, ValueError):
            continue
        if DERIVED_UNITS_KEY in metadata:
            return f
    return None


# --------------------------------------------------------------------------------------------- P.L. 94-171

def _race_table(detail: np.ndarray) -> np.ndarray:
    """The 71 P1/P3 cells from the 63 detailed race counts (rows = blocks)."""
    sizes = np.array([sum(c) for c in CENRACE_COMBOS])
    cols = [detail.sum(1)]
    one = detail[:, sizes == 1]
    cols += [one.sum(1), *one.T, detail[:, sizes > 1].sum(1)]
    for k in range(2, 7):
        part = detail[:, sizes == k]
        cols += [part.sum(1), *part.T]
    return np.stack(cols, axis=1)


#: Positions of the 63 detailed cells within the 71 P1 cells.
DETAIL_POS = np.array([i for i in range(71) if i not in (0, 1, 8, 9, 25, 46, 62, 69)])


def _table_fields(table: int, ncells: int, prefix: str = "P") -> list[str]:
    return [f"{prefix}{table:03d}{i:04d}" for i in range(1, ncells + 1)]


SEGMENT_FIELDS = {
    1: _table_fields(1, 71) + _table_fields(2, 73),
    2: _table_fields(3, 71) + _table_fields(4, 73) + _table_fields(1, 3, "H"),
    3: _table_fields(5, 10),
}


def _read_pipe(src: Path | Traversable) -> pd.DataFrame:
    try:
        with src.open("rb") as fh:
            return pd.read_csv(fh, sep="|", header=None, dtype=str, keep_default_na=False, encoding="latin-1",
                               compression="gzip" if src.name.endswith(".gz") else None, quoting=3)
    except (OSError, ValueError, UnicodeDecodeError, *DAMAGED_FILE_ERRORS) as exc:
        raise IngestError(f"{src}: column -, row -: cannot read pipe-delimited file ({exc})") from exc


def _ints(frame: pd.DataFrame, src: object, names: list[str], first_col: int,
          cap: int | None = MAX_BLOCK_COUNT) -> np.ndarray:
    """Integer columns of ``frame`` (strings of digits), each value at most ``cap`` (None: any int64)."""
    raw = frame.iloc[:, first_col:first_col + len(names)].to_numpy(dtype=object)
    return _digits(raw, src, names, frame.index.to_numpy(), cap)


def _digits(raw: np.ndarray, src: object, names: list[str], rows: np.ndarray, cap: int | None) -> np.ndarray:
    """int64 of a 2-D array of digit strings; a non-integer, or a value above ``cap`` or int64, is an error
    naming the column, the table row and the value."""
    width = _WIDTH(raw) if raw.size else np.zeros(raw.shape, np.int64)  # -1: not digits
    if (width < 0).any():
        r, c = np.argwhere(width < 0)[0]
        raise IngestError(f"{src}: column {names[c]}, row {rows[r]}: not a non-negative integer (value {raw[r, c]!r})")
    limit = cap if cap is not None else np.iinfo(np.int64).max
    too_long = width > len(str(limit))
    values = np.where(too_long, "0", raw).astype(np.int64) if raw.size else np.zeros(raw.shape, np.int64)
    over = too_long | (values > limit)
    if over.any():
        r, c = np.argwhere(over)[0]
        what = f"exceeds the cap of {cap:,} per block (ingest.MAX_BLOCK_COUNT)" if cap is not None else "overflows int64"
        raise IngestError(f"{src}: column {names[c]}, row {rows[r]}: value {raw[r, c]!r} {what}")
    return values


#: Significant digits of a string of ASCII digits; -1 for anything else.
_WIDTH = np.vectorize(lambda s: len(s.lstrip("0")) if isinstance(s, str) and s.isascii() and s.isdigit() else -1,
                      otypes=[np.int64])


def _check_memory(src: object, records: int) -> None:
    """Refuse an expansion to ``records`` rows that needs more than half of this machine's memory."""
    need = records * BYTES_PER_RECORD
    try:
        have = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES")
    except (ValueError, OSError, AttributeError):  # pragma: no cover - not POSIX
        return
    if need > have // 2:
        raise IngestError(f"{src}: the tables describe {records:,} person and unit records; writing them needs "
                          f"about {need / 2**30:.1f} GiB, more than half of this machine's {have / 2**30:.1f} GiB "
                          "(ingest.BYTES_PER_RECORD per record)")


def _segment(src: Path | Traversable, number: int, blocks: pd.DataFrame) -> tuple[np.ndarray, np.ndarray]:
    """The segment's table cells for each block (rows = blocks) and each block's 0-based row in the file."""
    names = SEGMENT_FIELDS[number]
    frame = _read_pipe(src)
    if frame.shape[1] != len(ID_FIELDS) + len(names):
        raise IngestError(f"{src}: column -, row 0: expected {len(ID_FIELDS) + len(names)} fields for segment "
                          f"{number}, found {frame.shape[1]}")
    cifsn = frame.iloc[:, 3].to_numpy(dtype=object)
    bad = np.flatnonzero(cifsn != f"{number:02d}")
    if bad.size:
        raise IngestError(f"{src}: column CIFSN, row {bad[0]}: expected {number:02d} (value {cifsn[bad[0]]!r})")
    logrec = _ints(frame, src, ["LOGRECNO"], 4, cap=None)[:, 0]
    if len(np.unique(logrec)) != len(logrec):
        dup = pd.Series(logrec).duplicated().to_numpy().argmax()
        raise IngestError(f"{src}: column LOGRECNO, row {dup}: duplicate logical record (value {logrec[dup]})")
    pos = pd.Index(logrec).get_indexer(blocks["LOGRECNO"].to_numpy())
    if (pos < 0).any():
        i = int(np.flatnonzero(pos < 0)[0])
        raise IngestError(f"{src}: column LOGRECNO, row -: no record for block {blocks['GEOCODE'].iat[i]} "
                          f"(value {blocks['LOGRECNO'].iat[i]})")
    return _ints(frame.iloc[pos], src, names, len(ID_FIELDS)), pos


def _find_pl94(directory: Path) -> dict[str, Path]:
    if not Path(directory).is_dir():
        what = "no such directory" if not Path(directory).exists() else "not a directory"
        raise IngestError(f"{directory}: column -, row -: {what} (the P.L. 94-171 source is a directory of "
                          "xxgeoYYYY.pl and xx0000[1-3]YYYY.pl files)")
    found: dict[str, Path] = {}
    for path in sorted(Path(directory).iterdir()):
        name = path.name.lower()
        if not re.search(r"\.pl(\.gz)?$", name):
            continue
        if re.match(r"^[a-z]{2}geo\d{4}", name):
            found.setdefault("geo", path)
        elif m := re.match(r"^[a-z]{2}0000([1-3])\d{4}", name):
            found.setdefault(f"seg{m.group(1)}", path)
    missing = [k for k in ("geo", "seg1", "seg2", "seg3") if k not in found]
    if missing:
        raise IngestError(f"{directory}: column -, row -: missing P.L. 94-171 file(s) {missing} "
                          "(expected xxgeoYYYY*.pl, xx00001YYYY*.pl .. xx00003YYYY*.pl, optionally .gz)")
    return found


def _check_geoids(src: object, column: str, geoids: pd.Series, rows: np.ndarray) -> None:
    """Block GEOIDs are 15 ASCII digits (``str.isdigit`` and ``\\d`` also take other scripts' digits) whose
    first two are a state's FIPS code (geo/states.py); the first that is not is refused, naming it."""
    text = geoids.astype("string")
    bad = np.flatnonzero(~text.str.fullmatch(r"[0-9]{15}").fillna(False).to_numpy(bool))
    if bad.size:
        raise IngestError(f"{src}: column {column}, row {rows[bad[0]]}: malformed block GEOID, 15 digits 0-9 "
                          f"expected (value {geoids.iat[bad[0]]!r})")
    unknown = np.flatnonzero(~text.str[:2].isin(set(STATE_FIPS.values())).to_numpy(bool))
    if unknown.size:
        value = geoids.iat[unknown[0]]
        raise IngestError(f"{src}: column {column}, row {rows[unknown[0]]}: block GEOID {value!r}: unknown state "
                          f"FIPS code {value[:2]!r} (value {value!r}; the 50 states, DC and Puerto Rico are known)")


def _check_state(src: object, stusab: pd.Series, geocodes: pd.Series, rows: np.ndarray) -> None:
    """Every block's GEOCODE lies in the state its STUSAB names."""
    fips = stusab.map(STATE_FIPS)
    unknown = np.flatnonzero(fips.isna().to_numpy())
    if unknown.size:
        raise IngestError(f"{src}: column STUSAB, row {rows[unknown[0]]}: unknown state abbreviation "
                          f"(value {stusab.iat[unknown[0]]!r})")
    bad = np.flatnonzero((geocodes.str[:2] != fips).to_numpy())
    if bad.size:
        i = bad[0]
        raise IngestError(f"{src}: column GEOCODE, row {rows[i]}: block {geocodes.iat[i]} is in state "
                          f"{geocodes.iat[i][:2]}, but STUSAB {stusab.iat[i]!r} is state {fips.iat[i]}")


def ingest_pl94(dir: Path, out: Path) -> Summary:  # noqa: A002 - name fixed by the CLI contract
    """Read P.L. 94-171 legacy files (geo header + segments 1-3) in ``dir``; write CEF-like Parquet to ``out``."""
    files = _find_pl94(Path(dir))
    return ingest_pl94_files(files["geo"], files["seg1"], files["seg2"], files["seg3"], Path(out))


def _check_equal(src: object, got: np.ndarray, published: np.ndarray, names: list[str], rows: np.ndarray,
                 geocodes: np.ndarray, what: str) -> None:
    bad = got != published
    if bad.any():
        b, c = np.argwhere(bad)[0]
        raise IngestError(f"{src}: column {names[c]}, row {rows[b]}: block {geocodes[b]}: {what}")


def ingest_pl94_files(geo: Path | Traversable, seg1: Path | Traversable, seg2: Path | Traversable,
                      seg3: Path | Traversable, out: Path, command: str = "ingest") -> Summary:
    """:func:`ingest_pl94` on explicit files (plain or gzipped), e.g. package resources; ``command``: the
    command whose output ``out`` is (``outdir.WRITERS``)."""
    steps = Steps("ingest pl94", 3)
    steps.start("read and check")
    header = _read_pipe(geo)
    if header.shape[1] != GEO_FIELDS:
        raise IngestError(f"{geo}: column -, row 0: expected {GEO_FIELDS} geographic-header fields, "
                          f"found {header.shape[1]}")
    blocks = header[header.iloc[:, GEO_POS["SUMLEV"]] == BLOCK_SUMLEV]
    stusab = blocks.iloc[:, ID_FIELDS.index("STUSAB")]
    blocks = pd.DataFrame({name: blocks.iloc[:, pos] for name, pos in GEO_POS.items()})
    rows = blocks.index.to_numpy()
    for name in ("LOGRECNO", "POP100", "HU100"):
        blocks[name] = _ints(blocks, geo, [name], list(blocks.columns).index(name),
                             cap=None if name == "LOGRECNO" else MAX_BLOCK_COUNT)[:, 0]
    _check_geoids(geo, "GEOCODE", blocks["GEOCODE"], rows)
    _check_state(geo, stusab, blocks["GEOCODE"], rows)
    dup = blocks["GEOCODE"].duplicated().to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise IngestError(f"{geo}: column GEOCODE, row {rows[i]}: duplicate block (value {blocks['GEOCODE'].iat[i]!r})")
    geocodes = blocks["GEOCODE"].to_numpy(dtype=object)

    (s1, r1), (s2, r2), (p5, r3) = (_segment(src, n, blocks) for n, src in ((1, seg1), (2, seg2), (3, seg3)))
    f1, f2, f3 = SEGMENT_FIELDS[1], SEGMENT_FIELDS[2], SEGMENT_FIELDS[3]
    p1, p2, p3, p4, h1 = s1[:, :71], s1[:, 71:], s2[:, :71], s2[:, 71:144], s2[:, 144:]

    tot, va = p1[:, DETAIL_POS], p3[:, DETAIL_POS]
    nh, va_nh = p2[:, DETAIL_POS + 2], p4[:, DETAIL_POS + 2]
    _check_equal(seg1, _race_table(tot), p1, f1[:71], r1, geocodes, "P1 subtotals disagree with its cells")
    _check_equal(seg2, _race_table(va), p3, f2[:71], r2, geocodes, "P3 subtotals disagree with its cells")
    for src, table, hisp_total, nh_detail, names, srow, label in (
            (seg1, p2, p1[:, 0], nh, f1[71:], r1, "P2"), (seg2, p4, p3[:, 0], va_nh, f2[71:144], r2, "P4")):
        expect = np.column_stack([hisp_total, hisp_total - nh_detail.sum(1), _race_table(nh_detail)])
        _check_equal(src, expect, table, names, srow, geocodes, f"{label} disagrees with its cells or with P1/P3")
    _check_equal(seg2, np.column_stack([h1[:, 1] + h1[:, 2]]), h1[:, :1], f2[144:145], r2, geocodes,
                 "H1 total is not occupied + vacant")
    gq = p5[:, list(P5_DETAIL)]
    inst, noninst = gq[:, :4].sum(1), gq[:, 4:].sum(1)
    _check_equal(seg3, np.column_stack([inst + noninst, inst, noninst]), p5[:, [0, 1, 6]],
                 [f3[0], f3[1], f3[6]], r3, geocodes, "P5 subtotals disagree with its cells")
    _check_equal(geo, p1[:, :1], blocks[["POP100"]].to_numpy(), ["POP100"], rows, geocodes, "POP100 is not P1 total")

    # votingage x hispanic x cenrace, shape (blocks, 2, 2, 63)
    cross = np.stack([np.stack([nh - va_nh, (tot - nh) - (va - va_nh)], 1), np.stack([va_nh, va - va_nh], 1)], 1)
    if (cross < 0).any():
        b, v, h, r = np.argwhere(cross < 0)[0]
        col = f1[71 + 2 + DETAIL_POS[r]] if v == 0 else f2[71 + 2 + DETAIL_POS[r]]
        raise IngestError(f"{seg1 if v == 0 else seg2}: column {col}, row {(r1 if v == 0 else r2)[b]}: block "
                          f"{geocodes[b]}: P1-P4 imply a negative {'18+' if v else 'under-18'} "
                          f"{'Hispanic' if h else 'not-Hispanic'} count for this race")

    gq_persons = gq.sum(1)
    _check_memory(geo, int(p1[:, 0].sum()) + int(blocks["HU100"].sum()))
    facilities = blocks["HU100"].to_numpy() - h1[:, 0]
    bad = (facilities < 0) | ((gq_persons == 0) & (facilities != 0))
    if bad.any():
        b = int(np.flatnonzero(bad)[0])
        raise IngestError(f"{geo}: column HU100, row {rows[b]}: block {geocodes[b]}: HU100 - H1_001 is negative, or "
                          "non-zero without GQ population (HU100 counts housing units plus GQ facilities)")
    hh_persons = p1[:, 0] - gq_persons
    if ((hh_persons > 0) & (h1[:, 0] == 0)).any():
        b = int(np.flatnonzero((hh_persons > 0) & (h1[:, 0] == 0))[0])
        raise IngestError(f"{seg2}: column H0010001, row {r2[b]}: block {geocodes[b]} has household "
                          "population but no housing unit")

    steps.start("allocate group quarters")
    person_block, person_cell, person_count = [], [], []
    fac_type, fac_block, fac_count = [], [], []
    fallback = 0
    for b in np.flatnonzero(gq_persons > 0):
        cells = cross[b].reshape(-1).copy()
        for k, taken in _allocate_gq(cells, gq[b], geo, rows[b], geocodes[b]):
            nz = np.flatnonzero(taken)
            person_block.append(np.full(nz.size, b))
            person_cell.append(k * 252 + nz)
            person_count.append(taken[nz])
        cross[b] = cells.reshape(2, 2, NRACE)
        fallback += int(facilities[b] == 0)
        fac = _allocate_facilities(gq[b], int(facilities[b]), geo, rows[b], geocodes[b])
        fac_type.append(np.arange(1, 8))
        fac_block.append(np.full(7, b))
        fac_count.append(fac)
    flat = cross.reshape(len(blocks), -1)
    b_idx, c_idx = np.nonzero(flat)
    person_block.append(b_idx)
    person_cell.append(c_idx)  # hhgq 0: cells 0..251
    person_count.append(flat[b_idx, c_idx])

    nb = len(blocks)
    unit_block = np.concatenate([np.arange(nb), np.arange(nb), *fac_block])
    unit_type = np.concatenate([np.zeros(2 * nb, np.int64), *fac_type])
    unit_occ = np.concatenate([np.ones(nb, bool), np.zeros(nb, bool), np.ones(sum(len(f) for f in fac_type), bool)])
    unit_count = np.concatenate([h1[:, 1], h1[:, 2], *fac_count])
    steps.start("write")
    n_persons, n_units = write_cef(out, geocodes, np.concatenate(person_block), np.concatenate(person_cell),
                                   np.concatenate(person_count), unit_block, unit_type, unit_occ, unit_count,
                                   command=command)
    steps.close()
    written = int(((p1[:, 0] > 0) | (h1[:, 0] > 0)).sum())
    notes = (f"{fallback} block(s) without a facility count (HU100 = H1_001): one GQ facility per present type",) \
        if fallback else ()
    derived = ("group-quarters persons' age, ethnicity and race: P5 does not cross GQ type with them; each type "
               "takes whole cells, largest first (ingest module docstring, 1)",
               "facilities per GQ type: HU100 - H1_001 apportioned over the types present (module docstring, 2)")
    return Summary(source=str(geo), blocks_read=nb, blocks_written=written, persons=n_persons,
                   housing_units=int(h1[:, 0].sum()), gq_facilities=n_units - int(h1[:, 0].sum()), notes=notes,
                   derived=derived)


def _allocate_gq(cells: np.ndarray, gq: np.ndarray, src: object, row: int, geocode: str):
    """Yield (hhgq, taken[252]) per GQ type, removing the taken persons from ``cells`` (module docstring, 1)."""
    for k in GQ_ORDER:
        need = int(gq[k - 1])
        if need == 0:
            continue
        adult, minor = np.arange(126, 252), np.arange(126)
        groups = (adult,) if k == NURSING else ((minor, adult) if k == JUVENILE else (adult, minor))
        taken = np.zeros_like(cells)
        for group in groups:
            order = group[np.lexsort((group, -cells[group]))]
            before = np.cumsum(cells[order]) - cells[order]
            take = np.clip(need - before, 0, cells[order])
            taken[order] += take
            need -= int(take.sum())
        if need > 0:
            raise IngestError(f"{src}: column -, row {row}: block {geocode}: too few persons aged 18+ for the "
                              f"nursing-facility population (P5 cell 005 vs P3)" if k == NURSING else
                              f"{src}: column -, row {row}: block {geocode}: GQ population exceeds the population")
        cells -= taken
        yield k, taken


def _allocate_facilities(gq: np.ndarray, facilities: int, src: object, row: int, geocode: str) -> np.ndarray:
    """Facilities per GQ type 1..7 (module docstring, 2)."""
    present = gq > 0
    if facilities == 0:
        return present.astype(np.int64)
    if facilities < present.sum() or facilities > gq.sum():
        raise IngestError(f"{src}: column HU100, row {row}: block {geocode}: HU100 - H1_001 does not give between "
                          "one facility per GQ type present and one per GQ person")
    fac = present.astype(np.int64)
    for _ in range(int(facilities - fac.sum())):
        best = -1
        for k in np.flatnonzero(fac < gq):
            if best < 0 or gq[k] * fac[best] > gq[best] * fac[k]:
                best = k
        fac[best] += 1
    return fac


# --------------------------------------------------------------------------------------------- block CSV

BLOCK_GROUPS = ("hisp", "white", "black", "aian", "asian", "nhpi", "other", "two")
#: Not-Hispanic single-race groups -> cenrace index.
SINGLE_RACE = {"white": 0, "black": 1, "aian": 2, "asian": 3, "nhpi": 4, "other": 5}
_W, _B, _I, _A, _P, _S = range(6)


def _combo(*races: int) -> int:
    return cenrace_index(tuple(int(r in races) for r in range(6)))


#: Two-race combinations, percent weights (rounded 2010 national shares of the two-race population).
TWO_RACE_WEIGHTS: dict[int, int] = {
    _combo(_W, _B): 22, _combo(_W, _I): 18, _combo(_W, _A): 20, _combo(_W, _P): 2, _combo(_W, _S): 21,
    _combo(_B, _I): 3, _combo(_B, _A): 2, _combo(_B, _P): 1, _combo(_B, _S): 4, _combo(_I, _A): 1,
    _combo(_I, _P): 1, _combo(_I, _S): 1, _combo(_A, _P): 2, _combo(_A, _S): 1, _combo(_P, _S): 1,
}
#: Race of Hispanic persons, percent weights (rounded 2010 national shares).
HISPANIC_RACE_WEIGHTS: dict[int, int] = {_W: 53, _B: 2, _I: 1, _A: 1, _S: 37, _combo(_W, _S): 6}
STRIDE = 37


def _stride_pick(j: np.ndarray, weights: dict[int, int]) -> np.ndarray:
    """The race of the weight bucket that holds slot (j * STRIDE) mod total, for each j (module docstring)."""
    races = np.array(list(weights))
    bounds = np.cumsum(list(weights.values()))
    return races[np.searchsorted(bounds, (np.asarray(j, np.int64) * STRIDE) % bounds[-1], side="right")]


def _stride_races(counts: np.ndarray, weights: dict[int, int]) -> tuple[np.ndarray, np.ndarray]:
    """``spread``: ``counts`` (per owner, in output order) over the races in ``weights``, person by person.
    Returns (owner, race) per person."""
    owner = np.repeat(np.arange(counts.size), counts)
    return owner, _stride_pick(np.arange(owner.size), weights)


def _compact_races(counts: np.ndarray, weights: dict[int, int]) -> np.ndarray:
    """``compact``: one race per block for ``counts`` (blocks x age groups), block by block. Returns the race
    of each owner (block * 2 + age group)."""
    present = counts.sum(1) > 0
    return np.repeat(_stride_pick(np.cumsum(present) - 1, weights), 2)


GEOID_COLUMNS = ("GEOID", "GEOID20", "GEOID10")
HU_COLUMNS = ("hu", "hu_occupied", "hu_vacant")


def _read_block_table(csv: Path) -> tuple[str, pd.DataFrame]:
    """The block CSV as strings, and the name of its GEOID column."""
    try:
        frame = pd.read_csv(csv, dtype=str, keep_default_na=False)
    except (OSError, ValueError, UnicodeDecodeError, *DAMAGED_FILE_ERRORS) as exc:
        raise IngestError(f"{csv}: column -, row -: cannot read CSV ({exc})") from exc
    names = [c for c in GEOID_COLUMNS if c in frame.columns]
    if len(names) != 1:
        raise IngestError(f"{csv}: column GEOID, row -: expected exactly one block GEOID column of "
                          f"{', '.join(GEOID_COLUMNS)} (found {names or 'none'})")
    return names[0], frame


def _block_units(csv: Path, values: dict[str, np.ndarray], persons: np.ndarray, geoids: np.ndarray,
                 rows: np.ndarray) -> tuple[np.ndarray, np.ndarray, bool]:
    """Occupied and vacant housing units per block: the table's own columns or the derived ones (module
    docstring), arrays in table order; and whether the housing-unit counts were derived from the persons."""
    derived = (2 * persons + 4) // 5  # ceil(persons / 2.5)
    if "hu_occupied" in values:
        occupied, vacant = values["hu_occupied"], values["hu_vacant"]
    elif "hu" in values:
        occupied = np.minimum(values["hu"], derived)
        vacant = values["hu"] - occupied
    else:
        order = np.argsort(geoids, kind="stable")
        running = np.cumsum(derived[order])
        vacant = np.empty_like(derived)
        vacant[order] = running // 9 - np.concatenate([[0], running[:-1]]) // 9
        return derived, vacant, True
    column = "hu_occupied" if "hu_occupied" in values else "hu"
    for bad, problem in ((persons > 0) & (occupied == 0), "has persons but no occupied housing unit"),\
                        (occupied > persons, "has more occupied housing units than persons"):
        if bad.any():
            i = int(np.flatnonzero(bad)[0])
            raise IngestError(f"{csv}: column {column}, row {rows[i]}: block {geoids[i]} {problem}")
    return occupied, vacant, False


def ingest_blocks(csv: Path, out: Path, races: str = "spread") -> Summary:
    """Read a block demographics CSV (``GEOID, pop, pop_<g>.., vap, vap_<g>..``, optional ``hu`` or
    ``hu_occupied, hu_vacant``); write CEF-like Parquet. ``races``: how the collapsed groups get their race
    combinations (:data:`RACE_CHOICES`, module docstring)."""
    if races not in RACE_CHOICES:
        raise ValueError(f"races must be one of {RACE_CHOICES}, not {races!r}")
    csv = Path(csv)
    steps = Steps("ingest blocks", 3)
    steps.start("read and check")
    geoid_col, frame = _read_block_table(csv)
    need = ["pop", "vap"] + [f"{a}_{g}" for a in ("pop", "vap") for g in BLOCK_GROUPS]
    hu = [c for c in HU_COLUMNS if c in frame.columns]
    if hu and hu not in (["hu"], ["hu_occupied", "hu_vacant"]):
        raise IngestError(f"{csv}: column {hu[0]}, row -: give either hu, or hu_occupied and hu_vacant (found "
                          f"{', '.join(hu)})")
    missing = [c for c in need if c not in frame.columns]
    if missing:
        raise IngestError(f"{csv}: column {missing[0]}, row -: required column missing")
    if frame.empty:
        raise IngestError(f"{csv}: column -, row 0: no blocks (a header without rows)")
    geoids = frame[geoid_col].to_numpy(dtype=object)
    rows = np.arange(len(frame))
    _check_geoids(csv, geoid_col, frame[geoid_col], rows)
    dup = frame[geoid_col].duplicated().to_numpy()
    if dup.any():
        i = int(np.flatnonzero(dup)[0])
        raise IngestError(f"{csv}: column {geoid_col}, row {i}: duplicate block (value {geoids[i]!r})")
    numeric = need + hu
    parsed = _digits(frame[numeric].to_numpy(dtype=object), csv, numeric, rows, MAX_BLOCK_COUNT)
    values = {col: parsed[:, j] for j, col in enumerate(numeric)}
    pop = np.stack([values[f"pop_{g}"] for g in BLOCK_GROUPS], 1)
    vap = np.stack([values[f"vap_{g}"] for g in BLOCK_GROUPS], 1)
    for col, got, want in (("pop", pop.sum(1), values["pop"]), ("vap", vap.sum(1), values["vap"])):
        if (got != want).any():
            i = int(np.flatnonzero(got != want)[0])
            raise IngestError(f"{csv}: column {col}, row {i}: block {geoids[i]}: total is not the sum of the groups")
    if (vap > pop).any():
        i, g = np.argwhere(vap > pop)[0]
        raise IngestError(f"{csv}: column vap_{BLOCK_GROUPS[g]}, row {i}: block {geoids[i]}: voting age exceeds "
                          f"pop_{BLOCK_GROUPS[g]}")
    occupied, vacant, derived = _block_units(csv, values, pop.sum(1), geoids, rows)
    _check_memory(csv, int(pop.sum()) + int(occupied.sum()) + int(vacant.sum()))

    steps.start("derive persons and units")
    order = np.argsort(geoids, kind="stable")
    geoids, pop, vap, occupied, vacant = geoids[order], pop[order], vap[order], occupied[order], vacant[order]
    nb = len(geoids)
    # counts[b, v, g]: persons of block b, votingage v, group g
    counts = np.stack([pop - vap, vap], 1)
    blocks_l, cells_l, counts_l = [], [], []
    for g, name in enumerate(BLOCK_GROUPS):
        per = counts[:, :, g].reshape(-1)  # owner = b * 2 + v, i.e. geoid then under-18 before 18+
        weights = HISPANIC_RACE_WEIGHTS if name == "hisp" else TWO_RACE_WEIGHTS
        hisp = int(name == "hisp")
        if name in SINGLE_RACE:
            owner, race, n = np.arange(per.size), np.full(per.size, SINGLE_RACE[name]), per
        elif races == "compact":
            owner, race, n = np.arange(per.size), _compact_races(counts[:, :, g], weights), per
        else:
            owner, race = _stride_races(per, weights)
            n = np.ones(owner.size, np.int64)
        cell = PERSONS.cell_index(np.zeros_like(owner), owner % 2, np.full_like(owner, hisp), race)
        blocks_l.append(owner // 2)
        cells_l.append(np.asarray(cell))
        counts_l.append(n)
    household = pop.sum(1)
    steps.start("write")
    n_persons, n_units = write_cef(out, geoids, np.concatenate(blocks_l), np.concatenate(cells_l),
                                   np.concatenate(counts_l), np.concatenate([np.arange(nb)] * 2),
                                   np.zeros(2 * nb, np.int64), np.repeat([True, False], nb),
                                   np.concatenate([occupied, vacant]), units_derived=derived)
    steps.close()
    return Summary(source=str(csv), blocks_read=nb,
                   blocks_written=int(((household > 0) | (occupied + vacant > 0)).sum()),
                   persons=n_persons, housing_units=n_units, gq_facilities=0,
                   derived=_blocks_derived(hu, races))


def _blocks_derived(hu: list[str], races: str) -> tuple[str, ...]:
    """What :func:`ingest_blocks` made up, in words (module docstring): no count of the table, which may be
    confidential."""
    units = {(): "housing units: the table has none; occupied = ceil(persons / 2.5) per block, one vacant per 9 "
                 "occupied file-wide (derived from the population: a production run refuses this input unless [run] "
                 "weaken_privacy waives \"derived_housing_units\")",
             ("hu",): "occupied and vacant housing units: occupied = min(hu, ceil(persons / 2.5)), the rest vacant",
             ("hu_occupied", "hu_vacant"): None}[tuple(hu)]
    way = ("spread person by person over the weight tables, so a block's group lies in many combinations"
           if races == "spread" else "one combination per block and group (compact)")
    return tuple(d for d in (
        units,
        "group quarters: the table has none; everybody lives in a household",
        f"race combinations of the two-or-more-races and Hispanic persons: not in "
        f"the table; {way} (--races {races}; docs/reference/input.md)") if d)
