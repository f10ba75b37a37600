"""The partitioned data plane: input records are read, checked and tabulated on the Dask workers,
partition by partition, and every level's true histograms stay on the workers.

* Input: ``persons.parquet`` or a directory ``persons/`` of Parquet files (hive-partitioned by state, or any
  split), the same for units. Each read task takes whole row groups of one file (about
  :data:`ROWS_PER_TASK` records), checks them (validate.py) and keeps its block histograms on its worker; the
  driver receives the task's block GEOIDs and the public per-block unit counts only.
* Shards: the spine's blocks in node order, :data:`SHARD_BLOCKS` at a time. A shard task sums the read
  tasks' histograms of its blocks, checks the block structure (a person needs a unit of its type, a GQ
  facility a resident), and keeps per level the partial sums of the nodes its blocks belong to. The driver
  receives per node the few query answers the feasibility checks and the total invariants need.
* A chunk of level L (engine.py) gets its children's true histograms from the shards' partials of L and its
  parents' estimated histograms from the committed Parquet parts of level L-1; it writes its own part.
* The MDF is written by workers, one task per county (a prefix hierarchy's node of the second level below
  the root; a column hierarchy's :data:`MDF_LEAVES` leaves at a time), from the committed block-level parts.
* Every census (``read_input(..., census)``; P.L. 94-171 when none is given) reads each product's records with
  ``validate.check_records``, a product counting the census's unit records from the units file: a column
  hierarchy's records carry one code column per level, and the read tasks return the public level codes of
  their leaves, from which the driver builds the spine (:func:`input_geography`). A census without unit records
  needs no units file.

Nothing here depends on the number of workers, tasks or shards: outputs are byte-identical to the
in-memory path (tests/test_dataplane.py).
"""
from __future__ import annotations

import copy
import dataclasses
import functools
import itertools
import pickle
from dataclasses import dataclass
from pathlib import Path
from typing import Callable, NamedTuple

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import scipy.sparse as sp

from ..inputs.invariants import UNIT_COLUMNS, LevelConstraints, bind, infeasible, infeasible_error, invariant_rows, level_rhs
from topdown.geo.spine import US_HIERARCHY, is_sorted, nesting_problem, sorted_factorize
from topdown.vocab.census import GENERIC_MDF, Census, Hierarchy, Product, Units
from topdown.vocab.queries import build_query

from .levels import (Level, LevelPart, LevelParts, _geography, _plb, aggregate, holding, levels_from_units,
                     node_answers, total_is_invariant)
from .memory import release_memory
from ..runtime.rundir import sha256_file, write_frames, write_json_atomic, write_table
from ..runtime.storage import location, parquet_file, read_part
from ..configuration.census import default_census
from ..configuration.errors import InputError
from .tasks import Chunk, ChunkResult, batch_chunks, run_chunk, shared_values, taken, windowed
from ..inputs.tabulate import block_units
from ..outputs.mdf import MDF_PARQUET, product_mdf
from topdown.vocab.problem import SparseHist
from ..inputs.validate import (PERSON_RECORDS, UNIT_RECORDS, block_problem, check_records,
                               check_units, nesting_error, raise_block_problem)

#: Input records per read task (whole row groups; a bigger row group is a task alone).
ROWS_PER_TASK = 2_000_000
#: Blocks per tabulation shard.
SHARD_BLOCKS = 20_000
#: Digits of a U.S. block GEOID (a spine's block geocodes of another common number of digits are searched as
#: numbers too: :func:`_geoid_numbers`).
GEOID_DIGITS = 15
#: Leaves per MDF task of a column hierarchy (a prefix hierarchy's tasks are its second level's nodes).
MDF_LEAVES = 50_000


# --------------------------------------------------------------------------------------------- input files

@dataclass(frozen=True)
class InputFiles:
    """The Parquet files of an input directory: ``persons.parquet`` or ``persons/**.parquet``, same for units."""

    root: Path
    persons: tuple[Path, ...]
    units: tuple[Path, ...]  # empty: a census without unit records
    #: The file names (without .parquet) of the person records and of the unit records.
    names: tuple[str, str] = (PERSON_RECORDS, UNIT_RECORDS)

    def where(self, kind: str) -> Path:
        """What an error about records of ``kind`` in no single file names: the file, or the directory."""
        files = getattr(self, kind)
        name = self.names[(PERSON_RECORDS, UNIT_RECORDS).index(kind)]
        return files[0] if len(files) == 1 and files[0].name == f"{name}.parquet" else self.root / name

    def hashes(self) -> dict[str, str]:
        """SHA-256 of every input file, by its path below the input directory."""
        return {f.relative_to(self.root).as_posix(): sha256_file(f) for f in (*self.persons, *self.units)}


def find_input(root: Path | str, census: Census | None = None) -> InputFiles:
    """The input files under ``root`` (of ``census``'s records, the default census's when None: those its products
    count, and its unit records when it declares them); a missing kind is a FileNotFoundError naming what is
    expected."""
    root = location(root)
    names = census_files(census or default_census())
    found = {}
    for kind in names:
        if kind is None:
            continue
        single, folder = root / f"{kind}.parquet", root / kind
        if single.is_file():
            found[kind] = (single,)
        elif folder.is_dir():
            found[kind] = tuple(sorted(p for p in folder.rglob("*.parquet") if p.is_file() and not any(
                part.startswith((".", "_")) for part in p.relative_to(folder).parts)))
        if not found.get(kind):
            needs = " and ".join(f"{n}.parquet" for n in names if n)
            folders = " and ".join(f"{n}/" for n in names if n)
            raise FileNotFoundError(f"{single}: input file not found (the input directory needs {needs}, or "
                                    f"directories {folders} of Parquet files; see `topdown demo-data`, "
                                    "`topdown synth`, `topdown ingest`)")
    return InputFiles(root, found.get(names[0], ()), found.get(names[1], ()),
                      (names[0] or PERSON_RECORDS, names[1] or UNIT_RECORDS))


def census_files(census: Census) -> tuple[str | None, str | None]:
    """The record files a census's input has: the one its products count besides the unit records (None: they
    count unit records only) and its unit records (None: it declares none)."""
    units = None if census.units is None else census.units.name
    counted = {p.records.name for p in census.products if not counts_units(census, p)}
    if len(counted) > 1:
        raise InputError(f"census {census.name!r}: its products count records of {sorted(counted)}; the input "
                         "reads one record file besides the unit records")
    return (counted.pop() if counted else None), units


