"""A whole run of a histogram of more than 10^8 declared cells: the root's cells in play come from its noisy
marginals (``[<product>.budget] root_support``), every level below from its parent's published estimate
(DESIGN.md items 30 and 31)."""
from __future__ import annotations

import json
import subprocess
import sys
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


#: ``topdown run CONFIG --out RUN`` in this process, then the peak resident memory (KiB) of the process and of
#: its largest reaped child (the cluster's workers). The process's own peak is its address space's high-water
#: mark (``VmHWM``), not ``ru_maxrss``: Linux carries ``ru_maxrss`` across fork and exec, so a process started by
#: a pytest worker that once held 1.2 GB would report 1.2 GB before doing anything.
PEAK = """
import resource, sys
from topdown.pipeline.cli import main
code = main(["run", sys.argv[1], "--out", sys.argv[2], "--workers", "1", "--quiet"])
assert code == 0, code
hwm = next(int(line.split()[1]) for line in open("/proc/self/status") if line.startswith("VmHWM:"))
print(hwm, resource.getrusage(resource.RUSAGE_CHILDREN).ru_maxrss)
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
@pytest.mark.skipif(not Path("/proc/self/status").exists(), reason="reads the peak memory from /proc (Linux)")
def test_a_run_of_128_million_declared_cells_holds_its_cells_in_play(tmp_path):
    """The run's peak memory is that of a small histogram's (about 200 MB a process), not of the declared cells;
    every level's estimate lies in the root's support, which is a function of the root's published noisy
    marginals alone; the root's detailed answers held are exactly the support's cells."""
    from topdown.pipeline.configuration.census import load_census
    from topdown.pipeline.configuration.config import ConfigError, load_config
    from topdown.pipeline.privacy.measure import NodeMeasurements, root_cells

    census_path, config = write_vast(tmp_path)
    run = tmp_path / "run"
    # in its own process, to read the peak memory of the driver and of its (reaped) workers
    peak = subprocess.run([sys.executable, "-c", PEAK, str(config), str(run)], capture_output=True, text=True,
                          timeout=600)
    assert peak.returncode == 0, peak.stderr[-2000:]
    driver_kib, workers_kib = map(int, peak.stdout.split()[-2:])
    assert max(driver_kib, workers_kib) < 600 * 1024, (driver_kib, workers_kib)  # an int64[128M] is 1 GB
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
    assert main(["verify", str(run)]) == 0
    assert main(["nmf", str(run), "--out", str(tmp_path / "nmf")]) == 0


@pytest.mark.parametrize("change, fragments", [
    (("measure = \"in_play\"\n", ""), ("persons.budget", "root_support needs measure = \"in_play\"")),
    (('root_support = ["a", "b", "c"]', 'root_support = ["a", "total"]'),
     ("persons.budget.root_support", "'total'", "root level 'Nation'")),
])
def test_root_support_is_checked(tmp_path, change, fragments):
    from topdown.pipeline.configuration.config import ConfigError, load_config

    census = tmp_path / "vast.toml"
    census.write_text(CENSUS.replace("{a}", _weights(500, [1])).replace("{b}", _weights(500, [1]))
                      .replace("{c}", _weights(512, [1])))
    config = tmp_path / "bad.toml"
    config.write_text(CONFIG.replace("{census}", str(census)).replace("{input}", str(tmp_path)).replace(*change))
    with pytest.raises(ConfigError) as err:
        load_config(config)
    for fragment in fragments:
        assert fragment in str(err.value)
