"""The partitioned data plane (pipeline/execution/dataplane.py): outputs are byte-identical to the pinned
outputs of the in-memory pipeline before the change (tests/pinned_outputs.json: SHA-256 of every output file
but the manifest, of a two-state synthetic input, recorded on the untouched tree; the demo's are pinned in
test_output_hashes), for 1 or 2 workers and for one input file or many
partitions; input errors in a partitioned input name the file, column, block and value, and nothing is written."""
from __future__ import annotations

import json
import os
import pickle
import socket
import subprocess
import sys
from pathlib import Path
from typing import Iterator

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from distributed import Security

from conftest import end_process_groups
from test_output_hashes import output_hashes as pinned_hashes
from rel_inputs import no_partial_output
from topdown.pipeline.execution import dataplane
from topdown.pipeline import load_config, run
from topdown.pipeline.inputs.us_synth import write_synthetic
from topdown.pipeline.configuration.errors import InputError

PINNED = json.loads((Path(__file__).parent / "pinned_outputs.json").read_text())
STATES = ("09", "44")


def output_hashes(run_dir: Path) -> dict[str, str]:
    """SHA-256 of every output file but the manifest (its other fields are pinned for the demo in
    test_output_hashes), the certificate in the canonical form of test_output_hashes."""
    return {k: v for k, v in pinned_hashes(run_dir).items() if k != "manifest.json"}


def multi_config():
    """Production settings for persons and units, test mode with a fixed seed, standard spine."""
    return load_config("pl94_production_2021").with_overrides(mode="test", seed=7, spine="standard", name="multi")


@pytest.fixture(scope="module")
def multi_tables(tmp_path_factory) -> dict[str, pa.Table]:
    """Two synthetic states of 700 blocks (the pinned multi-state input), one table per kind."""
    tmp = tmp_path_factory.mktemp("states")
    for st in STATES:
        write_synthetic(tmp / st, 700, seed=int(st), state=st)
    return {kind: pa.concat_tables([pq.read_table(tmp / st / f"{kind}.parquet") for st in STATES])
            for kind in ("persons", "units")}


@pytest.fixture(scope="module")
def multi_single(tmp_path_factory, multi_tables) -> Path:
    path = tmp_path_factory.mktemp("multi-single")
    for kind, table in multi_tables.items():
        pq.write_table(table, path / f"{kind}.parquet")
    return path


def write_partitioned(path: Path, tables: dict[str, pa.Table], row_group_size: int = 4000) -> Path:
    """The tables hive-partitioned by state, several small row groups per file."""
    for kind, table in tables.items():
        state = pa.compute.utf8_slice_codeunits(table.column("geoid"), 0, 2)
        for st in STATES:
            part = table.filter(pa.compute.equal(state, st))
            (path / kind / f"state={st}").mkdir(parents=True, exist_ok=True)
            pq.write_table(part, path / kind / f"state={st}" / "part-0.parquet", row_group_size=row_group_size)
    return path


def test_multi_state_single_file_two_workers(multi_single, dask_client, tmp_path):
    out = run(multi_config(), tmp_path / "run", input_dir=multi_single, client=dask_client)
    assert output_hashes(out) == PINNED["multi"]


def test_multi_state_partitioned_one_worker_many_tasks_and_shards(multi_tables, tmp_path, monkeypatch):
    """Hive partitions by state, 4,000-record row groups read 4,000 records a task, 300-block shards: the
    same bytes on one worker."""
    inp = write_partitioned(tmp_path / "input", multi_tables)
    assert len(dataplane.find_input(inp).persons) == 2
    monkeypatch.setattr(dataplane, "ROWS_PER_TASK", 4000)
    monkeypatch.setattr(dataplane, "SHARD_BLOCKS", 300)
    assert len(dataplane.read_tasks(dataplane.find_input(inp).persons)) > 4
    out = run(multi_config(), tmp_path / "run", input_dir=inp, workers=1)
    assert output_hashes(out) == PINNED["multi"]


