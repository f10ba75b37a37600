"""Where a chunk's noisy measurements come from: drawn now, or read back from a release.

A :class:`Chunk`'s ``source`` answers one question for the task, "the noisy answers of these children",
so the level loop (engine.py) and the task (tasks.py) are the same for a run and for a reprocessing:

* :class:`Draw` (a run): noise is drawn now from the chunk's confidential child histograms
  (:func:`measure.measure`) and the measurements are staged beside the level, to be published with it.
* :class:`Published` (``topdown reprocess``): the answers are read from a level's published Parquet
  parts (``noisy_measurements/<product>/level=<L>/``, geocode, query, answer, value, variance). Nothing
  confidential is read and nothing is drawn, so the estimates are post-processing (zero privacy loss).
"""
from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from pathlib import Path
from typing import Any, ClassVar, Protocol

import pandas as pd
import pyarrow as pa
import pyarrow.dataset as ds

from ..configuration.errors import InputError
from ..privacy.measure import (MEASUREMENT_PARQUET, MEASUREMENT_SCHEMA, NodeMeasurements, from_table, measure,
                               root_cells)
from ..runtime.rundir import write_table
from ..runtime.storage import arrow, location, parquet_file
from topdown.vocab.census import Product
from topdown.vocab.problem import SparseHist


class Chunk(Protocol):
    """What a source reads of a chunk (``execution.tasks.Chunk``; named here so that no import cycle forms)."""

    product: Product
    cfg: Any  # ProductConfig
    level: str
    children: list[str]
    child_plb: list[Fraction]
    child_hist: Any  # scipy CSR of the true child histograms, or None when reprocessing
    mode: str
    seed: int | None
    measurements_path: str | None
    parents: list[Any]  # ParentTask: child_rows and parent_hist


class MeasurementSource:
    """The noisy answers of a chunk's children (one query per :class:`NodeMeasurements`, budget order)."""

    #: True when the source writes the measurements it draws (staged; the level commits them).
    draws: ClassVar[bool] = False

    def for_children(self, children: list[str]) -> "MeasurementSource":
        """The (smaller) source a chunk with these children carries to its worker."""
        return self

    def noisy(self, chunk: "Chunk") -> list[NodeMeasurements]:
        raise NotImplementedError

    def by_parent(self, chunk: "Chunk") -> list[list[NodeMeasurements]]:
        """Per parent of the chunk (``chunk.parents``), the noisy answers of its children."""
        budget = chunk.cfg.budget
        if budget.measure == "in_play" and chunk.parents and (chunk.parents[0].parent_hist is not None
                                                              or budget.root_support):
            return self.held(chunk)
        measured = self.noisy(chunk)
        return [[m.rows(task.child_rows) for m in measured] for task in chunk.parents]

    def held(self, chunk: "Chunk") -> list[list[NodeMeasurements]]:
        """:meth:`by_parent` when each parent's children are measured on the answers in play only (at the root:
        those of :func:`measure.root_cells`)."""
        raise NotImplementedError

    def staged(self, chunk: "Chunk") -> bool:
        """Whether the chunk's measurements are in place (for reusing a finished chunk on --resume)."""
        return True


