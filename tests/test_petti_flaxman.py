"""benchmarks/petti_flaxman.py: Petti and Flaxman's errors of e2e_1940 runs (median, p95 and
RMSE of |DP - exact| per level, numpy's linear quantiles; TC over all geounits, SC = voting age x ethnicity x
race and the 192 single cells over the answers not zero in both), checked against an independent pandas
computation from the input records and the run's histograms; a zero-noise run has no error; runs pool by
epsilon; the evaluation file is private and holds no true count; bad paths fail cleanly."""
from __future__ import annotations

import importlib.util
import json
import stat
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from rel_inputs import leaked_secrets
from topdown.pipeline import load_config, run
from topdown.pipeline.configuration.census import load_census
from topdown.pipeline.inputs.synth import write_census

ROOT = Path(__file__).resolve().parents[1]
_spec = importlib.util.spec_from_file_location("petti_flaxman", ROOT / "benchmarks" / "petti_flaxman.py")
pf = sys.modules["petti_flaxman"] = importlib.util.module_from_spec(_spec)  # dataclasses look their module up
_spec.loader.exec_module(pf)

#: Persons of the synthetic input: a few states, counties and some tens of enumeration districts.
PERSONS = 30_000
WIDTH = {"ED": 10, "county": 6, "state": 2}
#: The histogram's cell index is hhgq-major (cell = hhgq * 24 + the voting age x ethnicity x race cell).
SC_CELLS = 24


@pytest.fixture(scope="module")
def e2e(tmp_path_factory, dask_client) -> tuple[Path, dict[str, Path]]:
    """A small e2e_1940 input and two test-mode runs of it: zero noise, and epsilon 1."""
    root = tmp_path_factory.mktemp("petti-flaxman")
    write_census(root / "input", load_census("e2e_1940"), PERSONS, seed=3)
    runs = {}
    for name, eps in (("zero", "inf"), ("eps1", "1")):
        config = root / f"{name}.toml"
        config.write_text(f'include = "e2e_1940.toml"\n[run]\nmode = "test"\nseed = 1\n'
                          f'[persons.budget]\nepsilon = "{eps}"\n')
        run(load_config(config), root / name, input_dir=root / "input", client=dask_client)
        runs[name] = root / name
    return root / "input", runs


def _true_cells(truth: Path) -> pd.DataFrame:
    """(geocode, cell, count) of the input, tabulated here with pandas (IPUMS codes as the census declares)."""
    schema = load_census("e2e_1940").product("persons").schema
    persons = pd.concat([pd.read_parquet(f) for f in sorted((truth / "persons").rglob("*.parquet"))])
    cells = schema.cell_index(persons["hhgq"].to_numpy(), persons["age18plus"].to_numpy(),
                              (persons["hispan"].to_numpy() > 0).astype(int), persons["race"].to_numpy() - 1)
    return (persons.assign(cell=np.asarray(cells)).groupby(["geocode", "cell"]).size()
            .rename("count").reset_index())


def _expected(truth: pd.DataFrame, run_dir: Path, level: str, count: str) -> np.ndarray:
    """|DP - exact| of every geounit (TC), or every SC answer or cell not zero in both, computed with pandas."""
    name = pf.LEVELS[level]
    est = pd.read_parquet(run_dir / "histograms" / "persons" / f"level={name}", columns=["geocode", "cell", "count"])
    est = est.assign(geocode=est["geocode"].astype(str))
    true = truth.assign(geocode=truth["geocode"].str[:WIDTH[level]]).groupby(["geocode", "cell"], as_index=False).sum()
    if count == "SC":
        true, est = true.assign(cell=true["cell"] % SC_CELLS), est.assign(cell=est["cell"] % SC_CELLS)
    keys = ["geocode"] if count == "TC" else ["geocode", "cell"]
    t, e = true.groupby(keys)["count"].sum(), est.groupby(keys)["count"].sum()
    both = pd.concat([t.rename("t"), e.rename("e")], axis=1).fillna(0)
    if count != "TC":
        both = both[(both["t"] != 0) | (both["e"] != 0)]
    return (both["e"] - both["t"]).abs().to_numpy()


def _rows(runs: list[Path], truth: Path) -> dict[tuple[str, str, str], dict]:
    pools, _ = pf.evaluate_runs(runs, truth)
    return {(r["epsilon"], r["count"], r["level"]): r for r in pf.table(pools)}