@pytest.mark.parametrize("gather", [1, dataplane.MDF_GATHER_BLOCKS])
def test_the_mdf_writes_runs_of_counties_a_task_each_and_the_same_files(multi_single, dask_client, tmp_path,
                                                                         monkeypatch, gather):
    """The MDF's counties run in batches (a national MDF has 3,200 counties: a task each before);
    each county still gets its own file, the pinned bytes, whether a task gathers its counties' blocks one
    county at a time or all at once."""
    from topdown.pipeline.execution import tasks

    monkeypatch.setattr(tasks, "TASKS_PER_WORKER", 0.001)  # a target above the whole MDF: BATCH_CHUNKS counties a task
    monkeypatch.setattr(dataplane, "MDF_GATHER_BLOCKS", gather)
    submitted = []
    real_submit = dask_client.submit
    monkeypatch.setattr(dask_client, "submit", lambda fn, *a, **k: (submitted.append((fn.__name__, a)),
                                                                   real_submit(fn, *a, **k))[1])
    out = run(multi_config(), tmp_path / "run", input_dir=multi_single, client=dask_client)
    batches = [pickle.loads(a[1]) for name, a in submitted if name == "write_counties_mdf"]
    counties = sorted(p.parent.name for p in (out / "mdf" / "persons").rglob("part-*.parquet"))
    assert len(counties) >= 2 and len(batches) == 2  # persons' and units' counties: a task each
    assert sorted(Path(c[3]).parent.name for c in batches[0]) == counties
    assert output_hashes(out) == PINNED["multi"]


def _broken(tables: dict[str, pa.Table], kind: str, row: int, column: str, value) -> dict[str, pa.Table]:
    table = tables[kind]
    values = table.column(column).to_pylist()
    values[row] = value
    return {**tables, kind: table.set_column(table.column_names.index(column), column,
                                             pa.array(values, type=table.schema.field(column).type))}


def test_bad_code_in_a_partition_names_the_file_block_and_value(multi_tables, dask_client, tmp_path):
    row = multi_tables["persons"].num_rows - 1  # a person of the second state
    block = multi_tables["persons"].column("geoid")[row].as_py()
    inp = write_partitioned(tmp_path / "input", _broken(multi_tables, "persons", row, "cenrace", 63))
    with pytest.raises(InputError) as err:
        run(multi_config(), tmp_path / "run", input_dir=inp, client=dask_client)
    text = str(err.value)
    assert "state=44" in text and "part-0.parquet" in text and "'cenrace'" in text and block in text
    assert "(value 63)" in text
    assert no_partial_output(tmp_path / "run") == []


def test_person_without_a_unit_across_partitions_names_the_persons_file(multi_tables, dask_client, tmp_path):
    """A block's persons and units in different files: the structural check runs on the shards."""
    units = multi_tables["units"]
    gq = pa.compute.greater(units.column("unit_type"), 0)
    first_gq = pa.compute.index(gq, True).as_py()
    block, utype = units.column("geoid")[first_gq].as_py(), units.column("unit_type")[first_gq].as_py()
    keep = pa.compute.invert(pa.compute.and_(pa.compute.equal(units.column("geoid"), block),
                                             pa.compute.equal(units.column("unit_type"), utype)))
    inp = write_partitioned(tmp_path / "input", {**multi_tables, "units": units.filter(keep)})
    with pytest.raises(InputError) as err:
        run(multi_config(), tmp_path / "run", input_dir=inp, client=dask_client)
    text = str(err.value)
    assert f"state={block[:2]}" in text and "persons" in text and "'hhgq'" in text and block in text
    assert f"GQ facility of type {utype}" in text and f"(value {utype})" in text
    assert no_partial_output(tmp_path / "run") == []


