"""A product's marginal held equal to an earlier run's published counts (``[<product>.estimation] match_published``).

The Bureau's 2020 DHC persons estimates equal, in every geounit, the P.L. 94-171 release's hhgq x voting age x
hispanic x cenrace counts (DAS 2020 DHC ``Constraints_DHCP.py`` ``pl94``): the published table is read as a
constraint table and enters every parent's problem as equalities on its children. Here the earlier run is named
by its run directory, and only its published outputs are read (``config.json``, ``spine.parquet`` and the
product's ``histograms/``), each checked against the SHA-256 its manifest records; never its input nor its
staging. Published counts are public: using them costs no privacy (DESIGN.md, "Constraints to an earlier
release").

:func:`check_matched` makes every check that needs no input (exit 4: the run is missing, incomplete or its files
differ from its manifest; exit 2: its product, attributes, levels or spine kind cannot serve the query, or a term
has no declared counterpart); :func:`matched_levels` then compares the two spines node by node and gives each
level's counts in this run's node order.
"""
from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd
import scipy.sparse as sp

from topdown.geo.spine import Spine
from topdown.vocab.census import Product
from topdown.vocab.queries import CROSS, QueryError, Query, build_query, canonical_name

from ..configuration.config import Config, ConfigError, MatchPublished, census_hierarchy
from ..configuration.errors import did_you_mean
from ..inputs.invariants import MatchedCounts
from .levels import Level
from ..runtime.rundir import RunDirError, RunReader, sha256_file
from ..runtime.storage import location

#: The name of the constraint the published counts bind (solvers' rows, failsafe messages).
CONSTRAINT = "match_published"
#: The earlier run's files that are read: what :meth:`RunReader.check_sums` checks first.
READ = ("config.json", "spine.parquet", "histograms")
#: What the certificate says of the counts used.
PUBLIC = ("published output of an earlier run (public): constraining to it adds no privacy loss; its input is "
          "not read")


@dataclass(frozen=True)
class Matched:
    """One product's ``match_published``, checked: the earlier run, its product's query answering this product's
    ``query`` (``order``: the earlier answers' axes in this query's order) and its manifest's SHA-256."""

    product: Product
    setting: MatchPublished
    reader: RunReader
    earlier: Product
    earlier_query: Query
    query: Query
    order: tuple[int, ...]
    shape: tuple[int, ...]  # the earlier answers' axes (the terms' sizes, in the earlier schema's order)
    manifest_sha256: str

    def record(self) -> dict[str, Any]:
        """The manifest's and certificate's entry."""
        return {"run": str(self.reader.root), "product": self.earlier.name, "query": self.query.name,
                "published_query": self.earlier_query.name, "manifest_sha256": self.manifest_sha256,
                "privacy": PUBLIC}

    def answers(self, hist: sp.csr_matrix) -> sp.csr_matrix:
        """This query's answers (in its answer order) of the earlier product's histograms ``hist`` (rows x cells)."""
        counts = self.earlier_query.answer_rows(hist).reshape(hist.shape[0], *self.shape)
        counts = counts.transpose(0, *(1 + np.asarray(self.order, dtype=np.int64)))
        return sp.csr_matrix(counts.reshape(hist.shape[0], -1), dtype=np.int64)


def _where(config: Config, product: Product) -> str:
    return f"{config.source}: [{product.name}.estimation] match_published"


def check_matched(config: Config) -> dict[str, Matched]:
    """Each run product's ``match_published`` checked against its earlier run, before the input is read."""
    return {spec.name: _check(config, spec) for spec in config.run_products
            if config.product(spec.name).estimation.match_published is not None}


def _check(config: Config, spec: Product) -> Matched:
    setting = config.product(spec.name).estimation.match_published
    where = _where(config, spec)
    reader = RunReader(location(setting.run))
    try:
        manifest = reader.complete_manifest(f"matching {spec.name} to it")
    except RunDirError as exc:
        raise RunDirError(f"{where}: {exc}") from None
    if setting.product not in manifest.products:
        raise ConfigError(f"{where}: run {reader.root} has no product {setting.product!r} (products: "
                          f"{', '.join(manifest.products)}){did_you_mean(setting.product, manifest.products)}")
    missing = [lv for lv in manifest.levels if manifest.level_sha256(setting.product, lv) is None]
    if missing:
        raise RunDirError(f"{where}: {reader.manifest_path} records no SHA-256 for {setting.product} level "
                          f"{missing[0]} (a run of an older version): its histograms cannot be checked")
    try:
        reader.check_sums(READ, f"matching {spec.name} to it")
        earlier_config = reader.config()
    except RunDirError as exc:
        raise RunDirError(f"{where}: {exc}") from None
    levels = list(census_hierarchy(config).names)
    if manifest.levels != levels or manifest.spine != config.run.spine:
        raise ConfigError(f"{where}: run {reader.root} is on another spine ({manifest.spine!r}, levels "
                          f"{', '.join(manifest.levels)}; this run: {config.run.spine!r}, {', '.join(levels)})")
    if any(f.get("product") == setting.product and f.get("parent_relaxed") for f in manifest.failsafe):
        raise ConfigError(f"{where}: run {reader.root}'s {setting.product} has parents whose children do not sum "
                          "to them (its failsafe relaxed them): no estimate can equal its counts at every level")
    earlier = earlier_config.census.product(setting.product)
    query, earlier_query, order, shape = _queries(spec, earlier, setting, where)
    return Matched(spec, setting, reader, earlier, earlier_query, query, order, shape,
                   sha256_file(reader.manifest_path))


