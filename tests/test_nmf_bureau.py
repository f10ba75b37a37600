"""The noisy measurement file in the Bureau's 2020 layout: our file read by an independent
reader written from the field list of the Bureau's GLS code (GitHub uscensusbureau/DAS_2020_GLS_Uncertainty_
Evaluation, GLS/main_two_pass_alg.py: ``setup_spine_structures``, ``convert_constr_to_query``), a file built
here by hand in that layout read and reprocessed by ours, the round trip, and malformed files."""
from __future__ import annotations

import hashlib
import json
import shutil
from fractions import Fraction
from pathlib import Path

import numpy as np
import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq
import pytest

from cli_subprocess import assert_clean_failure, topdown
from test_reprocess import _no_confidential_reads
from topdown.pipeline import load_config
from topdown.pipeline.cli import EXIT_INPUT
from topdown.pipeline.execution.nmf import read_nmf, write_nmf
from topdown.pipeline.execution.reprocess import reprocess
from topdown.pipeline.outputs.verify import verify_run

SUFFIX_LEN = 4  # the Bureau's QUERY_NAME_SUFFIX_LEN (GLS/drivers/us_pl94_2020.py)
# DPQuery and Constraint columns the Bureau's reader uses, and the non-attribute Constraint columns it skips
# when it builds a constraint's query from the attribute columns (convert_constr_to_query's non_attr_dims)
NON_ATTRIBUTE = ("geocode", "query_name", "sign", "query_shape", "value", "variance", "plb", "State", "County")
DPQUERY_SCHEMA = pa.schema([("geocode", pa.string()), ("query_name", pa.string()), ("value", pa.list_(pa.int64())),
                            ("variance", pa.float64())])


def sha256_tree(root: Path) -> dict[str, str]:
    return {p.relative_to(root).as_posix(): hashlib.sha256(p.read_bytes()).hexdigest()
            for p in sorted(root.rglob("*")) if p.is_file()}


# ------------------------------------------------------------------- an independent reader (pyarrow only)
def bureau_read(reader_path: Path, geolevels: list[str]) -> dict:
    """Read ``reader_path`` as the Bureau's GLS code does: per geolevel ``<Level>.parquet/DPQuery`` rows
    (geocode, query_name less its 4-character suffix, value, variance) and ``<Level>.parquet/Constraint`` rows,
    whose geocodes are the level's nodes; a constraint's query is the non-``*`` attribute columns joined by
    " * "; an ``=`` constraint other than total_con / pl94_con must be zero."""
    out = {}
    for level in geolevels:
        base = reader_path / f"{level}.parquet"
        dpq = pq.read_table(base / "DPQuery")
        for col, check in (("geocode", pa.types.is_string), ("query_name", pa.types.is_string),
                           ("variance", pa.types.is_float64), ("plb", pa.types.is_string)):
            assert check(dpq.schema.field(col).type), (level, col)
        assert dpq.schema.field("value").type == pa.list_(pa.int64())
        measured = {}
        for row in dpq.to_pylist():
            assert row["query_name"].endswith("_dpq")
            assert int(np.prod(row["query_shape"])) == len(row["value"])
            measured[row["geocode"], row["query_name"][:-SUFFIX_LEN]] = (
                np.array(row["value"]), row["variance"], Fraction(row["plb"]), row)
        con = pq.read_table(base / "Constraint")
        assert con.schema.field("value").type == pa.list_(pa.int64())
        constraints = {}
        for row in con.to_pylist():
            assert row["query_name"].endswith("_con") and row["sign"] in ("=", "<=", ">=")
            name = row["query_name"][:-SUFFIX_LEN]
            query = " * ".join(v for k, v in row.items()
                               if isinstance(v, str) and k not in NON_ATTRIBUTE and "*" not in v)
            if row["sign"] == "=" and name not in ("total", "pl94"):
                assert not any(row["value"]), row  # the Bureau's reader asserts it
            assert int(np.prod(row["query_shape"])) == len(row["value"])
            constraints[row["geocode"], name] = (row["sign"], query, np.array(row["value"]))
        nodes = {g for g, _ in constraints}
        assert {g for g, _ in measured} <= nodes
        out[level] = {"measured": measured, "constraints": constraints, "nodes": nodes}
    return out


@pytest.fixture(scope="module")
def demo_nmf(demo_run, tmp_path_factory):
    return write_nmf(demo_run, tmp_path_factory.mktemp("nmf") / "nmf")