def test_facility_without_residents_across_partitions_names_the_units_file(multi_tables, dask_client, tmp_path):
    """The units frames stay on the workers: the file holding the facility is found by asking them."""
    units, persons = multi_tables["units"], multi_tables["persons"]
    gq = pa.compute.greater(units.column("unit_type"), 0)
    last_gq = units.num_rows - 1 - pa.compute.index(gq[::-1], True).as_py()  # a facility of the second state
    block, utype = units.column("geoid")[last_gq].as_py(), units.column("unit_type")[last_gq].as_py()
    hhgq = pa.compute.cast(persons.column("hhgq"), pa.int64())
    keep = pa.compute.invert(pa.compute.and_(pa.compute.equal(persons.column("geoid"), block),
                                             pa.compute.equal(hhgq, utype)))
    inp = write_partitioned(tmp_path / "input", {**multi_tables, "persons": persons.filter(keep)})
    with pytest.raises(InputError) as err:
        run(multi_config(), tmp_path / "run", input_dir=inp, client=dask_client)
    text = str(err.value)
    assert f"state={block[:2]}" in text and "units" in text and "'unit_type'" in text and block in text
    assert "more GQ facilities" in text or "hhgq_total_lb" in text
    assert no_partial_output(tmp_path / "run") == []


def test_missing_input_names_both_layouts(tmp_path):
    with pytest.raises(FileNotFoundError, match="persons.parquet.*directories persons/ and units/"):
        dataplane.find_input(tmp_path)


@pytest.fixture
def tls_shell_cluster(tmp_path) -> Iterator[tuple[str, Security]]:
    """`dask scheduler` and two `dask worker` processes started as from a shell, TLS with credentials of their
    own (PEM files, as on an HPC or Kubernetes deployment); lifetime bounded, always ended."""
    creds = Security.temporary()
    files = {}
    for name, pem in (("ca", creds.tls_ca_file), ("cert", creds.tls_client_cert), ("key", creds.tls_client_key)):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text(pem)
        files[name].chmod(0o600)
    tls = ["--tls-ca-file", str(files["ca"]), "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"])]
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    address = f"tls://127.0.0.1:{port}"
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "RAYON_NUM_THREADS": "1"}
    dask = [sys.executable, "-m", "dask"]  # this interpreter: the `dask` on PATH may import another checkout
    log = open(tmp_path / "cluster.log", "w")
    procs = [subprocess.Popen(["timeout", "300", *dask, "scheduler", "--host", "127.0.0.1", "--port", str(port),
                               "--protocol", "tls", "--no-dashboard", *tls], stdout=log, stderr=log, env=env,
                              start_new_session=True)]
    for i in range(2):
        procs.append(subprocess.Popen(["timeout", "300", *dask, "worker", address, "--nthreads", "1", "--nworkers", "1",
                                       "--no-dashboard", "--local-directory", str(tmp_path / f"w{i}"), *tls],
                                      stdout=log, stderr=log, env=env, start_new_session=True))
    security = Security(tls_ca_file=str(files["ca"]), tls_client_cert=str(files["cert"]),
                        tls_client_key=str(files["key"]), require_encryption=True)
    try:
        yield address, security
    finally:
        end_process_groups(procs)
        log.close()


def test_external_tls_cluster_runs_the_partitioned_input_identically(multi_tables, tmp_path, tls_shell_cluster):
    """A cluster started from the shell, the input on storage its workers share."""
    from distributed import Client

    address, security = tls_shell_cluster
    inp = write_partitioned(tmp_path / "input", multi_tables)
    with Client(address, security=security, timeout=60) as client:
        client.wait_for_workers(2, timeout=60)
        out = run(multi_config(), tmp_path / "run", input_dir=inp, client=client)
    assert output_hashes(out) == PINNED["multi"]


