"""The evaluation report reads right (pipeline/evaluation/eval_report.py): figures with a
caption, no legend entry for an undrawn series, no empty panel; integers as integers; levels top-down;
suppressed cells say so. Built on hand-made evaluation tables shaped like a one-state run's."""
from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from topdown.pipeline.configuration.census import PL94, load_census
from topdown.pipeline.evaluation import eval_report as R
from topdown.pipeline.evaluation.intervals import coverage_summary, geounit_label, interval_caption

LEVELS = ["US", "State", "County", "Tract", "Block_Group", "Block"]
N = {"US": 1, "State": 1, "County": 2, "Tract": 15, "Block_Group": 40, "Block": 900}  # County: 2, suppressed
#: The report of a P.L. 94-171 run: its declared studies (trade-off query SC).
PL = R.Declared(PL94.name, PL94.products, us=True)
SC = PL.tradeoff_query
QUERIES = ["total", "hhgq", SC]


def _key(level: str, **more) -> dict:
    return {"run": "r", "seed": "1", "product": "persons", "level": level, **more}


def _tables(srs_epl_levels=("Block_Group", "Block")) -> dict[str, pd.DataFrame]:
    """Tables as evaluate() writes them after suppression: US, State and County statistics blank; total and hhgq
    with equal errors at every level (one line must show both); the sample's EPL estimated only at
    ``srs_epl_levels``."""
    summary, epl, sampling, bins, blau, hom = [], [], [], [], [], []
    for i, level in enumerate(LEVELS):
        n, small = N[level], N[level] < 3
        for query in QUERIES:
            err = np.nan if small else (10.0 / (i + 1) if query != SC else 30.0 / (i + 1))
            summary.append({**_key(level, query=query), "n": n, "n_answers": 1, "mean_abs_error": err,
                            "mean_abs_cell_error": err / 4, "median_abs_error": err, "suppressed": small})
            status = ("suppressed (fewer than 3 geounits)" if small else
                      "estimated" if query != "hhgq" else "too few residuals")
            value = 0.5 + i / 10 if status == "estimated" else np.nan
            epl.append({**_key(level, query=query), "n": n, "n_residuals": n, "status": status, "epl": value,
                        "epl_lo": value - 0.1, "epl_hi": value + 0.1, "epsilon_query": 0.6, "epsilon_total": 17.1,
                        "suppressed": small})
        for rate in (0.1, 0.5):
            for query in ("total", SC):
                est = level in srs_epl_levels and not small
                sampling.append({"rate": rate, "replicate": 0, "level": level, "query": query, "sampling_seed": 0,
                                 "n": n, "mean_abs_error": np.nan if small else 100 * (1 - rate),
                                 "median_abs_error": np.nan if small else 50.0,
                                 "mean_abs_cell_error": np.nan if small else 10 * (1 - rate),
                                 "status": "suppressed (fewer than 3 geounits)" if small else
                                 "estimated" if est else "too few residuals",
                                 "epl": 2 + rate if est else np.nan, "epl_lo": np.nan, "epl_hi": np.nan,
                                 "suppressed": small})
        edges = ["0", "1-9", "10-99", "100-999", "1000+"] if level == "Block" else ["0-1000", "1001-9999", "10000+"]
        for j, b in enumerate([*edges, "all"]):
            cnt = 0 if b == edges[-1] else (n if b == "all" else (n if j == 0 else 0) if small else n // 3)
            stat = np.nan if cnt < 3 else float(j)
            bins.append({**_key(level, query="total"), "bin": b, "n": cnt, "mean_abs_error": stat,
                         "mean_signed_error": stat, "mean_rel_abs_error": stat,
                         **{f"q{q}": (np.nan if cnt < 3 else float(j - 2)) for q in
                            ("0.005", "0.025", "0.05", "0.25", "0.5", "0.75", "0.95", "0.975", "0.995")},
                         "suppressed": 0 < cnt < 3})
        for q in range(1, 6):
            cnt = (1 if q == 5 else 0) if small else n // 5
            blau.append({**_key(level), "quintile": q, "n": cnt, "blau_min": 0.0, "blau_max": 1.0,
                         "mean_signed_error": np.nan if cnt < 3 else q - 3.0, "mean_abs_error": np.nan if cnt < 3
                         else 1.0, "suppressed": cnt < 3})
        for h in (2000, 2010):
            hom.append({**_key(level), "homogeneity": h, "n": n, "bias": np.nan if small else h / 1000 - 2,
                        "mean_abs_error": np.nan if small else 1.0, "suppressed": small})
    return {"summary": pd.DataFrame(summary), "epl": pd.DataFrame(epl), "sampling": pd.DataFrame(sampling),
            "errors_by_bin": pd.DataFrame(bins), "blau": pd.DataFrame(blau), "homogeneity": pd.DataFrame(hom),
            "entities": pd.DataFrame(), "replicates": pd.DataFrame()}


def _drawn(ax) -> list:
    """Artists of ``ax`` that show data (lines with a finite point, line collections with a segment)."""
    out = []
    for line in ax.get_lines():
        x, y = np.asarray(line.get_xdata(), dtype=object), np.asarray(line.get_ydata(), dtype=float)
        if line.get_label().startswith("_") and len(x) == 2 and np.ptp(y) == 0:
            continue  # an axhline
        if np.isfinite(y).any():
            out.append(line)
    return out + [c for c in ax.collections if len(c.get_paths()) or len(getattr(c, "get_segments", list)())]


@pytest.fixture(scope="module")
def drawn():
    pytest.importorskip("matplotlib")
    figs, notes = R.draw_figures(_tables(), PL)
    yield figs, notes
    import matplotlib.pyplot as plt

    for f in figs.values():
        plt.close(f.fig)


def test_every_figure_has_a_one_line_caption(drawn):
    figs, _ = drawn
    assert set(figs) == {"mae_by_level", "errors_by_bin", "blau", "homogeneity", "epl_tradeoff"}
    for name, f in figs.items():
        assert f.caption and "\n" not in f.caption and f.caption.endswith("."), name
        assert len(f.caption) < 320, name


def test_no_empty_panel_and_no_legend_entry_for_an_undrawn_series(drawn):
    figs, _ = drawn
    for name, f in figs.items():
        for ax in f.fig.axes:
            shown = _drawn(ax)
            assert shown, f"{name}: empty panel {ax.get_title()!r}"
            legend = ax.get_legend()
            if legend is not None:
                labels = {t.get_text() for t in legend.get_texts()}
                assert labels <= {a.get_label() for a in shown}, name
    # the suppressed levels (US, State, County) are drawn nowhere and named in no legend
    blau = figs["blau"].fig.axes[0]
    assert [t.get_text() for t in blau.get_legend().get_texts()] == ["Tract", "Block_Group", "Block"]
    assert [t.get_text() for t in figs["homogeneity"].fig.axes[0].get_legend().get_texts()] == ["Block_Group", "Block"]


def test_a_bin_without_data_gets_no_label_and_a_level_without_bins_no_panel(drawn):
    figs, _ = drawn
    axes = figs["errors_by_bin"].fig.axes  # County's only bins hold 0 or 2 geounits: no County panel
    assert [ax.get_title() for ax in axes] == ["Block: TOTAL error by true population"]
    ticks = [t.get_text() for t in axes[0].get_xticklabels()]
    assert ticks == ["0\n(n=300)", "1-9\n(n=300)", "10-99\n(n=300)", "100-999\n(n=300)"]  # 1000+: none


def test_identical_lines_are_one_line_named_for_both(drawn):
    figs, _ = drawn
    labels = [t.get_text() for t in figs["mae_by_level"].fig.axes[0].get_legend().get_texts()]
    assert labels == ["total = hhgq", SC]
    assert [ln.get_xdata().tolist() for ln in figs["mae_by_level"].fig.axes[0].get_lines()][0] == LEVELS[3:]


def test_tradeoff_figure_at_the_highest_level_with_both_or_left_out_with_a_note():
    pytest.importorskip("matplotlib")
    import matplotlib.pyplot as plt

    figs, notes = R.draw_figures(_tables(("Block_Group", "Block")), PL)
    ax = figs["epl_tradeoff"].fig.axes[0]
    assert ax.get_title().startswith("Block_Group,") and "Block_Group" in figs["epl_tradeoff"].caption
    assert {t.get_text() for t in ax.get_legend().get_texts()} == {"simple random sample (rate)", "TopDown run"}
    assert not any("trade-off" in n for n in notes)
    for f in figs.values():
        plt.close(f.fig)
    figs, notes = R.draw_figures(_tables(()), PL)  # the sample's EPL estimated nowhere
    assert "epl_tradeoff" not in figs and any("trade-off figure is left out" in n for n in notes)
    for f in figs.values():
        plt.close(f.fig)


def test_integers_print_as_integers_and_suppressed_cells_say_so():
    frame = pd.DataFrame({"n": [17644, 2], "n_share": [3.0, 1.0], "mean_abs_error": [5.7037, np.nan],
                          "q0.5": [-3.0, np.nan], "q0.95": [1.0, np.nan], "median_abs_error": [81.5, np.nan],
                          "suppressed": [False, True]})
    out = R.formatted(frame)
    assert list(out.columns) == ["n", "n_share", "mean_abs_error", "q0.5", "q0.95", "median_abs_error"]
    assert out.iloc[0].tolist() == ["17644", "3", "5.704", "-3", "1", "81.500"]
    assert out.iloc[1].tolist() == ["2", "1", R.SUPPRESSED, R.SUPPRESSED, R.SUPPRESSED, R.SUPPRESSED]
    # a blank that is not a suppression stays blank
    assert R.formatted(pd.DataFrame({"x": [np.nan], "suppressed": [False]})).iloc[0, 0] == ""


def _html_tables(body: str) -> dict[str, str]:
    """Caption -> table HTML of report.html."""
    return dict(re.findall(r"<h3>(.*?)</h3>\s*(<table.*?</table>)", body, flags=re.S))


def test_report_tables_top_down_integers_and_suppression_notes(tmp_path: Path):
    tables = _tables()
    R.write_report(tmp_path, tables, ["r"], figures=False, declared=PL)
    body = (tmp_path / "report.html").read_text()
    found = _html_tables(body)
    mae = next(v for k, v in found.items() if k.startswith("Mean L1"))
    order = [lv for lv in re.findall(r"<th[^>]*>(\w+)</th>", mae) if lv in LEVELS]
    assert order == LEVELS  # top-down, not alphabetical
    assert mae.count(R.SUPPRESSED) == 3 and "(all queries)" in mae  # US, State, County: one row each
    srs_title = next(k for k in found if k.startswith("Simple random sample"))
    assert srs_title.startswith("Simple random sample baselines at Block_Group")  # the trade-off figure's level
    assert "<td></td>" not in found[srs_title] and ">10%<" in found[srs_title]
    R.write_report(tmp_path, _tables(()), ["r"], figures=False, declared=PL)  # no trade-off: the highest unsuppressed level
    srs = _html_tables((tmp_path / "report.html").read_text())["Simple random sample baselines at Tract (mean over "
                                                                 "replicates)"]
    assert "<td></td>" not in srs and srs.count("too few residuals") == 4 and ">15<" in srs and ".000</td>" in srs
    # a level whose every sample statistic is suppressed says so in each cell instead of 16 blank rows
    county, level = R._sampling_table(tables["sampling"], LEVELS, "County")
    cells = R.formatted(county)
    assert level == "County" and len(cells) == 4
    assert (cells[["mean_abs_error", "mean_abs_cell_error", "median_abs_error"]] == R.SUPPRESSED).all().all()
    assert cells["empirical privacy loss"].str.startswith("suppressed").all() and (cells["n"] == "2").all()
    bins = next(v for k, v in found.items() if k.startswith("TOTAL error by true population"))
    assert "<td>300</td>" in bins and "300.000" not in bins  # counts as integers, means with 3 decimals
    assert re.search(r"<td>-2</td>", bins)  # observed errors (quantiles) as integers
    assert ">0-1000<" in bins and R.SUPPRESSED in bins  # County's bin of 2 geounits says so
    assert ">1001-9999<" not in bins  # a bin without geounits is left out
    blau = next(v for k, v in found.items() if k.startswith("Mean signed TOTAL error by Blau"))
    rows = re.findall(r"<tr>\s*(?:<th[^>]*>(\w*)</th>\s*)?<th>(\d)</th>", blau)
    tract = [q for lv, q in rows][3:8]
    assert tract == ["1", "2", "3", "4", "5"]
    assert "<td></td>" not in blau


def test_epl_title_counts_its_estimators_and_stars_values_above_epsilon_query(tmp_path: Path):
    tables = _tables()
    R.write_report(tmp_path, tables, ["r"], figures=False, declared=PL)
    body = (tmp_path / "report.html").read_text()
    assert "two estimators" not in body and "the residual EPL (no audit given" in body
    assert "0.800 [0.700, 0.900] *" in body and "no breach of the guarantee" in body  # 0.8 > 0.6
    assert "0.500" not in re.findall(r"<td>([^<]*\*)</td>", body)
    tables["audit"] = pd.DataFrame({"product": "persons", "level": ["Block"], "query": "total", "epl_lower": [0.3]})
    R.write_report(tmp_path, tables, ["r"], figures=False, declared=PL)
    assert "two estimators (residual EPL, direct audit lower bound)" in (tmp_path / "report.html").read_text()


def test_every_figure_in_the_report_sits_in_a_figure_with_its_caption(tmp_path: Path):
    pytest.importorskip("matplotlib")
    extra = ({"intervals": (b"png", "Intervals, read this.")}, "")
    R.write_report(tmp_path, _tables(), ["r"], extra=extra, declared=PL)
    body = (tmp_path / "report.html").read_text()
    imgs = re.findall(r"<img [^>]*>", body)
    figures = re.findall(r"<figure><img [^>]*alt=\"(\w+)\"><figcaption>([^<]+)</figcaption></figure>", body)
    assert len(imgs) == len(figures) == 6 and all(c.strip() for _, c in figures)
    assert {n for n, _ in figures} == set(R.FIGURE_NAMES)
    assert (tmp_path / "epl_tradeoff.png").read_bytes()[:4] == b"\x89PNG"
    R.write_report(tmp_path, _tables(()), ["r"], declared=PL)  # evaluated again into the same folder: no trade-off figure now
    assert not (tmp_path / "epl_tradeoff.png").exists() and not (tmp_path / "intervals.png").exists()
    assert (tmp_path / "blau.png").exists()


def test_coverage_levels_top_down_with_integer_counts_and_entities_named_by_code():
    unc = pd.DataFrame({"product": "persons", "query": "total", "cell": 0, "method": "gls",
                        "level": ["Tract", "Tract", "Block_Group", "place"], "geocode": ["t1", "t2", "b1", "4459000"],
                        "ci90_low": [0, 0, 0, 0], "ci90_high": [10, 10, 10, 10]})
    truth = pd.Series([5, 50, 5, 5], index=pd.MultiIndex.from_tuples(
        [("Tract", "t1"), ("Tract", "t2"), ("Block_Group", "b1"), ("place", "4459000")]))
    cov = coverage_summary(unc, truth, PL94.product("persons"))
    assert cov["level"].tolist() == ["Tract", "Block_Group", "place"]
    assert cov["geounits"].dtype == np.int64 and cov["geounits"].tolist() == [2, 1, 1]
    assert R.formatted(cov)["geounits"].tolist() == ["2", "1", "1"]
    assert geounit_label("place", "4459000", LEVELS) == "place code 4459000"
    assert geounit_label("Tract", "44007000101", LEVELS) == "Tract 44007000101"
    caption = interval_caption(unc, LEVELS)  # names only the intervals drawn; entities by code
    assert "by their code" in caption and "replicate" not in caption and "\n" not in caption
    caption = interval_caption(unc[unc["level"] != "place"].assign(amc90_low=0), LEVELS)
    assert "by their code" not in caption and "AMC interval" in caption
    both = pd.concat([unc, unc.assign(method="amc", ci90_high=[10, 60, 10, 0])], ignore_index=True)
    cov = coverage_summary(both, truth, PL94.product("persons"))  # one column per method, gls first; place: 5 not in [0, 0]
    assert list(cov.columns) == ["level", "geounits", "gls_covers", "amc_covers"]
    assert cov["geounits"].tolist() == [2, 1, 1] and cov["amc_covers"].tolist() == [1, 1, 0]
    assert cov["gls_covers"].tolist() == [0.5, 1, 1]  # t2 (50) is outside [0, 10]


def test_a_study_the_census_does_not_declare_is_left_out_with_one_line():
    """P.L. 94-171 declares every study; chile_2017 none: one line each, naming the census and the key to declare."""
    assert PL.undeclared() == [] and SC == "votingage * hispanic * cenrace"
    chile = load_census("chile_2017")
    notes = R.Declared(chile.name, chile.products).undeclared()
    assert len(notes) == 4 and all("\n" not in n and "'chile_2017' declares no" in n for n in notes)
    assert [k for k in ("diversity_query", "homogeneity", "share_query", "sample_queries") if any(k in n for n in notes)] \
        == ["diversity_query", "homogeneity", "share_query", "sample_queries"]
    figs, drawn = R.draw_figures(_tables(), R.Declared(chile.name, chile.products))
    assert "epl_tradeoff" not in figs and not any("trade-off" in n for n in drawn)
    for f in figs.values():
        assert "votingage" not in f.caption
