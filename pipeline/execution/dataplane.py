"""The partitioned data plane (issue 16): input records are read, checked and tabulated on the Dask workers,
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
* The MDF is written by workers, one task per county, from the committed block-level parts.

Nothing here depends on the number of workers, tasks or shards: outputs are byte-identical to the
in-memory path (tests/test_dataplane.py).
"""
from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq
import scipy.sparse as sp

from .levels import node_answers
from .memory import release_memory
from .rundir import sha256_file, write_table
from topdown.vocab.schema import PERSONS, SCHEMAS
from .tasks import Chunk, ChunkResult, run_chunk, windowed
from ..inputs.tabulate import block_units
from ..products import PRODUCTS
from ..inputs.validate import PERSON_RECORDS, UNIT_RECORDS, InputError, block_problem, check_persons, check_units, raise_block_problem

#: Input records per read task (whole row groups; a bigger row group is a task alone).
ROWS_PER_TASK = 2_000_000
#: Blocks per tabulation shard.
SHARD_BLOCKS = 20_000
#: Person cells per hhgq code (the hhgq dimension is the slowest of the row-major cell index).
CELLS_PER_HHGQ = PERSONS.ncells // 8


# --------------------------------------------------------------------------------------------- input files

@dataclass(frozen=True)
class InputFiles:
    """The Parquet files of an input directory: ``persons.parquet`` or ``persons/**.parquet``, same for units."""

    root: Path
    persons: tuple[Path, ...]
    units: tuple[Path, ...]

    def where(self, kind: str) -> Path:
        """What an error about records of ``kind`` in no single file names: the file, or the directory."""
        files = getattr(self, kind)
        return files[0] if len(files) == 1 and files[0].name == f"{kind}.parquet" else self.root / kind

    def hashes(self) -> dict[str, str]:
        """SHA-256 of every input file, by its path below the input directory."""
        return {f.relative_to(self.root).as_posix(): sha256_file(f) for f in (*self.persons, *self.units)}


def find_input(root: Path | str) -> InputFiles:
    """The input files under ``root``; a missing kind is a FileNotFoundError naming what is expected."""
    root = Path(root)
    found = {}
    for kind in (PERSON_RECORDS, UNIT_RECORDS):
        single, folder = root / f"{kind}.parquet", root / kind
        if single.is_file():
            found[kind] = (single,)
        elif folder.is_dir():
            found[kind] = tuple(sorted(p for p in folder.rglob("*.parquet") if p.is_file() and not any(
                part.startswith((".", "_")) for part in p.relative_to(folder).parts)))
        if not found.get(kind):
            raise FileNotFoundError(f"{single}: input file not found (the input directory needs persons.parquet and "
                                    "units.parquet, or directories persons/ and units/ of Parquet files; see "
                                    "`topdown demo-data`, `topdown synth`, `topdown ingest`)")
    return InputFiles(root, found[PERSON_RECORDS], found[UNIT_RECORDS])


def read_tasks(files: tuple[Path, ...]) -> list[tuple[str, list[int]]]:
    """(file, row groups) of the read tasks: whole row groups, about :data:`ROWS_PER_TASK` records each.
    Reads Parquet footers only."""
    tasks = []
    for f in files:
        try:
            meta = pq.ParquetFile(f).metadata
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


# --------------------------------------------------------------------------------------------- worker tasks

@dataclass
class BlockPart:
    """One read task's person histograms (confidential: stays on its worker)."""

    path: str
    geoids: pd.Index  # sorted unique block GEOIDs (Arrow strings: no Python object per block)
    hist: sp.csr_matrix  # blocks x person cells, int64


def read_persons(path: str, row_groups: list[int]) -> BlockPart:
    """Read, check and tabulate person records of one file's row groups."""
    _, persons = check_persons(Path(path), row_groups)
    codes, blocks = pd.factorize(persons["geoid"], sort=True)
    cells = PERSONS.cell_index(*(persons[name].to_numpy() for name in PERSONS.dim_names))
    hist = sp.csr_matrix((np.ones(len(codes), np.int64), (codes, np.asarray(cells, np.int64))),
                         shape=(len(blocks), PERSONS.ncells), dtype=np.int64)
    hist.sum_duplicates()
    return BlockPart(path, pd.Index(blocks, dtype="str"), hist)


def part_geoids(part: BlockPart) -> pd.Index:
    return part.geoids


def read_units(path: str, row_groups: list[int]) -> pd.DataFrame:
    """Read and check unit records of one file's row groups; per block u0..u7 and occupied (tabulate.block_units)."""
    _, units = check_units(Path(path), row_groups)
    return block_units(units)