def test_an_independent_reader_of_the_bureaus_fields_reads_our_file(demo_run, demo_nmf):
    """(a) What the Bureau's code would read from ``<nmf>/<product>/``: every noisy measurement of the run
    (values in cell order, variance), its plb, query shapes and attribute columns, and constraints it accepts."""
    levels = json.loads((demo_run / "manifest.json").read_text())["levels"]
    cert = json.loads((demo_run / "certificate.json").read_text())
    spine = pd.read_parquet(demo_run / "spine.parquet")
    for product in ("persons", "units"):
        read = bureau_read(demo_nmf / product, levels)
        for level in levels:
            run = pd.read_parquet(demo_run / "noisy_measurements" / product / f"level={level}")
            assert len(run) and {k[1] for k in read[level]["measured"]}
            rows = read[level]["measured"]
            for (g, q), grp in run.sort_values("answer").groupby(["geocode", "query"]):
                value, variance, _, _ = rows[str(g), q]
                np.testing.assert_array_equal(value, grp["value"].to_numpy())
                assert variance == grp["variance"].iloc[0]
            assert len(rows) == run.groupby(["geocode", "query"]).ngroups
            assert read[level]["nodes"] == set(spine[level].astype(str))
        shares = {(q["level"], q["query"]): q for q in cert[product]["queries"]}
        for (g, q), (_, variance, plb, _) in read["Tract"]["measured"].items():
            assert plb == Fraction(shares["Tract", q]["share"])  # standard spine: the level's share of the query
            assert variance == pytest.approx(shares["Tract", q]["variance"])
    persons = bureau_read(demo_nmf / "persons", levels)
    vhc = next(r for (g, q), (*_, r) in persons["Tract"]["measured"].items() if q == "votingage * hispanic * cenrace")
    assert (vhc["hhgq"], vhc["votingage"], vhc["hispanic"], vhc["cenrace"]) == ("*", "votingage", "hispanic", "cenrace")
    assert vhc["query_shape"] == [1, 2, 2, 63]
    block = persons["Block"]["constraints"]
    assert {n for _, n in block} == {"hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0"}
    sign, query, value = next(v for (g, n), v in block.items() if n == "nurse_nva_0")
    assert (sign, query, value.tolist()) == ("=", "gqNursingTotal * nonvoting", [0])
    assert next(v for (g, n), v in block.items() if n == "hhgq_total_ub")[1] == "hhgq"
    state = persons["State"]["constraints"]
    assert {n for _, n in state} == {"total", "hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0"}  # total_con: State total


def _bureau_file(run: Path, out: Path) -> Path:
    """A file of the Bureau's layout built by hand from a run's published measurements and invariants: only the
    Bureau's columns, Spark-like part names, each level's DPQuery rows shuffled over two parts, one query
    named with its terms in another order, constraints as DAS-2020 states them (hhgq_total_lb/ub per level,
    nurse_nva_0 at blocks, total_con where the total is invariant; the housing units' total_con)."""
    product_specs = {p.name: p for p in load_config("demo").run_products}
    levels = json.loads((run / "manifest.json").read_text())["levels"]
    rng = np.random.default_rng(0)
    for product in ("persons", "units"):
        spec = product_specs[product]
        attrs = [d for d, _ in spec.schema.dims]
        inv = pd.read_parquet(run / "invariants" / f"{product}.parquet")
        for level in levels:
            base = out / product / f"{level}.parquet"
            long = pd.read_parquet(run / "noisy_measurements" / product / f"level={level}").sort_values(
                ["geocode", "query", "answer"])
            grouped = long.groupby(["geocode", "query"], sort=True)
            rows = pd.DataFrame({"geocode": [g for g, _ in grouped.groups],
                                 "query_name": [("cenrace * hispanic * votingage" if q == "votingage * hispanic * cenrace"
                                                 else q) + "_dpq" for _, q in grouped.groups],
                                 "value": [grp["value"].tolist() for _, grp in grouped],
                                 "variance": [grp["variance"].iloc[0] for _, grp in grouped]})
            rows = rows.iloc[rng.permutation(len(rows))]
            (base / "DPQuery").mkdir(parents=True)
            for i, half in enumerate(np.array_split(np.arange(len(rows)), 2)):
                pq.write_table(pa.Table.from_pandas(rows.iloc[half], schema=DPQUERY_SCHEMA, preserve_index=False),
                               base / "DPQuery" / f"part-{i:05d}-3f2a-c000.snappy.parquet")
            here = inv[inv["level"] == level].set_index("geocode").sort_index()
            con = []
            for g, node in here.iterrows():
                star = dict.fromkeys(attrs, "*")
                if product == "units":
                    con.append({"geocode": g, "query_name": "total_con", "sign": "=", "query_shape": [1],
                                "value": [int(node["u0"])], **star})
                    continue
                u = node[[f"u{k}" for k in range(8)]].to_numpy(dtype=np.int64)
                bounds = spec.unit_bounds
                con += [{"geocode": g, "query_name": name, "sign": sign, "query_shape": [8, 1, 1, 1],
                         "value": (u * np.array(mult)).tolist(), **star, "hhgq": "hhgq"}
                        for name, sign, mult in (("hhgq_total_lb_con", ">=", bounds.min_per_unit),
                                                 ("hhgq_total_ub_con", "<=", bounds.cap))]
                if "tot" in node and not np.isnan(node["tot"]):
                    con.append({"geocode": g, "query_name": "total_con", "sign": "=", "query_shape": [1, 1, 1, 1],
                                "value": [int(node["tot"])], **star})
                if level == "Block":
                    con.append({"geocode": g, "query_name": "nurse_nva_0_con", "sign": "=",
                                "query_shape": [1, 1, 1, 1], "value": [0], **star,
                                "hhgq": "gqNursingTotal", "votingage": "nonvoting"})
            (base / "Constraint").mkdir(parents=True)
            table = pa.Table.from_pylist(con, schema=pa.schema(
                [("geocode", pa.string()), ("query_name", pa.string()), ("sign", pa.string()),
                 ("query_shape", pa.list_(pa.int32())), ("value", pa.list_(pa.int64())),
                 *((a, pa.string()) for a in attrs)]))
            pq.write_table(table, base / "Constraint" / "part-00000-3f2a-c000.snappy.parquet")
    return out


