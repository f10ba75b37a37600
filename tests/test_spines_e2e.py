"""End to end with the AIAN and optimized spines (DESIGN.md items 5 and 13; Abowd et al. 2022, sections
7.4-7.5) on real 2020 Rhode Island blocks.

The input is synthetic (``write_synthetic``) with its block GEOIDs remapped onto real 2020 RI blocks
from the block assignment files: tract 44009051101 and one block of 44009051102 hold the 25 blocks of
AIAN area 2415, so the state splits into an AIAN part "144" and a non-AIAN part "044"; two more tracts
(one in another county) make the non-AIAN part branch. Checks: the run completes and verifies, the
state total is exact over the two parts together, bypassed single-child nodes are not measured and
equal their parent, the certificate's path condition holds, the MDF keeps tabulation geography.
"""
from __future__ import annotations

import json
import logging
from pathlib import Path


import numpy as np
import pandas as pd
import pytest

from topdown.geo.baf import read_baf_dir
from topdown.geo.spine import build_spine, check_path_condition
from topdown.pipeline import load_config, run
from topdown.pipeline.inputs.us_synth import write_synthetic
from topdown.pipeline.outputs.verify import verify_run
from conftest import DATA
from rel_inputs import scan_run_dir, leaked_secrets

BAF_DIR = DATA / "ri_baf2020"
AIAN_AREA = "2415"



def chosen_blocks() -> list[str]:
    """Every AIAN-area block, plus the first non-AIAN blocks of the AIAN tracts and of two other tracts."""
    baf = read_baf_dir(BAF_DIR)
    aian = baf.index[baf["aiannhce"] == AIAN_AREA]
    assert len(aian) == 25
    rest = baf.index[baf["aiannhce"] != AIAN_AREA].to_series()
    picks = [aian.to_series()]
    for tract, n in (("44009051101", 16), ("44009051102", 8), ("44009051000", 20), ("44007000101", 20)):
        picks.append(rest[rest.str.startswith(tract)].iloc[:n])
    return sorted(pd.concat(picks).tolist())


def write_input(out: Path, seed: int = 11) -> list[str]:
    """Synthetic persons and units, deterministically remapped block by block onto ``chosen_blocks()``."""
    blocks = chosen_blocks()
    raw = out.parent / f"{out.name}-raw"
    write_synthetic(raw, blocks=2 * len(blocks), seed=seed)
    persons, units = pd.read_parquet(raw / "persons.parquet"), pd.read_parquet(raw / "units.parquet")
    nonempty = np.intersect1d(persons["geoid"].unique(), units["geoid"].unique())[:len(blocks)]
    assert len(nonempty) == len(blocks)  # every chosen block gets persons and units
    mapping = dict(zip(nonempty, blocks))
    persons, units = persons[persons["geoid"].isin(nonempty)], units[units["geoid"].isin(nonempty)]
    out.mkdir(parents=True, exist_ok=True)
    for frame, name in ((persons, "persons"), (units, "units")):
        frame.assign(geoid=frame["geoid"].map(mapping)).to_parquet(out / f"{name}.parquet", index=False)
    return blocks


@pytest.fixture(scope="module")
def spine_input(tmp_path_factory) -> Path:
    path = tmp_path_factory.mktemp("spines") / "input"
    write_input(path)
    return path


#: The DEBUG log of each spine's run (client and forwarded worker records), for the confidentiality scan.
DEBUG_LOGS: dict[str, list[str]] = {}


