"""Intervals for a few published counts, for users: a table and a figure (published count, GLS 90 % interval,
AMC 90 % interval, and the true count where one is known), from a ``topdown uncertainty`` file (long in
``method``: ``gls`` rows, and ``amc`` rows where replicates were given)."""
from __future__ import annotations

import io
from typing import Collection

import numpy as np
import pandas as pd

from topdown.vocab.census import Product

def interval_table(unc: pd.DataFrame, product: Product, levels: tuple[str, ...], per_level: int = 5,
                   query: str = "total", truth: pd.Series | None = None) -> pd.DataFrame:
    """The first ``per_level`` geounits (geocode order) of each of ``levels``: ``product``'s ``query`` cell 0
    with published count (where the run had its histograms), GLS estimate and interval, and the AMC interval
    (``amc90_low``, ``amc90_high``) where the file has ``amc`` rows; ``truth`` (indexed by (level, geocode))
    adds the true count."""
    rows = unc[(unc["product"] == product.name) & (unc["query"] == query) & (unc["cell"] == 0)
               & unc["level"].isin(levels)]
    gls = rows[rows["method"] == "gls"].sort_values(["level", "geocode"]).groupby("level", sort=False).head(per_level)
    table = gls[["level", "geocode", "published", "estimate", "ci90_low", "ci90_high"]].reset_index(drop=True)
    if table["published"].isna().all():
        table = table.drop(columns="published")
    amc = rows[rows["method"] == "amc"].set_index(["level", "geocode"])
    if len(amc):
        where = pd.MultiIndex.from_frame(table[["level", "geocode"]])
        table["amc90_low"] = amc["ci90_low"].reindex(where).to_numpy()
        table["amc90_high"] = amc["ci90_high"].reindex(where).to_numpy()
    if truth is not None:
        table["truth"] = truth.reindex(pd.MultiIndex.from_frame(table[["level", "geocode"]])).to_numpy()
    return table


def interval_figure(table: pd.DataFrame, spine_levels: Collection[str]) -> bytes:
    """PNG: per geounit, the GLS and AMC 90 % intervals relative to the published count (or the GLS
    estimate where there is no published column), the estimate, and the true count if present; one panel per
    level, each on its own scale (a place's interval can be a hundred times a tract's); a level not in
    ``spine_levels`` is an entity kind, its geounits named by code."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    levels = list(dict.fromkeys(table["level"]))
    sizes = [int((table["level"] == lv).sum()) for lv in levels]
    fig, axes = plt.subplots(len(levels), 1, figsize=(6.5, 0.3 * len(table) + 0.9 * len(levels) + 0.6),
                             height_ratios=[n + 1.5 for n in sizes], squeeze=False, layout="constrained")
    for ax, level in zip(axes[:, 0], levels):
        t = table[table["level"] == level]
        center = t["published"] if "published" in t.columns else t["estimate"].round()
        y = np.arange(len(t))[::-1]
        ax.hlines(y + 0.12, t["ci90_low"] - center, t["ci90_high"] - center, lw=4, color="C0",
                  label="GLS 90% interval (noisy measurements)")
        if "amc90_low" in t.columns:
            ax.hlines(y - 0.12, t["amc90_low"] - center, t["amc90_high"] - center, lw=4, color="C1",
                      label="AMC 90% interval (published count, replicates)")
        ax.plot(t["estimate"] - center, y + 0.12, "|", color="k", ms=10, mew=1.5, label="GLS estimate")
        if "truth" in t.columns and t["truth"].notna().any():
            ax.plot(t["truth"] - center, y, "x", color="C3", ms=7, label="true count")
        ax.axvline(0, color="grey", lw=0.8)
        ax.set_ylim(-0.6, len(t) - 0.4)
        ax.set_yticks(y, [geounit_label(lv, g, spine_levels) for lv, g in zip(t["level"], t["geocode"])], fontsize=7)
        ax.set_xlabel(f"{level}: persons, relative to the published count", fontsize=8)
    handles, labels = axes[0, 0].get_legend_handles_labels()
    fig.legend(handles, labels, fontsize=7, loc="outside lower center", ncol=2, frameon=False)
    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def interval_caption(table: pd.DataFrame, spine_levels: Collection[str]) -> str:
    """The one-line caption of :func:`interval_figure` for ``table``: names only the intervals drawn, and says
    that entities (of block assignment files, which carry no names) are shown by their code."""
    rep = " and the AMC interval (the Bureau's, over replicate runs)" if "amc90_low" in table.columns else ""
    codes = ("; entities are shown by their code (the block assignment files carry no names)"
             if not set(table["level"]) <= set(spine_levels) else "")
    return (f"90% intervals of a few published persons totals, relative to the published count (one panel per "
            f"level, each on its own scale): the GLS interval (from the noisy measurements){rep}; an interval that "
            f"reaches 0 covers the published count{codes}.")


def geounit_label(level: str, geocode: str, spine_levels: Collection[str]) -> str:
    """How a geounit is named in figures: "Tract 44007000101"; an off-spine entity (of block assignment files,
    which carry no names) by its code: "place code 4459000"."""
    return f"{level} {geocode}" if level in spine_levels else f"{level} code {geocode}"


def coverage_summary(unc: pd.DataFrame, truth: pd.Series, product: Product, query: str = "total") -> pd.DataFrame:
    """Share of ``product``'s geounits per level whose 90 % interval of each method in the file (``gls_covers``,
    ``amc_covers``...) covers the truth - a summary only. Levels in the order the file holds them (the
    spine's, top-down, then the entity kinds); geounits an integer."""
    rows = unc[(unc["product"] == product.name) & (unc["query"] == query) & (unc["cell"] == 0)]
    t = truth.reindex(pd.MultiIndex.from_frame(rows[["level", "geocode"]])).to_numpy()
    rows = rows.assign(truth=t, covers=(rows["ci90_low"] <= t) & (t <= rows["ci90_high"])).dropna(subset=["truth"])
    out = rows.astype({"covers": float}).pivot_table(index="level", columns="method", values="covers",
                                                     aggfunc="mean", sort=False)
    out = out[sorted(out.columns, key=lambda m: (m != "gls", m))]  # gls first
    out.columns = [f"{m}_covers" for m in out.columns]
    out.insert(0, "geounits", rows[rows["method"] == "gls"].groupby("level", sort=False).size())
    return out.reset_index().astype({"geounits": np.int64})


def truth_totals(truth_blocks: pd.DataFrame, spine: pd.DataFrame, entities: pd.DataFrame | None) -> pd.Series:
    """True totals (of one product) indexed by (level, geocode) for every spine level and entity, from block
    histograms (geocode = block GEOID, count) - for evaluation against a known truth only."""
    per_block = truth_blocks.groupby("geocode")["count"].sum()
    frames = []
    sp = spine.assign(n=spine["geoid"].map(per_block).fillna(0))
    for level in spine.columns[1:]:
        s = sp.groupby(level)["n"].sum()
        frames.append(pd.Series(s.to_numpy(), index=pd.MultiIndex.from_arrays([[level] * len(s), s.index.astype(str)])))
    if entities is not None:
        e = entities.assign(n=entities["geoid"].map(per_block).fillna(0)).groupby(["entity_type", "entity"])["n"].sum()
        frames.append(e)
    out = pd.concat(frames)
    out.index = out.index.set_names(["level", "geocode"])
    return out