def _queries(spec: Product, earlier: Product, setting: MatchPublished, where: str
             ) -> tuple[Query, Query, tuple[int, ...], tuple[int, ...]]:
    """This product's query, the earlier product's query of the same answers, the permutation from the
    earlier answers' axes to this query's (both answer in the order of their schema's axes) and the earlier
    answers' axes' sizes."""
    schema, other = spec.schema, earlier.schema
    try:
        query = build_query(schema, setting.query)
    except QueryError as exc:
        raise ConfigError(f"{where}: query: {exc}") from None
    terms = canonical_name(setting.query).split(CROSS)
    if query.name in ("total", "detailed") or query.is_identity:
        raise ConfigError(f"{where}: query {setting.query!r}: name its terms (each one has a counterpart among the "
                          f"attributes of {earlier.name}: {', '.join(other.dim_names)})")
    if unused := sorted(set(setting.attributes) - set(terms)):
        raise ConfigError(f"{where}: attributes.{unused[0]}: not a term of query {query.name!r}")
    targets = {}
    for term in terms:
        target = setting.attributes.get(term, term if term in other.dim_names else None)
        if target is None:
            raise ConfigError(f"{where}: the recode from {spec.name}'s {term!r} to an attribute of {earlier.name} "
                              f"({', '.join(other.dim_names)}) is not declared: add attributes.{term} = "
                              "\"<attribute>\"")
        if target not in other.dim_names:
            raise ConfigError(f"{where}: attributes.{term}: {earlier.name} has no attribute {target!r} (its "
                              f"attributes: {', '.join(other.dim_names)}){did_you_mean(target, list(other.dim_names))}")
        groups = query.sizes[_axis(schema, term)]
        if other.dims[other.axis(target)][1] != groups:
            raise ConfigError(f"{where}: {term!r} has {groups} groups but {earlier.name}'s {target!r} has "
                              f"{other.dims[other.axis(target)][1]} levels")
        targets[term] = target
    if len(set(targets.values())) < len(targets):
        raise ConfigError(f"{where}: two terms of {query.name!r} recode to the same attribute of {earlier.name}")
    mine = sorted(terms, key=lambda t: _axis(schema, t))  # the order of this query's answer axes
    theirs = sorted(terms, key=lambda t: other.axis(targets[t]))
    earlier_query = build_query(other, CROSS.join(targets[t] for t in theirs))
    return (query, earlier_query, tuple(theirs.index(t) for t in mine),
            tuple(other.dims[other.axis(targets[t])][1] for t in theirs))


def _axis(schema, term: str) -> int:
    """The schema axis a query term (an attribute or a recode) acts on."""
    return schema.axis(term if term in schema.dim_names else schema.recodes[term][0])


def matched_levels(matched: dict[str, Matched], spine: Spine, levels: dict[str, list[Level]]) -> None:
    """Give every level of each matched product its earlier run's published counts (``Level.matched``), after
    checking that the earlier run's spine is this run's: the same blocks, each in the same node at every level."""
    for product, m in matched.items():
        _same_spine(m, spine)
        for level in levels[product]:
            table = m.reader.table(m.reader.histograms(m.earlier.name, level.name), ["geocode", "cell", "count"])
            rows = level.nodes.get_indexer(table["geocode"].astype(str))
            if (rows < 0).any():
                raise ConfigError(f"{_where_run(m)}: {level.name} node {table['geocode'].iloc[np.argmax(rows < 0)]!r} "
                                  "of its histograms is not a node of this run's spine")
            hist = sp.csr_matrix((table["count"].to_numpy(np.int64), (rows, table["cell"].to_numpy(np.int64))),
                                 shape=(len(level), m.earlier.schema.ncells), dtype=np.int64)
            level.matched = MatchedCounts(CONSTRAINT, m.query.name, m.answers(hist))


def _where_run(m: Matched) -> str:
    return f"[{m.product.name}.estimation] match_published: run {m.reader.root}"


def _same_spine(m: Matched, spine: Spine) -> None:
    """The earlier run's spine has this run's blocks and, level by level, puts each in the same node."""
    columns = ["geoid", *spine.levels]
    earlier = m.reader.spine_table()
    mine = spine.table[columns].astype(str).sort_values("geoid", ignore_index=True)
    theirs = earlier[[c for c in columns if c in earlier.columns]].sort_values("geoid", ignore_index=True)
    if list(theirs.columns) != columns:
        raise ConfigError(f"{_where_run(m)}: its spine has columns {list(earlier.columns)}, this run's {columns}")
    if len(mine) != len(theirs) or not mine["geoid"].equals(theirs["geoid"]):
        extra = pd.Index(mine["geoid"]).symmetric_difference(pd.Index(theirs["geoid"]))
        raise ConfigError(f"{_where_run(m)}: its spine differs from this run's: block {extra[0]!r} is in one of them "
                          "only (the two runs must read inputs of the same blocks)")
    for level in spine.levels:
        differ = np.flatnonzero(mine[level].to_numpy() != theirs[level].to_numpy())
        if differ.size:
            raise ConfigError(f"{_where_run(m)}: its spine differs from this run's at {level}: block "
                              f"{mine['geoid'].iloc[differ[0]]!r} is in node {theirs[level].iloc[differ[0]]!r} there, "
                              f"{mine[level].iloc[differ[0]]!r} here")

