"""``topdown verify RUN``: re-check a run directory independently of the code that wrote it.

Checks, for every product and level: histograms are non-negative integers on valid cells; children
sum to their parent cell by cell (parents from ``spine.parquet``); invariants hold (US and state
totals, block housing-unit and GQ-facility bounds, no minors in nursing facilities, housing-unit
counts); the MDF tabulates back to the block histograms. A state's total is checked as the sum over its
parts (the AIAN spine splits a state; only the whole state's total is invariant, DESIGN.md "State totals").
Every file the manifest records a SHA-256 for (each level's files, and the run-wide outputs: configuration, certificate,
spine, invariants, MDF) still has it: one check per file, so a changed, truncated, swapped, lost or added
file fails by name.

A run of a declared census (its ``config.json`` holds the census) is checked by the spine's levels and the
product's declaration (:func:`verify_declared`): its invariant totals, its unit bounds, its structural zeros
where the run declared them, and its MDF (the generic layout tabulated back).

No level is read into memory whole (a national run's Block level and MDF do not fit one process): each
level's parts, the invariants and the MDF are routed, a batch at a time, to one file per group of whole
states (:class:`_Groups`, about :data:`GROUP_BLOCKS` blocks or :data:`GROUP_RECORDS` records each) in a temporary folder (``TMPDIR``; it needs
room for a copy of the histograms and the MDF), and the checks run one group at a time; only the root level
is read whole. A small run is one group.
"""
from __future__ import annotations

import tempfile
from dataclasses import dataclass, field
from pathlib import Path
from typing import Iterable, Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.compute as pc
import pyarrow.parquet as pq

from topdown.geo.spine import PREFIX, STATE, spine_state
from topdown.vocab.census import Hierarchy, Product
from topdown.vocab.queries import build_query

from ..inputs.invariants import UNIT_COLUMNS, WHOLE_STATE, configured_below
from .mdf import MDF_LAYOUT
from ..runtime.storage import StorePath, arrow, dataset, parquet_file, read_schema, read_table
from ..runtime.rundir import LOCK, LevelsMismatch, Manifest, RunDirError, RunReader, changed_files, level_digests


@dataclass
class VerifyReport:
    checks: int = 0
    failures: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    @property
    def ok(self) -> bool:
        return not self.failures

    def check(self, condition: bool, message: str) -> None:
        self.checks += 1
        if not condition:
            self.failures.append(message)


@dataclass
class _Merged:
    """A product's checks gathered group by group (:class:`_Groups`): a check, identified by its message or by
    ``key``, passes when it passed in every group; of a failing one the message with the smallest ``rank``
    (its first failing parent and cell) is kept. :meth:`emit` adds them to a report, in the order first seen."""

    results: dict = field(default_factory=dict)

    def check(self, condition: bool, message: str, key=None, rank=None) -> None:
        key = message if key is None else key
        ok, kept, kept_rank = self.results.get(key, (True, message, None))
        if not condition and (ok or (rank is not None and kept_rank is not None and rank < kept_rank)):
            kept, kept_rank = message, rank
        self.results[key] = (ok and bool(condition), kept, kept_rank)

    def emit(self, rep: VerifyReport) -> None:
        for ok, message, _ in self.results.values():
            rep.check(ok, message)


def _parent_map(spine: pd.DataFrame, child: str, parent: str) -> pd.Series:
    pairs = spine[[child, parent]].drop_duplicates()
    return pairs.set_index(child)[parent]


#: At most this many groups, of about this many blocks or this many records each, whichever is reached first
#: (a group holds whole states, however large): verify holds one group's rows of a product in memory at a time.
MAX_GROUPS, GROUP_BLOCKS, GROUP_RECORDS = 64, 250_000, 4_000_000
#: Rows of a source file read at a time while its rows are routed to their groups.
ROUTE_BATCH = 1 << 18


