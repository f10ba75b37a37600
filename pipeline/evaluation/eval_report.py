"""Figures (matplotlib, Agg) and the one-page ``report.html`` of ``topdown evaluate`` (see evaluate.py).

Every figure comes with a one-line caption saying what to read from it, draws only series that have data
(its legend names nothing that is not drawn) and is left out, with a note saying why, when it would be empty.
Tables print counts as integers, keep the levels top-down, and say "suppressed" where a statistic over fewer
than :data:`~.metrics.MIN_NODES` geounits was blanked. Queries and products are named as the census declares
them (:class:`Declared`); a study the census declares no query for is left out with a one-line note.
"""
from __future__ import annotations

import base64
import html
import io
import textwrap
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import pandas as pd

from topdown.vocab.census import Product

from .metrics import MIN_NODES

#: Error axis of the accuracy/privacy trade-off figure (Petti & Flaxman 2020, Figure 2: their SC, at the county
#: level; the query is the census's declared ``tradeoff_query``): the mean |error| per answer, since with many
#: cells most answers are zero and the median absolute error Petti & Flaxman plot (6 races) is 0 and uninformative.
TRADEOFF_ERROR = "mean_abs_cell_error"
#: Text of a statistic blanked because it is over fewer than MIN_NODES geounits.
SUPPRESSED = "suppressed"
#: Columns that count geounits or answers (never blanked), and columns of observed errors (inverted-CDF
#: quantiles, the median and largest |error|): both print as integers when every value is a whole number.
COUNT_COLUMNS = ("n", "n_answers", "n_residuals", "n_share", "geounits")
WHOLE_COLUMNS = (*COUNT_COLUMNS, "median_abs_error", "max_abs_error")


#: Every figure the report can hold (``intervals``: evaluate --uncertainty); one left out this time has its PNG
#: of an earlier evaluation into the same folder removed, so no stale figure lies beside the report.
FIGURE_NAMES = ("mae_by_level", "errors_by_bin", "blau", "homogeneity", "epl_tradeoff", "intervals")


@dataclass(frozen=True)
class Declared:
    """What the report takes from the census declaration: the census's name, the products evaluated in order
    (the first is the headline one) with their declared studies, and whether the entities are the U.S. block
    assignment files' kinds."""

    census: str = "(undeclared)"
    products: tuple[Product, ...] = ()
    us: bool = False

    @property
    def main(self) -> Product | None:
        return self.products[0] if self.products else None

    @property
    def sampled(self) -> Product | None:
        """The product of the simple random sample baselines: the first declaring sample queries."""
        return next((p for p in self.products if p.evaluation.sample_queries), None)

    @property
    def tradeoff_query(self) -> str | None:
        return self.sampled.evaluation.tradeoff_query if self.sampled is not None else None

    def undeclared(self) -> list[str]:
        """One line per study left out because the census declares no query for it."""
        main = self.main
        if main is None:
            return []
        roles, where = main.evaluation, f"census {self.census!r} declares no"
        key = f"[census.products.{main.name}.evaluation]"
        notes = []
        if not roles.diversity_query:
            notes.append(f"The Blau diversity study is left out: {where} diversity_query in {key}.")
        if not roles.homogeneity:
            notes.append(f"The homogeneity study is left out: {where} homogeneity = true in {key}.")
        if not roles.share_query:
            notes.append(f"Off-spine entities (--entities) are not studied: {where} share_query in {key}.")
        if self.sampled is None:
            notes.append(f"The simple random sample baselines are left out: {where} sample_queries for any product.")
        elif self.tradeoff_query is None:
            notes.append(f"The accuracy/privacy trade-off figure is left out: {where} tradeoff_query in "
                         f"[census.products.{self.sampled.name}.evaluation].")
        return notes


@dataclass
class Figure:
    """One drawn figure: its matplotlib figure (closed once saved) and the caption under it."""

    fig: object
    caption: str


def _levels(frame: pd.DataFrame) -> list[str]:
    """Levels in the order the tables hold them: the run's spine order, top-down."""
    return list(dict.fromkeys(frame["level"])) if not frame.empty else []


