"""``topdown evaluate`` one group of states at a time: on runs of three states, a group per
state writes the very files one group writes; no task holds more than one group's truth or a level below the
root whole; the merged metrics are those of the whole level; the samples are drawn per state."""
from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from topdown.pipeline.configuration.census import PERSONS, PERSONS_PRODUCT
from topdown.pipeline.evaluation import evaluate as E
from topdown.pipeline.evaluation import metrics as M
from topdown.pipeline.runtime.outdir import MARKER
from topdown.pipeline.inputs.us_synth import write_partitioned
from topdown.pipeline.outputs import verify
from topdown.vocab.queries import build_query

OPTS = E.EvalOptions(figures=False, sampling_rates=(0.25, 1.0), epl_bootstrap=20)


@pytest.fixture(scope="module")
def three_states(tmp_path_factory, dask_client) -> tuple[Path, Path, Path, Path]:
    """The demo configuration on 600 synthetic blocks in three states (input hive-partitioned by state), a
    second run (a copy: the replicates table needs two), and entities of two kinds, one crossing states."""
    from topdown.pipeline import load_config, run

    base = tmp_path_factory.mktemp("three-states-eval")
    write_partitioned(base / "input", 600, seed=5, persons=20_000, states=3)
    out = base / "run"
    run(load_config("demo").with_overrides(build_demo_input=False), out, input_dir=base / "input", client=dask_client)
    shutil.copytree(out, base / "run2")
    geoid = pd.read_parquet(out / "spine.parquet")["geoid"]
    entities = pd.concat([pd.DataFrame({"geoid": geoid, "entity_type": "place", "entity": "P" + geoid.str[:5]}),
                          pd.DataFrame({"geoid": geoid[::3], "entity_type": "aiannh", "entity": "A" + geoid[::3].str[-1]})])
    entities.to_csv(base / "entities.csv", index=False)
    return base / "input", out, base / "run2", base / "entities.csv"


def _evaluate(three_states, out: Path, monkeypatch, by_state: bool) -> list[int]:
    """Evaluate both runs (with entities) into ``out``, by state (groups of one block: a state each) or in one
    group; returns the groups evaluated."""
    truth, run, run2, entities = three_states
    seen: list[int] = []
    task = E.evaluate_group

    def spy(g, *args):
        seen.append(g)
        return task(g, *args)

    with monkeypatch.context() as m:
        m.setattr(E, "evaluate_group", spy)
        if by_state:
            m.setattr(verify, "GROUP_BLOCKS", 1)
        E.evaluate([run, run2], truth, entities, out, options=OPTS)
    return sorted(seen)


def test_a_group_per_state_writes_the_files_of_one_group(three_states, tmp_path, monkeypatch) -> None:
    assert _evaluate(three_states, tmp_path / "whole", monkeypatch, False) == [0]
    assert _evaluate(three_states, tmp_path / "states", monkeypatch, True) == [0, 1, 2]
    files = sorted(p.name for p in (tmp_path / "whole").iterdir() if p.name != MARKER)
    assert files == sorted(p.name for p in (tmp_path / "states").iterdir() if p.name != MARKER)
    assert {"summary.parquet", "sampling.parquet", "entities.parquet", "replicates.parquet", "blau.parquet",
            "report.html"} <= set(files)
    assert not any(name.startswith(".") for name in files)  # the groups' folder is gone (the output's marker aside)
    for name in files:
        assert (tmp_path / "whole" / name).read_bytes() == (tmp_path / "states" / name).read_bytes(), name
    entities = pd.read_parquet(tmp_path / "whole" / "entities.parquet")
    assert set(entities["entity_type"]) == {"place", "aiannh"} and len(pd.read_parquet(tmp_path / "whole" /
                                                                                       "replicates.parquet"))