def read_tasks(files: tuple[Path, ...]) -> list[tuple[str, list[int]]]:
    """(file, row groups) of the read tasks: whole row groups, about :data:`ROWS_PER_TASK` records each.
    Reads Parquet footers only."""
    tasks = []
    for f in files:
        try:
            meta = parquet_file(f).metadata
        except (OSError, ValueError) as exc:
            raise InputError(f"{f}: not a readable Parquet file ({type(exc).__name__}: {exc})") from exc
        groups: list[int] = []
        rows = 0
        for g in range(meta.num_row_groups):
            n = meta.row_group(g).num_rows
            if groups and rows + n > ROWS_PER_TASK:
                tasks.append((str(f), groups))
                groups, rows = [], 0
            groups.append(g)
            rows += n
        tasks.append((str(f), groups))
    return tasks


def counts_units(census: Census, product: Product) -> bool:
    """Whether ``product`` counts the census's unit records (it then reads the units file)."""
    return census.units is not None and product.records.name == census.units.name


# --------------------------------------------------------------------------------------------- worker tasks

@dataclass
class BlockPart:
    """One read task's person histograms (confidential: stays on its worker)."""

    path: str
    geoids: pd.Index  # sorted unique block GEOIDs (Arrow strings: no Python object per block)
    hist: sp.csr_matrix  # blocks x person cells, counts in the fewest bytes that hold them (:func:`_narrow`)
    geography: pd.DataFrame | None = None  # a column hierarchy's level codes per block (public)


def read_records(path: str, row_groups: list[int], product: Product, hierarchy: Hierarchy) -> BlockPart:
    """Read, check and tabulate the records ``product`` counts in one file's row groups."""
    leaf, cells, geography = check_records(location(path), product, hierarchy, row_groups)
    codes, blocks = pd.factorize(leaf, sort=True)
    ncells = product.schema.ncells
    hist = sp.csr_matrix((np.ones(len(codes), np.int64), (codes, cells)), shape=(len(blocks), ncells), dtype=np.int64)
    hist.sum_duplicates()
    hist.data = _narrow(hist.data)
    return BlockPart(path, pd.Index(blocks, dtype="str"), hist, geography)


def part_geoids(part: BlockPart) -> pd.Index:
    return part.geoids


def part_geography(part: BlockPart | pd.DataFrame) -> pd.DataFrame | None:
    """A read task's public level codes per block (a column hierarchy's), from a person part or a units frame."""
    return part.geography if isinstance(part, BlockPart) else part.attrs.get("geography")


def read_units(path: str, row_groups: list[int], census: Census) -> pd.DataFrame:
    """Read and check ``census``'s unit records of one file's row groups; per block u0..u7 and occupied
    (tabulate.block_units), and a column hierarchy's level codes per block in ``attrs["geography"]``."""
    _, units = check_units(location(path), row_groups, census.hierarchy, census.units)
    frame = _narrow_counts(block_units(units))
    frame.attrs["geography"] = units.attrs["geography"]
    return frame


def _narrow_counts(frame: pd.DataFrame) -> pd.DataFrame:
    """A units frame's counts in the fewest bytes that hold them (:func:`_narrow`; :func:`_block_units` sums
    them in 64 bits)."""
    for column in frame.columns.drop("geoid"):
        frame[column] = _narrow(frame[column].to_numpy())
    return frame


#: The integer types :func:`_narrow` picks from, smallest first.
NARROW_INTS = (np.int8, np.int16, np.int32)


def _narrow(values: np.ndarray) -> np.ndarray:
    """Integral counts in the fewest bytes that hold them exactly (held for a whole level on the workers):
    integers, and floats that are all integers, in the smallest of :data:`NARROW_INTS` that holds them; floats
    with NaN ("no constraint") or infinities whose other values are integers below 2**24 in 32-bit floats;
    else unchanged. Readers widen them back (:class:`BlockMeta`) or sum them in 64 bits (:func:`_stack`)."""
    if values.size == 0 or values.dtype.kind not in "iuf" or values.dtype.itemsize == 1:
        return values
    finite = values[np.isfinite(values)] if values.dtype.kind == "f" else values
    if finite.size and not (finite == np.round(finite)).all():
        return values
    low, high = (finite.min(), finite.max()) if finite.size else (0, 0)
    if finite.size == values.size:  # all integral
        fits = next((t for t in NARROW_INTS if np.iinfo(t).min <= low and high <= np.iinfo(t).max), None)
        if fits is None or values.dtype.kind in "iu" and np.dtype(fits).itemsize >= values.dtype.itemsize:
            return values
        return values.astype(fits)
    return values.astype(np.float32) if values.dtype.itemsize > 4 and max(-low, high) < 2 ** 24 else values


def _strings(index: pd.Index) -> pa.Array:
    """An index's strings as one Arrow array (no pandas hash table kept with them)."""
    return pa.array(np.asarray(index, dtype=object), type=pa.string())


class BlockMeta:
    """The public metadata of a range of the block level's rows (stays on its worker): the blocks' GEOIDs and
    unit counts (u0..u7, occupied; indexed by block geocode), rows in node order from row ``lo``, and the rule
    giving their constraints' right-hand sides from those counts (:func:`block_rhs`; None: no constraints), so
    that no right-hand side is held. Held compact (strings as Arrow arrays, counts in the fewest bytes that
    hold them): :attr:`geoids`, :attr:`units`, :attr:`constraints` and the ``*_rows`` methods give them back
    with their original types."""

    def __init__(self, lo: int, geoids: pd.Index, units: pd.DataFrame,
                 rhs: Callable[[pd.DataFrame], LevelConstraints] | None, totals: np.ndarray | None = None):
        self.lo, self.n, self.rhs = lo, len(units), rhs
        self.totals = totals  # the product's block totals where they are invariant (the leaf level's), else None
        self._geoids = _strings(geoids)
        self._names = None if units.index is geoids or units.index.equals(geoids) else _strings(units.index)
        self._dtypes = {"geoids": geoids.dtype, "names": units.index.dtype}
        self._columns = [(c, _narrow(units[c].to_numpy()), units[c].dtype) for c in units.columns]

    def __len__(self) -> int:
        return self.n

    def _index(self, values: pa.Array, rows, dtype) -> pd.Index:
        picked = values if isinstance(rows, slice) else values.take(pa.array(np.asarray(rows, dtype=np.int64)))
        return pd.Index(picked.to_numpy(zero_copy_only=False), dtype=dtype)

    def names_rows(self, rows: np.ndarray | slice = slice(None)) -> pd.Index:
        """The block geocodes (the units' index) of local ``rows``."""
        return self._index(self._geoids if self._names is None else self._names, rows, self._dtypes["names"])

    def geoids_rows(self, rows: np.ndarray | slice = slice(None)) -> pd.Index:
        """The GEOIDs of local ``rows``."""
        return self._index(self._geoids, rows, self._dtypes["geoids"])

    def units_rows(self, rows: np.ndarray | slice = slice(None)) -> pd.DataFrame:
        """The unit counts of local ``rows``, indexed by block geocode."""
        return pd.DataFrame({c: v[rows].astype(d) for c, v, d in self._columns}, index=self.names_rows(rows),
                            columns=[c for c, _, _ in self._columns])

    @property
    def geoids(self) -> pd.Index:
        return self.geoids_rows()

    @property
    def units(self) -> pd.DataFrame:
        return self.units_rows()

    def sharing(self, rhs: Callable[[pd.DataFrame], LevelConstraints] | None,
                totals: np.ndarray | None = None) -> BlockMeta:
        """The same blocks' metadata with the rule ``rhs`` and invariant ``totals`` (another product's), sharing
        these arrays."""
        other = copy.copy(self)
        other.rhs, other.totals = rhs, totals
        return other

    def rhs_frame(self, rows: np.ndarray | slice = slice(None)) -> pd.DataFrame:
        """What the rule takes: the unit counts of local ``rows``, with ``tot`` where the totals are invariant."""
        units = self.units_rows(rows)
        return units if self.totals is None else units.assign(tot=self.totals[rows])

    @property
    def has_constraints(self) -> bool:
        return self.rhs is not None

    @property
    def constraints(self) -> LevelConstraints | None:
        return None if self.rhs is None else self.rhs(self.rhs_frame())