def _tradeoff(tables: dict[str, pd.DataFrame], declared: Declared) -> tuple[str, pd.DataFrame, pd.DataFrame] | None:
    """The highest level (top-down) where a TopDown run and a sampling rate both have an estimated EPL of the
    declared trade-off query: (level, the runs' points, the sample's points per rate); None if no level has both."""
    summary, epl, sampling = tables["summary"], tables["epl"], tables["sampling"]
    query = declared.tradeoff_query
    if query is None or summary.empty or epl.empty or sampling.empty:
        return None
    keys = ["run", "product", "level", "query"]
    runs = summary[(summary["query"] == query) & (summary["product"] == declared.sampled.name)].merge(
        epl[[*keys, "epl"]], on=keys).dropna(subset=["epl", TRADEOFF_ERROR])
    srs = sampling[sampling["query"] == query].dropna(subset=["epl", TRADEOFF_ERROR])
    for level in _levels(summary):
        r, s = runs[runs["level"] == level], srs[srs["level"] == level]
        if len(r) and len(s):
            return level, r, s.groupby("rate")[["epl", TRADEOFF_ERROR]].mean().reset_index()
    return None


def _merge_identical(rows: pd.DataFrame) -> list[tuple[str, np.ndarray]]:
    """(label, values) per distinct row: rows with identical values become one line labelled "a = b", so no
    line hides under another."""
    out: list[tuple[list[str], np.ndarray]] = []
    for name, row in rows.iterrows():
        values = row.to_numpy(float)
        for names, seen in out:
            if np.allclose(values, seen, equal_nan=True):
                names.append(str(name))
                break
        else:
            out.append(([str(name)], values))
    return [(textwrap.fill(" = ".join(names), 40), values) for names, values in out]


def first_product(summary: pd.DataFrame) -> str | None:
    """The product the headline figures show: the first one evaluated (the census's first)."""
    return None if summary.empty or "product" not in summary.columns else str(summary["product"].iloc[0])


