"""``[persons.estimation] match_published``: the 2020 DHC persons estimates held equal, at every level, to the
hhgq x voting age x hispanic x cenrace counts a P.L. 94-171 run published on the same spine; the refusals (one
line, exit 4 for an unusable run directory, exit 2 for a configuration that cannot work) before the input is
read; the records of the earlier run's manifest; and no confidential count in what is added."""
from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import scipy.sparse as sp

from rel_inputs import leaked_secrets
from topdown.pipeline import load_config, run
from topdown.pipeline.cli import main
from topdown.pipeline.configuration.census import load_census
from topdown.pipeline.configuration.config import ConfigError, config_from_dict, read_toml
from topdown.vocab.queries import build_query

QUERY = "hhgq8lev * votingage * hispanic * cenrace"
LEVELS = ["US", "State", "County", "Tract", "Block_Group", "Block"]


def _pl_input(dhc: Path, out: Path, drop: str | None = None) -> Path:
    """The P.L. 94-171 input of the same persons and units (hhgq = hhgq8lev of relgq, votingage = age >= 18);
    ``drop``: without that block."""
    schema = load_census("dhc2020").product("persons").schema
    hhgq = np.zeros(42, np.int64)
    for g, levels in enumerate(schema.recodes["hhgq8lev"][1]):
        hhgq[list(levels)] = g
    persons, units = pd.read_parquet(dhc / "persons"), pd.read_parquet(dhc / "units")
    if drop is not None:
        persons, units = persons[persons["geoid"] != drop], units[units["geoid"] != drop]
    out.mkdir(parents=True)
    pd.DataFrame({"geoid": persons["geoid"], "hhgq": hhgq[persons["relgq"]],
                  "votingage": (persons["age"] >= 18).astype(np.int64), "hispanic": persons["hispanic"],
                  "cenrace": persons["cenrace"]}).to_parquet(out / "persons.parquet", index=False)
    units[["geoid", "unit_type", "occupied"]].to_parquet(out / "units.parquet", index=False)
    return out


def _pl_run(where: Path, data: Path, client) -> Path:
    """A P.L. 94-171 persons run (the demo's settings: production budget, standard spine, test-mode seed)."""
    config = where / "pl.toml"
    config.write_text('include = "demo"\n[run]\nname = "pl"\nproducts = ["persons"]\nbuild_demo_input = false\n')
    return run(load_config(config), where / "pl-run", input_dir=data, client=client)


@pytest.fixture(scope="module")
def inputs(tmp_path_factory) -> tuple[Path, Path]:
    root = tmp_path_factory.mktemp("match")
    assert main(["synth", "--census", "dhc2020", "--persons", "400", "--seed", "1", str(root / "dhc-in")]) == 0
    return root / "dhc-in", _pl_input(root / "dhc-in", root / "pl-in")


@pytest.fixture(scope="module")
def pl_run(tmp_path_factory, inputs, dask_client) -> Path:
    return _pl_run(tmp_path_factory.mktemp("pl"), inputs[1], dask_client)


def _dhc_config(path: Path, data: Path, earlier: Path | str, extra: str = 'attributes = { hhgq8lev = "hhgq" }') -> Path:
    """DHC persons with the preset's budget (test mode), matched to ``earlier``'s published persons."""
    path.write_text(f'include = "dhc2020"\n[run]\nmode = "test"\nseed = 3\ninput = "{data}"\nproducts = ["persons"]\n'
                    f'[persons.estimation.match_published]\nrun = "{earlier}"\nproduct = "persons"\n'
                    f'query = "{QUERY}"\n{extra}\n')
    return path


def _marginals(run_dir: Path, census: str, query: str, level: str) -> pd.DataFrame:
    """A run's published answers of ``query`` at ``level``, by node."""
    schema = load_census(census).product("persons").schema
    table = pd.read_parquet(run_dir / "histograms" / "persons" / f"level={level}")
    nodes = pd.Index(sorted(set(table["geocode"].astype(str))))
    hist = sp.csr_matrix((table["count"], (nodes.get_indexer(table["geocode"].astype(str)), table["cell"])),
                         shape=(len(nodes), schema.ncells))
    return pd.DataFrame(build_query(schema, query).answer_rows(hist), index=nodes)


def _refused(capsys, argv: list[str]) -> tuple[int, str]:
    """The exit code and the one line of a refused command (stderr, warnings aside)."""
    capsys.readouterr()
    code = main(argv)
    lines = [line for line in capsys.readouterr().err.splitlines() if line.strip() and "WARNING" not in line]
    assert len(lines) == 1, lines
    return code, lines[0]