def block_rhs(product: Product, cfg, levels: list[str], units: pd.DataFrame) -> LevelConstraints:
    """The constraints' right-hand sides of blocks with unit counts ``units`` (indexed by geocode): at the
    lowest level each block's depend on its own counts alone."""
    return level_rhs(product, cfg, levels, levels[-1], units, None, None)


def _locate(metas: list[BlockMeta], rows: np.ndarray) -> tuple[list[np.ndarray], np.ndarray]:
    """Each part's local positions of block ``rows``, and the order that puts their concatenation back in
    ``rows`` order."""
    picked, local = [], []
    for m in metas:
        sel = np.flatnonzero((rows >= m.lo) & (rows < m.lo + len(m)))
        picked.append(sel)
        local.append(rows[sel] - m.lo)
    return local, np.argsort(np.concatenate(picked), kind="stable")


def _units_of(metas: list[BlockMeta], rows: np.ndarray, rule: bool = False
              ) -> tuple[pd.DataFrame, list[np.ndarray], np.ndarray]:
    """The unit counts of block ``rows`` (in that order; ``rule``: with the invariant totals, as the rule takes
    them) from the parts holding them, with :func:`_locate`'s local rows and order."""
    local, back = _locate(metas, rows)
    frames = [m.rhs_frame(i) if rule else m.units_rows(i) for m, i in zip(metas, local)]
    return pd.concat(frames).iloc[back], local, back


def meta_constraints(metas: list[BlockMeta], rows: np.ndarray) -> LevelConstraints:
    """The constraints of block ``rows`` (in that order) from the parts holding them (a Block chunk's: no
    unit frames gathered, no GEOIDs taken)."""
    return metas[0].rhs(_units_of(metas, rows, rule=True)[0])


def geoids_units(metas: list[BlockMeta], rows: np.ndarray) -> tuple[pd.Index, pd.DataFrame]:
    """The GEOIDs and unit counts of block ``rows`` (in that order) from the parts holding them."""
    units, local, back = _units_of(metas, rows)
    geoids = metas[0].geoids_rows(local[0][:0]).append([m.geoids_rows(i) for m, i in zip(metas, local)])[back]
    return geoids, units


def meta_rows(metas: list[BlockMeta], rows: np.ndarray) -> BlockMeta:
    """The metadata of block ``rows`` (in that order) from the parts holding them."""
    geoids, units = geoids_units(metas, rows)
    return BlockMeta(0, geoids, units, metas[0].rhs)


@dataclass
class Shard:
    """True histograms of a range of blocks and their partial sums at every level, and the blocks' public
    metadata (stays on its worker)."""

    partials: list[tuple[np.ndarray, sp.csr_matrix]]  # per level: node rows touched, their partial histograms
    answers: list[dict[str, np.ndarray]]  # per level above the blocks: feasibility_queries answers of those rows
    units: list[np.ndarray]  # per level above the blocks: those rows' summed u0..u7 and occupied
    below: dict[str, np.ndarray]  # the blocks' constraint right-hand sides summed per row of the level above
    infeasible: dict[str, tuple[str, int]]  # block constraints the true data violate: first block, how many
    problem: tuple | None  # a structural input problem (validate.block_problem) and the persons file holding it
    meta: BlockMeta


def _stack(parts: list[BlockPart], blocks: np.ndarray, ncells: int) -> sp.csr_matrix:
    """The histograms of ``blocks`` (rows in that order) summed over the read tasks' parts."""
    index = pd.Index(blocks)
    rows, cols, data = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for part in parts:
        pos = index.get_indexer(part.geoids)
        keep = np.flatnonzero(pos >= 0)
        sub = part.hist[keep].tocoo()
        rows.append(pos[keep][sub.row])
        cols.append(sub.col.astype(np.int64))
        data.append(sub.data.astype(np.int64))
    out = sp.csr_matrix((np.concatenate(data), (np.concatenate(rows), np.concatenate(cols))),
                        shape=(len(blocks), ncells), dtype=np.int64)
    out.sum_duplicates()
    return out


def _persons_problem(parts: list[BlockPart], blocks: np.ndarray, hist: sp.csr_matrix, units_by_type: np.ndarray,
                     by_type: sp.csr_matrix, product: Product) -> tuple | None:
    """The first structural problem (in GEOID order) of the shard's blocks, with the persons file holding it
    (``by_type``: cells x unit types, the bounded attribute's marginal: :func:`unit_type_matrix`)."""
    order = np.argsort(blocks, kind="stable")
    persons_by_type = np.asarray((hist @ by_type).todense())
    problem = block_problem(blocks[order], persons_by_type[order], units_by_type[order], product)
    if problem is None or problem[0] != PERSON_RECORDS:
        return None if problem is None else (problem, None)
    block, k = problem[1], problem[2]
    for part in parts:
        i = int(part.geoids.searchsorted(block))
        if i < len(part.geoids) and part.geoids[i] == block and (part.hist[i] @ by_type[:, k]).sum():
            return problem, part.path
    return problem, None


def unit_type_matrix(schema, attribute: str) -> sp.csr_matrix:
    """Cells x levels of the unit-bounded ``attribute`` (its levels are the unit types): 1 where a cell has it."""
    return sp.csr_matrix(build_query(schema, attribute).matrix().T, dtype=np.int64)


def unit_bounded(spec: Product) -> str | None:
    """The attribute whose answers a product's structural input checks bound by the units of each type (a
    person of type k needs a unit of type k), or None: the product's declared ``unit_bounds``."""
    return None if spec.unit_bounds is None else spec.unit_bounds.attribute