class _Lines(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        self.lines.append(f"{record.name} {record.levelname} {record.getMessage()}")


def _debug_everywhere() -> None:
    logging.getLogger().setLevel(logging.DEBUG)
    logging.getLogger("pyomo").setLevel(logging.INFO)  # Pyomo's DEBUG model dumps: see test_confidentiality


def _run(kind: str, inp: Path, out: Path, client) -> Path:
    """A test-mode run of the production preset on ``kind``'s spine, every logger at DEBUG (workers' forwarded)."""
    config = load_config("pl94_production_2021").with_overrides(
        name=f"spine-{kind}", spine=kind, baf=str(BAF_DIR), input=str(inp), seed=2415, mode="test")
    root, handler = logging.getLogger(), _Lines()
    level = root.level
    client.run(_debug_everywhere)
    client.forward_logging(level=logging.DEBUG)
    root.addHandler(handler)
    _debug_everywhere()
    try:
        return run(config, out, input_dir=inp, client=client)
    finally:
        root.removeHandler(handler)
        root.setLevel(level)
        client.unforward_logging()
        DEBUG_LOGS[kind] = handler.lines


@pytest.fixture(scope="module", params=["aian", "optimized"])
def spine_run(request, tmp_path_factory, spine_input, dask_client) -> tuple[str, Path, Path]:
    out = tmp_path_factory.mktemp(f"run-{request.param}") / "run"
    return request.param, _run(request.param, spine_input, out, dask_client), spine_input


def _hist(run_dir: Path, product: str, level: str) -> pd.DataFrame:
    h = pd.read_parquet(run_dir / "histograms" / product / f"level={level}")
    return h.assign(geocode=h["geocode"].astype(str))


def test_run_completes_and_verifies(spine_run):
    kind, run_dir, _ = spine_run
    manifest = json.loads((run_dir / "manifest.json").read_text())
    assert manifest["status"] == "complete" and manifest["spine"] == kind
    assert manifest["failsafe"] == []  # the US -> State group total (DESIGN.md item 5) needs no relaxation
    report = verify_run(run_dir)
    assert report.ok, report.failures


def test_state_total_exact_over_the_two_parts(spine_run):
    _, run_dir, inp = spine_run
    spine = pd.read_parquet(run_dir / "spine.parquet")
    assert sorted(spine["State"].unique()) == ["044", "144"]
    aian_blocks = spine.loc[spine["State"] == "144", "geoid"]
    assert len(aian_blocks) == 25
    persons = pd.read_parquet(inp / "persons.parquet")
    state = _hist(run_dir, "persons", "State")
    assert set(state["geocode"]) <= {"044", "144"}
    assert int(state["count"].sum()) == len(persons)
    units = pd.read_parquet(inp / "units.parquet")
    assert int(_hist(run_dir, "units", "State")["count"].sum()) == int((units["unit_type"] == 0).sum())


def test_bypassed_nodes_are_copies_and_unmeasured(spine_run):
    kind, run_dir, inp = spine_run
    units = pd.read_parquet(inp / "units.parquet")
    geoids = pd.Series(np.union1d(units["geoid"].unique(), pd.read_parquet(inp / "persons.parquet")["geoid"].unique()))
    spine = build_spine(kind, geoids, baf_dir=BAF_DIR, units=units)
    written = pd.read_parquet(run_dir / "spine.parquet")
    pd.testing.assert_frame_equal(written.reset_index(drop=True),
                                  spine.table[["geoid", *spine.levels]].reset_index(drop=True), check_dtype=False)
    bypassed = 0
    for parent, child in zip(spine.levels[:-1], spine.levels[1:]):
        only = spine.fanout(parent)
        only = only[only == 1].index
        pairs = spine.table[[parent, child]].drop_duplicates()
        pairs = pairs[pairs[parent].isin(only)]
        for product in ("persons", "units"):
            nm = pd.read_parquet(run_dir / "noisy_measurements" / product / f"level={child}", columns=["geocode"])
            assert not set(nm["geocode"].astype(str)) & set(pairs[child]), (product, child)
            ph = _hist(run_dir, product, parent).set_index(["geocode", "cell"])["count"]
            ch = _hist(run_dir, product, child).set_index(["geocode", "cell"])["count"]
            for p, c in pairs.itertuples(index=False):
                got = ch.xs(c, level="geocode") if c in ch.index.get_level_values(0) else pd.Series(dtype=np.int64)
                want = ph.xs(p, level="geocode") if p in ph.index.get_level_values(0) else pd.Series(dtype=np.int64)
                pd.testing.assert_series_equal(got[got != 0], want[want != 0], check_names=False, check_dtype=False)
        above = spine.levels[:spine.levels.index(child)]
        for row in spine.table[spine.table[child].isin(pairs[child])].drop_duplicates(child).itertuples(index=False):
            node = row._asdict()
            assert spine.budget_levels(child, node[child]) == ()  # its budget moved up the chain of one-child nodes
            assert any(child in spine.budget_levels(lv, node[lv]) for lv in above)
        bypassed += len(pairs)
    assert bypassed > 0  # the AIAN state part has one county: at least that is bypassed
    assert spine.budget_levels("County", "144009") == ()


def test_certificate_path_condition(spine_run):
    kind, run_dir, inp = spine_run
    cert = json.loads((run_dir / "certificate.json").read_text())
    n_blocks = pd.read_parquet(run_dir / "spine.parquet")["geoid"].nunique()
    for product in ("persons", "units"):
        pc = cert[product]["path_condition"]
        assert pc["holds"] is True and pc["blocks"] == n_blocks
        assert pc["min_share"]["County"] == "0"  # a bypassed county carries nothing
    units = pd.read_parquet(inp / "units.parquet")
    check_path_condition(build_spine(kind, pd.Series(np.sort(units["geoid"].unique())), baf_dir=BAF_DIR, units=units))


def test_mdf_keeps_tabulation_geography(spine_run):
    _, run_dir, inp = spine_run
    persons = pd.read_parquet(inp / "persons.parquet")
    mdf = pd.read_parquet(run_dir / "mdf" / "persons")
    assert len(mdf) == len(persons)
    geoid = mdf["TABBLKST"] + mdf["TABBLKCOU"] + mdf["TABTRACTCE"] + mdf["TABBLK"]
    assert set(geoid) <= set(pd.read_parquet(run_dir / "spine.parquet")["geoid"])
    assert (mdf["TABBLKST"] == "44").all()
    assert (mdf["TABBLKGRPCE"] == mdf["TABBLK"].str[0]).all()
    per_block = _hist(run_dir, "persons", "Block").groupby("geocode")["count"].sum()
    per_block = per_block[per_block > 0]
    counts = geoid.value_counts().sort_index()
    assert counts.index.tolist() == per_block.sort_index().index.tolist()
    assert (counts.to_numpy() == per_block.sort_index().to_numpy()).all()


def true_secrets(run_dir: Path, inp: Path) -> dict[str, int]:
    """Every true total of 100 or more of a node that is not a declared invariant: the spine's State parts
    (of a split state), counties, tracts, block groups and blocks, and the tabulation counties and tracts,
    less the values of the US and state totals (declared invariants)."""
    spine = pd.read_parquet(run_dir / "spine.parquet").astype(str).set_index("geoid")
    per_block = pd.read_parquet(inp / "persons.parquet", columns=["geoid"])["geoid"].value_counts()
    nodes = {f"{lv} {g}": int(n) for lv in spine.columns if lv != "US"
             for g, n in per_block.groupby(spine[lv].reindex(per_block.index)).sum().items()}
    for name, width in (("tabulation county", 5), ("tabulation tract", 11)):
        nodes.update({f"{name} {g}": int(n) for g, n in per_block.groupby(per_block.index.str[:width]).sum().items()})
    states = per_block.groupby(per_block.index.str[:2]).sum()
    parts = spine["State"].groupby(spine.index.str[:2]).nunique()
    whole = {f"State {g}" for g in spine["State"].unique() if parts[spine.index[spine["State"] == g][0][:2]] == 1}
    return {k: v for k, v in nodes.items() if v >= 100 and k not in whole and v not in set(states) | {states.sum()}}


def check_unit_invariants(run_dir: Path, inp: Path) -> dict[str, list[str]]:
    """The unit columns of the invariants files are exactly the sums of the block unit and GQ-facility
    counts (declared invariants), recomputed here from the input; returns those columns per file."""
    spine = pd.read_parquet(run_dir / "spine.parquet").astype(str).set_index("geoid")
    units = pd.read_parquet(inp / "units.parquet")
    per_block = pd.crosstab(units["geoid"], units["unit_type"]).reindex(columns=range(8), fill_value=0)
    per_block.columns = [f"u{k}" for k in range(8)]
    groups = {lv: spine[lv] for lv in spine.columns} | {"whole_state": pd.Series(spine.index.str[:2], spine.index)}
    for product, cols in (("persons", list(per_block.columns)), ("units", ["u0"])):
        inv = pd.read_parquet(run_dir / "invariants" / f"{product}.parquet")
        for level, key in groups.items():
            want = per_block[cols].groupby(key.reindex(per_block.index)).sum().sort_index()
            got = inv.loc[inv["level"] == level].set_index("geocode")[cols].sort_index()
            if product == "units" and level == "whole_state":
                assert got.empty
                continue
            pd.testing.assert_frame_equal(got.reindex(want.index), want, check_dtype=False, check_names=False)
    return {"invariants/persons.parquet": list(per_block.columns), "invariants/units.parquet": ["u0"]}


def test_no_true_total_in_any_output_or_log(spine_run, tmp_path_factory):
    """Only declared invariants leave the protected outputs: no true total of a State part, county, tract,
    block group or block (>= 100) is in any file of the run directory (outside the histograms, noisy
    measurements and MDF, which are the DP outputs) or any line of the run's DEBUG log. The unit columns
    of the invariants files are compared with the block unit counts instead (a housing-unit count may equal
    a person total by chance). The scanner finds a total planted in a copy of the invariants file."""
    kind, run_dir, inp = spine_run
    named = true_secrets(run_dir, inp)
    secrets = set(named.values())
    parts = [k for k in named if k.startswith("State ")]
    assert len(parts) == 2 and len(named) >= 8, named  # both parts of the split state, and more, are secrets
    checked = check_unit_invariants(run_dir, inp)
    findings, scanned = scan_run_dir(run_dir, secrets, strip=str(tmp_path_factory.getbasetemp()), checked=checked)
    log = DEBUG_LOGS[kind]
    findings += [f"DEBUG log: {line}" for _, line in leaked_secrets("\n".join(log), secrets)]
    print(f"\n[{kind}] {len(secrets)} secret totals ({', '.join(sorted(named))}); scanned {len(scanned)} files "
          f"and {len(log)} lines of the log at DEBUG:\n  " + "\n  ".join(scanned + [f"log: {line}" for line in log]))
    assert any("persons Block:" in line for line in log) and any("units Block:" in line for line in log)
    assert {s.split(" ")[0] for s in scanned} >= {"certificate.json", "manifest.json", "spine.parquet",
                                                  "invariants/persons.parquet", "invariants/units.parquet"}
    assert findings == []
    planted = tmp_path_factory.mktemp(f"planted-{kind}")
    inv = pd.read_parquet(run_dir / "invariants" / "persons.parquet")
    (planted / "invariants").mkdir()
    inv.assign(tot=inv["tot"].fillna(named[parts[0]])).to_parquet(planted / "invariants" / "persons.parquet")
    assert scan_run_dir(planted, secrets, checked=checked)[0]


def test_invariants_file_holds_whole_state_totals_only(spine_run):
    """The State rows (the AIAN and non-AIAN parts) carry no total; the whole state's total is one row."""
    _, run_dir, inp = spine_run
    inv = pd.read_parquet(run_dir / "invariants" / "persons.parquet")
    with_tot = inv[inv["tot"].notna()]
    assert sorted(with_tot["level"]) == ["US", "whole_state"]
    assert with_tot.set_index("level")["tot"].to_dict() == {"US": len(pd.read_parquet(inp / "persons.parquet")),
                                                            "whole_state": len(pd.read_parquet(inp / "persons.parquet"))}
    assert set(inv.loc[inv["level"] == "State", "geocode"]) == {"044", "144"}
    assert with_tot.loc[with_tot["level"] == "whole_state", "geocode"].tolist() == ["44"]


def test_reprocessing_and_the_measurement_file_keep_the_whole_state_totals(spine_run, dask_client, tmp_path):
    """A state split into AIAN / non-AIAN parts: reprocessing the run gives its estimates byte for byte (the
    whole-state totals are read back from the invariants file), and the noisy measurement file carries each
    whole state's total so that a reprocessing of the file enforces it too."""
    from topdown.pipeline.inputs.invariants import WHOLE_STATE
    from topdown.pipeline.execution.nmf import read_nmf, write_nmf
    from topdown.pipeline.execution.reprocess import invariants_of_nmf, reprocess

    _, run_dir, _ = spine_run
    out = reprocess(run_dir, tmp_path / "again", client=dask_client)
    for sub in ("histograms", "mdf"):
        base, again = run_dir / sub, out / sub
        assert ({p.relative_to(base): p.read_bytes() for p in base.rglob("*") if p.is_file()}
                == {p.relative_to(again): p.read_bytes() for p in again.rglob("*") if p.is_file()}), sub
    published = pd.read_parquet(run_dir / "invariants" / "persons.parquet")
    published = published[published["level"] == WHOLE_STATE].set_index("geocode")["tot"]
    from topdown.pipeline.configuration.census import PL94

    from_file = invariants_of_nmf(read_nmf(write_nmf(run_dir, tmp_path / "nmf")), PL94.products[0], list(PL94.products))
    from_file = from_file[from_file["level"] == WHOLE_STATE].set_index("geocode")["tot"]
    assert len(published) and from_file.sort_index().to_dict() == published.sort_index().to_dict()


def test_the_driver_frees_the_block_assignment_frame_once_the_spine_is_built(spine_input, dask_client, monkeypatch):
    """The block assignment frame (74 bytes a block, 0.6 GB at national size) is gone from the driver before the
    tabulation, the start-up's memory peak: a run held it to its end."""
    import weakref

    from topdown.pipeline.execution import runner

    refs: list[weakref.ref] = []
    alive_at_tabulation: list[bool] = []
    read_baf, tabulate_levels = runner.read_baf, runner.tabulate_levels

    def read(config):
        frame = read_baf(config)
        refs.append(weakref.ref(frame))
        return frame

    def tabulate(*args, **kwargs):
        alive_at_tabulation.append(refs[-1]() is not None)
        return tabulate_levels(*args, **kwargs)

    monkeypatch.setattr(runner, "read_baf", read)
    monkeypatch.setattr(runner, "tabulate_levels", tabulate)
    config = load_config("pl94_production_2021").with_overrides(
        name="spine-baf-freed", spine="optimized", baf=str(BAF_DIR), input=str(spine_input), seed=2415, mode="test")
    prep = runner.prepare(config, spine_input, dask_client)
    assert prep.spine.kind == "optimized" and len(refs) == 1
    assert alive_at_tabulation == [False, False]  # persons, then units