def draw_figures(tables: dict[str, pd.DataFrame], declared: Declared = Declared()) -> tuple[dict[str, Figure],
                                                                                          list[str]]:
    """The report's figures (name -> Figure) and a note for each figure left out for lack of data."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figs: dict[str, Figure] = {}
    notes: list[str] = []
    summary = tables["summary"]
    main = first_product(summary)
    headline = summary[(summary["product"] == main) & summary["mean_abs_error"].notna()] \
        if not summary.empty else summary
    levels = _levels(summary)
    if not headline.empty:
        shown = [lv for lv in levels if lv in set(headline["level"])]
        mae = headline.groupby(["query", "level"], sort=False)["mean_abs_error"].mean().unstack().reindex(columns=shown)
        fig, ax = plt.subplots(figsize=(7.5, 3.8), layout="constrained")
        for label, values in _merge_identical(mae):
            ax.plot(shown, values, marker="o", label=label)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylabel("mean L1 error per geounit")
        ax.set_title("Error by level (mean over runs)")
        ax.legend(fontsize=7, loc="upper left", bbox_to_anchor=(1.01, 1), frameon=False)
        figs["mae_by_level"] = Figure(fig, (
            f"How far each {main} query is from the truth at each level, top-down (mean L1 error per geounit, log "
            "scale above 1; lower is better); queries with the same errors share one line, named 'a = b'."))

    bins = tables["errors_by_bin"]
    if not bins.empty:
        run = bins["run"].iloc[0]
        first = bins[(bins["run"] == run) & (bins["product"] == main) & (bins["bin"] != "all")
                     & bins["q0.5"].notna()]
        wanted = [lv for lv in ("County", levels[-1]) if lv in levels]
        shown = [lv for lv in wanted if lv in set(first["level"])]
        if shown:
            fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.5), squeeze=False, layout="constrained")
            for ax, level in zip(axes[0], shown):
                f = first[first["level"] == level]
                x = np.arange(len(f))
                ax.vlines(x, f["q0.05"], f["q0.95"], lw=1, color="C0")
                ax.vlines(x, f["q0.25"], f["q0.75"], lw=5, color="C0")
                ax.plot(x, f["q0.5"], "o", color="k", ms=4)
                ax.axhline(0, color="grey", lw=0.5)
                ax.set_xticks(x, [f"{b}\n(n={n})" for b, n in zip(f["bin"], f["n"])], fontsize=7)
                ax.set_xlim(-0.6, len(f) - 0.4)
                ax.set_xlabel("true population of the geounit", fontsize=8)
                ax.set_title(f"{level}: TOTAL error by true population", fontsize=9)
                ax.set_ylabel("protected - true (5/25/50/75/95%)", fontsize=8)
            figs["errors_by_bin"] = Figure(fig, (
                f"TOTAL error of each geounit by its true population, run {run}: bar 25-75%, line 5-95%, dot the "
                f"median; a box away from 0 is a bias; bins of fewer than {MIN_NODES} geounits are left out."))
        else:
            notes.append(f"The figure of TOTAL error by true population is left out: no {' or '.join(wanted)} bin "
                         f"holds {MIN_NODES} or more geounits.")

    blau = tables["blau"]
    blau = blau[blau["mean_signed_error"].notna()] if not blau.empty else blau
    if not blau.empty:
        fig, ax = plt.subplots(figsize=(5.5, 3.5), layout="constrained")
        mean = blau.groupby(["level", "quintile"], sort=False)["mean_signed_error"].mean().unstack()
        for level in [lv for lv in levels if lv in mean.index]:
            row = mean.loc[level].dropna()
            ax.plot(row.index, row.to_numpy(), marker="o", label=level)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xticks(range(1, 6))
        ax.set_xlabel("Blau index quintile (1 = least diverse)")
        diversity = declared.main.evaluation.diversity_query if declared.main is not None else None
        ax.set_ylabel("mean signed TOTAL error")
        ax.legend(fontsize=7)
        figs["blau"] = Figure(fig, (
            "Mean signed TOTAL error by how diverse the geounits are (Blau index quintile"
            + (f" of {diversity}" if diversity else "") + "): a line above 0 adds people to such areas, below 0 "
            "takes them away."))

    hom = tables["homogeneity"]
    hom = hom[hom["bias"].notna()] if not hom.empty else hom
    shown = [lv for lv in levels[-2:] if lv in set(hom["level"])] if not hom.empty else []
    if shown:
        fig, ax = plt.subplots(figsize=(5.5, 3.5), layout="constrained")
        for level in shown:
            h = hom[hom["level"] == level].groupby("homogeneity").apply(
                lambda g: np.average(g["bias"], weights=g["n"]), include_groups=False)
            ax.plot(h.index, h.to_numpy(), ".", label=level)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("homogeneity index (true zero cells of the detailed histogram)")
        ax.set_ylabel("bias of TOTAL")
        ax.legend(fontsize=7)
        figs["homogeneity"] = Figure(fig, (
            "Bias of TOTAL against homogeneity (how many detailed cells are truly zero; right = more homogeneous): "
            "points above 0 gain people, below 0 lose them; a trend shows a bias tied to homogeneity (Petti & Flaxman "
            "2020, Figure 3)."))

    trade = _tradeoff(tables, declared)
    query = declared.tradeoff_query
    if trade is not None:
        level, runs, srs = trade
        fig, ax = plt.subplots(figsize=(5.5, 3.8), layout="constrained")
        ax.plot(srs["epl"], srs[TRADEOFF_ERROR], "s-" if len(srs) > 1 else "s", color="C1",
                label="simple random sample (rate)")
        for _, r in srs.iterrows():
            ax.annotate(f"{r['rate']:.0%}", (r["epl"], r[TRADEOFF_ERROR]), fontsize=7)
        ax.plot(runs["epl"], runs[TRADEOFF_ERROR], "*", color="C3", ms=11, zorder=3, label="TopDown run")
        for _, r in runs.iterrows():
            ax.annotate(str(r["run"]), (r["epl"], r[TRADEOFF_ERROR]), xytext=(5, -11), textcoords="offset points",
                        fontsize=8, color="C3", weight="bold")
        ax.set_xlabel("empirical privacy loss (residual-based)")
        ax.set_ylabel("mean absolute error per answer")
        ax.set_title(f"{level}, {query}", fontsize=9)
        ax.legend(fontsize=7)
        figs["epl_tradeoff"] = Figure(fig, (
            f"Accuracy against empirical privacy loss at {level} ({query}): each TopDown run beside simple "
            f"random samples of {declared.sampled.name} at the rates labelled; lower and further left is better "
            "(the highest level where both have an estimated EPL)."))
    elif query is not None and not tables["epl"].empty:
        notes.append(f"The accuracy/privacy trade-off figure is left out: no level has an estimated empirical "
                     f"privacy loss of {query} both for a TopDown run and for a simple random sample "
                     "(too few residuals, or suppressed).")
    return figs, notes


def _png(fig) -> bytes:
    import matplotlib.pyplot as plt

    buf = io.BytesIO()
    fig.savefig(buf, format="png", dpi=90, bbox_inches="tight")
    plt.close(fig)
    return buf.getvalue()


def _figures(tables: dict[str, pd.DataFrame], declared: Declared) -> tuple[dict[str, tuple[bytes, str]], list[str]]:
    """PNG bytes and caption per figure name, and the notes of figures left out."""
    figs, notes = draw_figures(tables, declared)
    return {name: (_png(f.fig), f.caption) for name, f in figs.items()}, notes


# -- tables ----------------------------------------------------------------------------------------------

def formatted(frame: pd.DataFrame) -> pd.DataFrame:
    """The cells of ``frame`` as text: integer columns, and count or observed-error columns whose values are
    all whole numbers, without decimals; other numbers with 3; a statistic blanked in a ``suppressed`` row
    says "suppressed". The ``suppressed`` column itself is dropped."""
    sup = frame["suppressed"].to_numpy(bool) if "suppressed" in frame.columns else np.zeros(len(frame), bool)
    out = {}
    for col in frame.columns:
        if col == "suppressed":
            continue
        v = frame[col]
        if pd.api.types.is_bool_dtype(v) or not pd.api.types.is_numeric_dtype(v):
            out[col] = v.map(lambda x: "" if pd.isna(x) else str(x))
            continue
        name = str(col)
        whole = pd.api.types.is_integer_dtype(v) or (
            (name in WHOLE_COLUMNS or name.startswith("q0.")) and bool((v.dropna() % 1 == 0).all()))
        text = v.map(lambda x: "" if pd.isna(x) else (f"{int(x)}" if whole else f"{x:.3f}"))
        if name not in COUNT_COLUMNS:
            text = text.mask(sup & v.isna().to_numpy(), SUPPRESSED)
        out[col] = text
    return pd.DataFrame(out, index=frame.index)


def _wide(frame: pd.DataFrame, index: list[str], value: str) -> pd.DataFrame:
    """``value`` per run as columns (formatted, "suppressed" where blanked), rows in the frame's order."""
    cells = formatted(frame[[value, *(["suppressed"] if "suppressed" in frame.columns else [])]])[value]
    wide = frame.assign(_cell=cells).pivot_table(index=index, columns="run", values="_cell", aggfunc="first",
                                                  sort=False)
    return wide.reindex(pd.MultiIndex.from_frame(frame[index].drop_duplicates()))