def tabulate_shard(product: Product, cfg, levels: list[str], lo: int, blocks: pd.Index | np.ndarray | None,
                   names: pd.Index | None, parts: list[BlockPart], units: list[pd.DataFrame] | BlockMeta,
                   runs: list[tuple[np.ndarray, np.ndarray]], width: int = GEOID_DIGITS,
                   leaf_total: bool = False) -> Shard:
    """The shard of the block level's rows ``lo`` on: GEOIDs ``blocks`` (or their :func:`_geoid_numbers` of
    ``width`` digits) and geocodes ``names`` (None: the GEOIDs), unit counts summed from the unit read tasks'
    frames, or ``units`` the same rows' metadata of a product tabulated before (whose GEOIDs, geocodes and unit
    counts this shard's metadata shares; ``blocks`` and ``names`` are then None); histograms from the product's
    read tasks' ``parts``; partial sums per level above the blocks
    (``runs[i]``: the blocks' node rows at level i, as :func:`_runs`); the blocks' constraints, checked
    against their true answers and summed per node of the level above. ``leaf_total``: the blocks' totals are
    invariant (levels.total_is_invariant), so their constraints bind them."""
    schema, spec = product.schema, product
    known = units if isinstance(units, BlockMeta) else None
    if known is not None:
        blocks, frame = known.geoids, known.units
        units = frame.to_numpy(dtype=np.int64)
    else:
        blocks = _geoid_strings(blocks, width) if isinstance(blocks, np.ndarray) else blocks
        units = _block_units(units, blocks)
        frame = pd.DataFrame(units, index=blocks if names is None else names, columns=UNIT_COLUMNS + ["occupied"])
    names = frame.index
    inverses = [np.repeat(values, lengths) for values, lengths in runs]
    hist = _stack(parts, blocks, schema.ncells)
    bounded = unit_bounded(spec)
    by_type = None if bounded is None else unit_type_matrix(schema, bounded)
    problem = None if by_type is None else _persons_problem(parts, blocks, hist, units[:, :by_type.shape[1]],
                                                            by_type, spec)
    rule = functools.partial(block_rhs, product, cfg, levels)
    totals = np.asarray(hist.sum(axis=1), dtype=float).ravel() if leaf_total else None
    cons = rule(frame if totals is None else frame.assign(tot=totals))
    bad = infeasible(cons, node_answers(product, hist))
    partials, answers, sums, below = [], [], [], {}
    for i, inverse in enumerate(inverses):
        rows, local = np.unique(inverse, return_inverse=True)
        agg = sp.csr_matrix((np.ones(len(local), np.int64), (local, np.arange(len(local)))), shape=(len(rows), len(local)))
        partial = aggregate(agg, hist)
        partials.append(_compact_partial(rows, partial))
        answers.append(node_answers(product, partial))
        sums.append(agg @ units)
        if i == len(inverses) - 1:  # the level above the blocks: their right-hand sides summed per node
            for name, c in cons.rhs.items():
                below[name] = np.zeros((len(rows), c.rhs.shape[1]))
                np.add.at(below[name], local, c.rhs)
    partials.append(_compact_partial(lo + np.arange(len(blocks)), hist))
    return Shard(partials, answers, sums, below, {name: (str(names[row]), n) for name, (row, n) in bad.items()},
                 problem, BlockMeta(lo, blocks, frame, rule, totals) if known is None else known.sharing(rule, totals))


def _compact_partial(rows: np.ndarray, hist: sp.csr_matrix) -> tuple[np.ndarray, sp.csr_matrix]:
    """A partial as the shard holds it for its level's estimation: node rows and counts in the fewest bytes
    that hold them (:func:`_narrow`; :func:`_stack` sums them in 64 bits)."""
    hist = hist.copy()
    hist.data = _narrow(hist.data)
    return _narrow(rows), hist


