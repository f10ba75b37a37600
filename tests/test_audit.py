"""``topdown audit`` (pipeline/evaluation/audit.py): threshold-event statistics, the path-restricted run, and the known
answer of a one-level geometric configuration."""
from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from scipy.stats import binomtest

from topdown.pipeline.evaluation import audit as A
from topdown.pipeline.configuration.config import config_from_dict, load_config
from topdown.pipeline.runtime.rundir import write_table
from topdown.pipeline.configuration.census import PERSONS

LEVELS = ["US", "State", "County", "Tract", "Block_Group", "Block"]
# Three blocks of one block group with distinctive true counts (scanned for in the outputs).
BLOCKS = {"440010001001000": 47, "440010001001001": 53, "440010001001002": 61}
SRC, DST = "440010001001000", "440010001001001"
EPSILON = 3  # the one-level configuration's total epsilon


def _tiny_input(root: Path) -> Path:
    root.mkdir(parents=True, exist_ok=True)
    rows = [{"geoid": g, "hhgq": 0, "votingage": 1, "hispanic": 0, "cenrace": 0} for g, n in BLOCKS.items()
            for _ in range(n)]
    write_table(pd.DataFrame(rows).astype({c: "int8" for c in PERSONS.dim_names}), root / "persons.parquet")
    write_table(pd.DataFrame({"geoid": list(BLOCKS), "unit_type": 0, "occupied": True}), root / "units.parquet")
    return root


def one_level_config(epsilon: int = EPSILON, census: dict | None = None):
    """Block-by-block (the whole budget on the leaf level), geometric mechanism, the leaf total measured
    alone, no invariants or constraints: each leaf's published total is max(0, c + Z). P.L. 94-171's persons,
    or those of ``census`` (a declaration)."""
    levels = LEVELS if census is None else [lv["name"] for lv in census["hierarchy"]["levels"]]
    return config_from_dict({
        **({} if census is None else {"census": census}),
        "run": {"name": "one-level", "products": ["persons"], "mode": "test", "seed": 0, "algorithm": "block_by_block"},
        "persons": {"budget": {"mechanism": "geometric", "epsilon": str(epsilon),
                               "levels": {lv: ("1" if lv == levels[-1] else "0") for lv in levels},
                               "queries": {lv: {"total": "1"} for lv in levels}},
                    "estimation": {"l2_passes": {lv: [["total"]] for lv in levels},
                                   "rounder_passes": {lv: [["total"]] for lv in levels}}}})


#: A census of two-cell persons and no unit records, for the known answers' thousands of runs: the answer is the
#: leaf total's whatever the cells, each seed draws the same totals as on P.L. 94-171's 2,016 cells, and a run
#: costs less than half as much. The command's test below and the path run audit P.L. 94-171's persons.
TWO_CELLS = {"name": "two_cells",
             "hierarchy": {"geocode": "geoid", "pattern": r"\d{15}", "root_code": "US",
                           "levels": [{"name": "US"}, {"name": "Block", "width": 15}]},
             "products": {"persons": {"attributes": [{"name": "adult", "size": 2}]}}}


def analytic_loss(epsilon: float = EPSILON) -> float:
    """The privacy loss one block's total shows (pipeline/evaluation/audit.py docstring): the noise of a query with
    budget epsilon_q is exp(-epsilon_q |z| / 2) (bounded neighbours, L1 sensitivity 2), moving one person
    changes the count by 1, so the largest log-ratio over events on the count is epsilon_q / 2."""
    return epsilon / 2


@pytest.fixture(scope="module")
def tiny(tmp_path_factory) -> Path:
    return _tiny_input(tmp_path_factory.mktemp("audit-input"))


@pytest.fixture(scope="module")
def tiny_two_cells(tmp_path_factory) -> Path:
    """The blocks of ``tiny`` as records of the TWO_CELLS census."""
    root = tmp_path_factory.mktemp("audit-two-cells")
    rows = [{"geoid": g, "adult": 1} for g, n in BLOCKS.items() for _ in range(n)]
    write_table(pd.DataFrame(rows).astype({"adult": "int8"}), root / "persons.parquet")
    return root


def test_clopper_pearson_matches_scipy():
    for k, n in ((0, 20), (3, 20), (20, 20), (517, 2000)):
        lo, hi = A.clopper_pearson(np.array([k]), n, 0.025)
        ci = binomtest(k, n).proportion_ci(0.95, method="exact")
        assert lo[0] == pytest.approx(ci.low, abs=1e-12) and hi[0] == pytest.approx(ci.high, abs=1e-12)