def test_block_metadata_on_the_shards_equals_the_in_memory_levels(multi_single, multi_tables, dask_client, monkeypatch):
    """The partitioned run keeps the block level's unit counts and constraints on the shards (the driver holds
    neither); gathered from several shards they equal the in-memory path's, and so do every level's constraints
    above (built from the block right-hand sides the shards summed)."""
    from topdown.geo.spine import build_spine
    from topdown.pipeline.execution.levels import build_levels
    from topdown.pipeline.inputs.tabulate import block_histograms, block_units
    from topdown.pipeline.configuration.census import PERSONS_PRODUCT

    monkeypatch.setattr(dataplane, "SHARD_BLOCKS", 300)
    config = multi_config()
    files = dataplane.find_input(multi_single)
    data = dataplane.read_input(dask_client, files)
    spine = build_spine("standard", dataplane.block_geoids(data))
    levels = dataplane.tabulate_levels(dask_client, config, PERSONS_PRODUCT, spine, data, files)
    persons, units = (multi_tables[k].to_pandas() for k in ("persons", "units"))
    memory = build_levels(PERSONS_PRODUCT, config.product("persons"), spine, block_histograms(persons, PERSONS_PRODUCT.schema),
                          block_units(units).set_index("geoid"))
    blocks = levels[-1]
    assert blocks.units is None and blocks.constraints is None and len(blocks.meta) > 2
    meta = dataplane.meta_rows(dask_client.gather([p.future for p in blocks.meta]), np.arange(len(blocks)))
    pd.testing.assert_frame_equal(meta.units, memory[-1].units, check_names=False)
    assert list(meta.geoids) == list(meta.units.index)  # a standard spine's block geocode is its GEOID
    for got, expected in [(meta.constraints, memory[-1].constraints)] + [
            (a.constraints, b.constraints) for a, b in zip(levels[:-1], memory[:-1])]:
        assert list(got.rhs) == list(expected.rhs)
        for name in got.rhs:
            np.testing.assert_array_equal(got.rhs[name].rhs, expected.rhs[name].rhs)


def test_spine_rows_searches_numbers_as_pandas_finds_strings():
    """Input blocks are found on the spine by searching their GEOIDs as numbers: the rows pandas' hash lookup
    gives, and a block not on the spine is an error. The numbers give the GEOIDs back."""
    rng = np.random.default_rng(3)
    spine = pd.Index(sorted({f"{x:015d}" for x in rng.integers(0, 10**12, 500)}), dtype="str")
    some = spine[rng.choice(len(spine), 80, replace=False)]
    numbers = dataplane._spine_numbers(spine)
    assert isinstance(numbers, np.ndarray)
    assert dataplane._geoid_strings(numbers).equals(spine)  # what a shard gets back (leading zeros included)
    assert dataplane._spine_rows(numbers, some).tolist() == spine.get_indexer(some).tolist()
    with pytest.raises(ValueError, match="not the input's blocks"):
        dataplane._spine_rows(numbers, some.append(pd.Index(["999999999999999"], dtype="str")))


@settings(max_examples=40, deadline=None)
@given(st.sets(st.integers(0, 10**6 - 1), min_size=1, max_size=60), st.booleans(), st.integers(1, 7))
def test_counties_are_the_groups_of_the_geoids_five_character_prefixes(numbers, shuffle, step):
    """The MDF's counties (compared ``step`` GEOIDs at a time, sorted GEOIDs not copied) are the sorted
    five-character prefixes, each with its blocks' node rows in GEOID order, whatever the node order."""
    geoids = [f"4400{x // 10**5}{x:010d}" for x in sorted(numbers)]
    if shuffle:
        geoids = list(np.random.default_rng(len(geoids)).permutation(geoids))
    got = dataplane.counties(pd.Index(geoids, dtype="str"), step=step)
    frame = pd.DataFrame({"geoid": geoids}).sort_values("geoid")
    expected = {name: rows.tolist() for name, rows in frame.groupby(frame["geoid"].str[:5]).groups.items()}
    assert got.names == sorted(expected)
    assert {name: got.rows(i).tolist() for i, name in enumerate(got.names)} == expected
    assert (got.order is None) == (geoids == sorted(geoids))


# -- what the workers hold: compact block metadata, each level's truth dropped once estimated ----------------------
_counts = st.lists(st.one_of(st.integers(-2**40, 2**40), st.integers(-300, 300), st.sampled_from([np.nan, np.inf])),
                   min_size=1, max_size=12)