def _runs(rows: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Node rows as runs (each run's row and length; ``np.repeat`` undoes it): a shard's blocks lie in few nodes."""
    starts = np.r_[0, np.flatnonzero(np.diff(rows)) + 1]
    return rows[starts], np.diff(np.r_[starts, len(rows)])


def shard_summary(shard: Shard) -> tuple:
    """What the driver takes from a shard: node rows, query answers and unit sums per level above the blocks,
    the blocks' summed right-hand sides and infeasible constraints, and any input problem."""
    return ([rows for rows, _ in shard.partials], shard.answers, shard.units, shard.below, shard.infeasible,
            shard.problem)


def shard_meta(shard: Shard) -> BlockMeta:
    return shard.meta


def level_partial(shard: Shard, level: int) -> tuple[np.ndarray, sp.csr_matrix]:
    return shard.partials[level]


def rows_of(parts: list[tuple[np.ndarray, sp.csr_matrix]], rows: np.ndarray, ncells: int) -> sp.csr_matrix:
    """True histograms of node ``rows`` (in that order) summed from the shards' partials."""
    return _stack([BlockPart("", prow, m) for prow, m in parts], rows, ncells)


def read_rows(files: list[str], nodes: list[str], ncells: int,
              read: Callable[[str], pa.Table] = read_part) -> sp.csr_matrix:
    """Estimated histograms of ``nodes`` (rows in that order) read from a committed level's parts (``read``: how
    a part is read, e.g. through a cache). (A part without a non-zero cell has a geocode column of Arrow type
    null, so the parts are read one by one.)"""
    wanted = pa.array(nodes, type=pa.string())
    rows, cells, counts = [np.zeros(0, np.int64)], [np.zeros(0, np.int64)], [np.zeros(0, np.int64)]
    for f in files:
        table = read(f)
        if pa.types.is_null(table.schema.field("geocode").type):
            continue
        at = pc.index_in(table.column("geocode").cast(pa.string()), value_set=wanted)
        mine = at.is_valid()
        rows.append(at.filter(mine).to_numpy().astype(np.int64))
        cells.append(table.column("cell").filter(mine).to_numpy().astype(np.int64))
        counts.append(table.column("count").filter(mine).to_numpy().astype(np.int64))
    return sp.csr_matrix((np.concatenate(counts), (np.concatenate(rows), np.concatenate(cells))),
                         shape=(len(nodes), ncells), dtype=np.int64)


def hist_table(nodes: pd.Index, hist: sp.csr_matrix) -> pd.DataFrame:
    """Long ``geocode, cell, count`` rows of a histogram matrix, non-zero cells only, sorted."""
    coo = hist.tocoo()
    keep = coo.data != 0
    return pd.DataFrame({"geocode": np.asarray(nodes)[coo.row[keep]], "cell": coo.col[keep].astype(np.int32),
                         "count": coo.data[keep].astype(np.int64)}).sort_values(["geocode", "cell"], kind="stable")


#: Block-level parts a batch of MDF counties keeps read (neighbouring counties' blocks share parts).
MDF_PARTS_KEPT = 4


#: Blocks whose GEOIDs, unit counts and estimates the MDF writer gathers at once: a run of neighbouring counties
#: (a county's own gathering costs about as much as writing its file, on the national shape's small counties).
MDF_GATHER_BLOCKS = 20_000


def write_counties_mdf(product: Product, counties: bytes, metas: list, gather: int = MDF_GATHER_BLOCKS) -> None:
    """Write a batch of counties' MDF parts from the committed block-level parts (``counties``: pickled, for each
    the parts holding its blocks, its block metadata as positions into ``metas`` (each shard's once), its block
    rows in GEOID order, its file and, for the generic layout, its blocks' level codes), each block-level part
    read once while neighbouring counties need it. When the metadata are a run's shards (disjoint row ranges),
    runs of counties of up to ``gather`` blocks have their GEOIDs, unit counts and estimates gathered at once
    and each county's file is written from its slice (the same bytes); else a county at a time."""
    read = functools.lru_cache(maxsize=MDF_PARTS_KEPT)(read_part)
    jobs = pickle.loads(counties)
    shards = _disjoint(metas)
    for run in _gathered(jobs, gather) if shards else [[job] for job in jobs]:
        held = metas if shards else taken(metas, run[0][1])
        geoids, units = geoids_units(held, np.concatenate([rows for _, _, rows, _, _ in run]))
        files = list(dict.fromkeys(f for job in run for f in job[0]))
        hist = read_rows(files, list(units.index), product.schema.ncells, read)
        at = 0
        for _, _, rows, path, codes in run:
            part = slice(at, at + len(rows))
            at = part.stop
            write_table(product_mdf(product, np.asarray(geoids[part]), hist[part], units.iloc[part], codes),
                        location(path), **MDF_PARQUET)


def _disjoint(metas: list[BlockMeta]) -> bool:
    """Whether block metadata hold disjoint ranges of the block level's rows."""
    spans = sorted((m.lo, m.lo + len(m)) for m in metas)
    return all(end <= start for (_, end), (start, _) in zip(spans, spans[1:]))


def _gathered(jobs: list, most: int) -> list[list]:
    """Consecutive ``jobs`` (each with its block rows third) in runs of at most ``most`` blocks (or one job)."""
    runs, size = [], 0
    for job in jobs:
        if not runs or size + len(job[2]) > most:
            runs.append([])
            size = 0
        runs[-1].append(job)
        size += len(job[2])
    return runs


def run_part_chunk(chunk: Chunk, child_rows: np.ndarray, child_parts: list | None, parent_files: list[str] | None,
                   hist_path: str, child_meta: list[BlockMeta] | None = None) -> ChunkResult:
    """Run a chunk on a worker: its children's true histograms from the shards' partials (``child_parts``,
    None: the chunk carries them, or none is needed), their constraints from the shards' block metadata
    (``child_meta``, None: the chunk carries them), its parents' from the committed parts of the level
    above (``parent_files``, None at the root); its estimate is written to ``hist_path`` and the driver gets
    back each child's count of non-zero cells and the part's SHA-256 instead of the histograms."""
    ncells = chunk.product.schema.ncells
    if child_parts is not None:
        chunk.child_hist = rows_of(child_parts, child_rows, ncells)
    if child_meta is not None:
        cons = meta_constraints(child_meta, child_rows)
        for task in chunk.parents:
            task.constraints = cons.take(task.child_rows)
    if parent_files is not None:
        hists = SparseHist.rows_of(read_rows(parent_files, [t.parent for t in chunk.parents], ncells))
        for task, hist in zip(chunk.parents, hists):
            task.parent_hist = hist
    result = run_chunk(chunk)
    write_table(hist_table(pd.Index(result.children), result.hist), location(hist_path))
    return dataclasses.replace(result, hist=None, nnz=np.diff(result.hist.indptr).astype(np.int32),
                               hist_sha256=sha256_file(location(hist_path)))


def run_part_chunks(chunks: bytes, args: bytes, shards: list, records: str) -> list[ChunkResult]:
    """Run a batch of chunks on a worker, one after the other (``chunks``: the batch's chunks pickled together;
    ``args``: pickled, for each the other arguments of :func:`run_part_chunk`, its shards' partials and block
    metadata as positions into ``shards``, each shard's once, :func:`tasks.shared_values`); each chunk's
    histograms and then its record (the mark of a finished chunk, for --resume) are written as it finishes.
    Returns each chunk's result without its children's names; the worker's freed heap goes back to the system
    after the batch (its models' transients would otherwise stay resident)."""
    batch: list[Chunk] = pickle.loads(chunks)[::-1]
    results = []
    for rows, parts, parent_files, hist_path, meta in pickle.loads(args):
        res = run_part_chunk(batch.pop(), rows, taken(shards, parts), parent_files, hist_path,  # a finished chunk
                             taken(shards, meta))                                             # is dropped
        record_chunk(location(records), res)
        results.append(dataclasses.replace(res, children=[]))
    release_memory()
    return results


def record_chunk(records: Path, res: ChunkResult) -> None:
    """Record a finished chunk whose histograms its task staged (written last: the mark of a finished chunk),
    with the SHA-256 of the chunk's two staged files."""
    records.mkdir(parents=True, exist_ok=True)
    write_json_atomic(records / f"part-{res.index:05d}.json",
                      {"failsafe": res.failsafe, "solved": res.solved, "copied": res.copied,
                       "solve_seconds": res.solve_seconds,
                       "sha256": {"histograms": res.hist_sha256, "measurements": res.measurements_sha256}})


# --------------------------------------------------------------------------------------------- the driver

@dataclass
class ReadInput:
    """What the driver holds after the read tasks: futures of the person parts and of the unit frames (on the
    workers; an error message asks them which file holds a block), and each part's block GEOIDs."""

    persons: list  # futures of BlockPart
    person_geoids: list[pd.Index]
    units: list  # futures of read_units frames (per block, sorted by geoid: u0..u7, occupied, vacant)
    unit_geoids: list[pd.Index]
    unit_files: list[str]  # the file of each unit frame
    #: The read tasks per product (name): futures of BlockPart and their block geocodes (``persons`` and
    #: ``person_geoids`` are those of the first product that counts records other than the units).
    parts: dict[str, tuple[list, list[pd.Index]]] = dataclasses.field(default_factory=dict)
    #: A column hierarchy's level codes per block of every read task, and the task's file.
    geography: list[tuple[str, pd.DataFrame]] = dataclasses.field(default_factory=list)


def read_input(client, files: InputFiles, census: Census | None = None) -> ReadInput:
    """Read and check every input file on the workers (the records of each of ``census``'s products, and its
    unit records; None: the default census's). The first error of the person files (in file order), then of
    the unit files, is raised here as the :class:`InputError` its task raised."""
    census = census or default_census()
    ptasks, utasks = read_tasks(files.persons), read_tasks(files.units)
    # each product reads its own records (a product counting the unit records reads the units file)
    parts = {p.name: ([client.submit(read_records, f, g, p, census.hierarchy, pure=False)
                       for f, g in (utasks if counts_units(census, p) else ptasks)], []) for p in census.products}
    pfuts = next((parts[p.name][0] for p in census.products if not counts_units(census, p)), [])
    ufuts = [client.submit(read_units, f, g, census, pure=False) for f, g in utasks]
    gfuts = [client.submit(part_geoids, p, pure=False) for p in pfuts]
    ugfuts = [client.submit(frame_geoids, u, pure=False) for u in ufuts]
    person_geoids, unit_geoids = [f.result() for f in gfuts], []
    # the unit records are checked (check_units) before the products counting them report their errors
    for product in sorted(census.products, key=lambda p: counts_units(census, p)):
        if counts_units(census, product) and not unit_geoids:
            unit_geoids = [f.result() for f in ugfuts]
        futs, geoids = parts[product.name]
        geoids += person_geoids if futs is pfuts else [client.submit(part_geoids, p, pure=False).result() for p in futs]
    geography = []
    if not census.hierarchy.by_prefix:
        for path, fut in [*zip([f for f, _ in ptasks], pfuts), *zip([f for f, _ in utasks], ufuts)]:
            geography.append((path, client.submit(part_geography, fut, pure=False).result()))
    return ReadInput(pfuts, person_geoids, ufuts, unit_geoids or [f.result() for f in ugfuts], [f for f, _ in utasks],
                     parts, geography)


def input_geography(inp: ReadInput, hierarchy: Hierarchy = US_HIERARCHY) -> pd.Series | pd.DataFrame:
    """What ``build_spine`` takes for the input's blocks: their sorted geocodes (a prefix hierarchy), or the
    level codes of every block (a column hierarchy), checked to nest across the read tasks: a code under two
    parents is an :class:`InputError` naming a file that holds it under the second."""
    if hierarchy.by_prefix:
        return block_geoids(inp)
    frame = pd.concat([g for _, g in inp.geography], ignore_index=True).drop_duplicates(ignore_index=True)
    problem = nesting_problem(frame, hierarchy)
    if problem is not None:
        level, code, parent, _, second = problem
        path = next(f for f, g in inp.geography if ((g[level] == code) & (g[parent] == second)).any())
        raise nesting_error(problem, hierarchy, path)
    return frame


def frame_geoids(frame: pd.DataFrame) -> pd.Index:
    return pd.Index(frame["geoid"], dtype="str")


def block_geoids(inp: ReadInput) -> pd.Series:
    """Every block of the input (with persons or units), sorted."""
    indexes = inp.unit_geoids + inp.person_geoids  # no unit geoids: a census without unit records
    found = indexes[0].append(indexes[1:]).sort_values()
    unique = sorted_factorize(found)  # sorted: neighbours compared, no hash table
    return pd.Series(found.unique() if unique is None else unique[1], name="geoid").reset_index(drop=True)


def gq_presence(client, inp: ReadInput) -> pd.DataFrame:
    """(geoid, unit_type) of every GQ type present in a block, in that order: all the optimized spine takes
    from the units (computed on the workers)."""
    found = pd.concat(client.gather([client.submit(_gq_rows, u, pure=False) for u in inp.units]), ignore_index=True)
    return found.drop_duplicates().sort_values(["geoid", "unit_type"], ignore_index=True)


def _gq_rows(frame: pd.DataFrame) -> pd.DataFrame:
    rows, cols = np.nonzero(frame[[f"u{k}" for k in range(1, 8)]].to_numpy())
    return pd.DataFrame({"geoid": frame["geoid"].to_numpy()[rows], "unit_type": cols + 1})


def _block_units(frames: list[pd.DataFrame], blocks: pd.Index) -> np.ndarray:
    """u0..u7 and occupied of ``blocks`` (rows in that order) summed over the unit read tasks' frames (a block
    without unit records has none)."""
    columns = UNIT_COLUMNS + ["occupied"]
    units = np.zeros((len(blocks), len(columns)), dtype=np.int64)
    for frame in frames:
        pos = blocks.get_indexer(frame["geoid"])
        keep = pos >= 0
        np.add.at(units, pos[keep], frame[columns].to_numpy(dtype=np.int64)[keep])
    return units


def tabulate_levels(client, config, product: Product, spine, inp: ReadInput, files: InputFiles,
                    later: tuple[Product, ...] = (), first: list | None = None) -> list:
    """Every level of ``product`` with its invariants and constraints (checked) in the driver and its true
    histograms on the workers (``Level.parts``): one shard task per :data:`SHARD_BLOCKS` blocks. The block
    level's unit counts and constraints stay on the shards too (``Level.meta``): the driver holds per block
    its geocode, parent row and budget share only. The first product tabulated sums the unit read tasks'
    frames; the others (``first``: its levels) take each shard's unit counts from its block metadata and share
    them. When none of the ``later`` products (tabulated after this one) counts this one's records, the driver
    forgets their read tasks once the shards are submitted, and the first product forgets the unit read tasks
    once its shards are done, so that the workers free each read part as soon as no shard needs it."""
    from distributed import wait

    cfg = config.product(product.name)
    tab_geoid, geo, parents = _geography(spine)
    release_memory()
    names = geo[-1].nodes  # the block level's geocodes, in the spine's block order (that of tab_geoid)
    n = len(tab_geoid)
    starts = list(range(0, n, SHARD_BLOCKS))
    counted = _counted(inp, product)
    unit_parts: list[list] = [[] for _ in starts]
    shard_parts: list[list] = [[] for _ in starts]
    known = None if first is None else [p.future for p in first[-1].meta]
    sources = ([] if known else [(inp.units, inp.unit_geoids, unit_parts)]) + [(*counted, shard_parts)]
    spine_numbers, width = _spine_numbers(tab_geoid), _code_width(tab_geoid)
    for futs, geoids, into in sources:  # the read tasks holding each shard's blocks
        for fut, g in zip(futs, geoids):
            for s in np.unique(_spine_rows(spine_numbers, g, width) // SHARD_BLOCKS):
                into[s].append(fut)
    # A task's arguments stay in the scheduler, in the driver, as long as its result (so that a lost worker's
    # shards can be computed again): each shard gets its GEOIDs (as numbers where they are: 8 bytes a block
    # instead of 23), its geocodes only where they differ, and its blocks' node rows as runs.
    same_names = bool(pc.all(pc.equal(pa.array(names.array), pa.array(tab_geoid.array))).as_py())
    leaf_total = total_is_invariant(product, cfg, spine, len(spine.levels) - 1)
    shards = []
    for s, lo in enumerate(starts):
        hi = min(lo + SHARD_BLOCKS, n)
        geoids = spine_numbers[lo:hi] if isinstance(spine_numbers, np.ndarray) else tab_geoid[lo:hi]
        shards.append(client.submit(tabulate_shard, product, cfg, spine.levels, lo, None if known else geoids,
                                    None if same_names or known else names[lo:hi],
                                    shard_parts[s], known[s] if known else unit_parts[s],
                                    [_runs(g.inverse[lo:hi]) for g in geo[:-1]], width, leaf_total, pure=False))
    for g in geo:  # each shard has its blocks' node rows now
        g.inverse = None
    del sources, shard_parts, unit_parts
    if all(_counted(inp, q)[0] is not counted[0] for q in later):
        counted[0].clear()  # the read tasks' only references in the driver (ReadInput's lists)
    columns = UNIT_COLUMNS + ["occupied"]
    above = geo[:-1]
    answers: list[dict[str, np.ndarray]] = [{} for _ in above]
    sums = [np.zeros((len(g.nodes), len(columns)), dtype=np.int64) for g in above]
    below: dict[str, np.ndarray] = {}
    bad: dict[str, list] = {}
    ranges: list[list[tuple[int, int]]] = [[] for _ in geo]
    listed: list[list[np.ndarray]] = [[] for _ in above]  # each shard's node rows above the blocks
    problems = []
    for fut in shards:
        rows, ans, units, summed, infeasible_here, problem = client.submit(shard_summary, fut, pure=False).result()
        for i, (a, u) in enumerate(zip(ans, units)):
            for q, values in a.items():
                answers[i].setdefault(q, np.zeros((len(geo[i].nodes), values.shape[1]), values.dtype))[rows[i]] += values
            sums[i][rows[i]] += u
        for name, values in summed.items():
            below.setdefault(name, np.zeros((len(above[-1].nodes), values.shape[1])))[rows[-2]] += values
        for name, (block, count) in infeasible_here.items():
            bad.setdefault(name, [block, 0])[1] += count
        for i, r in enumerate(rows):
            ranges[i].append((int(r.min()), int(r.max())) if len(r) else (0, -1))
            if i < len(above):
                listed[i].append(r)
        if problem is not None:
            problems.append(problem)
    _raise_first(problems, files, inp, product, config.census.units)
    if known is None and all(unit_bounded(q) is None for q in later):
        # the later products take the unit counts from this one's block metadata, and none of them can find a
        # unit problem whose file _raise_first would look up
        inp.units.clear()
    for name in below:  # the lowest infeasible level is reported: the blocks first, constraints in order
        if name in bad:
            raise infeasible_error(geo[-1].name, name, *bad[name])
    release_memory()
    levels = levels_from_units(product, cfg, spine, geo, parents,
                               [pd.DataFrame(u, index=g.nodes, columns=columns) for g, u in zip(above, sums)], answers,
                               LevelConstraints(above[-1].nodes, {k: bind(product.constraints[k], v) for k, v in below.items()}))
    del answers, sums, below
    levels.append(Level(geo[-1].name, names, parents[-1], None, None, None, _plb(cfg, spine, geo[-1].name, names), None))
    levels[-1].meta = [LevelPart(client.submit(shard_meta, fut, pure=False), lo, hi)
                       for fut, (lo, hi) in zip(shards, ranges[-1])]
    for i, level in enumerate(levels):  # the blocks' parts hold every row of their range
        level.parts = [LevelPart(client.submit(level_partial, fut, i, pure=False), lo, hi,
                                 listed[i][s] if i < len(above) else None)
                       for s, (fut, (lo, hi)) in enumerate(zip(shards, ranges[i])) if hi >= lo]
        if i < len(above):
            level.parts = LevelParts(level.parts)
    wait([p.future for level in levels for p in (*level.parts, *(level.meta or []))])
    return levels


def _counted(inp: ReadInput, spec: Product) -> tuple[list, list[pd.Index]]:
    """The read tasks of the records a product counts (futures of BlockPart) and their blocks."""
    return inp.parts[spec.name]


def _spine_rows(spine_numbers: np.ndarray | pd.Index, geoids: pd.Index, width: int = GEOID_DIGITS) -> np.ndarray:
    """Each input block's row on the spine (``spine_numbers``: :func:`_geoid_numbers` of the spine's GEOIDs in
    block order, ``width`` digits each, or the GEOIDs when they are not sorted numbers); every block of the
    input must be on it. Sorted numbers are searched, not hashed: a hash table over a national spine's GEOIDs
    costs about 200 bytes a block."""
    if isinstance(spine_numbers, np.ndarray):
        numbers = _geoid_numbers(geoids, width)
        rows = np.full(len(geoids), -1) if numbers is None else np.searchsorted(spine_numbers, numbers)
        if numbers is not None:
            found = rows < len(spine_numbers)
            found[found] = spine_numbers[rows[found]] == numbers[found]
            rows[~found] = -1
    else:
        rows = spine_numbers.get_indexer(geoids)
    if (rows < 0).any():
        raise ValueError("the spine's blocks are not the input's blocks")
    return rows


def _geoid_numbers(geoids: pd.Index, width: int | None = GEOID_DIGITS) -> np.ndarray | None:
    """Geocodes of ``width`` digits (at most 18: an int64) as numbers (their order is the strings' order);
    None for any other string (or no ``width``)."""
    arr = pa.array(geoids.array)
    if width is None or width > 18 or len(arr) and (
            arr.null_count or pc.any(pc.not_equal(pc.utf8_length(arr), width)).as_py()
            or not pc.all(pc.utf8_is_digit(arr)).as_py()):
        return None
    return pc.cast(arr, pa.int64()).to_numpy()


def _geoid_strings(numbers: np.ndarray, width: int = GEOID_DIGITS) -> pd.Index:
    """The ``width``-digit geocodes of :func:`_geoid_numbers`."""
    return pd.Index(pd.array(pc.utf8_lpad(pc.cast(pa.array(numbers), pa.string()), width, "0"), dtype="str"))


def _code_width(tab_geoid: pd.Index) -> int | None:
    """The length of the spine's block geocodes when it may be their common one (the first one's)."""
    return len(tab_geoid[0]) if len(tab_geoid) else None


def _spine_numbers(tab_geoid: pd.Index) -> np.ndarray | pd.Index:
    """What :func:`_spine_rows` searches: the spine's GEOIDs as sorted numbers (of any one number of digits up
    to 18), or as they are."""
    numbers = _geoid_numbers(tab_geoid, _code_width(tab_geoid))
    return numbers if numbers is not None and (np.diff(numbers) > 0).all() else tab_geoid


def _raise_first(problems: list[tuple], files: InputFiles, inp: ReadInput, product: Product,
                 units: Units | None) -> None:
    """Raise the first structural problem of ``product`` in validate_input's order: persons without a unit first,
    then facilities without residents; within each, the first block GEOID."""
    if not problems:
        return
    kinds = [p for p in problems if p[0][0] == PERSON_RECORDS] or problems
    problem, path = min(kinds, key=lambda p: p[0][1])
    _, block, k, _ = problem
    if problem[0] == UNIT_RECORDS:
        path = next((f for f, fut in zip(inp.unit_files, inp.units)
                     if fut.client.submit(_has_units, fut, block, k, pure=False).result()),
                    files.where(UNIT_RECORDS))
    raise_block_problem(problem, path or files.where(PERSON_RECORDS), path or files.where(UNIT_RECORDS), product,
                        units)


def _has_units(frame: pd.DataFrame, block: str, k: int) -> bool:
    """Whether a read task's units frame has units of type ``k`` in ``block``."""
    return bool(((frame["geoid"] == block) & (frame[f"u{k}"] > 0)).any())


def write_mdf(client, rundir, product: Product, spine, blocks, estimated, hierarchy: Hierarchy) -> None:
    """Write the MDF of ``product`` on the workers, a file per county (:func:`mdf_groups`), from the committed
    block level (``estimated``: engine.LevelOutput), atomically (staging, then rename). The block level's unit
    counts are on the shards (``blocks.meta``) or, reprocessing, in ``blocks.units``."""
    geoids = block_geoids_in_order(spine)  # node order
    county, folder = mdf_groups(geoids, hierarchy)
    final = rundir.mdf(product.name)
    rundir.clear_place(final)
    staged = rundir.staging(final)
    codes = None
    if product.mdf == GENERIC_MDF:
        codes = spine.table.set_index("geoid")[spine.levels[1:]].reindex(geoids)

    def job(i: int) -> tuple:
        rows = county.rows(i)
        if blocks.meta is not None:
            metas, local = holding(blocks.meta, rows), rows
        else:
            metas, local = [BlockMeta(0, geoids[rows], blocks.units.iloc[rows], None)], np.arange(len(rows))
        return (estimated.files(rows), metas, local, str(staged / folder(county.names[i])),
                None if codes is None else codes.iloc[rows])

    # Runs of neighbouring counties, one task each (a national MDF has 3,200 counties): each still its own file.
    workers = max(1, len(client.scheduler_info().get("workers", {})))
    batches = batch_chunks(np.diff(county.starts).tolist(), list(range(len(county.names))), workers)

    def submit(b: int):
        jobs = [job(i) for i in batches[b]]
        metas, where = shared_values([j[1] for j in jobs])  # each shard's metadata named once
        plain = [(files, w, rows, path, codes) for (files, _, rows, path, codes), w in zip(jobs, where)]
        return client.submit(write_counties_mdf, product, pickle.dumps(plain, protocol=5), metas, MDF_GATHER_BLOCKS,
                             pure=False)

    for fut in windowed(client, submit, list(range(len(batches)))):
        fut.result()
    staged.mkdir(parents=True, exist_ok=True)
    rundir.commit(final)


class Counties(NamedTuple):
    """The counties (a GEOID's first five characters) of a level's blocks in GEOID order: their names, where
    each one's blocks start in GEOID order, and the node rows in GEOID order (None: node order is GEOID
    order)."""

    names: list[str]
    starts: np.ndarray
    order: np.ndarray | None

    def rows(self, i: int) -> np.ndarray:
        """The node rows of county ``i``'s blocks, in GEOID order."""
        lo, hi = self.starts[i], self.starts[i + 1]
        return np.arange(lo, hi) if self.order is None else self.order[lo:hi]


def mdf_groups(geoids: pd.Index, hierarchy: Hierarchy) -> tuple[Counties, object]:
    """The MDF's tasks over the blocks ``geoids`` (node order) and each one's file path from its name: a prefix
    hierarchy's nodes of the second level below the root (the U.S.: counties, ``county=CODE/part-00000.parquet``),
    a column hierarchy's :data:`MDF_LEAVES` leaves at a time (``part-NNNNN.parquet``)."""
    if hierarchy.by_prefix and len(hierarchy.levels) > 3:
        level = hierarchy.levels[2]
        return counties(geoids, width=level.width), lambda name: f"{level.name.lower()}={name}/part-00000.parquet"
    order = None if is_sorted(geoids) else np.argsort(geoids)
    starts = np.r_[np.arange(0, len(geoids), MDF_LEAVES), len(geoids)]
    return (Counties([f"{i:05d}" for i in range(len(starts) - 1)], starts, order),
            lambda name: f"part-{name}.parquet")


def counties(geoids: pd.Index, step: int = 1 << 16, width: int = US_HIERARCHY.levels[2].width) -> Counties:
    """The counties (prefixes of ``width`` characters) of the blocks whose (unique) GEOIDs are ``geoids``, in
    node order. GEOIDs already in order (a spine built here) are neither sorted nor copied; their prefixes are
    compared ``step`` at a time."""
    order = None if is_sorted(geoids) else np.argsort(geoids)
    arr = pa.array(geoids.array if order is None else geoids.array.take(order))
    starts = [np.zeros(1, dtype=np.int64)]
    for lo in range(0, len(arr) - 1, step):  # the pairs (i - 1, i) for i in lo + 1 .. lo + step
        county = pc.utf8_slice_codeunits(arr[lo:lo + step + 1], 0, width)
        starts.append(np.flatnonzero(pc.not_equal(county[1:], county[:-1]).to_numpy(zero_copy_only=False)) + lo + 1)
    first = np.concatenate(starts)
    names = [geoids[i if order is None else order[i]][:width] for i in first]  # Arrow's take would concatenate arr
    return Counties(names, np.r_[first, len(arr)], order)


def block_geoids_in_order(spine) -> pd.Index:
    """Each block's GEOID in the block level's node order (the spine's rows sorted by block geocode)."""
    table = spine.table
    block = spine.levels[-1]
    if is_sorted(table[block]):
        return pd.Index(table["geoid"], dtype="str")
    return pd.Index(table["geoid"], dtype="str")[pd.Index(table[block]).argsort()]


def write_invariants_table(frames: list[pd.DataFrame], metas: list[BlockMeta], level: str, with_tot: bool,
                           path: str) -> None:
    """Write a product's invariants file on a worker: the rows of the levels above the blocks (``frames``)
    then the blocks' rows from the shards' metadata (invariants.invariant_rows), a shard at a time (a national
    block level's rows in one frame took 1.4 GB of the worker)."""
    blocks = (invariant_rows(m.units, level, (np.nan if m.totals is None else m.totals) if with_tot else None)
              for m in metas)
    first = pd.concat(frames + [next(blocks)], ignore_index=True)  # the columns' types of the whole table
    write_frames(itertools.chain([first], blocks), location(path))