def test_threshold_event_loss_on_exact_geometric_samples():
    """Errors c + Z - c and c - 1 + Z - c, Z two-sided geometric with parameter a: the loss is a."""
    rng = np.random.default_rng(4)
    a, n = 1.5, 20_000
    z = lambda: rng.geometric(1 - np.exp(-a), n) - rng.geometric(1 - np.exp(-a), n)  # noqa: E731
    loss = A.threshold_event_loss(z(), z() - 1)
    assert loss.lower <= a and loss.lower >= 0.9 * a
    assert abs(loss.point - a) < 0.15
    same = A.threshold_event_loss(z(), z())  # identical distributions: no loss can be shown
    assert same.lower < 0.1
    assert A.threshold_event_loss(np.zeros(5), np.zeros(5)).lower == 0.0


def test_move_and_plan_errors(tiny):
    with pytest.raises(A.AuditError, match="BLOCK_FROM:BLOCK_TO"):
        A.parse_move("440010001001000")
    with pytest.raises(A.AuditError, match="no persons records"):
        A.build_plans(one_level_config(), tiny, ("440010001001003", DST))
    with pytest.raises(A.AuditError, match="not a Block of the input"):
        A.build_plans(one_level_config(), tiny, (SRC, "440010001009999"))


def test_the_audited_input_is_checked_against_its_units(tiny, tmp_path):
    """The records are read as a run reads them: a person in a block without a unit of their type is the run's
    input error (file, column, block), before anything is moved."""
    from topdown.pipeline.configuration.errors import InputError

    config = one_level_config()
    product = A.audited_product(config)
    bad = _tiny_input(tmp_path / "in")
    write_table(pd.DataFrame({"geoid": list(BLOCKS)[1:], "unit_type": 0, "occupied": True}), bad / "units.parquet")
    with pytest.raises(InputError, match=rf"persons\.parquet: column 'hhgq', block {SRC}: the block has no housing "
                                         r"unit for this person"):
        A.read_records(config, bad, product)
    assert len(A.read_records(config, tiny, product).leaf) == sum(BLOCKS.values())


def test_move_into_a_block_without_housing_is_refused(demo_input):
    persons = pd.read_parquet(demo_input / "persons.parquet")
    units = pd.read_parquet(demo_input / "units.parquet")
    src = persons.loc[persons["hhgq"] == 0, "geoid"].iloc[0]
    empty = sorted(set(units["geoid"]) - set(units.loc[units["unit_type"] == 0, "geoid"]))
    if not empty:
        pytest.skip("every demo block has a housing unit")
    with pytest.raises(A.AuditError, match="can live in Block"):
        A.build_plans(load_config("demo").with_overrides(mode="test", seed=1), demo_input, (src, empty[0]))


def test_path_run_reproduces_the_full_run(demo_input, demo_run):
    """The audit's run (only the parents on the two paths, measurements in memory) gives the path nodes
    exactly the histograms of a full run with the same seed, and again when it reuses the root's chunks."""
    manifest = json.loads((demo_run / "manifest.json").read_text())
    spine = pd.read_parquet(demo_run / "spine.parquet")
    persons = pd.read_parquet(demo_input / "persons.parquet")
    units = pd.read_parquet(demo_input / "units.parquet")
    src = persons.loc[persons["hhgq"] == 0, "geoid"].value_counts().index[0]
    housed = set(units.loc[units["occupied"] & (units["unit_type"] == 0), "geoid"])
    bg = spine.set_index("geoid")["Block_Group"]
    dst = next(g for g in spine["geoid"] if g in housed and bg[g] != bg[src])
    config = load_config("demo").with_overrides(mode="test", seed=manifest["seed"])
    plan, moved = A.build_plans(config, demo_input, (src, dst), ("total", "detailed"))
    values = A.run_plan(plan, manifest["seed"])
    checked = 0
    for t, v in zip(plan.targets, values):
        level = plan.levels[t.level].name
        h = pd.read_parquet(demo_run / "histograms" / "persons" / f"level={level}")
        h = h[h["geocode"].astype(str) == t.geocode]
        assert v == h.loc[h["cell"].isin(t.cells), "count"].sum(), (level, t.geocode, t.query)
        checked += 1
    assert checked == len(plan.targets) and {t.path for t in plan.targets} == {"both", "from", "to"}
    assert plan.fixed and np.array_equal(A.run_plan(plan, manifest["seed"]), values)  # the root's chunks reused
    assert (plan.truth != moved.truth).any() and np.array_equal(plan.truth[:2], moved.truth[:2])  # the US is shared


def _known_answer(tiny, client, runs: int, census: dict | None = None) -> pd.DataFrame:
    return A.audit(one_level_config(census=census), tiny, (SRC, DST), runs, client, queries=("total",),
                   seed=11).table


def test_known_answer_fast(tiny_two_cells, dask_client):
    """N = 200: the lower bound is at most the analytic loss, and at least the analytic loss less 20% scaled
    by the standard-error ratio sqrt(2000 / 200) of the N = 2000 requirement (so 63% at N = 200)."""
    runs = 200
    table = _known_answer(tiny_two_cells, dask_client, runs, TWO_CELLS)
    assert list(table["level"]) == ["Block", "Block"] and table["changed"].all()
    a = analytic_loss()
    slack = 0.2 * np.sqrt(2000 / runs)
    for lower in table["epl_lower"]:
        assert (1 - slack) * a <= lower <= a