def test_no_task_holds_more_than_a_group(three_states, tmp_path, monkeypatch) -> None:
    """By state: each group's truth is one state's blocks (together the whole truth), and only the root level's
    estimates are read whole."""
    truth_rows: list[pd.DataFrame] = []
    whole_levels: list[str] = []
    group_truth, read_estimates = E._group_truth, E.read_estimates

    def spy_truth(tmp, product, g):
        rows = group_truth(tmp, product, g)
        truth_rows.append(rows.assign(product=product.name))
        return rows

    def spy_estimates(path, level, nodes):
        whole_levels.append(level)
        return read_estimates(path, level, nodes)

    monkeypatch.setattr(E, "_group_truth", spy_truth)
    monkeypatch.setattr(E, "read_estimates", spy_estimates)
    _evaluate(three_states, tmp_path / "states", monkeypatch, True)
    assert set(whole_levels) == {"US"}
    assert all(t["geocode"].str[:2].nunique() == 1 for t in truth_rows)
    whole = E.load_truth(three_states[0])
    for product, blocks in whole.blocks.items():  # each group's truth read once, the groups' together the whole
        rows = pd.concat([t for t in truth_rows if (t["product"] == product).all()])
        pd.testing.assert_frame_equal(rows.drop(columns="product").sort_values(["geocode", "cell"])
                                      .reset_index(drop=True), blocks)


def test_the_merged_metrics_are_the_whole_levels(three_states, tmp_path, monkeypatch) -> None:
    """The summary, the bins and the Blau quintiles of the Block level by state equal those computed on the whole
    level at once (a whole-level computation kept here as the reference)."""
    _evaluate(three_states, tmp_path / "states", monkeypatch, True)
    truth, run = three_states[0], three_states[1]
    view, blocks = E.RunView(run, "run"), E.load_truth(truth).blocks[PERSONS.name]
    true, est = view.truth_at(blocks, "Block"), view.estimate_at(PERSONS_PRODUCT, "Block")
    summary = pd.read_parquet(tmp_path / "states" / "summary.parquet").set_index(["run", "product", "level", "query"])
    for query in ("total", "votingage * hispanic * cenrace"):
        qe = M.query_errors(true, est, build_query(PERSONS, query))
        row = summary.loc[("run", PERSONS.name, "Block", query)]
        assert row["mean_abs_error"] == float(qe.l1.mean()) and row["n"] == true.n_units
        assert row["q0.005"] == qe.signed_quantiles([0.005])[0] and row["q0.995"] == qe.signed_quantiles([0.995])[0]
        assert row["median_abs_error"] == qe.abs_quantiles([0.5])[0]
    qe = M.query_errors(true, est, build_query(PERSONS, "total"))
    err = (qe.est - qe.true)[:, 0]
    bins = pd.read_parquet(tmp_path / "states" / "errors_by_bin.parquet")
    got = bins[(bins["run"] == "run") & (bins["product"] == PERSONS.name) & (bins["level"] == "Block")]
    want = M.errors_by_bin(qe.true[:, 0], err, M.BLOCK_BINS)
    exact = [c for c in want.columns if c != "mean_rel_abs_error"]
    pd.testing.assert_frame_equal(got[exact].reset_index(drop=True), want[exact], check_exact=True)
    np.testing.assert_allclose(got["mean_rel_abs_error"], want["mean_rel_abs_error"], rtol=1e-15)  # exactly rounded
    blau_q = build_query(PERSONS, PERSONS_PRODUCT.evaluation.diversity_query)
    quint = M.blau_quintile_errors(M.blau_index(M.query_errors(true, true, blau_q).true), err)
    blau = pd.read_parquet(tmp_path / "states" / "blau.parquet")
    got = blau[(blau["run"] == "run") & (blau["level"] == "Block")].reset_index(drop=True)
    pd.testing.assert_frame_equal(got[quint.columns], quint, check_exact=True)


def test_a_states_sample_does_not_depend_on_its_group() -> None:
    blocks = pd.DataFrame({"geocode": ["01001", "01001", "01002", "02001", "02002", "04001"],
                           "cell": [0, 5, 0, 1, 1, 3], "count": [4, 3, 9, 2, 6, 5]})
    keys, draws, seed = np.array(["01", "02", "04"]), np.array([7, 8, 0]), (0, 2500, 0)
    state = np.searchsorted(keys, blocks["geocode"].str[:2])  # each row's key number
    drawn = E._sample(blocks, state, draws, seed)
    assert (drawn <= blocks["count"]).all()
    assert [drawn[blocks["geocode"].str[:2] == k].sum() for k in keys] == [7, 8, 0]
    alone = E._sample(blocks.iloc[3:5].reset_index(drop=True), state[3:5], draws, seed)  # state 02 in a group of its own
    assert np.array_equal(alone, drawn[3:5])
    assert np.array_equal(E._sample(blocks, state, draws, seed), drawn)  # seeded: the same draw again