def _collapse_suppressed(wide: pd.DataFrame, keep: int) -> pd.DataFrame:
    """One row "(all queries)" for each group of the first ``keep`` index levels whose every cell is suppressed
    (the US and State rows of a one-state run), so that a long run of "suppressed" rows says it once."""
    parts = []
    for key, g in wide.groupby(level=list(range(keep)), sort=False):
        if len(g) > 1 and (g == SUPPRESSED).to_numpy().all():
            key = key if isinstance(key, tuple) else (key,)
            g = g.iloc[[0]].set_axis(pd.MultiIndex.from_tuples([(*key, "(all queries)")], names=wide.index.names))
        parts.append(g)
    return pd.concat(parts) if parts else wide


def _table(frame: pd.DataFrame, caption: str, note: str = "") -> str:
    """An HTML table (numbers formatted by :func:`formatted`) under its caption, with an optional note."""
    if frame.empty:
        return ""
    body = formatted(frame).to_html(na_rep="", border=0, classes="t")
    return f"<h3>{html.escape(caption)}</h3>\n{body}\n" + (f"<p>{html.escape(note)}</p>\n" if note else "")


EPL_CAPTION_TITLE = "Empirical privacy loss beside the theoretical epsilon"
EPL_CAPTION = (
    "How much could the published counts reveal about one person? The theoretical epsilon is what the proof "
    "guarantees: 'epsilon (query)' for the noisy measurement of this query at this level, 'epsilon (run)' for "
    "everything published (both converted from zCDP at the run's delta). The residual EPL looks at the errors "
    "(protected minus true) of all geounits of the level, takes the distribution as if it were one count's noise, "
    "and reports the largest log-ratio of the chances of two neighbouring errors x and x+1 (Petti & Flaxman 2020), "
    "with a 95% bootstrap interval; it only uses pairs of errors seen at least 50 times each. 'invariant' means "
    "every error is 0 (published exactly); 'too few residuals' means no such pair; 'suppressed' means fewer than "
    "3 geounits. The direct audit (topdown audit) runs TopDown many times on the data and on the data with one "
    "person moved, and gives a 95% lower confidence bound on the privacy loss that the counts of the nodes on "
    "the moved person's paths actually show (the largest over the audited nodes of the level). A value near the "
    "theoretical epsilon means the noise protects exactly as proven; a much smaller one means the estimation "
    "hides more than the proof counts, for these counts and this person; neither can prove a value above what "
    "they measure.")
