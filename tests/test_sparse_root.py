"""A whole run of a histogram of more than 10^8 declared cells: the root's cells in play come from its noisy
marginals (``[<product>.budget] root_support``), every level below from its parent's published estimate
(DESIGN.md items 30 and 31)."""
from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pyarrow.parquet as pq
import pytest

from topdown.pipeline.cli import main

#: a 500 x 500 x 512 = 128,000,000-cell histogram of persons in a nation of two regions.
CENSUS = """
[census]
name = "vast"

[census.hierarchy]
root_code = "V"
levels = [{ name = "Nation" }, { name = "Region", column = "region" }]

[census.products.persons]
records = "persons"
mdf = "generic"
evaluation_queries = ["total", "a", "detailed"]
uncertainty_queries = ["total", "a"]

[[census.products.persons.attributes]]
name = "a"
size = 500
column = "a"

[[census.products.persons.attributes]]
name = "b"
size = 500
column = "b"

[[census.products.persons.attributes]]
name = "c"
size = 512
column = "c"

[census.products.persons.invariants]
tot = "total"

[census.products.persons.constraints]
total = { query = "total", sense = "==", rhs = "total" }

[census.products.persons.synth]
persons_per_leaf = 150
codes.Region = ["N", "S"]
weights.a = [{a}]
weights.b = [{b}]
weights.c = [{c}]
"""

CONFIG = """
[run]
name = "vast"
census = "{census}"
products = ["persons"]
spine = "standard"
mode = "test"
seed = 7
input = "{input}"

[persons.budget]
rho = "4"
measure = "in_play"
root_support = ["a", "b", "c"]
root_threshold = 4

[persons.budget.levels]
Nation = "1/2"
Region = "1/2"

[persons.budget.queries.Nation]
a = "1/4"
b = "1/4"
c = "1/4"
detailed = "1/4"

[persons.budget.queries.Region]
total = "1/4"
a = "1/4"
detailed = "1/2"

[persons.estimation.l2_passes]
Nation = [["a", "b", "c"], ["detailed"]]
Region = [["total"], ["a", "detailed"]]

[persons.estimation.rounder_passes]
Nation = [["detailed"]]
Region = [["total"], ["detailed"]]

[persons.invariants]
Nation = ["tot"]

[persons.constraints]
Nation = ["total"]
"""


def _weights(size: int, used: list[int]) -> str:
    w = np.zeros(size)
    w[used] = 1
    return ", ".join(str(int(x)) for x in w)


def write_vast(tmp_path: Path) -> tuple[Path, Path]:
    """The declaration, a synthetic input of 300 persons on a few levels of each attribute, and the run's
    configuration."""
    census = tmp_path / "vast.toml"
    census.write_text(CENSUS.replace("{a}", _weights(500, [3, 250, 499])).replace("{b}", _weights(500, [0, 7]))
                      .replace("{c}", _weights(512, [5, 100, 511])))
    data = tmp_path / "input"
    assert main(["synth", "--census", str(census), "--persons", "300", "--seed", "3", str(data)]) == 0
    config = tmp_path / "vast-run.toml"
    config.write_text(CONFIG.replace("{census}", str(census)).replace("{input}", str(data)))
    return census, config


@pytest.mark.slow
def test_a_run_of_128_million_declared_cells_holds_its_cells_in_play(tmp_path):
    """Every level's estimate lies in the root's support, which is a function of the root's published noisy
    marginals alone; the root's detailed answers held are exactly the support's cells."""
    from topdown.pipeline.configuration.census import load_census
    from topdown.pipeline.configuration.config import load_config
    from topdown.pipeline.privacy.measure import NodeMeasurements, root_cells

    census_path, config = write_vast(tmp_path)
    run = tmp_path / "run"
    assert main(["run", str(config), "--out", str(run), "--workers", "1", "--quiet"]) == 0
    manifest = json.loads((run / "manifest.json").read_text())
    assert manifest["status"] == "complete"
    schema = load_census(census_path).product("persons").schema
    noisy = pq.read_table(run / "noisy_measurements" / "persons" / "level=Nation").to_pandas()
    budget = load_config(config).product("persons").budget
    marginals = [NodeMeasurements(q, noisy[noisy["query"] == q].sort_values("answer")["value"].to_numpy(float)[None, :],
                                  np.ones(1)) for q in budget.root_support]
    support = root_cells(schema, budget, marginals, 0)
    assert support is not None and 0 < support.size < 10**4  # of 128,000,000 declared cells
    detailed = noisy[noisy["query"] == "detailed"]["answer"].to_numpy(np.int64)
    np.testing.assert_array_equal(np.sort(detailed), support)
    for level in ("Nation", "Region"):
        hist = pq.read_table(run / "histograms" / "persons" / f"level={level}").to_pandas()
        assert np.isin(hist["cell"].to_numpy(np.int64), support).all()
        assert hist["count"].sum() == 300