def _group_keys(blocks: np.ndarray, records: np.ndarray) -> np.ndarray:
    """The group of each key, in order: consecutive keys together while a group holds fewer than about
    :data:`GROUP_BLOCKS` blocks and :data:`GROUP_RECORDS` records (both limits grown so that there are at most
    :data:`MAX_GROUPS` groups); a key larger than both is a group of its own."""
    if not len(blocks):
        return np.zeros(0, np.int64)
    size_b = max(GROUP_BLOCKS, -(-int(blocks.sum()) // (MAX_GROUPS // 2)))
    size_r = max(GROUP_RECORDS, -(-int(records.sum()) // (MAX_GROUPS // 2)))
    load = np.maximum(blocks / size_b, records / size_r)  # each key's share of a group; their sum < MAX_GROUPS
    start = np.floor(np.r_[0.0, np.cumsum(load)[:-1]] + 1e-9)  # the group's number where the key begins
    return np.unique(start, return_inverse=True)[1].astype(np.int64)


class _Groups:
    """The run split into groups of whole subtrees below the root, so that no level is read into memory whole:
    consecutive keys - a U.S. spine's states (a state's AIAN parts together, as its whole-state total needs), a
    declared hierarchy's nodes of its first level below the root - of about :data:`GROUP_BLOCKS` blocks
    together, at most :data:`MAX_GROUPS` groups. Every level's nodes (and the blocks' GEOIDs) fall into runs of
    consecutive codes of one group; a row is routed by its code's run (a code outside the spine lands in some
    group, whose checks then fail on it as they would on the whole level)."""

    def __init__(self, spine_path: Path, levels: list[str], us: bool, records: dict[str, int] | None = None):
        self.spine = read_table(spine_path, read_dictionary=levels[:-1])
        key = (pc.utf8_slice_codeunits(self.spine.column("geoid"), 0, PREFIX[STATE]) if us
               else self.spine.column(levels[1]).cast(pa.large_string()))
        keys = pc.unique(key).sort()
        row_key = pc.index_in(key, keys).to_numpy()
        blocks = np.bincount(row_key, minlength=len(keys))
        per_key = np.zeros(len(keys))
        if records and len(keys):
            node = self.spine.column(levels[1]).cast(pa.large_string()).to_numpy(zero_copy_only=False)
            node_key = pd.Series(row_key, index=node).groupby(level=0).first()
            for name, n in records.items():
                if name in node_key.index:
                    per_key[node_key[name]] += n
        key_group = _group_keys(blocks, per_key)
        self.us, self.row_key = us, row_key  # each spine row's key number
        self.count = int(key_group[-1]) + 1 if len(keys) else 0
        self.row_group = key_group[row_key]
        self.runs = {name: self._runs(name) for name in ["geoid", *levels[1:]]}
        self.runs["key"] = (np.asarray(keys.to_numpy(zero_copy_only=False), dtype=str), key_group)

    def _runs(self, column: str) -> tuple[np.ndarray, np.ndarray]:
        """(the first code of each run of ``column``'s sorted codes that share a group, that group)."""
        codes = self.spine.column(column).cast(pa.large_string())
        order = pc.sort_indices(codes).to_numpy()
        group = self.row_group[order]
        starts = np.r_[0, np.flatnonzero(np.diff(group)) + 1] if group.size else np.zeros(0, np.int64)
        first = codes.take(pa.array(order[starts])).to_numpy(zero_copy_only=False)
        return np.asarray(first, dtype=str), group[starts]

    def route(self, column: str, values) -> np.ndarray:
        """The group of each of ``values`` (codes of the spine's ``column``)."""
        first, group = self.runs[column]
        codes = np.asarray(pc.cast(values, pa.large_string()).to_numpy(zero_copy_only=False), dtype=str)
        return group[np.maximum(np.searchsorted(first, codes, side="right") - 1, 0)]

    def spine_frame(self, g: int) -> pd.DataFrame:
        """Group ``g``'s rows of the spine as :meth:`RunReader.spine_table` gives them (strings)."""
        return self.spine.filter(pa.array(self.row_group == g)).to_pandas().astype(str)


class _Spill:
    """Rows of one kind routed to one Parquet file per group in ``folder`` (written batch by batch), named
    ``<g>.parquet`` (``<g>-<part>.parquet`` with a ``part``); ``folder`` may be a store's prefix (a file is then
    an object written as it streams: the spill is scratch, read by the command that wrote it alone)."""

    def __init__(self, folder: Path | StorePath, part: str | None = None):
        self.folder, self.part = folder, part
        folder.mkdir(parents=True)
        self.writers: dict[int, pq.ParquetWriter] = {}
        self.sinks: list = []  # a store's open objects, closed after their writers
        self.schema: pa.Schema | None = None

    def path(self, g: int) -> Path | StorePath:
        return self.folder / (f"{g}.parquet" if self.part is None else f"{g}-{self.part}.parquet")

    def add(self, table: pa.Table, group: np.ndarray) -> None:
        for g in np.unique(group):
            part = table.filter(pa.array(group == g))
            if g not in self.writers:
                sink = self.path(g)
                if isinstance(sink, StorePath):
                    sink = sink.open("wb")
                    self.sinks.append(sink)
                self.writers[g] = pq.ParquetWriter(sink, part.schema)
            self.writers[g].write_table(part.cast(self.writers[g].schema))

    def close(self) -> None:
        for writer in self.writers.values():
            writer.close()
        for sink in self.sinks:
            sink.close()

    def frame(self, g: int) -> pd.DataFrame:
        """Group ``g``'s rows (none: an empty frame of the source's schema)."""
        path = self.path(g)
        return (pq.read_table(path) if path.exists() else self.schema.empty_table()).to_pandas()

    def batches(self, g: int) -> Iterator[pd.DataFrame]:
        """Group ``g``'s rows, :data:`ROUTE_BATCH` at a time (none: one empty frame of the source's schema)."""
        path = self.path(g)
        if not path.exists():
            yield self.schema.empty_table().to_pandas()
            return
        for batch in parquet_file(path).iter_batches(batch_size=ROUTE_BATCH):
            yield batch.to_pandas()


def hive_dataset(path: Path):
    """A run's Parquet file or folder as a dataset (hive partitions, as ``pq.read_table`` reads them)."""
    return dataset(path, partitioning="hive")


def _batches(path: Path):
    """A Parquet file or folder (hive partitions as ``pq.read_table`` reads them) as tables of about
    :data:`ROUTE_BATCH` rows (small files' batches together)."""
    dataset = hive_dataset(path)
    held, rows = [], 0
    for batch in dataset.to_batches(batch_size=ROUTE_BATCH):
        held.append(batch)
        rows += batch.num_rows
        if rows >= ROUTE_BATCH:
            yield pa.Table.from_batches(held, schema=dataset.schema)
            held, rows = [], 0
    if held:
        yield pa.Table.from_batches(held, schema=dataset.schema)


def verify_run(root: str | Path) -> VerifyReport:
    """Verify a run directory; the report lists every failed check (a missing or unreadable output file is
    one). Raises :class:`RunDirError` when ``root`` holds no complete run to verify."""
    reader = RunReader(root)
    manifest = reader.complete_manifest()
    try:
        reader.config()
    except LevelsMismatch:
        raise  # no file of the run can be named: nothing to verify
    except RunDirError:
        pass  # a changed or unreadable configuration: the checks below report it
    rep = VerifyReport()
    try:
        _verify_sums(reader, manifest, rep)
    except OSError as exc:
        rep.check(False, f"unreadable output: {exc}")
    changed = not rep.ok
    try:
        _verify(reader, manifest, rep)
    except (OSError, pa.ArrowException) as exc:  # a deleted or damaged output of a complete run
        rep.check(False, f"missing or unreadable output: {exc}")
    except (KeyError, ValueError, TypeError, IndexError, RunDirError) as exc:
        if not changed:  # the files are as the run wrote them: a bug, or (RunDirError) an unreadable run
            raise
        rep.check(False, f"the checks of the contents stopped on the changed files ({type(exc).__name__}: {exc})")
    return rep


#: What each top-level entry of a run directory holds, as a failure names it.
_KINDS = {"histograms": "histograms", "noisy_measurements": "noisy measurements", "mdf": "MDF",
          "invariants": "invariants", "spine.parquet": "spine", "certificate.json": "privacy certificate",
          "config.json": "configuration"}


def _output_kind(path: str) -> str:
    """What the file at ``path`` (relative to the run directory) is: e.g. ``persons Block histograms``."""
    parts = Path(path).parts
    kind = _KINDS.get(parts[0], "output")
    if len(parts) < 2:
        return kind
    level = parts[2].removeprefix("level=") + " " if len(parts) > 3 and parts[2].startswith("level=") else ""
    return f"{Path(parts[1]).stem} {level}{kind}"


def _verify_sums(reader: RunReader, manifest: Manifest, rep: VerifyReport) -> None:
    """One check per file the manifest records a SHA-256 for (and per file added beside them, or anywhere else
    in the run directory: only the manifest and a writer's lock are not outputs); a note says how many were
    checked, and which outputs no recorded sum covers (a run of an older version)."""
    recorded = manifest.recorded_sha256()
    found: dict[str, str] = {}
    for product in manifest.products:
        for level in manifest.levels:
            if manifest.level_sha256(product, level) is not None:
                found.update(level_digests(reader, product, level))
    if manifest.data.get("output_sha256") is not None:
        found.update(reader.output_digests(manifest.products))
    problems = changed_files(recorded, found)
    for path in sorted(recorded.keys() | found.keys()):
        rep.check(path not in problems, f"{path} ({_output_kind(path)}): {problems.get(path)}")
    if manifest.data.get("output_sha256") is not None or found:  # a run that records its levels' sums
        for product, levels in manifest.completed.items():
            for level in levels:
                rep.check(manifest.level_sha256(product, level) is not None,
                          f"{product} {level}: a completed level whose SHA-256 sums the manifest does not record "
                          "(removed from it)")
    rep.notes.append(f"SHA-256: {len(recorded.keys() | found.keys())} files checked against the manifest")
    covered = {Path(path).parts[0] for path in recorded}
    uncovered: dict[str, int] = {}
    for f in sorted(reader.root.rglob("*")):
        rel = f.relative_to(reader.root)
        if not f.is_file() or str(rel) in found or (len(rel.parts) == 1 and (rel.name == "manifest.json"
                                                                              or rel.name.startswith(LOCK))):
            continue
        if rel.parts[0] in _KINDS and rel.parts[0] not in covered:  # an output of an older version: no sums
            group = "/".join(rel.parts[:3 if rel.parts[2:3] and rel.parts[2].startswith("level=") else 2])
            uncovered[group] = uncovered.get(group, 0) + 1
        else:  # beside the outputs the manifest lists: nothing of the run's, perhaps confidential
            rep.check(False, f"{rel}: not listed in the manifest (not an output of the run)")
    if uncovered:
        rep.notes.append("no SHA-256 recorded in the manifest, not checked: " + ", ".join(
            g if (reader.root / g).is_file() else f"{g}/ ({n} file{'s' * (n > 1)})" for g, n in uncovered.items()))


def _verify(reader: RunReader, manifest: Manifest, rep: VerifyReport) -> None:
    levels = manifest.levels
    columns = [c for c in read_schema(reader.spine_path).names if not c.startswith("__index_level_")]
    rep.check(columns == ["geoid", *levels], "spine.parquet columns are not geoid + the manifest's levels")
    relaxed = {(f["product"], f["level"], f["parent"]) for f in manifest.failsafe if f.get("parent_relaxed")}
    for product, level, parent in sorted(relaxed):
        rep.notes.append(f"{product} {level}: parent {parent!r} needed the failsafe's parent relaxation (manifest)")
    if manifest.algorithm == "block_by_block":
        rep.notes.append("block-by-block run: totals above the block level are sums of blocks, not invariants "
                         "(TDA paper, Appendix A); their checks are skipped")
    products = reader.products()  # a lost config.json is a failed SHA-256 check (read as P.L. 94-171's)
    hierarchy = reader.hierarchy()
    groups = _Groups(reader.spine_path, levels, hierarchy.us, _records(reader, products, levels[1]))
    for product in products:
        _verify_product(reader, product, levels, groups, rep, {p for (pr, _, p) in relaxed if pr == product.name},
                        totals_invariant=manifest.algorithm != "block_by_block", hierarchy=hierarchy)


def _records(reader: RunReader, products: list[Product], level: str) -> dict[str, int]:
    """The published count of each node of ``level`` (the first below the root), the largest over the products:
    about as many MDF records as verify routes to the node's group."""
    most: dict[str, int] = {}
    for product in products:
        try:
            table = hive_dataset(reader.histograms(product.name, level))
            sums = table.to_table(columns=["geocode", "count"]).group_by("geocode").aggregate([("count", "sum")])
        except (OSError, pa.ArrowException, KeyError):  # a lost or damaged level: its own checks name it
            continue
        for name, n in zip(sums.column("geocode").to_pylist(), sums.column("count_sum").to_pylist()):
            most[str(name)] = max(most.get(str(name), 0), int(n or 0))
    return most


def _level_checks(product: Product, level: str, h: pd.DataFrame, nodes: set, rep) -> None:
    """One level's histogram rows of ``product`` (``h``, geocodes as strings) are non-negative integers on valid
    cells, once per (geocode, cell), of nodes of the spine (``nodes``)."""
    rep.check(h["count"].dtype.kind in "iu", f"{product.name} {level}: counts are not integers")
    rep.check(bool((h["count"] >= 0).all()), f"{product.name} {level}: negative counts")
    ncells = product.schema.ncells
    rep.check(bool(h["cell"].between(0, ncells - 1).all()), f"{product.name} {level}: cell out of range")
    rep.check(not h.duplicated(["geocode", "cell"]).any(), f"{product.name} {level}: duplicate (geocode, cell) rows")
    rep.check(set(h["geocode"]) <= nodes, f"{product.name} {level}: histogram geocode not in the spine")


def _children_sums(child: pd.DataFrame, pmap: pd.Series) -> pd.Series:
    """The children's counts ``child`` summed per (parent, cell) (``pmap``: each child's parent)."""
    return child.assign(parent=lambda d: d["geocode"].map(pmap)).groupby(["parent", "cell"])["count"].sum()


def _check_sums(product: Product, parent: str, child: str, summed: pd.Series, parents: pd.DataFrame, relaxed: set[str],
                rep: _Merged) -> None:
    """The children's sums (``summed``, per (parent, cell)) equal their parents' counts ``parents`` cell by cell
    (parents the failsafe relaxed excepted)."""
    summed = summed[summed != 0]
    p = parents.set_index(["geocode", "cell"])["count"]
    p = p[p != 0]
    p.index.names = ["parent", "cell"]
    diff = summed.sub(p, fill_value=0)
    bad = diff[(diff != 0) & ~diff.index.get_level_values("parent").isin(relaxed)]
    first = None if bad.empty else (str(bad.index[0][0]), int(bad.index[0][1]))
    rep.check(bad.empty, f"{product.name} {child}: children do not sum to their {parent} parent (first: parent "
                         f"{first[0]!r}, cell {first[1]})" if first else "", key=("sums", product.name, child),
              rank=first)


def _verify_product(reader: RunReader, spec: Product, levels: list[str], groups: _Groups, rep: VerifyReport,
                    relaxed: set[str], totals_invariant: bool, hierarchy: Hierarchy) -> None:
    """Every check of one product, one group of :class:`_Groups` in memory at a time: each level's rows, the
    invariants and the MDF are first routed to per-group files in a temporary folder (``TMPDIR``), one batch
    of :data:`ROUTE_BATCH` rows at a time. The root level (one node) is read whole; its children's sums are
    added up group by group."""
    product = spec.name
    root, below = levels[0], levels[1:]
    merged = _Merged()
    state = spine_state(*arrow(reader.spine_path))
    with tempfile.TemporaryDirectory(prefix="topdown-verify-") as tmp:
        hist = {level: _route(groups, reader.histograms(product, level), Path(tmp) / level, level) for level in below}
        inv, inv_top = _route_invariants(groups, reader.invariants(product), Path(tmp) / "invariants", root, below)
        mdf = (_route(groups, reader.mdf(product), Path(tmp) / "mdf", "geoid", _mdf_geoids(spec, hierarchy))
               if spec.mdf in MDF_LAYOUT else None)
        h_root = reader.table(reader.histograms(product, root))
        h_root["geocode"] = h_root["geocode"].astype(str)
        roots = {str(v) for v in pc.unique(groups.spine.column(root).cast(pa.large_string())).to_pylist()}
        _level_checks(spec, root, h_root, roots, merged)
        top: list[pd.Series] = []
        for g in range(groups.count):
            spine = groups.spine_frame(g)
            hists = {}
            for level in below:
                h = hist[level].frame(g)
                h["geocode"] = h["geocode"].astype(str)
                hists[level] = h
                _level_checks(spec, level, h, set(spine[level]), merged)
            if below:
                top.append(_children_sums(hists[below[0]], _parent_map(spine, below[0], root)))
            for parent, child in zip(below[:-1], below[1:]):
                _check_sums(spec, parent, child, _children_sums(hists[child], _parent_map(spine, child, parent)),
                            hists[parent], relaxed, merged)
            verify_declared(reader, hists, inv.frame(g), spine, merged, totals_invariant, spec, hierarchy,
                            mdf=None if mdf is None else mdf.batches(g), state=state, run_levels=levels)
        if below:
            _check_sums(spec, root, below[0], pd.concat(top).groupby(level=[0, 1]).sum(), h_root, relaxed, merged)
        verify_declared(reader, {root: h_root}, inv_top, groups.spine.slice(0, 1).to_pandas().astype(str), merged,
                        totals_invariant, spec, hierarchy, check_mdf=False, state=state, run_levels=levels)
    merged.emit(rep)


def _mdf_geoids(spec: Product, hierarchy: Hierarchy):
    """The leaf geocode of each row of a batch of ``spec``'s MDF (its layout's ``leaf_codes``)."""
    leaf_codes = MDF_LAYOUT[spec.mdf].leaf_codes
    return lambda t: leaf_codes(t, hierarchy)


def _route(groups: _Groups, path: Path, folder: Path, column: str, codes=None, part: str | None = None) -> _Spill:
    """Route the rows of the Parquet file or folder ``path`` to their groups by their codes of the spine's
    ``column`` (``codes(table)``; default the ``geocode`` column), into ``_Spill(folder, part)``."""
    spill = _Spill(folder, part)
    spill.schema = hive_dataset(path).schema
    for table in _batches(path):
        spill.add(table, groups.route(column, table.column("geocode") if codes is None else codes(table)))
    spill.close()
    return spill


def _route_invariants(groups: _Groups, path: Path, folder: Path, root: str, below: list[str]
                      ) -> tuple[_Spill, pd.DataFrame]:
    """The invariants routed to their groups (a whole state's by its code), and the root level's rows."""
    spill = _Spill(folder)
    spill.schema = read_schema(path)
    top = []
    for table in _batches(path):
        level = np.asarray(table.column("level").to_numpy(zero_copy_only=False), dtype=str)
        group = np.full(len(level), -1)
        for name, column in [*((b, b) for b in below), (WHOLE_STATE, "key")]:
            rows = np.flatnonzero(level == name)
            if rows.size:
                group[rows] = groups.route(column, table.column("geocode").take(pa.array(rows)))
        keep = np.flatnonzero(group >= 0)
        spill.add(table.take(pa.array(keep)), group[keep])
        top.append(table.filter(pa.array(level == root)))
    spill.close()
    return spill, pa.concat_tables(top).to_pandas() if top else spill.schema.empty_table().to_pandas()


def _summed(tabs: Iterable[pd.DataFrame]) -> pd.DataFrame:
    """Tabulations (geocode, cell, count) of batches of an MDF's rows, added up."""
    parts = list(tabs)
    if len(parts) == 1:
        return parts[0]
    return pd.concat(parts, ignore_index=True).groupby(["geocode", "cell"])["count"].sum().reset_index()


def _verify_mdf(mdf: Iterable[pd.DataFrame], spec: Product, hists: dict[str, pd.DataFrame], spine: pd.DataFrame,
                rep: VerifyReport, hierarchy: Hierarchy) -> None:
    """``spec``'s MDF (``mdf``: batches of its rows of the leaves of ``spine``) tabulates back to the leaf
    histograms, or, for a layout of counted rows only, has one such row per record of them."""
    layout, leaf = MDF_LAYOUT[spec.mdf], list(hists)[-1]
    if layout.tabulate is None:
        n = sum(layout.counted_rows(b) for b in mdf)
        rep.check(n == int(hists[leaf]["count"].sum()),
                  f"{spec.name} MDF {layout.rows_named} rows differ from the block histograms")
        return
    tab = _summed(layout.tabulate(b, spec, hierarchy) for b in mdf)
    _check_mdf_blocks(spec.name, hists[leaf], spine, leaf, tab, rep)


def _check_mdf_blocks(name: str, block_hist: pd.DataFrame, spine: pd.DataFrame, leaf: str, tab: pd.DataFrame,
                      rep: VerifyReport) -> None:
    """The MDF tabulated back (``tab``: geocode = block GEOID, cell, count) equals the block histograms."""
    block = block_hist.merge(spine[[leaf, "geoid"]].drop_duplicates(), left_on="geocode", right_on=leaf)
    block = block[block["count"] > 0].groupby(["geoid", "cell"])["count"].sum()
    tab = tab.set_index(["geocode", "cell"])["count"]
    tab.index.names = ["geoid", "cell"]
    rep.check(block.sort_index().equals(tab.sort_index().astype(block.dtype)),
              f"{name} MDF does not tabulate back to the block histograms")


def _active_zeros(reader: RunReader, spec: Product, levels: list[str]) -> dict[str, set[str]] | None:
    """Per level, the constraints the run configures there or below (a structural zero holds where configured);
    None when the run's configuration cannot be read (every declared zero is then checked)."""
    try:
        cfg = reader.config().product(spec.name)
    except Exception:  # an unreadable or changed config.json is reported by the SHA-256 check
        return None
    return {level: configured_below(cfg.constraints, levels, level) for level in levels}


#: ``verify_declared``'s default state level: read from the spine's metadata.
_SPINE_STATE = object()


def verify_declared(reader: RunReader, hists: dict[str, pd.DataFrame], inv: pd.DataFrame, spine: pd.DataFrame,
                    rep: VerifyReport, totals_invariant: bool, spec: Product, hierarchy: Hierarchy, *,
                    mdf: Iterable[pd.DataFrame] | None = None, check_mdf: bool = True, state=_SPINE_STATE,
                    run_levels: list[str] | None = None) -> None:
    """The product's declared invariants and constraints hold at every level of ``hists``: its unit bounds,
    its structural zeros and constraints to unit counts (where the run configures them), its total (a state's
    as the sum over its parts) and its housing-unit counts; its MDF (``mdf``: batches of its rows of the blocks
    of ``spine``; default the whole MDF) tabulates back to the leaves, unless not ``check_mdf``. ``run_levels``: all the run's levels, when ``hists``
    holds some of them (where a structural zero holds depends on the levels below)."""
    product, schema, bounds = spec.name, spec.schema, spec.unit_bounds
    levels = list(hists)
    if state is _SPINE_STATE:
        state = spine_state(*arrow(reader.spine_path))
    type_of_cell = None if bounds is None else schema.unravel(np.arange(schema.ncells))[schema.axis(bounds.attribute)]
    zeros = {c.name: build_query(schema, c.query).groups >= 0 for c in spec.constraints.values() if c.rhs == "zero"}
    by_units = {}  # constraint -> its query, sense and the invariants' unit columns it is held to
    for c in spec.constraints.values():
        if c.rhs in ("unit_counts", "housing_units"):
            query = build_query(schema, c.query)
            by_units[c.name] = (query, c.sense, UNIT_COLUMNS[:1 if c.rhs == "housing_units" else query.n_answers])
    active = _active_zeros(reader, spec, run_levels or levels) if zeros or by_units else None
    kinds = {s.kind for s in spec.invariants.values()}
    for level in levels:
        h = hists[level]
        lv_inv = inv[inv["level"] == level].set_index("geocode")
        lv_inv.index = lv_inv.index.astype(str)
        if bounds is not None and set(UNIT_COLUMNS[:len(bounds.cap)]) <= set(lv_inv.columns):
            size = len(bounds.cap)
            by_type = (h.assign(kind=type_of_cell[h["cell"].to_numpy()]).groupby(["geocode", "kind"])["count"].sum()
                       .unstack(fill_value=0).reindex(columns=range(size), fill_value=0)
                       .reindex(lv_inv.index, fill_value=0))
            u = lv_inv[UNIT_COLUMNS[:size]].to_numpy()
            p = by_type.to_numpy()
            rep.check(bool((p >= u * np.asarray(bounds.min_per_unit)).all()),
                      f"{product} {level}: fewer records of a {bounds.attribute} type than its units require")
            rep.check(bool((p <= u * np.asarray(bounds.cap)).all()),
                      f"{product} {level}: more records of a {bounds.attribute} type than its units allow "
                      "(or records of a type with no unit of that type)")
        for name, cells in zeros.items():
            if active is None or name in active[level]:
                rep.check(not bool((cells[h["cell"].to_numpy()] & (h["count"].to_numpy() > 0)).any()),
                          f"{product} {level}: structural zero {name} broken")
        for name, (query, sense, columns) in by_units.items():
            if (active is None or name in active[level]) and set(columns) <= set(lv_inv.columns):
                answer = query.groups[h["cell"].to_numpy()]
                got = (h[answer >= 0].assign(answer=answer[answer >= 0]).groupby(["geocode", "answer"])["count"].sum()
                       .unstack(fill_value=0).reindex(index=lv_inv.index, columns=range(query.n_answers), fill_value=0)
                       .to_numpy())
                units = lv_inv[columns].to_numpy()
                held = {"==": got == units, "<=": got <= units, ">=": got >= units}[sense]
                rep.check(bool(held.all()), f"{product} {level}: {name}: {query.name} {sense} the node's "
                                            f"{'housing units' if len(columns) == 1 else 'units of each type'} broken")
        if "housing_units" in kinds:
            totals = h.groupby("geocode")["count"].sum()
            u0 = lv_inv["u0"]
            diff = totals.reindex(u0.index, fill_value=0) - u0
            rep.check(bool((diff == 0).all()), f"{product} {level}: housing-unit counts differ from the invariant")
        if not spec.total_invariant or not totals_invariant or "tot" not in lv_inv.columns:
            continue
        totals = h.groupby("geocode")["count"].sum().reindex(lv_inv.index, fill_value=0)
        whole = inv[inv["level"] == WHOLE_STATE].set_index("geocode")["tot"]
        if level == state and not whole.empty:  # each whole U.S. state's total is the sum over its parts
            states = spine.drop_duplicates(state).set_index(state)["geoid"].str[:PREFIX[STATE]]
            got = totals.groupby(states.reindex(totals.index).to_numpy()).sum().reindex(whole.index, fill_value=0)
            rep.check(bool((got == whole).all()),
                      f"{product} {level}: a state's total (the sum over its parts) differs from its invariant")
        elif lv_inv["tot"].notna().any():
            rep.check(bool((totals == lv_inv["tot"]).all()), f"{product} {level}: total differs from its invariant")
    if check_mdf and spec.mdf in MDF_LAYOUT:
        _verify_mdf([reader.table(reader.mdf(spec.name))] if mdf is None else mdf, spec, hists, spine, rep, hierarchy)
