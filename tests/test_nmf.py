"""The noisy measurement file: ``topdown nmf`` writes the Bureau's 2020 DPQuery/Constraint layout (plus our
Invariant part), ``read_nmf`` gives back exactly the run's noisy measurements, and nothing confidential is in it
(the Bureau's own reader's view: tests/test_nmf_bureau.py)."""
from __future__ import annotations

import json
from fractions import Fraction

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from rel_inputs import SECRETS, leaked_secrets
from topdown.pipeline.cli import EXIT_OK, EXIT_RUNDIR, main
from topdown.pipeline.execution.nmf import read_nmf, write_nmf


@pytest.fixture(scope="module")
def planted_nmf(planted_run, tmp_path_factory):
    out = tmp_path_factory.mktemp("nmf") / "nmf"
    assert main(["nmf", str(planted_run), "--out", str(out)]) == EXIT_OK
    return out


def test_read_nmf_returns_the_runs_noisy_measurements(planted_run, planted_nmf):
    nmf = read_nmf(planted_nmf)
    levels = json.loads((planted_run / "manifest.json").read_text())["levels"]
    assert nmf.meta["levels"] == levels and set(nmf.parts) == {"persons", "units"}
    spine = pd.read_parquet(planted_run / "spine.parquet")
    for product in ("persons", "units"):
        for level in levels:
            own = pd.read_parquet(planted_run / "noisy_measurements" / product / f"level={level}")
            own = own.sort_values(["geocode", "query", "answer"], kind="stable").reset_index(drop=True)
            pd.testing.assert_frame_equal(nmf.measurements(product, level), own)
            assert list(nmf.nodes[product][level]) == sorted(spine[level].astype(str).unique())


def test_dpquery_rows_follow_the_2020_layout(planted_run, planted_nmf):
    dpq = pq.read_table(planted_nmf / "persons" / "Tract.parquet" / "DPQuery").to_pandas()
    assert list(dpq.columns) == ["geocode", "query_name", "query_shape", "value", "variance", "plb",
                                 "hhgq", "votingage", "hispanic", "cenrace"]
    row = dpq[dpq["query_name"] == "votingage * hispanic * cenrace_dpq"].iloc[0]
    assert len(row["value"]) == 2 * 2 * 63 and list(row["query_shape"]) == [1, 2, 2, 63]
    cert = json.loads((planted_run / "certificate.json").read_text())["persons"]["queries"]
    entry = next(q for q in cert if q["level"] == "Tract" and q["query"] == "votingage * hispanic * cenrace")
    assert Fraction(row["plb"]) == Fraction(entry["share"])  # standard spine: the level's share
    assert row["variance"] == pytest.approx(entry["variance"])
    assert dpq.groupby("geocode")["query_name"].nunique().eq(11).all()


def test_constraint_rows_hold_constraints_and_invariant_rows_the_invariants(planted_nmf):
    nmf = read_nmf(planted_nmf)
    block = nmf.constraints["persons"]["Block"]
    assert set(block["name"]) == {"hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0"}
    assert set(block["sign"]) == {"=", ">=", "<="}
    state = nmf.constraints["persons"]["State"]
    assert set(state["name"]) == {"total", "hhgq_total_lb", "hhgq_total_ub", "nurse_nva_0"}  # total_con: State total
    inv = pq.read_table(planted_nmf / "persons" / "State.parquet" / "Invariant").to_pandas()
    assert set(inv["query_name"]) == {"gqhh_vect", "tot"}
    lb = block[(block["name"] == "hhgq_total_lb")].set_index("geocode")["value"]
    inv = pq.read_table(planted_nmf / "persons" / "Block.parquet" / "Invariant").to_pandas()
    vect = inv[inv["query_name"] == "gqhh_vect"].set_index("geocode")["value"]
    for g in lb.index:  # at least one person per occupied GQ facility (hhgq_total_lb)
        assert np.array_equal(lb[g][1:], vect[g][1:])


def test_nmf_discloses_no_confidential_count(planted_nmf):
    """Constraint values are public invariants; no planted count is among them or in nmf.json."""
    text = (planted_nmf / "nmf.json").read_text()
    for path in [*planted_nmf.glob("*/*.parquet/Constraint"), *planted_nmf.glob("*/*.parquet/Invariant")]:
        text += "\n" + pq.read_table(path).to_pandas().to_string()
    assert leaked_secrets(text) == []
    assert "7081" not in text and all(str(s) not in text.split() for s in SECRETS)


def test_nmf_refuses_an_incomplete_run_and_an_existing_output(tmp_path, planted_run, planted_nmf):
    assert main(["nmf", str(tmp_path), "--out", str(tmp_path / "x")]) == EXIT_RUNDIR
    assert main(["nmf", str(planted_run), "--out", str(planted_nmf)]) == EXIT_RUNDIR
    assert not (tmp_path / "x").exists()


def test_nmf_reads_published_files_only(planted_run, planted_nmf, tmp_path):
    """The same file from a copy of the run without histograms, MDF or input: the NMF cannot hold more than
    the noisy measurements, invariants and configuration."""
    import shutil

    slim = tmp_path / "slim"
    shutil.copytree(planted_run, slim, ignore=shutil.ignore_patterns("histograms", "mdf"))
    write_nmf(slim, tmp_path / "nmf")
    a = sorted(p.relative_to(planted_nmf) for p in planted_nmf.rglob("*") if p.is_file())
    b = sorted(p.relative_to(tmp_path / "nmf") for p in (tmp_path / "nmf").rglob("*") if p.is_file())
    assert a == b
    for rel in a:
        if rel.suffix == ".parquet":
            assert pq.read_table(planted_nmf / rel).equals(pq.read_table(tmp_path / "nmf" / rel)), rel
