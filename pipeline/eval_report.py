"""Figures (matplotlib, Agg) and the one-page ``report.html`` of ``topdown evaluate`` (see evaluate.py)."""
from __future__ import annotations

import base64
import html
import io
from pathlib import Path

import numpy as np
import pandas as pd

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
    persons = summary[summary["product"] == "persons"] if not summary.empty else summary
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
        first = bins[(bins["run"] == bins["run"].iloc[0]) & (bins["product"] == "persons") & (bins["bin"] != "all")]
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
            epl[["run", "product", "level", "query", "epl"]], on=["run", "product", "level", "query"])
        fig, ax = plt.subplots(figsize=(5.5, 3.8))
        if not sampling.empty:
            s = sampling[(sampling["level"] == level) & (sampling["query"] == TRADEOFF_QUERY)]
            s = s.groupby("rate")[["epl", TRADEOFF_ERROR]].mean().reset_index()
            ax.plot(s["epl"], s[TRADEOFF_ERROR], "s-", color="C1", label="simple random sample")
            for _, r in s.iterrows():
                ax.annotate(f"{r['rate']:.0%}", (r["epl"], r[TRADEOFF_ERROR]), fontsize=7)
        ax.plot(runs["epl"], runs[TRADEOFF_ERROR], "o", color="C0", label="TopDown runs")
        for _, r in runs.iterrows():
            ax.annotate(str(r["run"]), (r["epl"], r[TRADEOFF_ERROR]), fontsize=7)
        ax.set_xlabel("empirical privacy loss")
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


def _key_tables(tables: dict[str, pd.DataFrame]) -> str:
    parts = []
    summary = tables["summary"]
    if not summary.empty:
        levels = _levels(summary)
        mae = summary.pivot_table(index=["product", "level", "query"], columns="run", values="mean_abs_error", sort=False)
        parts.append(_table(mae, "Mean L1 error per geounit (paper Tables 9-10)"))
        epl = tables["epl"].pivot_table(index=["product", "level", "query"], columns="run", values="epl", sort=False)
        parts.append(_table(epl, "Empirical privacy loss (KDE bandwidth factor 0.1)"))
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


def write_report(out: Path, tables: dict[str, pd.DataFrame], labels: list[str], figures: bool = True,
                 extra: tuple[dict[str, bytes], str] | None = None) -> Path:
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
    figs = "".join(f'<img src="data:image/png;base64,{base64.b64encode(png).decode()}" alt="{name}">'
                   for name, png in imgs.items())
    doc = f"""<!doctype html>
<html><head><meta charset="utf-8"><title>TopDown evaluation</title>
<style>body{{font-family:sans-serif;font-size:12px;margin:1em}} img{{max-width:48%;margin:2px}}
table.t{{border-collapse:collapse;font-size:11px;margin-bottom:1em}} .t td,.t th{{padding:1px 6px;text-align:right}}
.t tr:nth-child(even){{background:#f2f2f2}}</style></head><body>
<h2>TopDown evaluation: {html.escape(', '.join(labels))}</h2>
<p>Errors are protected minus true; only summaries over geounits are shown.</p>
{note}{figs}
{_key_tables(tables)}{extra[1] if extra else ""}
</body></html>
"""
    path = out / "report.html"
    path.write_text(doc)
    return path