@dataclass
class Shard:
    """True histograms of a range of blocks and their partial sums at every level (stays on its worker)."""

    partials: list[tuple[np.ndarray, sp.csr_matrix]]  # per level: node rows touched, their partial histograms
    answers: list[dict[str, np.ndarray]]  # per level: Product.feasibility_queries answers of those rows
    problem: tuple | None  # a structural input problem (validate.block_problem) and the persons file holding it


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


def _persons_problem(parts: list[BlockPart], blocks: np.ndarray, hist: sp.csr_matrix,
                     units_by_type: np.ndarray) -> tuple | None:
    """The first structural problem (in GEOID order) of the shard's blocks, with the persons file holding it."""
    order = np.argsort(blocks, kind="stable")
    by_type = np.asarray((hist @ _hhgq_matrix()).todense())
    problem = block_problem(blocks[order], by_type[order], units_by_type[order])
    if problem is None or problem[0] != PERSON_RECORDS:
        return None if problem is None else (problem, None)
    block, k = problem[1], problem[2]
    for part in parts:
        i = int(part.geoids.searchsorted(block))
        if i < len(part.geoids) and part.geoids[i] == block and part.hist[i, k * CELLS_PER_HHGQ:(k + 1) * CELLS_PER_HHGQ].sum():
            return problem, part.path
    return problem, None