@dataclass(frozen=True)
class Draw(MeasurementSource):
    """Draw the noise now and stage the chunk's measurements at ``chunk.measurements_path``."""

    draws: ClassVar[bool] = True

    def noisy(self, chunk: "Chunk") -> list[NodeMeasurements]:
        measured, table = measure(chunk.product, chunk.cfg.budget, chunk.level,
                                  chunk.children, chunk.child_plb, chunk.child_hist, chunk.mode, chunk.seed)
        self._stage(chunk, table)
        return measured

    def held(self, chunk: "Chunk") -> list[list[NodeMeasurements]]:
        """Each parent's children measured on the answers that count a cell of the parent's published estimate
        (its non-zero cells: a choice from published output only); the tables end to end, parent by parent."""
        out, tables = [], []
        plb = list(chunk.child_plb)
        schema, budget = chunk.product.schema, chunk.cfg.budget
        for task in chunk.parents:
            rows = task.child_rows
            args = (chunk.product, budget, chunk.level, chunk.children[rows], plb[rows],
                    chunk.child_hist[rows], chunk.mode, chunk.seed)
            if task.parent_hist is not None:
                measured, table = measure(*args, held=SparseHist.of(task.parent_hist).cells)
                parts = [table]
            else:  # a root: its support queries first, then the others on the cells those leave in play
                first, table = measure(*args, only=budget.root_support)
                rest = [q for q in budget.queries.get(chunk.level, {}) if q not in budget.root_support]
                second, more = measure(*args, held=root_cells(schema, budget, first, 0), only=rest)
                by_name = {m.query: m for m in first + second}
                measured, parts = [by_name[q] for q in budget.queries.get(chunk.level, {})], [table, more]
            out.append(measured)
            tables += [t.cast(MEASUREMENT_SCHEMA) if t.num_rows else t for t in parts]
        self._stage(chunk, pa.concat_tables(tables).unify_dictionaries() if tables else MEASUREMENT_SCHEMA.empty_table())
        return out

    @staticmethod
    def _stage(chunk: "Chunk", table: pa.Table) -> None:
        if chunk.measurements_path is not None:  # None: kept in memory (the audit's repeated runs)
            write_table(table, location(chunk.measurements_path), **MEASUREMENT_PARQUET)

    def staged(self, chunk: "Chunk") -> bool:
        return location(chunk.measurements_path).exists()


DRAW = Draw()


@dataclass(frozen=True)
class Published(MeasurementSource):
    """Measurements read from published Parquet parts; ``parts`` holds (file, lowest, highest geocode)."""

    parts: tuple[tuple[str, str | None, str | None], ...]

    @classmethod
    def of_level(cls, directory: Path) -> "Published":
        """The parts of one level's measurement directory, with their geocode range from the file statistics."""
        files = sorted(location(directory).glob("*.parquet"))
        if not files:
            raise FileNotFoundError(f"{directory}: no noisy measurements (no .parquet files)")
        return cls(tuple((str(f), *_geocode_range(f)) for f in files))

    def for_children(self, children: list[str]) -> "Published":
        lo, hi = min(children), max(children)
        return Published(tuple(p for p in self.parts if p[1] is None or (p[1] <= hi and p[2] >= lo)))

    def noisy(self, chunk: "Chunk") -> list[NodeMeasurements]:
        table, where = self._read(chunk)
        return from_table(chunk.product.schema, list(chunk.cfg.budget.queries.get(chunk.level, {})), chunk.children,
                          table, where=where)

    def held(self, chunk: "Chunk") -> list[list[NodeMeasurements]]:
        table, where = self._read(chunk)
        queries = list(chunk.cfg.budget.queries.get(chunk.level, {}))
        out = []
        for task in chunk.parents:
            children = chunk.children[task.child_rows]
            mine = table[table["geocode"].isin(children)]
            out.append(from_table(chunk.product.schema, queries, children, mine, where=where, held=True))
        return out

    def _read(self, chunk: "Chunk") -> tuple[pd.DataFrame, str]:
        files = [p[0] for p in self.parts]
        if files:
            sources = [arrow(location(f)) for f in files]
            table = ds.dataset([s for s, _ in sources], format="parquet", filesystem=sources[0][1]).to_table(filter=ds.field("geocode").isin(chunk.children))
            table = table.to_pandas()
        else:
            table = pd.DataFrame(columns=["geocode", "query", "answer", "value", "variance"])
        return table, (f"{location(files[0]).parent}" if files else f"published measurements of {chunk.level}")


def _geocode_range(path: Path) -> tuple[str | None, str | None]:
    """The lowest and highest geocode of a Parquet file from its row-group statistics (None: unknown)."""
    meta = parquet_file(path).metadata
    if meta.num_rows == 0:
        return "\uffff", ""  # an empty part overlaps nothing
    col = meta.schema.names.index("geocode") if "geocode" in meta.schema.names else None
    if col is None:
        raise InputError(f"{path}: no 'geocode' column; not a noisy-measurement file")
    lows, highs = [], []
    for g in range(meta.num_row_groups):
        stats = meta.row_group(g).column(col).statistics
        if stats is None or not stats.has_min_max:
            return None, None
        lows.append(stats.min)
        highs.append(stats.max)
    return min(lows), max(highs)