@settings(max_examples=200, deadline=None)
@given(_counts, st.booleans())
def test_narrowed_counts_widen_back_exactly(values, as_float):
    """dataplane._narrow keeps every value (NaN and infinities included) and picks the smallest integer type
    that holds integral values (4-byte floats for integral values with NaN or infinities below 2**24)."""
    a = np.array(values, dtype=float if as_float else object)
    if not as_float:
        a = np.array([v for v in values if isinstance(v, int)] or [0], dtype=np.int64)
    narrow = dataplane._narrow(a)
    back = narrow.astype(a.dtype)
    assert np.array_equal(back, a, equal_nan=True)
    finite = a[np.isfinite(a)]
    if finite.size == a.size and np.abs(finite).max() < 2**31 - 1:
        low, high = finite.min(), finite.max()
        assert narrow.dtype.kind == "i"
        assert narrow.dtype.itemsize == next(t(0).itemsize for t in dataplane.NARROW_INTS
                                             if np.iinfo(t).min <= low and high <= np.iinfo(t).max)
    else:
        assert narrow.dtype.itemsize == 4 or np.abs(finite).max() >= 2**24


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.integers(0, 60), st.integers(0, 8)), min_size=1, max_size=12),
       st.lists(st.integers(0, 70), min_size=1, max_size=20))
def test_a_chunk_asks_only_for_the_parts_whose_rows_it_needs(ranges, rows):
    """levels.holding: the parts whose row range holds one of the chunk's rows, not every part between its
    lowest and highest row (a chunk across two states far apart in row order would fetch them all)."""
    from topdown.pipeline.execution.levels import LevelPart, holding

    parts = [LevelPart(i, lo, lo + width) for i, (lo, width) in enumerate(ranges)]
    got = holding(parts, np.array(rows))
    assert got == [p.future for p in parts if any(p.lo <= r <= p.hi for r in rows)]
    wide = [LevelPart(i, 100 * i, 100 * i + 99) for i in range(50)]
    assert holding(wide, np.array([5, 4_950, 7])) == [0, 49]


@settings(max_examples=200, deadline=None)
@given(st.lists(st.lists(st.integers(0, 40), max_size=10, unique=True), min_size=1, max_size=10),
       st.lists(st.integers(0, 45), min_size=1, max_size=20))
def test_parts_that_list_their_rows_are_found_by_them(listed, rows):
    """levels.LevelParts: a chunk above the blocks asks only for the shards whose nodes it has (each shard's
    nodes are spread over its state: their ranges overlap those of most shards)."""
    from topdown.pipeline.execution.levels import LevelPart, LevelParts, holding

    parts = LevelParts(LevelPart(i, min(r), max(r), np.array(sorted(r))) for i, r in enumerate(listed) if r)
    got = holding(parts, np.array(rows))
    assert got == [p.future for p in parts if set(p.rows) & set(rows)]
    assert holding(parts, np.array(rows)) == got  # the index, built once, answers again


@settings(max_examples=200, deadline=None)
@given(st.lists(st.text(st.characters(codec="utf-8"), max_size=6), min_size=1, max_size=30), st.data())
def test_node_names_are_the_index_entries_whatever_its_storage(names, data):
    """levels.node_names (the children of every chunk the driver builds): the geocodes of a slice or of any rows,
    as Python strings, the same read from an Arrow string array (one chunk or several) as from pandas."""
    from topdown.pipeline.execution.levels import node_names, one_chunk

    lo = data.draw(st.integers(0, len(names)))
    hi = data.draw(st.integers(lo, len(names)))
    rows = np.array(data.draw(st.lists(st.integers(0, len(names) - 1), max_size=10)), dtype=np.int64)
    split = pd.arrays.ArrowStringArray(pa.chunked_array([names[:lo], names[lo:]], type=pa.string()))
    for index in (pd.Index(names, dtype=object), pd.Index(names, dtype="str"), pd.Index(split),
                  one_chunk(pd.Index(split)), pd.Index(pd.array(names, dtype=pd.ArrowDtype(pa.large_string())))):
        assert node_names(index, slice(lo, hi)) == names[lo:hi]
        assert node_names(index, rows) == [names[r] for r in rows]
        assert all(type(x) is str for x in node_names(index, rows))