EPL_ABOVE_NOTE = (
    "* marks a residual EPL above epsilon (query). That is no breach of the guarantee: a published count is "
    "computed from every noisy measurement of the run (all queries at all levels, then made non-negative "
    "integers that meet the invariants), so the bound that covers it is epsilon (run), not the epsilon of its "
    "own measurement; and the residual EPL reads the errors of many different geounits as one noise "
    "distribution, so it measures the shape that this post-processing gives the errors (many exact zeros, "
    "skew in small counts), not the mechanism.")


def _fmt_epl(row: pd.Series) -> str:
    if row["status"] != "estimated":
        return str(row["status"])
    return f"{row['epl']:.3f} [{row['epl_lo']:.3f}, {row['epl_hi']:.3f}]"


def _epl_cell(row: pd.Series) -> str:
    """:func:`_fmt_epl`, with " *" when the estimate is above the epsilon of the query's own measurement."""
    above = row["status"] == "estimated" and pd.notna(row.get("epsilon_query")) and row["epl"] > row["epsilon_query"]
    return _fmt_epl(row) + (" *" if above else "")


def epl_table(epl: pd.DataFrame, audit: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per product, level and query: the residual EPL of each run ("value [lo, hi]", with " *" when above
    epsilon (query), or its status), the direct audit's largest lower bound over the level's audited nodes, and
    the theoretical epsilons."""
    if epl.empty:
        return epl
    frame = epl.assign(cell=epl.apply(_epl_cell, axis=1))
    out = frame.pivot_table(index=["product", "level", "query"], columns="run", values="cell", aggfunc="first",
                            sort=False)
    out.columns = [f"residual EPL, {c}" for c in out.columns]
    if audit is not None and not audit.empty:
        best = audit.groupby(["product", "level", "query"], sort=False)["epl_lower"].max()
        out["audit lower bound"] = best.reindex(out.index).map(lambda v: "" if pd.isna(v) else f"{v:.3f}")
    theory = frame.groupby(["product", "level", "query"], sort=False)[["epsilon_query", "epsilon_total"]].first()
    out["epsilon (query)"] = theory["epsilon_query"].reindex(out.index).map(
        lambda v: "not measured" if pd.isna(v) else f"{v:.3f}")
    out["epsilon (run)"] = theory["epsilon_total"].reindex(out.index).map(lambda v: "" if pd.isna(v) else f"{v:.2f}")
    return out


def _epl_title(audit: pd.DataFrame | None) -> str:
    """The EPL table's title names the estimators it shows: the residual EPL, and the audit when there is one."""
    if audit is not None and not audit.empty:
        return f"{EPL_CAPTION_TITLE}: two estimators (residual EPL, direct audit lower bound)"
    return f"{EPL_CAPTION_TITLE}: the residual EPL (no audit given: topdown evaluate --audit)"


def _sampling_table(sampling: pd.DataFrame, levels: list[str], level: str | None) -> tuple[pd.DataFrame, str]:
    """The sample baselines at ``level`` (else the highest level with unsuppressed rows), mean over replicates,
    with the EPL as "value" or its status; and the level shown."""
    if level is None:
        kept = sampling[~sampling["suppressed"]] if "suppressed" in sampling.columns else sampling
        level = next((lv for lv in levels if lv in set(kept["level"])), levels[0] if levels else None)
    s = sampling[sampling["level"] == level]
    queries = {q: i for i, q in enumerate(dict.fromkeys(s["query"]))}
    s = s.sort_values(["query", "rate"], key=lambda c: c.map(queries) if c.name == "query" else c, kind="stable")

    def one(g: pd.DataFrame) -> pd.Series:
        est = g["epl"].dropna()
        epl = (f"{est.mean():.3f}" + (f" ({len(est)} of {len(g)} replicates)" if len(est) < len(g) else "")
               if len(est) else str(g["status"].iloc[0]))
        return pd.Series({"n": int(g["n"].iloc[0]), **g[["mean_abs_error", "mean_abs_cell_error",
                                                            "median_abs_error"]].mean(),
                          "empirical privacy loss": epl,
                          "suppressed": bool(g["suppressed"].all()) if "suppressed" in g else False})

    table = s.groupby(["query", "rate"], sort=False).apply(one, include_groups=False)
    table.index = table.index.set_levels([f"{r:.0%}" for r in table.index.levels[1]], level=1)
    return table.astype({"n": int, "suppressed": bool}), level


#: The entity kinds of the U.S. block assignment files (geo.baf), as the entities table's note explains them.
BAF_ENTITIES_NOTE = ("entity_type: a kind of entity of the block assignment files (place: incorporated places and "
                     "CDPs; mcd: county subdivisions; place_mcd: the county subdivision in a strong-MCD state, else "
                     "the place (the targeted entity); cd: congressional districts; vtd: voting districts; aiannh: "
                     "American Indian areas)")


def _key_tables(tables: dict[str, pd.DataFrame], levels: list[str], trade_level: str | None,
                declared: Declared) -> str:
    parts = []
    summary = tables["summary"]
    if not summary.empty:
        parts.append(_table(_collapse_suppressed(_wide(summary, ["product", "level", "query"], "mean_abs_error"), 2),
                            "Mean L1 error per geounit (paper Tables 9-10)"))
        audit = tables.get("audit")
        epl = epl_table(tables["epl"], audit)
        marked = not epl.empty and bool(epl.apply(lambda c: c.astype(str).str.endswith(" *")).to_numpy().any())
        parts.append(_table(epl, _epl_title(audit)))
        parts.append(f"<p>{html.escape(EPL_CAPTION)}</p>\n" + (f"<p>{html.escape(EPL_ABOVE_NOTE)}</p>\n" if marked else ""))
    bins = tables["errors_by_bin"]
    if not bins.empty and levels:
        run = bins["run"].iloc[0]
        first = bins[(bins["run"] == run) & bins["level"].isin(["County", levels[-1]]) & (bins["n"] > 0)]
        cols = ["product", "level", "bin", "n", "mean_abs_error", "mean_signed_error", "q0.005", "q0.05", "q0.5",
                "q0.95", "q0.995", *(["suppressed"] if "suppressed" in first.columns else [])]
        parts.append(_table(first[cols].set_index(["product", "level", "bin"]),
                            f"TOTAL error by true population, run {run} (paper Tables 11-12)",
                            "Bins without geounits are left out; quantiles are observed errors (protected - true)."))
    blau = tables["blau"]
    if not blau.empty:
        order = {lv: i for i, lv in enumerate(levels)}
        blau = blau[blau["n"] > 0].sort_values(["level", "quintile"], key=lambda c: c.map(order) if c.name == "level"
                                               else c, kind="stable")
        first = blau[blau["run"] == blau["run"].iloc[0]].set_index(["level", "quintile"])["n"]
        wide = _wide(blau, ["level", "quintile"], "mean_signed_error")
        wide.insert(0, "n", first.reindex(wide.index).to_numpy())
        parts.append(_table(wide, "Mean signed TOTAL error by Blau quintile (paper Table 13)",
                            "n: geounits in the quintile (quintiles without geounits are left out)."))
    if not tables["entities"].empty:
        ent = tables["entities"]
        cols = ["n", "mean_abs_error", "mean_signed_error", "n_share", "share_within_5pp",
                *(["suppressed"] if "suppressed" in ent.columns else [])]
        kinds = BAF_ENTITIES_NOTE if declared.us else "entity_type: a kind of entity of the --entities table"
        share = ", ".join(dict.fromkeys(p.evaluation.share_query for p in declared.products
                                        if p.evaluation.share_query))
        parts.append(_table(ent[ent["n"] > 0].set_index(["run", "entity_type", "bin"])[cols],
                            "Off-spine entities: TOTAL error and largest-group share within 5 points",
                            f"{kinds}; bin: true population of the entity; n_share: entities whose largest-group "
                            f"share ({share}) is defined. Entities are counted, not named"
                            + (": the bundled block assignment files carry codes only." if declared.us else ".")))
    sampling = tables["sampling"]
    if not sampling.empty:
        table, level = _sampling_table(sampling, levels, trade_level)
        sampled = declared.sampled.name if declared.sampled is not None else "records"
        parts.append(_table(table, f"Simple random sample baselines at {level} (mean over replicates)",
                            f"rate: share of {sampled} sampled (counts scaled by 1 / rate); the empirical privacy "
                            "loss is estimated as for the runs above."))
    rep = tables["replicates"]
    if not rep.empty:
        spread = rep.groupby(["product", "level", "query"], sort=False)["std_estimate"].agg(["mean", "max"])
        parts.append(_table(spread, "Run-to-run standard deviation of geounit estimates"))
    return "".join(parts)


CONFIDENTIAL_BANNER = ("CONFIDENTIAL: computed from the true (confidential) counts. Do not publish or share "
                       "outside the disclosure-avoidance team.")


def _figure_html(name: str, png: bytes, caption: str) -> str:
    return (f'<figure><img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{html.escape(name)}">'
            f"<figcaption>{html.escape(caption)}</figcaption></figure>")


def write_report(out: Path, tables: dict[str, pd.DataFrame], labels: list[str], figures: bool = True,
                 suppressed: bool = True, extra: tuple[dict[str, tuple[bytes, str]], str] | None = None,
                 step: Callable[[str], None] = lambda name: None, declared: Declared = Declared()) -> Path:
    """Write the PNG figures and report.html (figures embedded as data URIs, each with its caption) into
    ``out``; ``extra``: more figures (name -> PNG, caption) and HTML (the uncertainty intervals). ``step`` is
    called with "report" once the figures are drawn (a progress bar's next step); ``declared``: the census's
    names and studies."""
    imgs: dict[str, tuple[bytes, str]] = {}
    notes: list[str] = declared.undeclared()
    if figures:
        try:
            imgs, drawn = _figures(tables, declared)
            notes += drawn
        except ImportError:
            notes.append("Figures need matplotlib (pip install 'census-topdown[plots]').")
    imgs.update(extra[0] if extra else {})
    for name in FIGURE_NAMES:
        if name not in imgs:
            (out / f"{name}.png").unlink(missing_ok=True)
    for name, (png, _) in imgs.items():
        (out / f"{name}.png").write_bytes(png)
    if figures:
        step("report")
    small = (f"Statistics over fewer than {MIN_NODES} geounits are suppressed: their cells say '{SUPPRESSED}'."
             if suppressed else f"Statistics over fewer than {MIN_NODES} geounits are NOT suppressed "
             "(--no-suppress): they can pin down true counts.")
    figs = "".join(_figure_html(name, png, caption) for name, (png, caption) in imgs.items())
    note = "".join(f"<p><em>{html.escape(n)}</em></p>" for n in notes)
    summary = tables["summary"]
    trade = _tradeoff(tables, declared)
    doc = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>CONFIDENTIAL TopDown evaluation</title>
<style>body{{font-family:sans-serif;font-size:12px;margin:1em}}
figure{{display:inline-block;vertical-align:top;max-width:48%;margin:4px}} figure img{{max-width:100%}}
figcaption{{font-size:11px;color:#333}}
table.t{{border-collapse:collapse;font-size:11px;margin-bottom:1em}} .t td,.t th{{padding:1px 6px;text-align:right}}
.t tr:nth-child(even){{background:#f2f2f2}}</style></head><body>
<p style="color:#b00;font-weight:bold;font-size:14px">{html.escape(CONFIDENTIAL_BANNER)}</p>
<h2>TopDown evaluation: {html.escape(', '.join(labels))}</h2>
<p>Errors are protected minus true; only summaries over geounits are shown; levels run top-down. {html.escape(small)}</p>
{note}{figs}
{_key_tables(tables, _levels(summary), trade[0] if trade else None, declared)}{extra[1] if extra else ""}
</body></html>
"""
    path = out / "report.html"
    path.write_text(doc)
    return path