@pytest.mark.slow
def test_known_answer_2000(tiny_two_cells, dask_client):
    """With N = 2000 the lower confidence bound is within 20% of the analytic value, never above."""
    table = _known_answer(tiny_two_cells, dask_client, 2000, TWO_CELLS)
    assert list(table["level"]) == ["Block", "Block"] and table["changed"].all()
    a = analytic_loss()
    for lower in table["epl_lower"]:
        assert 0.8 * a <= lower <= a


def test_audit_cli_output_is_confidential_and_holds_no_true_count(tiny, tmp_path, capsys):
    from topdown.pipeline.cli import main

    cfg = tmp_path / "one.toml"
    data = one_level_config().model_dump(mode="json")
    lines = ["[run]", 'name = "one-level"', 'products = ["persons"]', 'mode = "test"', "seed = 0",
             'algorithm = "block_by_block"', "[persons.budget]", 'mechanism = "geometric"', f'epsilon = "{EPSILON}"',
             "[persons.budget.levels]"] + [f'{lv} = "{v}"' for lv, v in data["persons"]["budget"]["levels"].items()]
    for lv in LEVELS:
        lines += [f"[persons.budget.queries.{lv}]", 'total = "1"']
    lines += ["[persons.estimation.l2_passes]"] + [f'{lv} = [["total"]]' for lv in LEVELS]
    lines += ["[persons.estimation.rounder_passes]"] + [f'{lv} = [["total"]]' for lv in LEVELS]
    cfg.write_text("\n".join(lines) + "\n")
    out = tmp_path / "audit"
    code = main(["audit", str(cfg), "--input", str(tiny), "--move", f"{SRC}:{DST}", "--runs", "4",
                 "--queries", "total", "--out", str(out), "--workers", "1"])
    assert code == 0
    assert "CONFIDENTIAL" in capsys.readouterr().out
    report = (out / "report.txt").read_text()
    assert report.startswith("CONFIDENTIAL")
    meta = json.loads((out / "audit.json").read_text())
    # The ceiling a count can show is the product's whole epsilon (pure DP here: the total), not half a query's.
    assert meta["epsilon_product"] == pytest.approx(float(EPSILON)) and meta["delta"] is None
    assert f"up to the product's whole epsilon: {float(EPSILON):.3f}" in " ".join(report.split()) and "half" not in report
    assert meta["runs"] == 4 and meta["confidential"].startswith("CONFIDENTIAL")
    table = pd.read_parquet(out / "audit.parquet")
    assert (table["epsilon_query"] == EPSILON).all()
    text = (report + json.dumps(meta) + table.to_csv()).replace(str(tmp_path), "")  # the temp path has digits
    numbers = {int(m) for m in re.findall(r"(?<![\w.])\d+(?![\w.])", text)}
    for n in BLOCKS.values():  # no true count (47, 53, 61, or 46/54 after the move) in any output
        assert not {n - 1, n, n + 1} & numbers, n
    assert main(["audit", str(cfg), "--input", str(tiny), "--move", "1:2", "--runs", "4"]) == 2


def test_the_audit_ceiling_is_the_certificates_epsilon():
    """A zCDP product's ceiling is its certificate's epsilon at its delta (the 2021 persons budget: about 17.1)."""
    from topdown.pipeline.privacy.budget import zcdp_to_epsilon

    budget = load_config("pl94_production_2021").product("persons").budget
    ceiling = A.product_epsilon(budget)
    assert ceiling["delta"] == str(budget.delta)
    assert ceiling["epsilon_product"] == pytest.approx(zcdp_to_epsilon(budget.rho, budget.delta))
    assert 17 < ceiling["epsilon_product"] < 17.3


def test_a_move_is_between_two_leaves_of_the_census():
    """--move names two leaf geocodes of the run's census: any codes of a column hierarchy, the declared pattern of
    a prefix one (the error names the leaf level and the pattern)."""
    from topdown.pipeline.configuration.census import load_census

    assert A.parse_move("I101-01:I102-01", load_census("chile_2017").hierarchy) == ("I101-01", "I102-01")
    assert A.parse_move("0100300006:0100900001", load_census("e2e_1940").hierarchy) == ("0100300006", "0100900001")
    with pytest.raises(A.AuditError, match=r"ENUMDIST_FROM:ENUMDIST_TO, two different Enumdist geocodes matching"):
        A.parse_move("1:2", load_census("e2e_1940").hierarchy)
    with pytest.raises(A.AuditError, match="DISTRICT_FROM:DISTRICT_TO"):
        A.parse_move("I101-01:I101-01", load_census("chile_2017").hierarchy)