def test_block_meta_gives_back_its_frames_exactly():
    """BlockMeta holds the unit counts in the fewest bytes and no right-hand side: its rule gives back the
    constraints of any rows from their counts, as the tabulation computed them."""
    geoids = pd.Index([f"{i:015d}" for i in range(7)], dtype="str")
    units = pd.DataFrame({"u0": np.arange(7, dtype=np.int64) * 300, "occupied": np.arange(7, dtype=np.int64)},
                         index=geoids)
    from topdown.vocab.problem import Constraint
    from topdown.pipeline.inputs.invariants import LevelConstraints

    def rule(frame):  # a lower bound from u0, an upper bound with NaN ("no constraint") for odd counts
        u0 = frame[["u0"]].to_numpy(dtype=float)
        return LevelConstraints(frame.index, {"lb": Constraint("lb", "hhgq", ">=", np.hstack([u0, u0 / 2])),
                                              "ub": Constraint("ub", "hhgq", "<=", np.where(u0 % 600, np.nan, u0))})

    meta = dataplane.BlockMeta(10, geoids, units, rule)
    assert [v.dtype for _, v, _ in meta._columns] == [np.int16, np.int8]  # the fewest bytes a count
    assert not any(isinstance(v, np.ndarray) for v in vars(meta).values())  # no right-hand side held
    pd.testing.assert_frame_equal(meta.units, units)
    pd.testing.assert_index_equal(meta.geoids, geoids)
    rows = np.array([13, 10, 16])
    picked = dataplane.meta_rows([meta], rows)
    pd.testing.assert_frame_equal(picked.units, units.iloc[rows - 10])
    got, expected = dataplane.meta_constraints([meta], rows), rule(units.iloc[rows - 10])
    pd.testing.assert_index_equal(got.nodes, geoids[rows - 10])
    for name, c in expected.rhs.items():
        assert got.rhs[name].rhs.dtype == np.float64 and got.rhs[name].sense == c.sense
        np.testing.assert_array_equal(got.rhs[name].rhs, c.rhs)


def test_a_later_products_block_metadata_shares_the_first_ones_arrays():
    geoids = pd.Index([f"{i:015d}" for i in range(5)], dtype="str")
    units = pd.DataFrame({"u0": np.arange(5, dtype=np.int64), "occupied": np.arange(5, dtype=np.int64)}, index=geoids)
    meta = dataplane.BlockMeta(0, geoids, units, None)
    rule = lambda frame: None  # noqa: E731
    other = meta.sharing(rule)
    assert other.rhs is rule and meta.rhs is None and other.has_constraints and not meta.has_constraints
    assert other._geoids is meta._geoids and all(a is b for (_, a, _), (_, b, _) in zip(other._columns, meta._columns))
    pd.testing.assert_frame_equal(other.units, units)


def test_tabulated_block_rules_give_the_constraints_the_tabulation_checked(tmp_path, demo_input, dask_client):
    """The shards' block metadata hold their rule only; it gives back the right-hand sides computed at
    tabulation (level_rhs of the blocks' unit counts) for any rows."""
    from topdown.pipeline.inputs.invariants import level_rhs
    from topdown.pipeline.execution.runner import configure_run, prepare

    config = configure_run("demo", demo_input)
    prep = prepare(config, demo_input, dask_client)
    product = config.run_products[0]
    blocks = prep.levels[product.name][-1]
    metas = dask_client.gather([p.future for p in blocks.meta])
    rows = np.random.default_rng(3).permutation(sum(len(m) for m in metas))[:50]
    units = dataplane.meta_rows(metas, rows).units
    expected = level_rhs(product, config.product(product.name), prep.spine.levels, prep.spine.levels[-1], units,
                         None, None)
    got = dataplane.meta_constraints(metas, rows)
    assert list(got.rhs) == list(expected.rhs) and got.rhs
    for name, c in expected.rhs.items():
        np.testing.assert_array_equal(got.rhs[name].rhs, c.rhs)