@pytest.fixture(scope="module")
def bureau(demo_run, tmp_path_factory):
    return _bureau_file(demo_run, tmp_path_factory.mktemp("bureau") / "bureau")


def test_a_hand_built_bureau_file_is_read_and_reprocessed(demo_run, bureau, dask_client, tmp_path, monkeypatch):
    """(b) The Bureau's layout, no nmf.json: read with the configuration and spine it was measured with, its
    measurements are the run's (names mapped, including a query spelled with its terms in another order), its
    invariants are derived from the constraints, and reprocessing it gives the run's estimates byte for byte."""
    from topdown.geo.spine import Spine

    config = load_config("demo")
    spine = Spine.read_parquet(demo_run / "spine.parquet")
    nmf = read_nmf(bureau, config, spine)
    assert nmf.bureau and nmf.meta["levels"] == spine.levels
    for product in ("persons", "units"):
        assert len(nmf.parts[product]["Block"]) == 2
        for level in spine.levels:
            own = pd.read_parquet(demo_run / "noisy_measurements" / product / f"level={level}")
            own = own.sort_values(["geocode", "query", "answer"], kind="stable").reset_index(drop=True)
            pd.testing.assert_frame_equal(nmf.measurements(product, level), own)
    spine_file = tmp_path / "spine.parquet"
    shutil.copy(demo_run / "spine.parquet", spine_file)
    _no_confidential_reads(monkeypatch, tmp_path)
    out = reprocess(bureau, tmp_path / "from-bureau", "demo", spine=spine_file, client=dask_client)
    for sub in ("histograms", "mdf"):
        assert sha256_tree(out / sub) == sha256_tree(demo_run / sub) and sha256_tree(out / sub), sub
    assert verify_run(out).ok
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["reprocessing_of"]["noisy_measurement_file"] == str(bureau.resolve())
    assert cert["added_privacy_loss"]["rho"] == "0"


def test_our_file_round_trip_is_byte_identical_and_read_part_by_part(demo_run, demo_nmf, dask_client, tmp_path,
                                                                     monkeypatch):
    """(c) run -> nmf -> reprocess from the file: histograms and MDF with the run's SHA-256, and every level's
    measurements written back in as many parts as the file's DPQuery has (a block task reads its parts only)."""
    spine = tmp_path / "spine.parquet"
    spine.write_bytes((demo_run / "spine.parquet").read_bytes())
    _no_confidential_reads(monkeypatch, tmp_path)
    out = reprocess(demo_nmf, tmp_path / "from-nmf", "demo", spine=spine, client=dask_client)
    for sub in ("histograms", "mdf"):
        assert sha256_tree(out / sub) == sha256_tree(demo_run / sub) and sha256_tree(out / sub), sub
    for product in ("persons", "units"):
        for level in json.loads((demo_run / "manifest.json").read_text())["levels"]:
            parts = list((demo_nmf / product / f"{level}.parquet" / "DPQuery").glob("*.parquet"))
            again = list((out / "noisy_measurements" / product / f"level={level}").glob("*.parquet"))
            run = list((demo_run / "noisy_measurements" / product / f"level={level}").glob("*.parquet"))
            assert len(parts) == len(again) == len(run)
    assert verify_run(out).ok
    cert = json.loads((out / "certificate.json").read_text())
    assert cert["reprocessing_of"]["noisy_measurement_file"] == str(demo_nmf.resolve())
    assert cert["reprocessing_of"]["config_sha256"] == json.loads((demo_run / "manifest.json").read_text())["config_hash"]
    assert cert["added_privacy_loss"]["rho"] == "0"