@pytest.mark.slow
def test_every_level_equals_the_published_counts(tmp_path, inputs, pl_run, dask_client):
    """The DHC persons run (the preset's budget and passes; the root's in-play cells from its noisy answers, so
    few on this small input) has, at every level, the P.L. run's published hhgq x voting age x hispanic x
    cenrace counts, which differ from the true ones, without the failsafe and without the P.L. run's input;
    verify accepts it; the manifest and the certificate record the P.L. run's manifest digest, nothing added to
    the budget, and no count."""
    dhc_in, pl_in = inputs
    hidden = pl_in.rename(pl_in.with_name("pl-in-hidden"))  # the P.L. run's input is never read
    try:
        out = run(load_config(_dhc_config(tmp_path / "dhc.toml", dhc_in, pl_run)), tmp_path / "dhc-run",
                  client=dask_client)
    finally:
        hidden.rename(pl_in)
    truth = pd.read_parquet(pl_in / "persons.parquet")
    differs = 0
    for level in LEVELS:
        mine = _marginals(out, "dhc2020", QUERY, level)
        published = _marginals(pl_run, "pl94", "hhgq * votingage * hispanic * cenrace", level)
        assert mine.equals(published.reindex(mine.index)), level
        width = {"US": 0, "State": 2, "County": 5, "Tract": 11, "Block_Group": 12, "Block": 15}[level]
        cell = ((truth["hhgq"] * 2 + truth["votingage"]) * 2 + truth["hispanic"]) * 63 + truth["cenrace"]
        node = truth["geoid"].str[:width] if width else pd.Series("US", index=truth.index)
        true = pd.Series(1, index=pd.MultiIndex.from_arrays([node, cell], names=["node", "answer"]))
        stacked = published.stack()
        stacked.index.names = ["node", "answer"]
        differs += int((stacked.sub(true.groupby(level=[0, 1]).sum(), fill_value=0) != 0).sum())
    assert differs > 0  # the P.L. run's noise moved them: the DHC estimates follow the publication, not the truth
    assert main(["verify", str(out)]) == 0
    digest = hashlib.sha256((pl_run / "manifest.json").read_bytes()).hexdigest()
    manifest = json.loads((out / "manifest.json").read_text())
    cert = json.loads((out / "certificate.json").read_text())
    for record in (manifest["match_published"]["persons"], cert["persons"]["match_published"]):
        assert record["manifest_sha256"] == digest and record["run"] == str(pl_run) and record["query"] == QUERY
        assert "no privacy loss" in record["privacy"]
    assert cert["persons"]["rho"] == "24811/5000" and not manifest["failsafe"]  # nothing added to the budget
    added = json.dumps([manifest["match_published"], cert["persons"]["match_published"]])
    added = added.replace(str(pl_run), "").replace(digest, "")
    assert not leaked_secrets(added, set(range(10_000)) - {94, 171}), added  # no number but P.L. 94-171's


def test_a_missing_run_is_refused_before_the_input_is_read(tmp_path, capsys):
    """Exit 4, one line naming the key and the folder; the input (absent here) is not read."""
    config = _dhc_config(tmp_path / "dhc.toml", tmp_path / "no-input", tmp_path / "no-such-run")
    code, line = _refused(capsys, ["run", str(config), "--out", str(tmp_path / "out")])
    assert code == 4 and "match_published" in line and "no-such-run" in line and "no such run directory" in line
    assert not (tmp_path / "out").exists()


def test_an_edited_published_file_is_refused(tmp_path, capsys, pl_run):
    """A histogram changed after the P.L. run wrote it: exit 4, naming the file, before the input is read."""
    copy = tmp_path / "pl-run"
    shutil.copytree(pl_run, copy)
    part = sorted((copy / "histograms" / "persons" / "level=Block").glob("*.parquet"))[0]
    table = pd.read_parquet(part)
    table.loc[0, "count"] += 1
    table.to_parquet(part, index=False)
    config = _dhc_config(tmp_path / "dhc.toml", tmp_path / "no-input", copy)
    code, line = _refused(capsys, ["run", str(config), "--out", str(tmp_path / "out")])
    assert code == 4 and "match_published" in line and "level=Block" in line, line


@pytest.mark.slow
def test_a_run_on_another_spine_is_refused(tmp_path, capsys, inputs, dask_client):
    """A P.L. run of the same input less one block: exit 2, naming the block, before anything is written."""
    dhc_in, _ = inputs
    block = sorted(pd.read_parquet(dhc_in / "units")["geoid"].unique())[-1]
    other = _pl_run(tmp_path, _pl_input(dhc_in, tmp_path / "pl-in", drop=block), dask_client)
    config = _dhc_config(tmp_path / "dhc.toml", dhc_in, other)
    code, line = _refused(capsys, ["run", str(config), "--out", str(tmp_path / "out"), "--workers", "1", "--quiet"])
    assert code == 2 and "spine differs" in line and block in line, line
    assert not (tmp_path / "out").exists()


@pytest.mark.parametrize("extra, words", [
    ("", ["recode", "'hhgq8lev'", "not declared"]),
    ('attributes = { hhgq8lev = "hhgq_type" }', ["no attribute 'hhgq_type'", "did you mean 'hhgq'"]),
    ('attributes = { hhgq8lev = "hhgq", sex = "hispanic" }', ["attributes.sex", "not a term"]),
])
def test_a_query_the_earlier_product_cannot_answer_is_refused(tmp_path, capsys, pl_run, extra, words):
    config = _dhc_config(tmp_path / "dhc.toml", tmp_path / "no-input", pl_run, extra)
    code, line = _refused(capsys, ["run", str(config), "--out", str(tmp_path / "out")])
    assert code == 2 and all(w in line for w in words), line


def test_the_setting_is_validated_and_absent_from_older_configurations():
    """A misspelt key is refused naming it; without the table the configuration's JSON (and so its hash) has
    no match_published key."""
    data = read_toml(Path(load_config("dhc2020").source))
    data["persons"]["estimation"]["match_published"] = {"run": "r", "product": "persons", "query": QUERY,
                                                         "attribute": {}}
    with pytest.raises(ConfigError, match="match_published.attribute: unknown key.*did you mean 'attributes'"):
        config_from_dict(data)
    assert "match_published" not in load_config("dhc2020").model_dump(mode="json")["persons"]["estimation"]