def test_a_run_drops_each_levels_true_histograms_once_estimated(tmp_path, demo_input, dask_client, monkeypatch):
    """A one-off run keeps on its workers only the truth of the levels still to estimate: at each product's MDF
    no level above the blocks holds parts, and the first product's blocks are gone at the second's."""
    from topdown.pipeline.execution import runner

    seen = []
    write_mdf = runner.write_mdf

    def watching(client, rundir, product, spine, blocks, estimated, hierarchy):
        held = client.run(lambda dask_worker: sum("level_partial" in str(k) for k in dask_worker.data))
        seen.append((product.name, sum(held.values()), blocks.parts is None))
        return write_mdf(client, rundir, product, spine, blocks, estimated, hierarchy)

    monkeypatch.setattr(runner, "write_mdf", watching)
    run("demo", tmp_path / "run", input_dir=demo_input, client=dask_client)
    assert [name for name, _, _ in seen] == ["persons", "units"]
    (_, at_persons, persons_dropped), (_, at_units, units_dropped) = seen
    assert persons_dropped and units_dropped
    assert at_units < at_persons  # the persons' blocks went; the units' own levels were already dropped


def test_the_read_parts_are_freed_before_the_units_are_tabulated(tmp_path, demo_input, dask_client, monkeypatch):
    """The read tasks' person parts and unit frames live on the workers only until the persons' shards are
    built: the units product counts no person and takes its unit counts from the persons' block metadata, so
    they are all gone before its tabulation (the national run's tabulation peak)."""
    import time

    from topdown.pipeline.execution import runner

    keys: list[str] = []
    read_input, tabulate = runner.read_input, runner.tabulate_levels

    def reading(client, files, census=None):
        inp = read_input(client, files, census)
        keys.extend(str(f.key) for f in inp.persons + inp.units)
        return inp

    def held(client) -> int:
        found = client.run(lambda dask_worker, keys: sum(str(k) in keys for k in dask_worker.data), keys=set(keys))
        return sum(found.values())

    seen = []

    def watching(client, config, product, spine, inp, files, later=(), first=None):
        count = held(client)
        deadline = time.monotonic() + 30  # the scheduler frees released keys asynchronously
        while product.name == "units" and count and time.monotonic() < deadline:
            time.sleep(0.1)
            count = held(client)
        seen.append((product.name, count))
        return tabulate(client, config, product, spine, inp, files, later, first)

    monkeypatch.setattr(runner, "read_input", reading)
    monkeypatch.setattr(runner, "tabulate_levels", watching)
    run("demo", tmp_path / "run", input_dir=demo_input, client=dask_client)
    assert keys and [name for name, _ in seen] == ["persons", "units"]
    assert seen[0][1] >= len(keys) and seen[1][1] == 0  # each part held (replicas counted), then none


@settings(max_examples=60, deadline=None)
@given(st.lists(st.integers(1, 30), min_size=1, max_size=8), st.integers(1, 40))
def test_frames_written_one_after_the_other_give_the_bytes_of_their_concatenation(tmp_path_factory, sizes, group):
    """rundir.write_frames (the invariants file's block rows a shard at a time) writes the file write_table
    writes of the concatenated frame, row group for row group."""
    from topdown.pipeline.runtime.rundir import write_frames, write_table

    rng = np.random.default_rng(sum(sizes) + group)
    frames = [pd.DataFrame({"geocode": pd.Index([f"{v:015d}" for v in rng.integers(0, 10**9, n)], dtype="str"),
                            "u0": rng.integers(0, 50, n), "level": "Block", "tot": np.nan}) for n in sizes]
    frames[0] = pd.concat([pd.DataFrame({"geocode": ["01"], "u0": [7], "level": ["State"], "tot": [3.0]}),
                           frames[0]], ignore_index=True)  # the levels above: object strings, as the driver's
    d = tmp_path_factory.mktemp("w")
    write_frames(iter(frames), d / "a.parquet", rows_per_group=group)
    write_table(pd.concat(frames, ignore_index=True), d / "b.parquet", row_group_size=group)
    assert (d / "a.parquet").read_bytes() == (d / "b.parquet").read_bytes()
    assert pq.ParquetFile(d / "a.parquet").metadata.num_row_groups == -(-(sum(sizes) + 1) // group)
