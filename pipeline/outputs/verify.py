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
"""
from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa

from topdown.geo.spine import PREFIX, STATE, spine_state
from topdown.vocab.census import GENERIC_MDF, Hierarchy, Product
from topdown.vocab.queries import build_query

from ..execution.invariants import UNIT_COLUMNS, WHOLE_STATE, configured_below
from .mdf import tabulate_generic_mdf, tabulate_person_mdf
from ..execution.rundir import Manifest, RunReader, changed_files


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


def _parent_map(spine: pd.DataFrame, child: str, parent: str) -> pd.Series:
    pairs = spine[[child, parent]].drop_duplicates()
    return pairs.set_index(child)[parent]


def verify_run(root: str | Path) -> VerifyReport:
    """Verify a run directory; the report lists every failed check (a missing or unreadable output file is
    one). Raises :class:`RunDirError` when ``root`` holds no complete run to verify."""
    reader = RunReader(root)
    manifest = reader.complete_manifest()
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
    except (KeyError, ValueError, TypeError, IndexError) as exc:
        if not changed:  # the files are as the run wrote them: a bug
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
    """One check per file the manifest records a SHA-256 for (and per file added beside them); a note says
    how many were checked, and which outputs no recorded sum covers (a run of an older version)."""
    from ..execution.engine import level_digests  # engine imports the products, which import this module

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
    rep.notes.append(f"SHA-256: {len(recorded.keys() | found.keys())} files checked against the manifest")
    uncovered: dict[str, int] = {}
    for f in sorted(reader.root.rglob("*")):
        rel = f.relative_to(reader.root)
        if f.is_file() and str(rel) not in found and rel.parts[0] not in ("manifest.json", ".lock"):
            group = "/".join(rel.parts[:3 if rel.parts[2:3] and rel.parts[2].startswith("level=") else 2])
            uncovered[group] = uncovered.get(group, 0) + 1
    if uncovered:
        rep.notes.append("no SHA-256 recorded in the manifest, not checked: " + ", ".join(
            g if (reader.root / g).is_file() else f"{g}/ ({n} file{'s' * (n > 1)})" for g, n in uncovered.items()))


def _verify(reader: RunReader, manifest: Manifest, rep: VerifyReport) -> None:
    levels = manifest.levels
    spine = reader.spine_table()
    rep.check(list(spine.columns) == ["geoid", *levels], "spine.parquet columns are not geoid + the manifest's levels")
    relaxed = {(f["product"], f["level"], f["parent"]) for f in manifest.failsafe if f.get("parent_relaxed")}
    for product, level, parent in sorted(relaxed):
        rep.notes.append(f"{product} {level}: parent {parent!r} needed the failsafe's parent relaxation (manifest)")
    if manifest.algorithm == "block_by_block":
        rep.notes.append("block-by-block run: totals above the block level are sums of blocks, not invariants "
                         "(TDA paper, Appendix A); their checks are skipped")
    products = reader.products()  # a lost config.json is a failed SHA-256 check (read as P.L. 94-171's)
    hierarchy = reader.hierarchy()
    for product in products:
        _verify_product(reader, product, levels, spine, rep, {p for (pr, _, p) in relaxed if pr == product.name},
                        totals_invariant=manifest.algorithm != "block_by_block", hierarchy=hierarchy)


def _verify_product(reader: RunReader, spec: Product, levels: list[str], spine: pd.DataFrame, rep: VerifyReport,
                    relaxed: set[str], totals_invariant: bool, hierarchy: Hierarchy) -> None:
    product, schema = spec.name, spec.schema
    inv = reader.table(reader.invariants(product))
    hists = {}
    for level in levels:
        h = reader.table(reader.histograms(product, level))
        h["geocode"] = h["geocode"].astype(str)
        hists[level] = h
        rep.check(h["count"].dtype.kind in "iu", f"{product} {level}: counts are not integers")
        rep.check(bool((h["count"] >= 0).all()), f"{product} {level}: negative counts")
        rep.check(bool(h["cell"].between(0, schema.ncells - 1).all()), f"{product} {level}: cell out of range")
        rep.check(not h.duplicated(["geocode", "cell"]).any(), f"{product} {level}: duplicate (geocode, cell) rows")
        nodes = set(spine[level])
        rep.check(set(h["geocode"]) <= nodes, f"{product} {level}: histogram geocode not in the spine")
    for parent, child in zip(levels[:-1], levels[1:]):
        pmap = _parent_map(spine, child, parent)
        c = hists[child].assign(parent=lambda d: d["geocode"].map(pmap))
        summed = c.groupby(["parent", "cell"])["count"].sum()
        summed = summed[summed != 0]
        p = hists[parent].set_index(["geocode", "cell"])["count"]
        p = p[p != 0]
        p.index.names = ["parent", "cell"]
        diff = summed.sub(p, fill_value=0)
        bad = diff[(diff != 0) & ~diff.index.get_level_values("parent").isin(relaxed)]
        rep.check(bad.empty, f"{product} {child}: children do not sum to their {parent} parent "
                             f"(first: parent {bad.index[0][0]!r}, cell {bad.index[0][1]})" if not bad.empty else "")
    verify_declared(reader, hists, inv, spine, rep, totals_invariant, spec, hierarchy)


def _verify_person_mdf(reader: RunReader, spec: Product, hists: dict[str, pd.DataFrame], spine: pd.DataFrame,
                       rep: VerifyReport, hierarchy: Hierarchy) -> None:
    """The P.L. 94-171 persons MDF tabulates back to the block histograms."""
    levels = list(hists)
    mdf = reader.table(reader.mdf(spec.name))
    tab = tabulate_person_mdf(mdf.astype({c: str for c in ["TABBLKST", "TABBLKCOU", "TABTRACTCE", "TABBLK"]}))
    _check_mdf_blocks(spec.name, hists[levels[-1]], spine, levels[-1], tab, rep)


def _verify_unit_mdf(reader: RunReader, spec: Product, hists: dict[str, pd.DataFrame], spine: pd.DataFrame,
                     rep: VerifyReport, hierarchy: Hierarchy) -> None:
    """The P.L. 94-171 units MDF has one housing-unit row per unit of the block histograms."""
    mdf = reader.table(reader.mdf(spec.name))
    hu = int((mdf["RTYPE"] == "2").sum())
    rep.check(hu == int(hists[list(hists)[-1]]["count"].sum()),
              f"{spec.name} MDF housing-unit rows differ from the block histograms")


def _verify_generic_mdf(reader: RunReader, spec: Product, hists: dict[str, pd.DataFrame], spine: pd.DataFrame,
                        rep: VerifyReport, hierarchy: Hierarchy) -> None:
    """A generic MDF tabulates back to the leaf histograms."""
    leaf = list(hists)[-1]
    tab = tabulate_generic_mdf(reader.table(reader.mdf(spec.name)), spec, hierarchy)
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


#: The MDF checks of the declared layouts (``Product.mdf``).
MDF_CHECKS = {"pl94_persons": _verify_person_mdf, "pl94_units": _verify_unit_mdf, GENERIC_MDF: _verify_generic_mdf}


def _active_zeros(reader: RunReader, spec: Product, levels: list[str]) -> dict[str, set[str]] | None:
    """Per level, the constraints the run configures there or below (a structural zero holds where configured);
    None when the run's configuration cannot be read (every declared zero is then checked)."""
    try:
        cfg = reader.config().product(spec.name)
    except Exception:  # an unreadable or changed config.json is reported by the SHA-256 check
        return None
    return {level: configured_below(cfg.constraints, levels, level) for level in levels}


def verify_declared(reader: RunReader, hists: dict[str, pd.DataFrame], inv: pd.DataFrame, spine: pd.DataFrame,
                    rep: VerifyReport, totals_invariant: bool, spec: Product, hierarchy: Hierarchy) -> None:
    """The product's declared invariants and constraints hold at every level: its unit bounds, its structural
    zeros (where the run configures them), its total (a state's as the sum over its parts) and its housing-unit
    counts; its MDF tabulates back to the leaves."""
    product, schema, bounds = spec.name, spec.schema, spec.unit_bounds
    levels = list(hists)
    state = spine_state(reader.spine_path)
    type_of_cell = None if bounds is None else schema.unravel(np.arange(schema.ncells))[schema.axis(bounds.attribute)]
    zeros = {c.name: build_query(schema, c.query).groups >= 0 for c in spec.constraints.values() if c.rhs == "zero"}
    active = _active_zeros(reader, spec, levels) if zeros else None
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
    if spec.mdf in MDF_CHECKS:
        MDF_CHECKS[spec.mdf](reader, spec, hists, spine, rep, hierarchy)