def _hhgq_matrix() -> sp.csr_matrix:
    cells = np.arange(PERSONS.ncells)
    return sp.csr_matrix((np.ones(cells.size, np.int64), (cells, cells // CELLS_PER_HHGQ)), shape=(cells.size, 8))


def tabulate_shard(product: str, blocks: np.ndarray, parts: list[BlockPart] | None, hist: sp.csr_matrix | None,
                   units_by_type: np.ndarray | None, inverses: list[np.ndarray]) -> Shard:
    """The shard of ``blocks`` (spine node order): their histograms from the read tasks' ``parts`` (persons)
    or ``hist`` (units, from the public unit counts' occupancy), and partial sums per level, where
    ``inverses[i]`` is each block's node row at level i."""
    schema = SCHEMAS[product]
    if hist is None:
        hist = _stack(parts, blocks, schema.ncells)
    problem = _persons_problem(parts, blocks, hist, units_by_type) if parts is not None else None
    partials, answers = [], []
    for inverse in inverses:
        rows, local = np.unique(inverse, return_inverse=True)
        agg = sp.csr_matrix((np.ones(len(local), np.int64), (local, np.arange(len(local)))), shape=(len(rows), len(local)))
        partial = (agg @ hist).tocsr()
        partials.append((rows, partial))
        answers.append(node_answers(product, schema, partial))
    return Shard(partials, answers, problem)


def shard_summary(shard: Shard) -> tuple[list[np.ndarray], list[dict[str, np.ndarray]], tuple | None]:
    """What the driver takes from a shard: node rows and query answers per level, and any input problem."""
    return [rows for rows, _ in shard.partials], shard.answers, shard.problem


def level_partial(shard: Shard, level: int) -> tuple[np.ndarray, sp.csr_matrix]:
    return shard.partials[level]


def rows_of(parts: list[tuple[np.ndarray, sp.csr_matrix]], rows: np.ndarray, ncells: int) -> sp.csr_matrix:
    """True histograms of node ``rows`` (in that order) summed from the shards' partials."""
    return _stack([BlockPart("", prow, m) for prow, m in parts], rows, ncells)


def read_rows(files: list[str], nodes: list[str], ncells: int) -> sp.csr_matrix:
    """Estimated histograms of ``nodes`` (rows in that order) read from a committed level's parts. (A part
    without a non-zero cell has a geocode column of Arrow type null, so the parts are read one by one.)"""
    tables = []
    for f in files:
        table = pq.read_table(f)
        kind = table.schema.field("geocode").type
        if not pa.types.is_null(kind):
            tables.append(table.filter(pc.is_in(table.column("geocode"), value_set=pa.array(nodes, type=kind))).to_pandas())
    table = pd.concat(tables) if tables else pd.DataFrame({"geocode": [], "cell": [], "count": []})
    return sp.csr_matrix((table["count"].to_numpy(np.int64),
                          (pd.Index(nodes).get_indexer(table["geocode"].astype(str)), table["cell"].to_numpy(np.int64))),
                         shape=(len(nodes), ncells), dtype=np.int64)


def hist_table(nodes: pd.Index, hist: sp.csr_matrix) -> pd.DataFrame:
    """Long ``geocode, cell, count`` rows of a histogram matrix, non-zero cells only, sorted."""
    coo = hist.tocoo()
    keep = coo.data != 0
    return pd.DataFrame({"geocode": np.asarray(nodes)[coo.row[keep]], "cell": coo.col[keep].astype(np.int32),
                         "count": coo.data[keep].astype(np.int64)}).sort_values(["geocode", "cell"], kind="stable")


def write_county_mdf(product: str, files: list[str], nodes: list[str], geoids: np.ndarray, units: pd.DataFrame,
                     path: str) -> None:
    """Write one county's MDF part from the committed block-level parts (``nodes``: the county's block
    geocodes, in GEOID order; ``units``: their invariant unit counts)."""
    hist = read_rows(files, nodes, SCHEMAS[product].ncells)
    frame = PRODUCTS[product].mdf(geoids, hist, units)
    write_table(frame, Path(path))


def run_part_chunk(chunk: Chunk, child_rows: np.ndarray, child_parts: list | None, parent_files: list[str] | None,
                   hist_path: str) -> ChunkResult:
    """Run a chunk on a worker: its children's true histograms from the shards' partials (``child_parts``,
    None: the chunk carries them, or none is needed), its parents' from the committed parts of the level
    above (``parent_files``, None at the root); its estimate is written to ``hist_path`` and the driver gets
    back each child's count of non-zero cells and the part's SHA-256 instead of the histograms."""
    ncells = SCHEMAS[chunk.product].ncells
    if child_parts is not None:
        chunk.child_hist = rows_of(child_parts, child_rows, ncells)
    if parent_files is not None:
        hists = read_rows(parent_files, [t.parent for t in chunk.parents], ncells).toarray()
        for task, hist in zip(chunk.parents, hists):
            task.parent_hist = hist
    result = run_chunk(chunk)
    write_table(hist_table(pd.Index(result.children), result.hist), Path(hist_path))
    return dataclasses.replace(result, hist=None, nnz=np.diff(result.hist.indptr).astype(np.int32),
                               hist_sha256=sha256_file(Path(hist_path)))


# --------------------------------------------------------------------------------------------- the driver

@dataclass
class ReadInput:
    """What the driver holds after the read tasks: futures of the person parts (on the workers), each part's
    block GEOIDs, the public per-block unit counts, and each unit read task's file and future (its frame
    stays on the workers: an error message asks them which file holds a block)."""

    persons: list  # futures of BlockPart
    person_geoids: list[pd.Index]
    units: pd.DataFrame  # per block (index geoid, sorted): u0..u7, occupied, vacant
    unit_parts: list[tuple[str, object]]  # (file, future of its read_units frame)


def read_input(client, files: InputFiles) -> ReadInput:
    """Read and check every input file on the workers. The first error of the person files (in file order),
    then of the unit files, is raised here as the :class:`InputError` its task raised."""
    pfuts = [client.submit(read_persons, f, g, pure=False) for f, g in read_tasks(files.persons)]
    utasks = read_tasks(files.units)
    ufuts = [client.submit(read_units, f, g, pure=False) for f, g in utasks]
    gfuts = [client.submit(part_geoids, p, pure=False) for p in pfuts]
    geoids = [f.result() for f in gfuts]
    frames = client.gather(ufuts)
    units = (pd.concat(frames, ignore_index=True).groupby("geoid", sort=True).sum() if len(frames) > 1
             else frames[0].set_index("geoid"))
    del frames
    return ReadInput(pfuts, geoids, units, [(f, fut) for (f, _), fut in zip(utasks, ufuts)])


def block_geoids(inp: ReadInput) -> pd.Series:
    """Every block of the input (with persons or units), sorted."""
    found = inp.units.index.append(inp.person_geoids) if inp.person_geoids else inp.units.index
    return pd.Series(found.unique().sort_values(), name="geoid").reset_index(drop=True)


def gq_presence(units: pd.DataFrame) -> pd.DataFrame:
    """(geoid, unit_type) of every GQ type present in a block: all the optimized spine takes from the units."""
    types = units[[f"u{k}" for k in range(1, 8)]].to_numpy()
    rows, cols = np.nonzero(types)
    return pd.DataFrame({"geoid": units.index.to_numpy()[rows], "unit_type": cols + 1})


def tabulate_levels(client, config, product: str, spine, inp: ReadInput, files: InputFiles) -> list:
    """Every level of ``product`` with its invariants and constraints (checked) in the driver and its true
    histograms on the workers (``Level.parts``): one shard task per :data:`SHARD_BLOCKS` blocks."""
    from distributed import wait

    from .levels import LevelPart, _geography, levels_from_answers

    geography = _geography(spine)
    release_memory()
    tab_geoid, geo, _ = geography
    _spine_rows(tab_geoid, inp.units.index)
    units = inp.units.reindex(tab_geoid).fillna(0).astype(np.int64)
    n = len(tab_geoid)
    starts = list(range(0, n, SHARD_BLOCKS))
    shard_parts: list[list] = [[] for _ in starts]
    persons = PRODUCTS[product].records == PERSON_RECORDS
    if persons:
        for fut, g in zip(inp.persons, inp.person_geoids):
            for s in np.unique(_spine_rows(tab_geoid, g) // SHARD_BLOCKS):
                shard_parts[s].append(fut)
        by_type = units[[f"u{k}" for k in range(8)]].to_numpy()
    else:
        occupied = units["occupied"].to_numpy()
        hist = sp.csr_matrix(np.stack([occupied, units["u0"].to_numpy() - occupied], axis=1))
    shards = []
    for s, lo in enumerate(starts):
        hi = min(lo + SHARD_BLOCKS, n)
        args = ((shard_parts[s], None, by_type[lo:hi]) if persons else (None, hist[lo:hi], None))
        shards.append(client.submit(tabulate_shard, product, tab_geoid[lo:hi], *args,
                                    [g.inverse[lo:hi] for g in geo], pure=False))
    answers = [{} for _ in geo]
    ranges: list[list[tuple[int, int]]] = [[] for _ in geo]
    problems = []
    for fut in shards:
        rows, ans, problem = client.submit(shard_summary, fut, pure=False).result()
        for i, (r, a) in enumerate(zip(rows, ans)):
            for q, values in a.items():
                full = answers[i].setdefault(q, np.zeros((len(geo[i].nodes), values.shape[1]), values.dtype))
                full[r] += values
            ranges[i].append((int(r.min()), int(r.max())) if len(r) else (0, -1))
        if problem is not None:
            problems.append(problem)
    _raise_first(problems, files, inp)
    release_memory()
    levels = levels_from_answers(product, config.product(product), spine, geography, inp.units, answers)
    del answers
    for i, level in enumerate(levels):
        level.parts = [LevelPart(client.submit(level_partial, fut, i, pure=False), lo, hi)
                       for fut, (lo, hi) in zip(shards, ranges[i]) if hi >= lo]
    wait([p.future for level in levels for p in level.parts])
    return levels


def _spine_rows(tab_geoid: pd.Index, geoids: pd.Index) -> np.ndarray:
    """Each input block's row on the spine; every block of the input must be on it."""
    rows = tab_geoid.get_indexer(geoids)
    if (rows < 0).any():
        raise ValueError("the spine's blocks are not the input's blocks")
    return rows


def _raise_first(problems: list[tuple], files: InputFiles, inp: ReadInput) -> None:
    """Raise the first structural problem in validate_input's order: persons without a unit first, then
    facilities without residents; within each, the first block GEOID."""
    if not problems:
        return
    kinds = [p for p in problems if p[0][0] == PERSON_RECORDS] or problems
    problem, path = min(kinds, key=lambda p: p[0][1])
    _, block, k, _ = problem
    if problem[0] == UNIT_RECORDS:
        path = next((f for f, fut in inp.unit_parts if fut.client.submit(_has_units, fut, block, k, pure=False).result()),
                    files.where(UNIT_RECORDS))
    raise_block_problem(problem, path or files.where(PERSON_RECORDS), path or files.where(UNIT_RECORDS))


def _has_units(frame: pd.DataFrame, block: str, k: int) -> bool:
    """Whether a read task's units frame has units of type ``k`` in ``block``."""
    return bool(((frame["geoid"] == block) & (frame[f"u{k}"] > 0)).any())


def write_mdf(client, rundir, product: str, spine, blocks, estimated) -> None:
    """Write the MDF of ``product`` on the workers, one task per county, from the committed block level
    (``estimated``: engine.LevelOutput), atomically (staging, then rename)."""
    geoids = spine.table.set_index(spine.levels[-1])["geoid"].reindex(blocks.nodes).to_numpy()
    final = rundir.mdf(product)
    staged = rundir.staging(final)
    order = np.argsort(geoids, kind="stable")
    names, starts = np.unique(pd.Series(geoids[order]).str[:5].to_numpy(), return_index=True)
    counties = np.split(order, starts[1:])  # geoid order: a county's blocks are adjacent

    def submit(i: int):
        rows = counties[i]
        return client.submit(write_county_mdf, product, estimated.files(rows), list(blocks.nodes[rows]), geoids[rows],
                             blocks.units.iloc[rows], str(staged / f"county={names[i]}" / "part-00000.parquet"),
                             pure=False)

    for fut in windowed(client, submit, list(range(len(names)))):
        fut.result()
    staged.mkdir(parents=True, exist_ok=True)
    rundir.commit(final)