def test_errors_match_an_independent_computation(e2e):
    truth, runs = e2e
    rows, cells = _rows([runs["eps1"]], truth), _true_cells(truth)
    assert {k[0] for k in rows} == {"1"} and len(rows) == 9
    noisy = 0
    for level in pf.LEVELS:
        for count in pf.QUERIES:
            err = _expected(cells, runs["eps1"], level, count)
            row = rows[("1", count, level)]
            assert row["n_errors"] == err.size and row["runs"] == 1, (count, level)
            assert row["median"] == pytest.approx(np.median(err)), (count, level)
            assert row["p95"] == pytest.approx(np.quantile(err, 0.95)), (count, level)
            assert row["rmse"] == pytest.approx(np.sqrt(np.mean(err.astype(float) ** 2))), (count, level)
            noisy += row["rmse"] > 0
            anchor = pf.ANCHORS["1"].get((count, level))
            assert row["petti_flaxman"] == (anchor and dict(zip(("median", "p95", "rmse"), anchor)))
            assert (anchor is None) == (count == "cells" or (count, level) == ("TC", "state"))
    assert rows[("1", "TC", "state")]["rmse"] == 0  # the state totals are invariant
    assert noisy == 8
    # zero-zero cells are left out: fewer answers than geounits x 192, more than the true non-zero cells
    assert cells["geocode"].nunique() * 192 > rows[("1", "cells", "ED")]["n_errors"] > len(cells)


def test_zero_noise_has_no_error_and_runs_pool_by_epsilon(e2e):
    truth, runs = e2e
    rows = _rows([runs["zero"], runs["eps1"], runs["eps1"]], truth)
    cells = _true_cells(truth)
    for level, width in WIDTH.items():
        for count in pf.QUERIES:
            row = rows[("inf", count, level)]
            assert (row["median"], row["p95"], row["rmse"]) == (0, 0, 0), (count, level)
        g = cells["geocode"].str[:width]
        assert rows[("inf", "TC", level)]["n_errors"] == g.nunique()
        # only the true non-zero answers: zero-zero answers left out
        assert rows[("inf", "cells", level)]["n_errors"] == len(cells.groupby([g, "cell"]).size())
        assert rows[("inf", "SC", level)]["n_errors"] == len(cells.groupby([g, cells["cell"] % SC_CELLS]).size())
    for level in pf.LEVELS:  # the same run twice: the errors pooled, each answer counted twice
        for count in pf.QUERIES:
            err, row = np.tile(_expected(cells, runs["eps1"], level, count), 2), rows[("1", count, level)]
            assert row["runs"] == 2 and row["n_errors"] == err.size
            assert (row["median"], row["p95"], row["rmse"]) == pytest.approx(
                (np.median(err), np.quantile(err, 0.95), np.sqrt(np.mean(err.astype(float) ** 2))))


def test_evaluation_file_is_private_and_holds_no_true_count(e2e, tmp_path, capsys):
    truth, runs = e2e
    out = tmp_path / "pf.json"
    assert pf.main(["--truth", str(truth), "--out", str(out), "--describe-input", str(runs["eps1"])]) == 0
    printed = capsys.readouterr().out
    assert "TRUE-count statistics" in printed and "1940: 865 / 2,342 / 88" in printed
    assert stat.S_IMODE(out.stat().st_mode) == 0o600
    data = json.loads(out.read_text())
    assert "Gates Open Research 3:1722" in data["source"] and len(data["rows"]) == 9
    cells = _true_cells(truth)
    secrets = {int(n) for w in WIDTH.values() for n in cells.groupby(cells["geocode"].str[:w])["count"].sum()}
    secrets |= {int(n) for n in cells["count"]}
    secrets = {n for n in secrets if n >= 100}
    assert len(secrets) > 10
    assert leaked_secrets(out.read_text(), secrets) == []
    assert "describe" not in out.read_text() and "TC_median" not in out.read_text()


def test_bad_paths_fail_with_one_line(e2e, tmp_path, capsys):
    truth, runs = e2e
    assert pf.main(["--truth", str(tmp_path / "nowhere"), "--out", str(tmp_path / "a.json"), str(runs["eps1"])]) == 3
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("topdown: input error:") and "nowhere" in err[0]
    assert pf.main(["--truth", str(truth), "--out", str(tmp_path / "b.json"), str(tmp_path)]) == 4
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("topdown: ") and str(tmp_path) in err[0]
    assert not list(tmp_path.glob("*.json"))