def _broken(bureau: Path, tmp_path: Path, edit) -> Path:
    copy = tmp_path / "broken"
    shutil.copytree(bureau, copy)
    part = sorted((copy / "persons" / "Tract.parquet" / "DPQuery").glob("*.parquet"))[0]
    pq.write_table(edit(pq.read_table(part)), part)
    return copy


@pytest.mark.parametrize("edit, fragments", [
    (lambda t: t.drop(["variance"]), ("Tract.parquet/DPQuery/part-00000", "no column 'variance'")),
    (lambda t: t.set_column(t.column_names.index("variance"), "variance", pa.array(["1"] * t.num_rows)),
     ("column 'variance' is string, not a number",)),
    (lambda t: t.set_column(1, "query_name", pa.array(["race * age_dpq"] * t.num_rows)),
     ("Tract.parquet/DPQuery", "unknown query name 'race * age_dpq'")),
    (lambda t: t.set_column(2, "value", pa.array([v[:-1] or [1, 2] for v in t.column("value").to_pylist()],
                                                 pa.list_(pa.int64()))),
     ("Tract.parquet/DPQuery/part-00000", "values; its answers are")),
], ids=["missing-column", "wrong-type", "unknown-query", "wrong-length"])
def test_a_malformed_bureau_file_is_a_one_line_input_error(demo_run, bureau, tmp_path, edit, fragments):
    broken = _broken(bureau, tmp_path, edit)
    outcome = topdown("reprocess", broken, "--out", tmp_path / "x", "--config", "demo",
                      "--spine", demo_run / "spine.parquet", "--workers", "1")
    assert_clean_failure(outcome, EXIT_INPUT, *fragments)
    assert not (tmp_path / "x").exists()


BOUNDS = ("ci90_low", "ci90_high", "ci95_low", "ci95_high")


def test_uncertainty_reads_a_bureau_file_as_the_run(demo_run, bureau, dask_client, tmp_path):
    """``topdown uncertainty NMF --spine --config``: the same GLS table from the hand-built Bureau file (its rows
    spread over parts at random, regrouped into whole block groups) as from the run directory (our own file
    takes the same path); the converted measurements are removed afterwards."""
    from topdown.pipeline.evaluation.uncertainty import Z90, Z95, uncertainty

    spine = demo_run / "spine.parquet"
    tables = []
    for i, source in enumerate((demo_run, bureau)):
        out = tmp_path / f"u{i}.parquet"
        extra = {} if source is demo_run else {"spine": spine, "config": "demo"}
        uncertainty(source, out, levels=["County", "Tract"], client=dask_client, **extra)
        tables.append(pd.read_parquet(out))
    assert len(tables[0]) and set(tables[0]["level"]) == {"County", "Tract"}
    # The GLS (with the file's invariants: exact totals, structural zeros) is the run's; the published counts
    # are the run directory's alone (a measurement file holds none).
    assert tables[0]["published"].notna().all() and tables[1]["published"].isna().all()
    a, b = tables[1].drop(columns="published"), tables[0].drop(columns="published")
    # The file's parts are summed in another order than the run's: equal up to float rounding, and the integer
    # bounds equal except where a real bound lies within rounding of an integer.
    pd.testing.assert_frame_equal(a.drop(columns=["estimate", "variance", *BOUNDS]), b.drop(columns=["estimate", "variance", *BOUNDS]))
    np.testing.assert_allclose(a["estimate"], b["estimate"], rtol=1e-9, atol=1e-6)
    np.testing.assert_allclose(a["variance"], b["variance"], rtol=1e-9, atol=1e-9)
    for z, lo, hi in ((Z90, "ci90_low", "ci90_high"), (Z95, "ci95_low", "ci95_high")):
        for col, real in ((lo, b["estimate"] - z * np.sqrt(b["variance"])), (hi, b["estimate"] + z * np.sqrt(b["variance"]))):
            edge = (real - real.round()).abs() < 1e-6
            assert (a[col] == b[col])[~edge].all() and ((a[col] - b[col]).abs() <= 1)[edge].all()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["u0.parquet", "u1.parquet"]
