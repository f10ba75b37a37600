"""Figures (matplotlib, Agg) and the one-page ``report.html`` of ``topdown evaluate`` (see evaluate.py)."""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import numpy as np
import pandas as pd

from topdown.vocab.schema import PERSONS

#: Query and level of the accuracy/privacy trade-off figure (Petti & Flaxman 2020, Figure 2: county SC). Its
#: error axis is the mean |error| per answer: with 63 race combinations most SC answers are zero, so the
#: median absolute error Petti & Flaxman plot (6 races) is 0 here and uninformative.
TRADEOFF_ERROR = "mean_abs_cell_error"
TRADEOFF_QUERY = "votingage * hispanic * cenrace"
TRADEOFF_LEVEL = "County"


def _tradeoff_level(levels: list[str]) -> str:
    return TRADEOFF_LEVEL if TRADEOFF_LEVEL in levels else levels[min(2, len(levels) - 1)]


def _levels(summary: pd.DataFrame) -> list[str]:
    return list(dict.fromkeys(summary["level"])) if not summary.empty else []


def _figures(tables: dict[str, pd.DataFrame]) -> dict[str, bytes]:
    """PNG bytes per figure name; figures whose table is empty are skipped."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    out: dict[str, bytes] = {}

    def save(fig, name: str) -> None:
        buf = io.BytesIO()
        fig.tight_layout()
        fig.savefig(buf, format="png", dpi=90)
        plt.close(fig)
        out[name] = buf.getvalue()

    summary = tables["summary"]
    persons = summary[summary["product"] == PERSONS.name] if not summary.empty else summary
    levels = _levels(persons)
    if not persons.empty:
        fig, ax = plt.subplots(figsize=(6.5, 3.8))
        mae = persons.groupby(["query", "level"], sort=False)["mean_abs_error"].mean().unstack()
        for query, row in mae.iterrows():
            ax.plot(levels, row.reindex(levels).to_numpy(), marker="o", label=query)
        ax.set_yscale("symlog", linthresh=1)
        ax.set_ylabel("mean L1 error per geounit")
        ax.set_title("Error by level (mean over runs)")
        ax.legend(fontsize=7, ncol=2)
        save(fig, "mae_by_level")

    bins = tables["errors_by_bin"]
    if not bins.empty:
        first = bins[(bins["run"] == bins["run"].iloc[0]) & (bins["product"] == PERSONS.name) & (bins["bin"] != "all")]
        shown = [lv for lv in ("County", levels[-1] if levels else None) if lv in set(first["level"])]
        if shown:
            fig, axes = plt.subplots(1, len(shown), figsize=(4.2 * len(shown), 3.5), squeeze=False)
            for ax, level in zip(axes[0], shown):
                f = first[(first["level"] == level) & (first["n"] > 0)]
                x = np.arange(len(f))
                ax.vlines(x, f["q0.05"], f["q0.95"], lw=1, color="C0")
                ax.vlines(x, f["q0.25"], f["q0.75"], lw=5, color="C0")
                ax.plot(x, f["q0.5"], "o", color="k", ms=4)
                ax.axhline(0, color="grey", lw=0.5)
                ax.set_xticks(x, f["bin"], fontsize=7)
                ax.set_title(f"{level}: TOTAL error by true population", fontsize=9)
                ax.set_ylabel("protected - true (5/25/50/75/95%)", fontsize=8)
            save(fig, "errors_by_bin")

    blau = tables["blau"]
    if not blau.empty:
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        mean = blau.groupby(["level", "quintile"], sort=False)["mean_signed_error"].mean().unstack()
        for level in [lv for lv in levels if lv in mean.index]:
            ax.plot(mean.columns, mean.loc[level], marker="o", label=level)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("Blau index quintile (1 = least diverse)")
        ax.set_ylabel("mean signed TOTAL error")
        ax.legend(fontsize=7)
        save(fig, "blau")

    hom = tables["homogeneity"]
    if not hom.empty:
        shown = [lv for lv in levels[-2:] if lv in set(hom["level"])]
        fig, ax = plt.subplots(figsize=(5.5, 3.5))
        for level in shown:
            h = hom[hom["level"] == level].groupby("homogeneity").apply(
                lambda g: np.average(g["bias"], weights=g["n"]), include_groups=False)
            ax.plot(h.index, h.to_numpy(), ".", label=level)
        ax.axhline(0, color="grey", lw=0.5)
        ax.set_xlabel("homogeneity index (true zero cells of the detailed histogram)")
        ax.set_ylabel("bias of TOTAL")
        ax.legend(fontsize=7)
        save(fig, "homogeneity")

    epl, sampling = tables["epl"], tables["sampling"]
    if not epl.empty and levels:
        level = _tradeoff_level(levels)
        runs = summary[(summary["level"] == level) & (summary["query"] == TRADEOFF_QUERY)].merge(
            epl[["run", "product", "level", "query", "epl"]], on=["run", "product", "level", "query"]).dropna(
            subset=["epl", TRADEOFF_ERROR])
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        if not sampling.empty:
            s = sampling[(sampling["level"] == level) & (sampling["query"] == TRADEOFF_QUERY)]
            s = s.dropna(subset=["epl", TRADEOFF_ERROR]).groupby("rate")[["epl", TRADEOFF_ERROR]].mean().reset_index()
            ax.plot(s["epl"], s[TRADEOFF_ERROR], "s-", color="C1", label="simple random sample")
            for _, r in s.iterrows():
                ax.annotate(f"{r['rate']:.0%}", (r["epl"], r[TRADEOFF_ERROR]), fontsize=7)
        ax.plot(runs["epl"], runs[TRADEOFF_ERROR], "o", color="C0", label="TopDown runs")
        for _, r in runs.iterrows():
            ax.annotate(str(r["run"]), (r["epl"], r[TRADEOFF_ERROR]), fontsize=7)
        ax.set_xlabel("empirical privacy loss (residual-based)")
        ax.set_ylabel("mean absolute error per answer")
        ax.set_title(f"{level}, {TRADEOFF_QUERY}", fontsize=9)
        ax.legend(fontsize=7)
        save(fig, "epl_tradeoff")
    return out


def _table(frame: pd.DataFrame, caption: str) -> str:
    if frame.empty:
        return ""
    body = frame.to_html(float_format=lambda v: f"{v:.3f}", na_rep="", border=0, classes="t")
    return f"<h3>{html.escape(caption)}</h3>\n{body}\n"


EPL_CAPTION_TITLE = "Empirical privacy loss: two estimators beside the theoretical epsilon"
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


def _fmt_epl(row: pd.Series) -> str:
    if row["status"] != "estimated":
        return str(row["status"])
    return f"{row['epl']:.3f} [{row['epl_lo']:.3f}, {row['epl_hi']:.3f}]"


def epl_table(epl: pd.DataFrame, audit: pd.DataFrame | None = None) -> pd.DataFrame:
    """Per product, level and query: the residual EPL of each run ("value [lo, hi]" or its status), the
    direct audit's largest lower bound over the level's audited nodes, and the theoretical epsilons."""
    if epl.empty:
        return epl
    frame = epl.assign(cell=epl.apply(_fmt_epl, axis=1))
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


def _key_tables(tables: dict[str, pd.DataFrame]) -> str:
    parts = []
    summary = tables["summary"]
    if not summary.empty:
        levels = _levels(summary)
        mae = summary.pivot_table(index=["product", "level", "query"], columns="run", values="mean_abs_error", sort=False)
        parts.append(_table(mae, "Mean L1 error per geounit (paper Tables 9-10)"))
        parts.append(_table(epl_table(tables["epl"], tables.get("audit")), EPL_CAPTION_TITLE))
        parts.append(f"<p>{html.escape(EPL_CAPTION)}</p>\n")
        bins = tables["errors_by_bin"]
        first = bins[(bins["run"] == bins["run"].iloc[0]) & (bins["level"].isin(["County", levels[-1]]))]
        cols = ["product", "level", "bin", "n", "mean_abs_error", "mean_signed_error", "q0.005", "q0.05", "q0.5",
                "q0.95", "q0.995"]
        parts.append(_table(first[cols].set_index(["product", "level", "bin"]),
                            f"TOTAL error by true population, run {bins['run'].iloc[0]} (paper Tables 11-12)"))
    if not tables["blau"].empty:
        blau = tables["blau"].pivot_table(index=["level", "quintile"], columns="run", values="mean_signed_error",
                                          sort=False)
        parts.append(_table(blau, "Mean signed TOTAL error by Blau quintile (paper Table 13)"))
    if not tables["entities"].empty:
        ent = tables["entities"]
        parts.append(_table(ent[ent["n"] > 0].set_index(["run", "entity_type", "bin"])
                            [["n", "mean_abs_error", "mean_signed_error", "n_share", "share_within_5pp"]],
                            "Off-spine entities: TOTAL error and largest-group share within 5 points"))
    if not tables["sampling"].empty:
        s = tables["sampling"].groupby(["level", "query", "rate"], sort=False)[["mean_abs_error", "mean_abs_cell_error", "median_abs_error", "epl"]].mean()
        level = _tradeoff_level(_levels(summary)) if not summary.empty else None
        s = s.loc[[level]] if level in s.index.get_level_values(0) else s
        parts.append(_table(s, "Simple random sample baselines (mean over replicates)"))
    rep = tables["replicates"]
    if not rep.empty:
        spread = rep.groupby(["product", "level", "query"], sort=False)["std_estimate"].agg(["mean", "max"])
        parts.append(_table(spread, "Run-to-run standard deviation of geounit estimates"))
    return "".join(parts)


CONFIDENTIAL_BANNER = ("CONFIDENTIAL: computed from the true (confidential) counts. Do not publish or share "
                       "outside the disclosure-avoidance team.")


def write_report(out: Path, tables: dict[str, pd.DataFrame], labels: list[str], figures: bool = True,
                 suppressed: bool = True, extra: tuple[dict[str, bytes], str] | None = None) -> Path:
    """Write the PNG figures and report.html (figures embedded as data URIs) into ``out``; ``extra``: more
    figures and HTML (the uncertainty intervals)."""
    imgs, note = {}, ""
    if figures:
        try:
            imgs = _figures(tables)
        except ImportError:
            note = "<p><em>Figures need matplotlib (pip install 'census-topdown[plots]').</em></p>"
    imgs.update(extra[0] if extra else {})
    for name, png in imgs.items():
        (out / f"{name}.png").write_bytes(png)
    small = ("Statistics over fewer than 3 geounits are suppressed." if suppressed else
             "Statistics over fewer than 3 geounits are NOT suppressed (--no-suppress): they can pin down true counts.")
    figs = "".join(f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{name}">'
                   for name, png in imgs.items())
    doc = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>CONFIDENTIAL TopDown evaluation</title>
<style>body{{font-family:sans-serif;font-size:12px;margin:1em}} img{{max-width:48%;margin:2px}}
table.t{{border-collapse:collapse;font-size:11px;margin-bottom:1em}} .t td,.t th{{padding:1px 6px;text-align:right}}
.t tr:nth-child(even){{background:#f2f2f2}}</style></head><body>
<p style="color:#b00;font-weight:bold;font-size:14px">{html.escape(CONFIDENTIAL_BANNER)}</p>
<h2>TopDown evaluation: {html.escape(', '.join(labels))}</h2>
<p>Errors are protected minus true; only summaries over geounits are shown. {html.escape(small)}</p>
{note}{figs}
{_key_tables(tables)}{extra[1] if extra else ""}
</body></html>
"""
    path = out / "report.html"
    path.write_text(doc)
    return path
